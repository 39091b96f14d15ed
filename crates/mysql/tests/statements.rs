//! The lease statements' own edges against a real MariaDB: the fence read back from the
//! reply's `last_insert_id` on one connection whatever the statement before it set, keys
//! compared bytewise (case matters), expiry and the remaining time by the server's clock, and
//! rows that outlive release.

use std::time::Duration;

use leasehold_core::{Authority, KeyPrefix, Released};

mod common;

use common::{connect, key, start_server, url, OrFail, Result};

/// One lane, so every statement runs on the same connection: a held key must answer "held"
/// even right after a win on that connection set `LAST_INSERT_ID` to a fence, and a new row
/// must answer fence 1 right after a taken-over row answered a higher one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_come_back_right_on_one_connection() -> Result {
    let server = start_server().await?;
    let a = connect(&format!("{}&pool_size=1", url(&server))).await?;
    a.migrate().await.or_fail("migrate")?;
    let ttl = Duration::from_secs(30);
    let (k, other) = (key("one-connection")?, key("one-connection-other")?);
    let first = a
        .try_acquire(&k, ttl)
        .await
        .or_fail("the first acquisition")?
        .or_fail("a fresh key was held")?;
    assert_eq!(first.fence().raw(), 1);
    assert!(
        a.try_acquire(&k, ttl)
            .await
            .or_fail("the second try")?
            .is_none(),
        "a held key was granted again right after a win on the same connection"
    );
    assert_eq!(
        a.release(&first).await.or_fail("release")?,
        Released::Released
    );
    let second = a
        .try_acquire(&k, ttl)
        .await
        .or_fail("the acquisition after release")?
        .or_fail("a released key was held")?;
    assert_eq!(second.fence().raw(), 2);
    let fresh = a
        .try_acquire(&other, ttl)
        .await
        .or_fail("a fresh key after a taken-over one")?
        .or_fail("a fresh key was held")?;
    assert_eq!(fresh.fence().raw(), 1);
    assert!(
        a.try_acquire(&k, ttl)
            .await
            .or_fail("a try after the fresh key")?
            .is_none(),
        "a held key was granted after a fresh row on the same connection"
    );
    assert_eq!(
        a.release(&first).await.or_fail("a stale release")?,
        Released::AlreadyGone
    );
    assert!(a
        .renew(&first, ttl)
        .await
        .err()
        .is_some_and(|e| e.is_lease_lost()));
    // The same TTL twice within a microsecond changes nothing in the row, and still counts as
    // renewed (found rows, not changed rows).
    a.renew(&second, ttl).await.or_fail("renew")?;
    a.renew(&second, ttl).await.or_fail("renew again")?;
    a.proclaim(&second, b"v").await.or_fail("proclaim")?;
    a.proclaim(&second, b"v")
        .await
        .or_fail("the same value again")?;
    Ok(())
}

/// Keys are `VARBINARY`: `Key` and `key` are two locks (a case-insensitive collation would make
/// them one row, and one holder would block the other), and they list in byte order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_compared_bytewise() -> Result {
    let server = start_server().await?;
    let a = connect(&url(&server)).await?;
    a.migrate().await.or_fail("migrate")?;
    let ttl = Duration::from_secs(30);
    let upper = a
        .try_acquire(&key("case:Key")?, ttl)
        .await
        .or_fail("acquire case:Key")?;
    let lower = a
        .try_acquire(&key("case:key")?, ttl)
        .await
        .or_fail("acquire case:key")?;
    assert!(upper.is_some() && lower.is_some(), "{upper:?} {lower:?}");
    let listed = a
        .list_keys(&KeyPrefix::new("case:").or_fail("the prefix")?, 10)
        .await
        .or_fail("list")?;
    let listed: Vec<&str> = listed.iter().map(|k| k.as_str()).collect();
    assert_eq!(listed, ["case:Key", "case:key"]);
    Ok(())
}

/// Expiry is the server's: a lease runs out after its TTL by `UTC_TIMESTAMP(6)`, inspect
/// counts the remaining time on the server, and the row (with its fence) outlives the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_and_the_remaining_time_are_the_servers() -> Result {
    let server = start_server().await?;
    let a = connect(&url(&server)).await?;
    a.migrate().await.or_fail("migrate")?;
    let k = key("expiry")?;
    let ttl = Duration::from_millis(600);
    let grant = a
        .try_acquire(&k, ttl)
        .await
        .or_fail("acquire")?
        .or_fail("a fresh key was held")?;
    let seen = a.inspect(&k).await.or_fail("inspect")?;
    let remaining = seen.remaining.or_fail("a held key's remaining time")?;
    assert!(
        remaining <= ttl && remaining > Duration::from_millis(300),
        "{remaining:?}"
    );
    tokio::time::sleep(ttl + Duration::from_millis(100)).await;
    let seen = a.inspect(&k).await.or_fail("inspect after the TTL")?;
    assert!(!seen.held && seen.owner.is_none(), "{seen:?}");
    assert_eq!(seen.last_fence, Some(grant.fence()));
    let next = a
        .try_acquire(&k, ttl)
        .await
        .or_fail("acquire after expiry")?
        .or_fail("an expired key was held")?;
    assert!(next.fence() > grant.fence());
    Ok(())
}

/// A batch renewal larger than one statement's share (1,000 grants) renews every live grant in
/// two statements per share; a grant revoked meanwhile, and one whose key another client took
/// after its revoke, are refused by name while the rest renew; keys that differ only in case
/// are told apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_renewal_names_exactly_the_grants_it_renewed() -> Result {
    let server = start_server().await?;
    let a = connect(&url(&server)).await?;
    a.migrate().await.or_fail("migrate")?;
    let b = connect(&url(&server)).await?;
    let ttl = Duration::from_secs(30);
    let mut grants = Vec::new();
    for i in 0..1_500 {
        let name = if i == 1_200 {
            "batch-Case".to_string()
        } else {
            format!("batch-{i}")
        };
        grants.push(
            a.try_acquire(&key(&name)?, ttl)
                .await
                .or_fail("a grant")?
                .or_fail("a fresh key was held")?,
        );
    }
    let lower = a
        .try_acquire(&key("batch-case")?, ttl)
        .await
        .or_fail("the lower-case key")?
        .or_fail("a key differing only in case was held")?;
    for (i, answer) in a.renew_many(&grants).await.into_iter().enumerate() {
        answer.or_fail(format!("grant {i} was not renewed"))?;
    }
    let (revoked, taken) = (300, 1_200);
    for i in [revoked, taken] {
        let ended = a.revoke(grants[i].key()).await.or_fail("revoke")?;
        assert!(
            matches!(ended, leasehold_core::Revoked::Revoked { .. }),
            "grant {i}: {ended:?}"
        );
    }
    let newer = b
        .try_acquire(grants[taken].key(), ttl)
        .await
        .or_fail("the other client's acquisition")?
        .or_fail("a revoked key was still held")?;
    let answers = a.renew_many(&grants).await;
    assert_eq!(answers.len(), grants.len());
    for (i, answer) in answers.into_iter().enumerate() {
        match (i == revoked || i == taken, answer) {
            (false, Ok(_)) => {}
            (true, Err(e)) if e.is_lease_lost() => {}
            (_, other) => return Err(format!("grant {i}: {other:?}").into()),
        }
    }
    a.renew(&lower, ttl)
        .await
        .or_fail("the key differing in case stays its holder's")?;
    b.renew(&newer, ttl)
        .await
        .or_fail("the other client's grant is untouched")?;
    Ok(())
}
