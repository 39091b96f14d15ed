//! Proclaimed values on PostgreSQL, and the lease table of the version before them: a value
//! belongs to the grant that proclaimed it; a table without the value and waiter columns keeps
//! working for leases, says to migrate for the rest, is upgraded in place by `migrate()`, and a
//! process that fell back to the previous statements returns to the current ones afterwards.

use std::time::Duration;

use leasehold_core::{Authority, Error, Instant, LostReason, OwnerToken, Released};

mod common;

use common::{connect, key, start_server, url, OrFail, Result};

/// The value a grant proclaims belongs to that grant: a later grant on the key starts with none,
/// a stale grant's proclaim is refused with `LeaseLost` and leaves the holder's value as it was,
/// a released key shows no value, and a value over the limit is refused before any request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proclaimed_value_belongs_to_its_grant() -> Result {
    let server = start_server().await?;
    let url = url(&server);
    let (a, b) = (connect(&url).await?, connect(&url).await?);
    a.migrate().await.or_fail("migrate")?;
    let key = key("proclaim/owned")?;
    let ttl = Duration::from_millis(400);
    let old = a
        .try_acquire(&key, ttl)
        .await
        .or_fail("A acquires")?
        .or_fail("A acquires: a fresh key was held")?;
    a.proclaim(&old, b"old leader")
        .await
        .or_fail("A proclaims")?;
    let seen = b.inspect(&key).await.or_fail("B inspects")?;
    assert_eq!(seen.value.as_deref(), Some(&b"old leader"[..]), "{seen:?}");

    // The old grant runs out; the next one starts without a value.
    tokio::time::sleep(ttl + Duration::from_millis(100)).await;
    let new = b
        .try_acquire(&key, ttl * 10)
        .await
        .or_fail("B acquires")?
        .or_fail("B acquires: A's grant did not run out")?;
    assert!(new.fence() > old.fence());
    let seen = a.inspect(&key).await.or_fail("A inspects")?;
    assert!(seen.held && seen.value.is_none(), "{seen:?}");

    // The stale grant cannot write over the new holder's value, nor set one where it has none.
    let err = match a.proclaim(&old, b"stale").await {
        Ok(()) => return Err("the stale grant proclaimed where the new one has no value".into()),
        Err(e) => e,
    };
    assert!(
        matches!(
            &err,
            Error::LeaseLost {
                reason: LostReason::Refused,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(a
        .inspect(&key)
        .await
        .or_fail("A inspects after the stale proclaim")?
        .value
        .is_none());
    b.proclaim(&new, b"new leader")
        .await
        .or_fail("B proclaims")?;
    let err = match a.proclaim(&old, b"stale").await {
        Ok(()) => return Err("the stale grant proclaimed over the new holder's value".into()),
        Err(e) => e,
    };
    assert!(matches!(err, Error::LeaseLost { .. }), "{err:?}");
    let seen = a.inspect(&key).await.or_fail("A inspects")?;
    assert_eq!(seen.value.as_deref(), Some(&b"new leader"[..]), "{seen:?}");
    assert_eq!(seen.fence, Some(new.fence()));

    // An owner token that never held the key is refused the same way.
    let forged = leasehold_core::backend::grant(
        key.clone(),
        OwnerToken::generate().or_fail("an owner token")?,
        new.fence(),
        ttl,
        Instant::now() + ttl,
    );
    let err = match a.proclaim(&forged, b"forged").await {
        Ok(()) => return Err("a forged grant proclaimed".into()),
        Err(e) => e,
    };
    assert!(matches!(err, Error::LeaseLost { .. }), "{err:?}");

    // Too long: refused before anything is sent; the value stays.
    let err = match b
        .proclaim(&new, &vec![b'x'; leasehold_core::MAX_VALUE_LEN + 1])
        .await
    {
        Ok(()) => return Err("a value over the limit was proclaimed".into()),
        Err(e) => e,
    };
    assert!(matches!(err, Error::InvalidConfig { .. }), "{err:?}");
    b.proclaim(&new, &vec![b'y'; leasehold_core::MAX_VALUE_LEN])
        .await
        .or_fail("B proclaims a value of the largest length")?;
    assert_eq!(
        a.inspect(&key)
            .await
            .or_fail("A inspects the longest value")?
            .value
            .map(|v| v.len()),
        Some(leasehold_core::MAX_VALUE_LEN)
    );

    // Released: free, no value; the next grant (the same client's) starts without one too.
    let _ = b.release(&new).await.or_fail("B releases")?;
    let seen = a
        .inspect(&key)
        .await
        .or_fail("A inspects the released key")?;
    assert!(!seen.held && seen.value.is_none(), "{seen:?}");
    let again = b
        .try_acquire(&key, ttl * 10)
        .await
        .or_fail("B acquires again")?
        .or_fail("B acquires again: the released key was held")?;
    assert!(b
        .inspect(&key)
        .await
        .or_fail("B inspects its new grant")?
        .value
        .is_none());
    let err = match b.proclaim(&new, b"released").await {
        Ok(()) => return Err("a released grant proclaimed".into()),
        Err(e) => e,
    };
    assert!(matches!(err, Error::LeaseLost { .. }), "{err:?}");
    let _ = b.release(&again).await.or_fail("B releases again")?;
    Ok(())
}

/// A lease table made by the version before proclaim (created here by hand with that version's
/// SQL, in a table of its own) keeps working for leases, waiting included (the statements fall
/// back to the forms before `waited_until`); inspect and proclaim fail with a clear
/// permanent error that says to run migrate; `migrate()` adds the columns in place, keeping the
/// rows (the live lease, its fence and the fence counter), and is idempotent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_of_the_previous_version_says_to_migrate_and_is_upgraded_in_place() -> Result {
    let server = start_server().await?;
    let url = format!("{}&table=leases_v0", url(&server));
    let a = connect(&url).await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS \"leases_v0\" (
            lock_key   text        PRIMARY KEY,
            owner      text        NOT NULL,
            fence      bigint      NOT NULL CHECK (fence > 0),
            expires_at timestamptz NOT NULL
        ) WITH (fillfactor = 70)",
    )
    .execute(a.pool())
    .await
    .or_fail("create the previous version's table")?;
    let key = key("upgrade/held")?;
    let ttl = Duration::from_secs(30);
    // Leases work on the old table: their statements did not change.
    let first = a
        .try_acquire(&key, ttl)
        .await
        .or_fail("acquire on the old table")?
        .or_fail("acquire on the old table: a fresh key was held")?;
    let _ = a
        .release(&first)
        .await
        .or_fail("release on the old table")?;
    let held = a
        .try_acquire(&key, ttl)
        .await
        .or_fail("acquire again on the old table")?
        .or_fail("acquire again on the old table: the released key was held")?;
    let renewed = a.renew(&held, ttl).await;
    assert!(renewed.is_ok(), "{renewed:?}");
    // Waiting works too: without `waited_until`, waiters mark nothing and releases always notify.
    let other = common::key("upgrade/waited")?;
    let waited = a
        .acquire(&other, ttl, Duration::from_secs(1))
        .await
        .or_fail("a waiting acquire on the old table")?;
    a.wait_for_change(&other, Duration::from_millis(50))
        .await
        .or_fail("wait_for_change on the old table")?;
    let _ = a
        .release(&waited)
        .await
        .or_fail("release the waited-for key")?;

    let inspected = a.inspect(&key).await;
    let proclaimed = a.proclaim(&held, b"v").await;
    for (what, result) in [("inspect", inspected.map(|_| ())), ("proclaim", proclaimed)] {
        let err = match result {
            Ok(()) => return Err(format!("{what} worked on the old table").into()),
            Err(e) => e,
        };
        assert!(
            matches!(
                err,
                Error::Backend {
                    retryable: false,
                    ..
                }
            ),
            "{err:?}"
        );
        let text = err.to_string();
        assert!(
            text.contains("migrate()") && text.contains("leases_v0"),
            "{text}"
        );
    }

    a.migrate().await.or_fail("migrate")?;
    let seen = a.inspect(&key).await.or_fail("inspect after migrate")?;
    assert!(seen.held && seen.value.is_none(), "{seen:?}");
    assert_eq!(seen.fence, Some(held.fence()));
    a.proclaim(&held, b"after migrate")
        .await
        .or_fail("proclaim after migrate")?;
    assert_eq!(
        a.inspect(&key)
            .await
            .or_fail("inspect the proclaimed value")?
            .value
            .as_deref(),
        Some(&b"after migrate"[..])
    );
    // Idempotent, by migrate and by the published SQL, and leaves the value in place.
    a.migrate().await.or_fail("migrate again")?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(leasehold_postgres::schema_sql(
        a.table(),
    )))
    .execute(a.pool())
    .await
    .or_fail("the published SQL")?;
    assert_eq!(
        a.inspect(&key)
            .await
            .or_fail("inspect after the published SQL")?
            .value
            .as_deref(),
        Some(&b"after migrate"[..])
    );
    let _ = a.release(&held).await.or_fail("release after migrate")?;
    let next = a
        .try_acquire(&key, ttl)
        .await
        .or_fail("acquire after migrate")?
        .or_fail("acquire after migrate: the released key was held")?;
    assert!(next.fence() > held.fence() && held.fence() > first.fence());
    let _ = a.release(&next).await.or_fail("the last release")?;
    Ok(())
}

