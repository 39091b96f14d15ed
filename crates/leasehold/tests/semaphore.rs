//! The semaphore's input checks and its slot layout (the behaviour is the conformance
//! suite's `semaphore_*` scenarios, on every backend against its real server).

use leasehold::{connect, Error, LockKey, Semaphore, MAX_PERMITS};
use leasehold_conformance::kit::{ErrOrFail, OrFail, TestResult};

#[tokio::test]
async fn bad_permit_counts_and_names_are_refused_and_slots_carry_the_count() -> TestResult {
    let authority = connect("memory://semaphore-input")
        .await
        .or_fail("connect")?;
    let name = LockKey::new("jobs").or_fail("the name")?;
    for bad in [0, MAX_PERMITS + 1] {
        let e = Semaphore::new(authority.clone(), &name, bad)
            .err_or_fail(format!("a semaphore of {bad} permits"))?;
        assert!(matches!(e, Error::InvalidConfig { .. }), "{bad}: {e}");
    }
    let long = LockKey::new("n".repeat(195)).or_fail("a long name")?;
    let e = Semaphore::new(authority.clone(), &long, 3)
        .err_or_fail("a semaphore whose slots' keys are too long")?;
    assert!(matches!(e, Error::InvalidKey { .. }), "{e}");
    let semaphore = Semaphore::new(authority, &name, 3).or_fail("a semaphore of 3 permits")?;
    let slots: Vec<&str> = semaphore.slots().iter().map(|k| k.as_str()).collect();
    assert_eq!(
        slots,
        ["jobs/permits-3/0", "jobs/permits-3/1", "jobs/permits-3/2"]
    );
    let a = semaphore
        .try_acquire(std::time::Duration::from_secs(5))
        .await
        .or_fail("the first permit")?
        .or_fail("a permit is free for the first")?;
    let b = semaphore
        .try_acquire(std::time::Duration::from_secs(5))
        .await
        .or_fail("the second permit")?
        .or_fail("a permit is free for the second")?;
    assert_ne!(a.slot(), b.slot());
    Ok(())
}

/// Fences count per lock key, and a slot's key carries the permit count: after the count
/// changes, slot 0 is another key whose fences start again. A resource keyed by slot number
/// would then refuse every new holder as stale (or, where fences start low, accept a stale
/// one); keyed by the permit's lock key it sees fences that only grow.
///
/// Returns the last fence of the count of 1 and the fence of the count of 2.
async fn fences_follow_the_permit_key(
    authority: std::sync::Arc<dyn leasehold::Authority>,
) -> Result<(u64, u64), String> {
    use leasehold::{FencedRegister, FencedResource};
    use std::collections::HashMap;
    let ttl = std::time::Duration::from_secs(5);
    let name = LockKey::new("exports").map_err(|e| format!("name: {e}"))?;
    let mut by_key: HashMap<String, FencedRegister> = HashMap::new();
    let mut last_of_count = HashMap::new();
    for (permits, rounds) in [(1, 5), (2, 1)] {
        let semaphore = Semaphore::new(authority.clone(), &name, permits)
            .map_err(|e| format!("a semaphore of {permits}: {e}"))?;
        for round in 0..rounds {
            let permit = semaphore
                .try_acquire(ttl)
                .await
                .map_err(|e| format!("{permits} permits, round {round}: {e}"))?
                .ok_or_else(|| format!("{permits} permits, round {round}: every slot held"))?;
            if permit.key() != &semaphore.slots()[permit.slot() as usize] {
                return Err(format!(
                    "permit key {} is not slot {}'s key",
                    permit.key(),
                    permit.slot()
                ));
            }
            let written = by_key
                .entry(permit.key().to_string())
                .or_default()
                .write(permit.fence(), "exported")
                .await
                .map_err(|e| format!("the resource: {e}"))?;
            if !written.is_accepted() {
                return Err(format!(
                    "the resource keyed by {} refused its holder's fence {}",
                    permit.key(),
                    permit.fence()
                ));
            }
            last_of_count.insert(permits, permit.fence().value());
            let _ = permit
                .release()
                .await
                .map_err(|e| format!("release: {e}"))?;
        }
    }
    match (last_of_count.get(&1), last_of_count.get(&2)) {
        (Some(&one), Some(&two)) => Ok((one, two)),
        other => Err(format!("no fence for one of the counts: {other:?}")),
    }
}

