//! Issue 14: the semaphore's input checks and its slot layout (the behaviour is the conformance
//! suite's `semaphore_*` scenarios, on every backend against its real server).

use leasehold::{connect, Error, LockKey, Semaphore, MAX_PERMITS};

#[tokio::test]
async fn bad_permit_counts_and_names_are_refused_and_slots_carry_the_count() {
    let authority = connect("memory://semaphore-input").await.unwrap();
    let name = LockKey::new("jobs").unwrap();
    for bad in [0, MAX_PERMITS + 1] {
        let e = Semaphore::new(authority.clone(), &name, bad).unwrap_err();
        assert!(matches!(e, Error::InvalidConfig { .. }), "{bad}: {e}");
    }
    let long = LockKey::new("n".repeat(195)).unwrap();
    let e = Semaphore::new(authority.clone(), &long, 3).unwrap_err();
    assert!(matches!(e, Error::InvalidKey { .. }), "{e}");
    let semaphore = Semaphore::new(authority, &name, 3).unwrap();
    let slots: Vec<&str> = semaphore.slots().iter().map(|k| k.as_str()).collect();
    assert_eq!(
        slots,
        ["jobs/permits-3/0", "jobs/permits-3/1", "jobs/permits-3/2"]
    );
    let a = semaphore
        .try_acquire(std::time::Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    let b = semaphore
        .try_acquire(std::time::Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    assert_ne!(a.slot(), b.slot());
}
