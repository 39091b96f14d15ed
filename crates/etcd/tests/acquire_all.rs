//! A set of keys in one etcd transaction, cancelled: futures of `try_acquire_all` dropped at
//! points spread over two round trips leave no contender key of the cancelling session under
//! any prefix of the set (a won transaction whose answer came after the caller left is
//! withdrawn by the session), and another client takes the whole set in one step soon after.

use std::time::Duration;

use leasehold_core::{canonical, Authority, Instant};

mod common;

use common::{connect, cuts, eventually, key, keys_under, lease_alive, raw_client, start, url};
use common::{OrFail, Result};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_set_steps_leave_nothing_behind() -> Result {
    let server = start().await?;
    let raw = raw_client(&server).await?;
    let (a, b) = (connect(&url(&server)).await?, connect(&url(&server)).await?);
    let named = [key("cut/1")?, key("cut/2")?, key("cut/3")?];
    let keys = canonical(&named).or_fail("order the set")?;
    let prefixes: Vec<String> = keys.iter().map(|k| a.prefix(k)).collect();
    let ttl = Duration::from_secs(2);
    let sent = Instant::now();
    let measured = a
        .try_acquire_all(&keys, ttl)
        .await
        .or_fail("the measured step")?
        .or_fail("the measured step found a fresh set held")?;
    let round_trip = sent.elapsed();
    for grant in &measured {
        let _ = a.release(grant).await.or_fail("the measured release")?;
    }
    let session = a.session_leases()[0];
    let (mut cancelled, mut won) = (0, 0);
    for cut in cuts(round_trip, 200) {
        match tokio::time::timeout(cut, a.try_acquire_all(&keys, ttl)).await {
            Err(_) => cancelled += 1,
            Ok(Ok(Some(grants))) => {
                won += 1;
                for grant in &grants {
                    let _ = a.release(grant).await.or_fail("release")?;
                }
            }
            Ok(Ok(None)) => {}
            Ok(Err(e)) => return Err(format!("try_acquire_all failed: {e:?}").into()),
        }
    }
    eprintln!("{cancelled} cancelled, {won} won (round trip {round_trip:?})");
    assert!(cancelled > 0, "no step was cancelled");

    // The session withdraws what a cancelled step won; no key of it is left anywhere.
    let within = ttl + a.capabilities().expiry_slack + Duration::from_secs(1);
    let cleared = eventually(within, || async {
        for prefix in &prefixes {
            if keys_under(&raw, prefix)
                .await?
                .iter()
                .any(|(_, lease)| *lease == session)
            {
                return Ok(false);
            }
        }
        Ok(true)
    })
    .await?;
    let mut left = Vec::new();
    for prefix in &prefixes {
        left.extend(keys_under(&raw, prefix).await?);
    }
    assert!(cleared, "keys left after the cancelled steps: {left:?}");
    assert!(
        lease_alive(&raw, session).await?,
        "the session itself lives on"
    );
    let grants = b
        .try_acquire_all(&keys, ttl)
        .await
        .or_fail("B's step")?
        .or_fail("B found the set held after the cancelled steps")?;
    for grant in &grants {
        let _ = b.release(grant).await.or_fail("B releases")?;
    }
    Ok(())
}
