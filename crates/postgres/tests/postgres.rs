//! The PostgreSQL authority against a real PostgreSQL started by the harness: the whole
//! conformance suite with faults, PostgreSQL as the protected resource too, a crash while a lease
//! is held, batched renewal, and guarded writes. Connecting (bad input, TLS, secrets), proclaimed
//! values and the table's versions, notifications, the listening connection and the server's
//! other edges have test files of their own.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold_conformance::kit;
use leasehold_conformance::scenarios::run_all;
use leasehold_conformance::{Context, ResourceFactory};
use leasehold_core::{
    Authority, Error, FencedResource, Instant, Lease, LeaseOptions, LostReason, OwnerToken,
};
use leasehold_postgres::guarded::{Claimed, FencedTable, Guarded, PgFencedRegister};

mod common;
mod suite;

use common::{connect, key, start_server, url, OrFail, Result};

struct PgRegisters(sqlx::PgPool);

#[async_trait]
impl ResourceFactory for PgRegisters {
    async fn resource(&self) -> leasehold_core::Result<Arc<dyn FencedResource>> {
        let id = OwnerToken::generate()?.to_hex();
        Ok(Arc::new(
            PgFencedRegister::create(&self.0, "conformance_register", &id).await?,
        ))
    }
}

/// With `LEASEHOLD_POSTGRES_URL` set (external mode, e.g. docker compose), the suite runs against
/// that server without faults, which then show as not applicable; otherwise against a managed one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_the_conformance_suite_with_faults() -> Result {
    if let Some(external) = leasehold_servers::external::postgres_url() {
        let sep = if external.contains('?') { '&' } else { '?' };
        let url = format!("{external}{sep}timeout_ms=1000");
        connect(&url)
            .await?
            .migrate()
            .await
            .or_fail("migrate the external server")?;
        let ctx = Context::new(Arc::new(suite::clients(&url)))
            .await
            .or_fail("the suite's context")?;
        let report = run_all("postgres (external)", &ctx).await;
        println!("{report}");
        report.assert_passed();
        return Ok(());
    }
    let server = start_server().await?;
    let url = url(&server);
    connect(&url).await?.migrate().await.or_fail("migrate")?;
    let ctx = Context::new(Arc::new(suite::clients(&url)))
        .await
        .or_fail("the suite's context")?
        .with_residue(Arc::new(suite::LiveRows(url.clone())))
        .with_faults(Arc::new(suite::faults(server, url)));
    // Only failover needs a standby, which failover.rs runs.
    kit::passes_all_but_failover("postgres", &ctx).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_writes_are_refused_by_a_postgres_resource() -> Result {
    let server = start_server().await?;
    let url = url(&server);
    let admin = connect(&url).await?;
    admin.migrate().await.or_fail("migrate")?;
    let ctx = Context::new(Arc::new(suite::clients(&url)))
        .await
        .or_fail("the suite's context")?
        .with_resources(Arc::new(PgRegisters(admin.pool().clone())));
    kit::stale_writes_are_refused("postgres, resource in postgres", &ctx).await
}

