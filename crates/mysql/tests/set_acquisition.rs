//! `try_acquire_all` on MariaDB: a set with one key held by a plain single-key holder (another
//! client) takes none of the others (the transaction's upsert is rolled back: no row created,
//! no fence raised, nothing extended); a free set gets exactly the fences single acquisitions
//! would have; a key whose lease ran out is taken, above its fence; two sets racing over keys
//! that have no row yet never both win and the loser leaves nothing; and the conformance
//! suite's set scenarios.

use std::sync::Arc;
use std::time::Duration;

use leasehold_conformance::scenarios::{all, run_selected};
use leasehold_conformance::{Context, Verdict};
use leasehold_core::{Authority, LockKey};
use leasehold_mysql::MysqlAuthority;

mod common;
mod suite;

use common::{connect, key, start_server, url, Failure, OrFail, Result};

/// Each row of `keys` as `(key, fence, live, owner)`, read directly, in key order.
async fn rows(
    admin: &MysqlAuthority,
    keys: &[LockKey],
) -> Result<Vec<(String, i64, bool, String)>> {
    let mut found = Vec::new();
    for key in keys {
        let row: Option<(Vec<u8>, u64, i64, Vec<u8>)> = sqlx::query_as(
            "SELECT lock_key, fence, CAST(expires_at > UTC_TIMESTAMP(6) AS SIGNED), owner \
             FROM leasehold_leases WHERE lock_key = ?",
        )
        .bind(key.as_str())
        .fetch_optional(admin.pool())
        .await
        .or_fail("read a row of the set")?;
        found.extend(row.map(|(name, fence, live, owner)| {
            (
                String::from_utf8_lossy(&name).into_owned(),
                fence as i64,
                live == 1,
                String::from_utf8_lossy(&owner).into_owned(),
            )
        }));
    }
    Ok(found)
}

/// `a` and `b` are two clients (separate pools); `admin` reads the table directly.
async fn held_key_takes_nothing_then_free_set_takes_all(
    a: &MysqlAuthority,
    b: &MysqlAuthority,
    admin: &MysqlAuthority,
    prefix: &str,
) -> Result {
    let ttl = Duration::from_secs(10);
    let keys: Vec<LockKey> = (0..4)
        .map(|i| key(&format!("{prefix}/{i}")))
        .collect::<Result<_>>()?;
    // The first key has a history (fence 1, released); the third is held by B alone.
    let earlier = a
        .try_acquire(&keys[0], ttl)
        .await
        .or_fail("A takes the first key")?
        .or_fail("the first key is free")?;
    let _ = a
        .release(&earlier)
        .await
        .or_fail("A releases the first key")?;
    let blocker = b
        .try_acquire(&keys[2], ttl)
        .await
        .or_fail("B takes the third key")?
        .or_fail("the third key is free")?;
    let before = rows(admin, &keys).await?;

    let refused = a
        .try_acquire_all(&keys, ttl)
        .await
        .or_fail("A tries the set")?;
    if refused.is_some() {
        return Err(Failure::from(
            "the set was taken while B held its third key",
        ));
    }
    let after = rows(admin, &keys).await?;
    if after != before {
        return Err(Failure::from(format!(
            "a refused set changed the table: before {before:?}, after {after:?}"
        )));
    }
    if after.len() != 2 {
        return Err(Failure::from(format!(
            "a refused set left rows for keys it never had: {after:?}"
        )));
    }
    b.renew(&blocker, ttl)
        .await
        .or_fail("B renews after the refused set")?;
    let _ = b.release(&blocker).await.or_fail("B releases")?;

    let grants = a
        .try_acquire_all(&keys, ttl)
        .await
        .or_fail("A takes the free set")?
        .or_fail("the free set was answered held")?;
    let fences: Vec<u64> = grants.iter().map(|g| g.fence().raw()).collect();
    // As single acquisitions: the first and third keys' counters go on, the others start.
    if fences != [2, 1, 2, 1] {
        return Err(Failure::from(format!(
            "the set's fences are {fences:?}, single acquisitions would give [2, 1, 2, 1]"
        )));
    }
    let taken = rows(admin, &keys).await?;
    for ((name, fence, live, owner), grant) in taken.iter().zip(&grants) {
        if name != grant.key().as_str()
            || *fence as u64 != grant.fence().raw()
            || !live
            || *owner != grant.owner().to_hex()
        {
            return Err(Failure::from(format!(
                "row {name} fence {fence} live {live} is not the grant on {} fence {}",
                grant.key(),
                grant.fence()
            )));
        }
    }
    for grant in &grants {
        let _ = a.release(grant).await.or_fail("A releases")?;
    }
    Ok(())
}

