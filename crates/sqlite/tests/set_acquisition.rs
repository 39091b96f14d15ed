//! `try_acquire_all` on a SQLite file, from clients with pools of their own (as processes
//! would be): a set with one key held by a single-key holder takes none of the others (no row
//! created, no fence raised, nothing extended); a free set gets exactly the fences single
//! acquisitions would have; two sets racing over a shared key never both win and the loser
//! leaves nothing.

use std::path::Path;
use std::time::Duration;

use leasehold_conformance::kit::{OrFail, TestResult};
use leasehold_conformance::Failure;
use leasehold_core::{Authority, LockKey};
use leasehold_sqlite::SqliteAuthority;

mod common;

use common::{now_ns, url};

/// A row of the table: key, fence, owner, live (of this boot, before its expiry).
type Row = (String, i64, String, bool);

/// Each row of `keys`, read directly, in key order.
async fn rows(path: &Path, keys: &[LockKey]) -> Result<Vec<Row>, Failure> {
    let admin = SqliteAuthority::connect(&url(path))
        .await
        .or_fail("connect")?;
    let mut found = Vec::new();
    for key in keys {
        let row: Option<Row> = sqlx::query_as(
            "SELECT lock_key, fence, owner, boot_id = ?2 AND expires_ns > ?3 \
             FROM leasehold_leases WHERE lock_key = ?1",
        )
        .bind(key.as_str())
        .bind(admin.boot_id())
        .bind(now_ns())
        .fetch_optional(admin.pool())
        .await
        .or_fail("read a row")?;
        found.extend(row);
    }
    admin.close().await;
    Ok(found)
}

fn keys(prefix: &str, n: usize) -> Result<Vec<LockKey>, Failure> {
    (0..n)
        .map(|i| LockKey::new(format!("{prefix}/{i}")).or_fail("a key"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_with_a_key_held_by_a_single_holder_takes_none_of_it() -> TestResult {
    let dir = tempfile::tempdir().or_fail("a temporary directory")?;
    let path = dir.path().join("locks.db");
    let a = SqliteAuthority::connect(&url(&path))
        .await
        .or_fail("connect A")?;
    let b = SqliteAuthority::connect(&url(&path))
        .await
        .or_fail("connect B")?;
    let ttl = Duration::from_secs(10);
    let keys = keys("set", 4)?;
    // The first key has a history (fence 1, released); the third is held by B alone.
    let earlier = a
        .try_acquire(&keys[0], ttl)
        .await
        .or_fail("A takes the first key")?
        .or_fail("the first key is free")?;
    let _ = a.release(&earlier).await.or_fail("A releases")?;
    let blocker = b
        .try_acquire(&keys[2], ttl)
        .await
        .or_fail("B takes the third key")?
        .or_fail("the third key is free")?;
    let before = rows(&path, &keys).await?;
    if a.try_acquire_all(&keys, ttl)
        .await
        .or_fail("A tries the set")?
        .is_some()
    {
        return Err(Failure::from(
            "the set was taken while B held its third key",
        ));
    }
    let after = rows(&path, &keys).await?;
    if after != before || after.len() != 2 {
        return Err(Failure::from(format!(
            "a refused set changed the file: before {before:?}, after {after:?}"
        )));
    }
    b.renew(&blocker, ttl).await.or_fail("B renews")?;
    let _ = b.release(&blocker).await.or_fail("B releases")?;
    let grants = a
        .try_acquire_all(&keys, ttl)
        .await
        .or_fail("A takes the free set")?
        .or_fail("the free set was answered held")?;
    let fences: Vec<u64> = grants.iter().map(|g| g.fence().raw()).collect();
    if fences != [2, 1, 2, 1] {
        return Err(Failure::from(format!(
            "the set's fences are {fences:?}, single acquisitions would give [2, 1, 2, 1]"
        )));
    }
    for ((name, fence, owner, live), grant) in rows(&path, &keys).await?.iter().zip(&grants) {
        if name != grant.key().as_str()
            || *fence as u64 != grant.fence().raw()
            || *owner != grant.owner().to_hex()
            || !live
        {
            return Err(Failure::from(format!(
                "row {name} fence {fence} live {live} is not the grant on {}",
                grant.key()
            )));
        }
    }
    Ok(())
}

/// Two clients' sets sharing their middle key, sent together, forty times: one wins, and the
/// other holds nothing, not even the key only it asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_sets_take_all_or_none() -> TestResult {
    let dir = tempfile::tempdir().or_fail("a temporary directory")?;
    let path = dir.path().join("locks.db");
    let x = SqliteAuthority::connect(&url(&path))
        .await
        .or_fail("connect X")?;
    let y = SqliteAuthority::connect(&url(&path))
        .await
        .or_fail("connect Y")?;
    let ttl = Duration::from_secs(10);
    for round in 0..40 {
        let k = keys(&format!("race/{round}"), 3)?;
        let (first, second) = ([k[0].clone(), k[1].clone()], [k[1].clone(), k[2].clone()]);
        let (won_x, won_y) = tokio::join!(
            x.try_acquire_all(&first, ttl),
            y.try_acquire_all(&second, ttl)
        );
        let (won_x, won_y) = (won_x.or_fail("X's set")?, won_y.or_fail("Y's set")?);
        let rows = rows(&path, &k).await?;
        let live = |key: &LockKey| rows.iter().any(|r| r.0 == key.as_str() && r.3);
        let wrong = match (&won_x, &won_y) {
            (Some(_), Some(_)) => Some("both sets won the shared key"),
            (None, None) => Some("neither set won"),
            (Some(_), None) if live(&k[2]) => Some("Y lost but holds its own key"),
            (None, Some(_)) if live(&k[0]) => Some("X lost but holds its own key"),
            _ => None,
        };
        if let Some(wrong) = wrong {
            return Err(Failure::from(format!("round {round}: {wrong}: {rows:?}")));
        }
        for grant in won_x.iter().chain(won_y.iter()).flatten() {
            let _ = x.release(grant).await.or_fail("release")?;
        }
    }
    Ok(())
}
