//! The metrics core records, with exact values, read back from metrics-util's
//! debugging recorder. On the in-memory reference, through `connect` as an application holds
//! it; every backend records through the same code (`Instrumented` and `Lease` in core).

use std::time::Duration;

use leasehold::telemetry::{self, KeyLabels};
use leasehold::{
    connect, FencedRegister, FencedResource, Guarded, Lease, LeaseOptions, LockKey, LostReason,
};
use leasehold_conformance::kit::{OrFail, TestResult};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use metrics_util::CompositeKey;

/// What was recorded since the last snapshot. A snapshot drains the debugging recorder
/// (counters and histograms start again from nothing), so take one and ask it everything.
type Seen = Vec<(
    CompositeKey,
    Option<metrics::Unit>,
    Option<metrics::SharedString>,
    DebugValue,
)>;

fn snapshot(snapshotter: &Snapshotter) -> Seen {
    snapshotter.snapshot().into_vec()
}

/// Every value recorded under `name` whose labels include all of `labels`.
fn values<'s>(seen: &'s Seen, name: &str, labels: &[(&str, &str)]) -> Vec<&'s DebugValue> {
    seen.iter()
        .filter(|(key, _, _, _)| {
            key.key().name() == name
                && labels
                    .iter()
                    .all(|(k, v)| key.key().labels().any(|l| l.key() == *k && l.value() == *v))
        })
        .map(|(_, _, _, value)| value)
        .collect()
}

fn counter(s: &Seen, name: &str, labels: &[(&str, &str)]) -> u64 {
    values(s, name, labels)
        .into_iter()
        .map(|v| match v {
            DebugValue::Counter(n) => *n,
            other => panic!("{name} is not a counter: {other:?}"),
        })
        .sum()
}

fn gauge(s: &Seen, name: &str, labels: &[(&str, &str)]) -> f64 {
    values(s, name, labels)
        .into_iter()
        .map(|v| match v {
            DebugValue::Gauge(g) => g.into_inner(),
            other => panic!("{name} is not a gauge: {other:?}"),
        })
        .sum()
}

fn samples(s: &Seen, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
    values(s, name, labels)
        .into_iter()
        .flat_map(|v| match v {
            DebugValue::Histogram(h) => h.iter().map(|x| x.into_inner()).collect::<Vec<_>>(),
            other => panic!("{name} is not a histogram: {other:?}"),
        })
        .collect()
}

