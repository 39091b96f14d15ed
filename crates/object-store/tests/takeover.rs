//! A holder that stops (paused, so it neither renews nor releases) loses its key only when the
//! store's clock says its lease is over, and its renewal after the takeover is refused without
//! touching the new holder's lease. Against S3 on moto and Azure Blob on Azurite, each started
//! by the harness, one of each shared by the binary's tests (each on keys of its own).
#![cfg(all(feature = "aws", feature = "azure"))]

mod support;

use std::time::Duration;

use leasehold_conformance::kit::{ErrOrFail, OrFail, TestResult};
use leasehold_conformance::Failure;
use leasehold_core::{Authority, Instant, LockKey, OwnerToken, Released};

fn key(name: &str) -> TestResult<LockKey> {
    let run = OwnerToken::generate().or_fail("a run id")?.to_hex();
    LockKey::new(format!("takeover/{}/{name}", &run[..12])).or_fail("a key")
}

/// The holder takes the key with a 2 s TTL and then stops. A contender polling every 100 ms is
/// refused until more than the TTL has passed since the holder sent its request (the holder's
/// deadline is before that), and then takes the key with the next fence, within the TTL plus
/// the declared slack and a poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_s3_a_paused_holder_loses_its_key_only_when_the_store_clock_says_so() -> TestResult {
    let url = support::shared_moto().await?.url();
    paused_holder(support::Clients::new(
        move || support::s3(&url),
        support::config(),
    ))
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_azure_a_paused_holder_loses_its_key_only_when_the_store_clock_says_so() -> TestResult {
    let port = support::shared_azurite().await?.port();
    paused_holder(support::Clients::new(
        move || support::azure(port),
        support::config(),
    ))
    .await
}

async fn paused_holder(clients: support::Clients) -> TestResult {
    let (holder, contender) = (clients.authority()?, clients.authority()?);
    let key = key("paused")?;
    let ttl = Duration::from_secs(2);
    let sent = Instant::now();
    let held = holder
        .try_acquire(&key, ttl)
        .await
        .or_fail("the holder's acquire")?
        .or_fail("the key was free")?;
    if held.deadline() > sent + ttl {
        return Err(Failure::new("the holder's deadline is past its TTL"));
    }
    let slack = contender.capabilities().expiry_slack;
    let taken = loop {
        if let Some(grant) = contender
            .try_acquire(&key, ttl)
            .await
            .or_fail("the contender's try")?
        {
            break grant;
        }
        if sent.elapsed() > ttl + slack + Duration::from_secs(2) {
            return Err(Failure::new(format!(
                "the key stayed held {:?} after a {ttl:?} lease",
                sent.elapsed()
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let after = sent.elapsed();
    if after <= ttl {
        return Err(Failure::new(format!(
            "the contender took the key {after:?} after the holder sent its {ttl:?} acquire"
        )));
    }
    if held.deadline() >= Instant::now() {
        return Err(Failure::new(
            "the contender holds the key while the holder's deadline is still ahead",
        ));
    }
    if taken.fence() <= held.fence() {
        return Err(Failure::new(format!(
            "the takeover's fence {} is not above the holder's {}",
            taken.fence(),
            held.fence()
        )));
    }
    println!("taken over {after:?} after the holder's request ({ttl:?} TTL)");
    Ok(())
}

/// After a takeover, the former holder's renewal, proclaim and release are refused, and the new
/// holder's lease, fence and value are as it left them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_s3_a_renewal_after_a_takeover_is_refused_and_leaves_the_new_holder() -> TestResult {
    let url = support::shared_moto().await?.url();
    refused_after_takeover(support::Clients::new(
        move || support::s3(&url),
        support::config(),
    ))
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_azure_a_renewal_after_a_takeover_is_refused_and_leaves_the_new_holder() -> TestResult {
    let port = support::shared_azurite().await?.port();
    refused_after_takeover(support::Clients::new(
        move || support::azure(port),
        support::config(),
    ))
    .await
}

async fn refused_after_takeover(clients: support::Clients) -> TestResult {
    let (old, new) = (clients.authority()?, clients.authority()?);
    let key = key("refused")?;
    let ttl = Duration::from_secs(2);
    let stale = old
        .try_acquire(&key, ttl)
        .await
        .or_fail("the first holder's acquire")?
        .or_fail("the key was free")?;
    let taken = new
        .acquire(&key, ttl, Duration::from_secs(10))
        .await
        .or_fail("the takeover")?;
    new.proclaim(&taken, b"new-leader")
        .await
        .or_fail("the new holder's proclaim")?;
    let refused = old
        .renew(&stale, ttl)
        .await
        .err_or_fail("the former holder's renewal")?;
    if !refused.is_lease_lost() {
        return Err(Failure::new(format!(
            "the renewal failed otherwise: {refused}"
        )));
    }
    let refused = old
        .proclaim(&stale, b"old-leader")
        .await
        .err_or_fail("the former holder's proclaim")?;
    if !refused.is_lease_lost() {
        return Err(Failure::new(format!(
            "the proclaim failed otherwise: {refused}"
        )));
    }
    let released = old.release(&stale).await.or_fail("the former release")?;
    if released != Released::AlreadyGone {
        return Err(Failure::new(format!(
            "the former holder released: {released:?}"
        )));
    }
    let seen = new.inspect(&key).await.or_fail("inspect")?;
    if !seen.held || seen.fence != Some(taken.fence()) {
        return Err(Failure::new(format!(
            "the new holder's lease changed: {seen}"
        )));
    }
    if seen.value.as_deref() != Some(&b"new-leader"[..]) {
        return Err(Failure::new(format!(
            "the new holder's value changed: {seen:?}"
        )));
    }
    new.renew(&taken, ttl)
        .await
        .or_fail("the new holder's renewal")?;
    if new.release(&taken).await.or_fail("the new release")? != Released::Released {
        return Err(Failure::new("the new holder could not release"));
    }
    Ok(())
}
