//! A follower cut off from the rest of its ensemble, while its clients still reach it.
//!
//! Such a follower keeps answering reads from its last state for up to `syncLimit x tickTime`,
//! while the leader and the other follower go on: they expire the sessions of the clients behind
//! it and hand their locks on. A lease renewed (or granted) by a read from that follower would be
//! valid on two clients at once.
//!
//! The ensemble here is built for that cut ([`ZkEnsemble::start_with`] with an isolatable
//! [`ZkConfig`]): each member listens on its own loopback address and runs under its own uid, so
//! a [`Partition`] can drop the traffic between one member and the others while clients still
//! reach its client port. The partition's nftables table is deleted when the test ends, also
//! when it fails.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_conformance::kit::{OrFail, TestResult};
use leasehold_core::{Authority, Error, Instant, LockKey};
use leasehold_servers::{Partition, ZkConfig, ZkEnsemble};
use leasehold_zookeeper::ZkAuthority;

/// Runs a blocking harness step off the runtime; its error fails the test.
async fn off<T: Send + 'static>(
    what: &str,
    f: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> TestResult<T> {
    tokio::task::spawn_blocking(f)
        .await
        .or_fail(what)?
        .or_fail(what)
}

/// Short ticks, and a follower that waits 50 of them (5 s) before it gives up on its leader:
/// the window in which it serves stale reads is long against the TTL used here.
const TICK: Duration = Duration::from_millis(100);
const SYNC_LIMIT: u32 = 50;

/// A 3-member ensemble whose members a [`Partition`] can cut off.
fn start_ensemble() -> Result<ZkEnsemble, String> {
    let config = ZkConfig::default()
        .tick_time(TICK)
        .init_limit(50)
        .sync_limit(SYNC_LIMIT)
        .isolatable();
    ZkEnsemble::start_with(3, config).map_err(|e| e.to_string())
}

fn key(name: &str) -> TestResult<LockKey> {
    LockKey::new(name).or_fail(format!("key {name}"))
}

/// A holds a lease through follower F; F is cut off from the leader and the other follower
/// (A still reaches it). The leader expires A's session after the TTL and hands the lock to B.
/// Meanwhile A keeps renewing through F, which still has A's node in its frozen state: no such
/// renewal may succeed with a deadline past the moment B holds the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_cut_off_from_its_quorum_cannot_renew_a_lease_the_leader_expired() -> TestResult
{
    let ensemble = Arc::new(off("start the partition ensemble", start_ensemble).await?);
    let e = ensemble.clone();
    let leader = off("find the leader", move || {
        e.leader().map_err(|e| e.to_string())
    })
    .await?;
    let f = (0..3).find(|&i| i != leader).or_fail("a follower")?;
    let rest: Vec<String> = (0..3)
        .filter(|&i| i != f)
        .map(|i| ensemble.member(i).connect_string())
        .collect();
    let ttl = Duration::from_secs(1);
    let params = format!("timeout_ms={}", ttl.as_millis() / 3);
    let a = ZkAuthority::connect(&format!(
        "zk://{}/partition?{params}",
        ensemble.member(f).connect_string()
    ))
    .await
    .or_fail("A connects through F")?;
    let b = ZkAuthority::connect(&format!("zk://{}/partition?{params}", rest.join(",")))
        .await
        .or_fail("B connects through the others")?;
    let k = key("stale-follower")?;
    let grant = a
        .try_acquire(&k, ttl)
        .await
        .or_fail("A acquires")?
        .or_fail("A holds the key")?;

    // A renews every quarter of the TTL, and notes every renewal that succeeded.
    let renewed: Arc<Mutex<Vec<(Instant, Instant)>>> = Arc::default();
    let stop = Arc::new(tokio::sync::Notify::new());
    let (succeeded, mut successes) = tokio::sync::watch::channel(0usize);
    let renewer = tokio::spawn({
        let (a, grant, renewed, stop) = (a.clone(), grant.clone(), renewed.clone(), stop.clone());
        async move {
            let mut failures = Vec::new();
            loop {
                let sent = Instant::now();
                match a.renew(&grant, ttl).await {
                    Ok(deadline) => {
                        renewed
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push((sent, deadline));
                        succeeded.send_modify(|n| *n += 1);
                    }
                    Err(e) => failures.push(e),
                }
                tokio::select! {
                    _ = stop.notified() => return failures,
                    _ = tokio::time::sleep(ttl / 4) => {}
                }
            }
        }
    });
    // A renews while F is part of the quorum (a renewal may time out on a loaded machine, so
    // wait for the first success rather than a fixed time).
    tokio::time::timeout(ttl * 5, successes.wait_for(|n| *n > 0))
        .await
        .or_fail("A renews while F is part of the quorum")?
        .or_fail("the renewer's count")?;

    // Cut right after a renewal succeeded: the worst case, its deadline is the furthest out.
    successes.borrow_and_update();
    successes
        .changed()
        .await
        .or_fail("a renewal right before the cut")?;
    let partition = {
        let e = ensemble.clone();
        off("cut F off", move || {
            Partition::isolate(e.member(f)).map_err(|e| e.to_string())
        })
        .await?
    };
    let cut = Instant::now();
    let b_result = b.acquire(&k, ttl, ttl * 4).await;
    let b_holds = Instant::now();
    // F serves stale reads until SYNC_LIMIT ticks after the cut; keep A renewing for a TTL more,
    // well inside that window.
    tokio::time::sleep(ttl).await;
    stop.notify_one();
    let failures = renewer.await.or_fail("the renewer")?;
    drop(partition);

    let fresh = b_result.or_fail("B gets the key once the leader expired A's session")?;
    assert!(fresh.fence() > grant.fence());
    assert!(
        b_holds - cut >= ttl / 2,
        "B got the key {:?} after the cut: A's session cannot have expired yet",
        b_holds - cut
    );
    let renewed = renewed.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let late: Vec<_> = renewed
        .iter()
        .filter(|(_, deadline)| *deadline > b_holds)
        .map(|(sent, deadline)| (*sent - cut, *deadline - cut))
        .collect();
    let furthest = renewed
        .iter()
        .map(|(_, d)| *d)
        .max()
        .or_fail("A renewed at least once")?;
    eprintln!(
        "A's furthest deadline {:?} before B held",
        b_holds.saturating_duration_since(furthest)
    );
    eprintln!(
        "cut at 0; B held at {:?}; A renewed {} times, {} of them valid past B's grant; {} failed ({:?})",
        b_holds - cut,
        renewed.len(),
        late.len(),
        failures.len(),
        failures.first()
    );
    assert!(
        late.is_empty(),
        "A's renewals through the cut-off follower (sent, deadline after the cut) overlap B's lease from {:?}: {late:?}",
        b_holds - cut
    );
    assert!(
        failures
            .iter()
            .all(|e| matches!(e, Error::Unavailable { .. } | Error::LeaseLost { .. })),
        "renewals through the cut-off follower fail as unreachable or lost: {failures:?}"
    );
    let _ = b.release(&fresh).await;
    Ok(())
}