/// One contended acquire (busy, then timed out, then acquired after the release), one refused
/// renewal (a lease on a grant released behind its back), one stale write refused by the
/// register: exactly these counts, with the backend and (by the policy) the key as labels.
#[tokio::test]
async fn one_contended_acquire_one_refused_renewal_one_stale_write() -> TestResult {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    // Thread-local: a current-thread runtime polls every task (the renewal tasks too) here.
    let _installed = metrics::set_default_local_recorder(&recorder);
    telemetry::set_key_labels(KeyLabels::UpTo(':'));

    let authority = connect("memory://metrics-exact").await.or_fail("connect")?;
    let key = LockKey::new("invoice:inv_72").or_fail("the invoice key")?;
    let ttl = Duration::from_millis(600);
    let still = LeaseOptions::default().with_auto_renew(false);
    let register = FencedRegister::new();

    let a = Lease::acquire(authority.clone(), &key, ttl, Duration::ZERO, still.clone())
        .await
        .or_fail("the first lease")?;
    assert!(register
        .claim(a.fence())
        .await
        .or_fail("claim the register with the first fence")?
        .is_accepted());
    assert!(authority
        .try_acquire(&key, ttl)
        .await
        .or_fail("try the held key")?
        .is_none());
    let waited = authority
        .acquire(&key, ttl, Duration::from_millis(30))
        .await;
    assert!(
        matches!(waited, Err(leasehold::Error::Timeout { .. })),
        "{waited:?}"
    );
    let old = a.fence();
    let _ = a.release().await.or_fail("release the first lease")?;
    let b = Lease::acquire(authority.clone(), &key, ttl, Duration::ZERO, still)
        .await
        .or_fail("the second lease")?;
    assert!(register
        .claim(b.fence())
        .await
        .or_fail("claim the register with the second fence")?
        .is_accepted());
    assert_eq!(
        register
            .write(old, "late")
            .await
            .or_fail("write with the old fence")?,
        Guarded::Stale {
            newest: b.fence().value()
        }
    );
    let _ = b.release().await.or_fail("release the second lease")?;

    // A grant released behind its lease's back: the first renewal is refused.
    let other = LockKey::new("payout:p_9").or_fail("the payout key")?;
    let grant = authority
        .try_acquire(&other, ttl)
        .await
        .or_fail("acquire the payout key")?
        .or_fail("the payout key is free")?;
    let _ = authority
        .release(&grant)
        .await
        .or_fail("release the payout grant")?;
    let orphan = Lease::from_grant(authority.clone(), grant, LeaseOptions::default());
    let reason = tokio::time::timeout(ttl * 2, orphan.lost())
        .await
        .or_fail("the orphan lease is lost within two TTLs")?;
    assert!(matches!(reason, LostReason::Refused), "{reason}");

    let s = &snapshot(&snapshotter);
    let invoice = [("backend", "memory"), ("key", "invoice")];
    let acquire = "leasehold_acquire_total";
    assert_eq!(
        counter(
            s,
            acquire,
            &[&invoice[..], &[("outcome", "acquired")]].concat()
        ),
        2
    );
    assert_eq!(
        counter(s, acquire, &[&invoice[..], &[("outcome", "busy")]].concat()),
        1
    );
    assert_eq!(
        counter(
            s,
            acquire,
            &[&invoice[..], &[("outcome", "timed_out")]].concat()
        ),
        1
    );
    assert_eq!(counter(s, acquire, &[("outcome", "error")]), 0);
    assert_eq!(
        counter(s, acquire, &[("key", "payout"), ("outcome", "acquired")]),
        1
    );
    assert_eq!(counter(s, "leasehold_owner_changes_total", &invoice), 2);
    assert_eq!(
        samples(s, "leasehold_acquire_wait_seconds", &invoice).len(),
        2
    );

    assert_eq!(
        counter(
            s,
            "leasehold_renewals_total",
            &[("outcome", "refused"), ("key", "payout")]
        ),
        1
    );
    assert_eq!(
        counter(s, "leasehold_renewals_total", &[("key", "invoice")]),
        0
    );
    assert_eq!(
        counter(
            s,
            "leasehold_leases_lost_total",
            &[
                ("backend", "memory"),
                ("reason", "refused"),
                ("key", "payout")
            ]
        ),
        1
    );
    assert_eq!(
        counter(s, "leasehold_leases_lost_total", &[("key", "invoice")]),
        0,
        "a release is not a loss"
    );
    assert_eq!(
        counter(
            s,
            "leasehold_fence_rejections_total",
            &[("resource", "register")]
        ),
        1
    );

    assert_eq!(gauge(s, "leasehold_leases_held", &invoice), 0.0);
    assert_eq!(gauge(s, "leasehold_leases_held", &[("key", "payout")]), 0.0);
    let held = samples(s, "leasehold_lease_held_seconds", &invoice);
    assert_eq!(held.len(), 2, "{held:?}");
    let ratios = samples(s, "leasehold_lease_held_ttl_ratio", &[("key", "payout")]);
    assert_eq!(ratios.len(), 1);
    // Refused at the first renewal, a third of the TTL in (the lease is then over).
    assert!(ratios[0] > 0.2 && ratios[0] < 1.5, "{ratios:?}");
    Ok(())
}

/// While a lease is held the gauge counts it, and dropping the lease takes it off. (The
/// debugging recorder hands out each gauge's change since the previous snapshot.)
#[tokio::test]
async fn the_held_gauge_counts_live_leases() -> TestResult {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _installed = metrics::set_default_local_recorder(&recorder);
    let authority = connect("memory://metrics-gauge").await.or_fail("connect")?;
    let key = LockKey::new("job:nightly").or_fail("the nightly key")?;
    let ttl = Duration::from_secs(5);
    let options = LeaseOptions::default();
    let lease = Lease::acquire(
        authority.clone(),
        &key,
        ttl,
        Duration::ZERO,
        options.clone(),
    )
    .await
    .or_fail("the nightly lease")?;
    let second = LockKey::new("job:weekly").or_fail("the weekly key")?;
    let other = Lease::acquire(authority, &second, ttl, Duration::ZERO, options)
        .await
        .or_fail("the weekly lease")?;
    let memory = [("backend", "memory")];
    let held = gauge(&snapshot(&snapshotter), "leasehold_leases_held", &memory);
    assert_eq!(held, 2.0);
    drop(lease);
    let change = gauge(&snapshot(&snapshotter), "leasehold_leases_held", &memory);
    assert_eq!(change, -1.0, "one of two leases ended");
    let _ = other.release().await.or_fail("release the weekly lease")?;
    let change = gauge(&snapshot(&snapshotter), "leasehold_leases_held", &memory);
    assert_eq!(change, -1.0, "the other ended");
    Ok(())
}
