//! Telemetry: what core records is exact on every backend, against the real server.

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::telemetry::{self, KeyLabels};
use leasehold_core::{Error, Instrumented, Lease, LeaseOptions, LostReason};

use crate::context::Context;
use crate::ensure;
use crate::recorded;
use crate::verdict::{Failure, OrFail, Outcome, Verdict};

/// Through the layer `connect` puts on every backend: A holds a key with a lease; B's
/// try_acquire finds it busy, B's acquire times out, and after A releases B acquires. A grant
/// released behind its lease's back has its first renewal refused. On one key each, the
/// recorded metrics are exactly: 2 acquired, 1 busy, 1 timed out, 2 owner changes, 2 wait
/// samples, no errors; 0 leases held at the end and 2 hold times; and for the released grant's
/// lease, one loss with the reason the lease reported (a refused renewal counted as such).
pub async fn metrics_count_what_happened(ctx: &Context) -> Outcome {
    if !recorded::install() {
        return Ok(Verdict::NotApplicable(
            "another metrics recorder is installed in this process".into(),
        ));
    }
    telemetry::set_key_labels(KeyLabels::Full);
    let a: Arc<dyn leasehold_core::Authority> = Arc::new(Instrumented::new(ctx.connect().await?));
    let b: Arc<dyn leasehold_core::Authority> = Arc::new(Instrumented::new(ctx.connect().await?));
    let backend = ctx.capabilities().backend;
    let key = ctx.key("metrics");
    let ttl = ctx.ttl();
    let still = LeaseOptions::default().with_auto_renew(false);

    let held = Lease::acquire(a.clone(), &key, ttl, Duration::ZERO, still.clone())
        .await
        .or_fail("A acquires")?;
    let busy = b.try_acquire(&key, ttl).await.or_fail("B tries")?;
    ensure!(busy.is_none(), "B took a key A holds");
    match b.acquire(&key, ttl, ttl / 4).await {
        Err(Error::Timeout { .. }) => {}
        other => return Err(Failure::new(format!("B's short wait ended with {other:?}"))),
    }
    let _ = held.release().await.or_fail("A releases")?;
    let next = Lease::acquire(b.clone(), &key, ttl, ttl, still)
        .await
        .or_fail("B acquires after the release")?;
    let _ = next.release().await.or_fail("B releases")?;

    let orphan_key = ctx.key("metrics-orphan");
    let grant = a
        .try_acquire(&orphan_key, ttl)
        .await
        .or_fail("A takes another key")?
        .ok_or_else(|| Failure::new("A could not take a free key"))?;
    let _ = a.release(&grant).await.or_fail("A releases it")?;
    let orphan = Lease::from_grant(a.clone(), grant, LeaseOptions::default());
    let reason = tokio::time::timeout(ttl * 2 + ctx.tolerance(), orphan.lost())
        .await
        .map_err(|_| Failure::new("a lease on a released grant was never reported lost"))?;

    let k = key.as_str();
    let ours = |extra: &[(&'static str, &'static str)]| {
        let mut labels = vec![("backend", backend), ("key", k)];
        labels.extend_from_slice(extra);
        labels
    };
    let acquire = |outcome: &'static str| {
        recorded::value(telemetry::ACQUIRE_TOTAL, &ours(&[("outcome", outcome)])).count
    };
    let counts = (
        acquire("acquired"),
        acquire("busy"),
        acquire("timed_out"),
        acquire("error"),
    );
    ensure!(
        counts == (2, 1, 1, 0),
        "acquires (acquired, busy, timed_out, error) recorded as {counts:?}, not (2, 1, 1, 0)"
    );
    let owners = recorded::value(telemetry::OWNER_CHANGES_TOTAL, &ours(&[])).count;
    ensure!(owners == 2, "{owners} owner changes recorded, not 2");
    let waits = recorded::value(telemetry::ACQUIRE_WAIT_SECONDS, &ours(&[])).samples;
    ensure!(
        waits.len() == 2,
        "{} wait times recorded, not 2",
        waits.len()
    );
    let gauge = recorded::value(telemetry::LEASES_HELD, &ours(&[])).gauge;
    ensure!(
        gauge == 0.0,
        "leases held on the key at the end: {gauge}, not 0"
    );
    let holds = recorded::value(telemetry::LEASE_HELD_SECONDS, &ours(&[])).samples;
    ensure!(
        holds.len() == 2,
        "{} hold times recorded, not 2",
        holds.len()
    );
    let losses = recorded::value(telemetry::LEASES_LOST_TOTAL, &ours(&[])).count;
    ensure!(
        losses == 0,
        "{losses} losses recorded for leases that were released"
    );

    let orphaned = |extra: &[(&'static str, &'static str)]| {
        let mut labels = vec![("backend", backend), ("key", orphan_key.as_str())];
        labels.extend_from_slice(extra);
        labels
    };
    let lost = recorded::value(
        telemetry::LEASES_LOST_TOTAL,
        &orphaned(&[("reason", reason.kind())]),
    )
    .count;
    ensure!(
        lost == 1,
        "the orphan's loss ({reason}) recorded {lost} times, not once"
    );
    if matches!(reason, LostReason::Refused) {
        let refused = recorded::value(
            telemetry::RENEWALS_TOTAL,
            &orphaned(&[("outcome", "refused")]),
        )
        .count;
        ensure!(
            refused == 1,
            "the refused renewal recorded {refused} times, not once"
        );
    }
    let gauge = recorded::value(telemetry::LEASES_HELD, &orphaned(&[])).gauge;
    ensure!(
        gauge == 0.0,
        "the orphan's lease still counted as held: {gauge}"
    );
    Ok(Verdict::Passed)
}