/// Two sets that share their middle key, over keys with no row yet, sent together: one wins,
/// and the other took nothing, not even the key only it asked for (the statement that found
/// the shared key taken meanwhile rolled back its own insert).
async fn racing_sets_take_all_or_none(
    x: &MysqlAuthority,
    y: &MysqlAuthority,
    admin: &MysqlAuthority,
    prefix: &str,
    rounds: usize,
) -> Result {
    let ttl = Duration::from_secs(10);
    for round in 0..rounds {
        let [a, b, c] = ["a", "b", "c"].map(|k| key(&format!("{prefix}/{round}/{k}")));
        let (a, b, c) = (a?, b?, c?);
        let (first, second) = ([a.clone(), b.clone()], [b.clone(), c.clone()]);
        let (won_x, won_y) = tokio::join!(
            x.try_acquire_all(&first, ttl),
            y.try_acquire_all(&second, ttl)
        );
        let (won_x, won_y) = (won_x.or_fail("X's set")?, won_y.or_fail("Y's set")?);
        let rows = rows(admin, &[a.clone(), b.clone(), c.clone()]).await?;
        let live = |k: &LockKey| rows.iter().any(|r| r.0 == k.as_str() && r.2);
        match (&won_x, &won_y) {
            (Some(_), Some(_)) => {
                return Err(Failure::from(format!("round {round}: both sets won {b}")))
            }
            (None, None) => {
                return Err(Failure::from(format!(
                    "round {round}: neither set won, though one was alone on its keys first"
                )))
            }
            (Some(_), None) if live(&c) => {
                return Err(Failure::from(format!(
                    "round {round}: Y lost but its own key {c} is held: part of its set"
                )))
            }
            (None, Some(_)) if live(&a) => {
                return Err(Failure::from(format!(
                    "round {round}: X lost but its own key {a} is held: part of its set"
                )))
            }
            _ => {}
        }
        for grant in won_x.iter().chain(won_y.iter()).flatten() {
            let _ = x.release(grant).await.or_fail("release")?;
        }
    }
    Ok(())
}

/// A key whose holder let its lease run out (never released) is free by the database's clock:
/// the set takes it, one fence above the lapsed holder's.
async fn a_lapsed_lease_is_taken_by_the_set(
    a: &MysqlAuthority,
    b: &MysqlAuthority,
    prefix: &str,
) -> Result {
    let keys: Vec<LockKey> = (0..2)
        .map(|i| key(&format!("{prefix}/{i}")))
        .collect::<Result<_>>()?;
    let lapsed = b
        .try_acquire(&keys[1], Duration::from_millis(200))
        .await
        .or_fail("B takes the second key briefly")?
        .or_fail("the second key is free")?;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let grants = a
        .try_acquire_all(&keys, Duration::from_secs(10))
        .await
        .or_fail("A takes the set past B's expiry")?
        .or_fail("a set whose only holder's lease ran out was answered held")?;
    if grants[1].fence() <= lapsed.fence() {
        return Err(Failure::from(format!(
            "the set's fence {} is not above the lapsed holder's {}",
            grants[1].fence(),
            lapsed.fence()
        )));
    }
    if b.renew(&lapsed, Duration::from_secs(10)).await.is_ok() {
        return Err(Failure::from(
            "the lapsed holder renewed a key the set took",
        ));
    }
    for grant in &grants {
        let _ = a.release(grant).await.or_fail("A releases")?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_with_a_key_held_by_a_single_holder_takes_none_of_it() -> Result {
    let server = start_server().await?;
    let url = url(&server);
    let admin = connect(&url).await?;
    admin.migrate().await.or_fail("migrate")?;
    let (a, b) = (connect(&url).await?, connect(&url).await?);
    held_key_takes_nothing_then_free_set_takes_all(&a, &b, &admin, "set/direct").await?;
    a_lapsed_lease_is_taken_by_the_set(&a, &b, "lapsed/direct").await?;
    racing_sets_take_all_or_none(&a, &b, &admin, "race/direct", 40).await
}

/// The conformance suite's set scenarios alone (the whole suite runs them too), directly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_the_set_scenarios() -> Result {
    let server = start_server().await?;
    let url = url(&server);
    connect(&url).await?.migrate().await.or_fail("migrate")?;
    let ctx = Context::new(Arc::new(suite::clients(&url)))
        .await
        .or_fail("the suite's context")?
        .with_residue(Arc::new(suite::LiveRows(url.clone())))
        .with_faults(Arc::new(suite::faults(server, url)));
    let wanted = [
        "try_acquire_all_takes_all_or_none",
        "acquire_all_never_deadlocks_or_overlaps",
        "acquire_all_failure_leaves_no_key",
    ];
    let scenarios: Vec<_> = all()
        .into_iter()
        .filter(|s| wanted.contains(&s.name))
        .collect();
    if scenarios.len() != wanted.len() {
        return Err(Failure::from("the suite lacks a set scenario"));
    }
    let report = run_selected("mysql (MariaDB, sets)", &ctx, &scenarios).await;
    println!("{report}");
    for line in &report.lines {
        if line.outcome != Ok(Verdict::Passed) {
            return Err(Failure::from(format!("{}:\n{report}", line.scenario)));
        }
    }
    Ok(())
}