/// A process that fell back to the previous statements (its table lacked `waited_until`) goes
/// back to the current ones once `migrate()` has run in another process: its waiter marks the
/// key again, so the other process's release, which notifies only a marked key, wakes it long
/// before the holder's expiry. Kept on the previous statements, it marked nothing and slept
/// until the holder's TTL ran out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_on_the_previous_statements_returns_to_the_current_after_migrate_elsewhere(
) -> Result {
    let server = start_server().await?;
    let url = format!("{}&table=leases_v1", url(&server));
    let old = connect(&url).await?;
    sqlx::query(
        "CREATE TABLE \"leases_v1\" (
            lock_key   text        PRIMARY KEY,
            owner      text        NOT NULL,
            fence      bigint      NOT NULL CHECK (fence > 0),
            expires_at timestamptz NOT NULL
        ) WITH (fillfactor = 70)",
    )
    .execute(old.pool())
    .await
    .or_fail("creating the previous version's table")?;
    let ttl = Duration::from_secs(20);
    // A release is the first statement that needs `waited_until`: this process falls back.
    let first = key("returns/first")?;
    let g = old
        .try_acquire(&first, ttl)
        .await
        .or_fail("acquire on the old table")?
        .or_fail("a fresh key was held")?;
    if old.release(&g).await.or_fail("release on the old table")? != Released::Released {
        return Err("the lease on the old table was gone before its release".into());
    }
    // Another process upgrades the table and holds a key the first one waits for.
    let new = connect(&url).await?;
    new.migrate().await.or_fail("migrate")?;
    let k = key("returns/handoff")?;
    let held = new
        .try_acquire(&k, ttl)
        .await
        .or_fail("acquire after migrate")?
        .or_fail("a fresh key was held")?;
    let waiter = {
        let (old, k) = (old.clone(), k.clone());
        tokio::spawn(async move { old.acquire(&k, ttl, ttl).await })
    };
    let started = Instant::now();
    loop {
        let marked: Option<bool> = sqlx::query_scalar(
            "SELECT waited_until > statement_timestamp() FROM leases_v1 WHERE lock_key = $1",
        )
        .bind(k.as_str())
        .fetch_optional(new.pool())
        .await
        .or_fail("reading the mark")?
        .flatten();
        if marked == Some(true) {
            break;
        }
        if started.elapsed() > ttl / 4 {
            return Err(format!(
                "the waiter never marked the key in {:?}: it still sends the previous statements",
                started.elapsed()
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let released_at = Instant::now();
    if new.release(&held).await.or_fail("release")? != Released::Released {
        return Err("the holder's lease was gone before its release".into());
    }
    let grant = tokio::time::timeout(ttl / 4, waiter)
        .await
        .or_fail("the release did not reach the waiter within TTL/4")?
        .or_fail("the waiter's task")?
        .or_fail("the waiter")?;
    println!("hand-off {:?} after the release", released_at.elapsed());
    if grant.fence() <= held.fence() {
        return Err(format!("fence {} after {}", grant.fence(), held.fence()).into());
    }
    if old.release(&grant).await.or_fail("release")? != Released::Released {
        return Err("the waiter's lease was gone before its release".into());
    }
    Ok(())
}