#[tokio::test]
async fn memory_fences_follow_the_permit_key() -> Result<(), String> {
    let authority = connect("memory://semaphore-fences")
        .await
        .map_err(|e| format!("connect: {e}"))?;
    // The reference authority's counter is shared by every key, so its fences do not start
    // again; a resource keyed by the permit's key is right either way.
    fences_follow_the_permit_key(authority).await.map(|_| ())
}

/// On SQLite each key's row counts its own fences: the count of 2's first fence is below the
/// count of 1's last, which a resource keyed by slot number 0 would refuse.
#[cfg(feature = "sqlite")]
#[tokio::test]
async fn sqlite_fences_follow_the_permit_key() -> Result<(), String> {
    let dir = tempfile::tempdir().map_err(|e| format!("a temporary directory: {e}"))?;
    let url = format!("sqlite://{}", dir.path().join("locks.db").display());
    let authority = connect(&url).await.map_err(|e| format!("connect: {e}"))?;
    let (one, two) = fences_follow_the_permit_key(authority).await?;
    if two < one {
        Ok(())
    } else {
        Err(format!(
            "the count of 2's fence {two} did not start below the count of 1's {one}: \
             SQLite's fences are per key"
        ))
    }
}

/// Two processes that disagree on the count acquire at the same moment, round after round,
/// each on its own client: never do both hold a permit (each looks for the other count's held
/// slots before and after taking its own, so at least one sees the other and gives its slot
/// back).
async fn two_counts_at_once_never_both_hold(url: &str) -> Result<(), String> {
    const ROUNDS: usize = 100;
    let ttl = std::time::Duration::from_secs(5);
    let name = LockKey::new("exports-race").map_err(|e| format!("name: {e}"))?;
    let semaphore = |permits| {
        let url = url.to_string();
        let name = name.clone();
        async move {
            let client = connect(&url).await.map_err(|e| format!("connect: {e}"))?;
            Semaphore::new(client, &name, permits).map_err(|e| format!("{permits} permits: {e}"))
        }
    };
    let (two, three) = (semaphore(2).await?, semaphore(3).await?);
    let (mut both, mut refused) = (0, 0);
    for round in 0..ROUNDS {
        let (a, b) = (two.clone(), three.clone());
        let a = tokio::spawn(async move { a.try_acquire(ttl).await });
        let b = tokio::spawn(async move { b.try_acquire(ttl).await });
        let a = a
            .await
            .map_err(|e| format!("round {round}, 2 permits: {e}"))?;
        let b = b
            .await
            .map_err(|e| format!("round {round}, 3 permits: {e}"))?;
        let mut held = Vec::new();
        for (permits, result) in [(2, a), (3, b)] {
            match result {
                Ok(Some(permit)) => held.push(permit),
                Err(Error::InvalidConfig { .. }) => refused += 1,
                Ok(None) => return Err(format!("round {round}: all {permits} slots held")),
                Err(e) => return Err(format!("round {round}, {permits} permits: {e}")),
            }
        }
        if held.len() == 2 {
            both += 1;
        }
        for permit in held {
            let _ = permit
                .release()
                .await
                .map_err(|e| format!("round {round}: release: {e}"))?;
        }
    }
    if both > 0 {
        return Err(format!(
            "in {both} of {ROUNDS} rounds a permit of 2 and a permit of 3 were held at once"
        ));
    }
    if refused < ROUNDS {
        return Err(format!("only {refused} refusals in {ROUNDS} rounds"));
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_two_counts_at_once_never_both_hold() -> Result<(), String> {
    two_counts_at_once_never_both_hold("memory://semaphore-race").await
}

#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_two_counts_at_once_never_both_hold() -> Result<(), String> {
    let dir = tempfile::tempdir().map_err(|e| format!("a temporary directory: {e}"))?;
    let url = format!("sqlite://{}", dir.path().join("locks.db").display());
    two_counts_at_once_never_both_hold(&url).await
}