/// Kill PostgreSQL while a lease is held: the holder's renewal fails and `lost()` fires by its
/// deadline; after the restart the key is free within a TTL, and fences are greater than every
/// fence before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_while_held_loses_the_lease_and_keeps_the_fence_counter() -> Result {
    let server = start_server().await?;
    let url = url(&server);
    let a = Arc::new(connect(&url).await?);
    a.migrate().await.or_fail("migrate")?;
    let key = key("crash-while-held")?;
    let ttl = Duration::from_millis(1500);
    let first = a
        .try_acquire(&key, ttl)
        .await
        .or_fail("the first acquisition")?
        .or_fail("the first acquisition: a fresh key was held")?;
    let _ = a.release(&first).await.or_fail("the first release")?;
    let lease = Lease::try_acquire(a.clone(), &key, ttl, LeaseOptions::default())
        .await
        .or_fail("the lease")?
        .or_fail("the lease: the released key was held")?;
    let held_fence = lease.fence();
    let deadline = lease.deadline();
    {
        let s = server.clone();
        tokio::task::spawn_blocking(move || s.kill())
            .await
            .or_fail("the harness task")?
            .or_fail("kill the server")?;
    }
    let reason = tokio::time::timeout_at(deadline + Duration::from_millis(500), lease.lost())
        .await
        .or_fail("lost() must fire by the deadline while the server is down")?;
    assert!(
        matches!(
            reason,
            LostReason::RenewalFailed(_) | LostReason::DeadlinePassed
        ),
        "{reason:?}"
    );
    assert!(lease.ensure_valid().is_err());
    {
        let s = server.clone();
        tokio::task::spawn_blocking(move || s.restart())
            .await
            .or_fail("the harness task")?
            .or_fail("restart the server")?;
    }
    let b = connect(&url).await?;
    let restarted = Instant::now();
    let after = loop {
        if let Some(g) = b
            .try_acquire(&key, ttl)
            .await
            .or_fail("acquire after the restart")?
        {
            break g;
        }
        assert!(
            restarted.elapsed() < ttl * 2,
            "the key stayed held after the restart beyond the TTL"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        after.fence() > held_fence,
        "{} after the crash, {} before",
        after.fence(),
        held_fence
    );
    assert!(held_fence > first.fence());
    drop(lease);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guarded_updates_tell_stale_from_precondition_from_missing() -> Result {
    // The guarded statements run in this task, on this thread: its recorder sees them.
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _recording = metrics::set_default_local_recorder(&recorder);
    let server = start_server().await?;
    let a = connect(&url(&server)).await?;
    let pool = a.pool().clone();
    sqlx::query(
        "CREATE TABLE invoices (id text PRIMARY KEY, state text NOT NULL, paid_by text, \
         last_fence bigint NOT NULL DEFAULT 0)",
    )
    .execute(&pool)
    .await
    .or_fail("create the invoices")?;
    sqlx::query("INSERT INTO invoices (id, state) VALUES ('inv_1', 'open')")
        .execute(&pool)
        .await
        .or_fail("insert the invoice")?;
    a.migrate().await.or_fail("migrate")?;
    let key = key("invoice:inv_1")?;
    let ttl = Duration::from_secs(5);
    let old = a
        .try_acquire(&key, ttl)
        .await
        .or_fail("the old acquisition")?
        .or_fail("the old acquisition: a fresh key was held")?;
    let _ = a.release(&old).await.or_fail("the old release")?;
    let new = a
        .try_acquire(&key, ttl)
        .await
        .or_fail("the new acquisition")?
        .or_fail("the new acquisition: the released key was held")?;
    let invoices = FencedTable::new("invoices", "id").or_fail("the fenced table")?;
    let mut tx = pool.begin().await.or_fail("begin")?;

    let claimed: Claimed<(String, i64)> = invoices
        .claim(&mut tx, "inv_1", new.fence(), "state, last_fence")
        .await
        .or_fail("the new holder's claim")?;
    assert_eq!(
        claimed,
        Claimed::Claimed(("open".to_string(), new.fence().as_i64()))
    );
    let stale: Claimed<(String,)> = invoices
        .claim(&mut tx, "inv_1", old.fence(), "state")
        .await
        .or_fail("the old holder's claim")?;
    assert_eq!(
        stale,
        Claimed::Stale {
            newest: new.fence().value()
        }
    );
    let missing: Claimed<(String,)> = invoices
        .claim(&mut tx, "inv_404", new.fence(), "state")
        .await
        .or_fail("a claim of a missing row")?;
    assert_eq!(missing, Claimed::Missing);

    let pay = |who: &'static str| {
        move |q: sqlx::query::Query<'static, sqlx::Postgres, sqlx::postgres::PgArguments>| {
            q.bind(who)
        }
    };
    let set = "state = 'paid', paid_by = $3";
    assert_eq!(
        invoices
            .update(
                &mut tx,
                "inv_1",
                old.fence(),
                set,
                "state = 'open'",
                pay("old")
            )
            .await
            .or_fail("the old holder's update")?,
        Guarded::Stale {
            newest: new.fence().value()
        }
    );
    assert_eq!(
        invoices
            .update(
                &mut tx,
                "inv_1",
                new.fence(),
                set,
                "state = 'open'",
                pay("new")
            )
            .await
            .or_fail("the new holder's update")?,
        Guarded::Applied
    );
    assert_eq!(
        invoices
            .update(
                &mut tx,
                "inv_1",
                new.fence(),
                set,
                "state = 'open'",
                pay("again")
            )
            .await
            .or_fail("the new holder's second update")?,
        Guarded::PreconditionFailed
    );
    assert_eq!(
        invoices
            .update(&mut tx, "inv_404", new.fence(), set, "true", pay("x"))
            .await
            .or_fail("an update of a missing row")?,
        Guarded::Missing
    );
    tx.commit().await.or_fail("commit")?;
    let paid_by: String = sqlx::query_scalar("SELECT paid_by FROM invoices WHERE id = 'inv_1'")
        .fetch_one(&pool)
        .await
        .or_fail("read who paid")?;
    assert_eq!(paid_by, "new");
    // Two stale holders caught (the old claim and the old update); a missing row or a failed
    // precondition is not a stale fence.
    let mut rejected = 0;
    for (k, _, _, v) in snapshotter.snapshot().into_vec() {
        if k.key().name() == "leasehold_fence_rejections_total"
            && k.key()
                .labels()
                .any(|l| l.key() == "resource" && l.value() == "postgres_table")
        {
            match v {
                metrics_util::debugging::DebugValue::Counter(n) => rejected += n,
                other => return Err(format!("not a counter: {other:?}").into()),
            }
        }
    }
    assert_eq!(rejected, 2);
    assert!(FencedTable::new("invoices; drop table x", "id").is_err());
    assert!(FencedTable::new("invoices", "id")
        .or_fail("the fenced table")?
        .with_fence_column("a.b")
        .is_err());
    Ok(())
}

/// One statement renews a batch. A grant released behind its back and a stale grant
/// (its key since taken by another client) are refused, each alone; the others in the same batch
/// are renewed to their full TTL, by the database's clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renew_many_renews_a_batch_and_refuses_only_what_is_not_ours() -> Result {
    let server = start_server().await?;
    let url = url(&server);
    let (a, b) = (connect(&url).await?, connect(&url).await?);
    a.migrate().await.or_fail("migrate")?;
    assert!(a.capabilities().batch_renewal);
    let short = Duration::from_millis(300);
    let long = Duration::from_secs(20);
    let mut grants = Vec::new();
    for i in 0..5 {
        let key = key(&format!("batch/{i}"))?;
        let ttl = if i == 3 { short } else { long };
        grants.push(
            a.try_acquire(&key, ttl)
                .await
                .or_fail(format!("acquire {key}"))?
                .or_fail(format!("acquire {key}: a fresh key was held"))?,
        );
    }
    let _ = a.release(&grants[1]).await.or_fail("release grant 1")?;
    tokio::time::sleep(short + Duration::from_millis(100)).await;
    let taken = b
        .try_acquire(grants[3].key(), long)
        .await
        .or_fail("B takes key 3")?
        .or_fail("grant 3 ran out")?;
    let results = a.renew_many(&grants).await;
    assert_eq!(results.len(), 5);
    for (i, result) in results.iter().enumerate() {
        match i {
            1 | 3 => assert!(
                matches!(
                    result,
                    Err(Error::LeaseLost {
                        reason: LostReason::Refused,
                        ..
                    })
                ),
                "grant {i}: {result:?}"
            ),
            _ => {
                let deadline = *result.as_ref().or_fail(format!("renew grant {i}"))?;
                assert!(deadline > Instant::now() + long / 2, "grant {i}");
                let seen = b
                    .inspect(grants[i].key())
                    .await
                    .or_fail(format!("inspect grant {i}'s key"))?;
                assert!(
                    seen.held
                        && seen.remaining.or_fail(format!("grant {i}: time left"))?
                            > long - Duration::from_secs(2),
                    "grant {i}: {seen:?}"
                );
            }
        }
    }
    // The new holder of key 3 kept its own lease, untouched by the stale grant in the batch.
    let seen = a.inspect(taken.key()).await.or_fail("inspect key 3")?;
    assert_eq!(seen.fence, Some(taken.fence()));
    Ok(())
}
