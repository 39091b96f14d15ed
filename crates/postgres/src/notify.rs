//! LISTEN/NOTIFY: one listening connection per authority wakes the waiters of a released key.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_core::backend::Backoff;
use leasehold_core::time::{deadline_in, FOREVER};
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use tokio::sync::{watch, Notify};

use leasehold_core::backend::redact_url;

/// The channel every leasehold release and proclaim is announced on. The payload is
/// `<table> <key>` (keys have no spaces), so one channel serves every lease table of a
/// database; a waiter woken by a proclaim looks again and finds the key still held.
pub(crate) const CHANNEL: &str = "leasehold_release";

/// Waiters of this process, by key.
#[derive(Debug, Default)]
pub(crate) struct Waiters {
    by_key: Mutex<HashMap<String, Arc<Notify>>>,
}

/// One waiter's registration for a key's notifications; dropping it forgets the key when
/// nobody else waits on it, so the registry never outlives its waiters.
#[derive(Debug)]
pub(crate) struct Registration<'w> {
    waiters: &'w Waiters,
    key: String,
    notify: Arc<Notify>,
}

impl Registration<'_> {
    /// Woken by the key's notifications (and by every reconnection of the listener).
    pub fn notify(&self) -> &Notify {
        &self.notify
    }
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        let mut map = self
            .waiters
            .by_key
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        // The map's reference and ours: nobody else waits. Counted under the lock, which every
        // new registration takes first, so none can appear meanwhile.
        let last = map
            .get(&self.key)
            .is_some_and(|n| Arc::ptr_eq(n, &self.notify) && Arc::strong_count(n) == 2);
        if last {
            map.remove(&self.key);
        }
    }
}

impl Waiters {
    /// Registers for `key`'s notifications; hold the registration while waiting.
    pub fn for_key(&self, key: &str) -> Registration<'_> {
        let mut map = self.by_key.lock().unwrap_or_else(|e| e.into_inner());
        let notify = map.entry(key.to_string()).or_default().clone();
        Registration {
            waiters: self,
            key: key.to_string(),
            notify,
        }
    }

    /// How many keys have waiters now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.by_key.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub(crate) fn wake(&self, key: &str) {
        let map = self.by_key.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = map.get(key) {
            n.notify_waiters();
        }
    }

    /// Wakes everyone: after the listening connection was lost, releases may have been missed.
    fn wake_all(&self) {
        let map = self.by_key.lock().unwrap_or_else(|e| e.into_inner());
        for n in map.values() {
            n.notify_waiters();
        }
    }
}

/// What this authority last read of each key: its fence (when the read returned it) and
/// whether a lease on it was live. `wait_for_change` compares it with what its mark reads, so a
/// release or grant between the caller's read and the mark (which nobody announced, as nobody
/// had marked the key yet) returns at once instead of after `max_wait`.
#[derive(Debug, Default)]
pub(crate) struct LastSeen {
    by_key: Mutex<HashMap<String, (Option<i64>, bool)>>,
}

impl LastSeen {
    /// Keys remembered at most: past it the memory starts again (a forgotten key only costs
    /// the early return of one wait).
    const MAX_KEYS: usize = 4096;

    /// Records a read of `key`.
    pub fn record(&self, key: &str, fence: Option<i64>, live: bool) {
        let mut map = self.by_key.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= Self::MAX_KEYS && !map.contains_key(key) {
            map.clear();
        }
        map.insert(key.to_string(), (fence, live));
    }

    /// Records what a mark read of `key` and says whether it differs from the read before it:
    /// the lease ended or began, or another grant's fence is there.
    pub fn changed(&self, key: &str, fence: i64, live: bool) -> bool {
        let mut map = self.by_key.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= Self::MAX_KEYS && !map.contains_key(key) {
            map.clear();
        }
        match map.insert(key.to_string(), (Some(fence), live)) {
            Some((before, was_live)) => was_live != live || before.is_some_and(|f| f != fence),
            None => false,
        }
    }
}

/// What the listening connection needs: how to connect, and how long to wait.
#[derive(Clone)]
pub(crate) struct ListenConfig {
    pub connect: PgConnectOptions,
    /// How long connecting, `LISTEN` and each health check may take.
    pub timeout: Duration,
    /// How often the connection is checked with a round trip.
    pub check_every: Duration,
    /// The lease table, as it appears in notification payloads.
    pub table: String,
}

/// The text of the health check, recognisable in `pg_stat_activity`.
const CHECK: &str = "SELECT 'leasehold listener'";

/// Runs the listening connection until aborted. `ready` is true while LISTEN is active and the
/// last health check answered.
///
/// The connection is its own, never one of the authority's pool: a waiter must not take the
/// connection that renewals need (with `pool_size=1`, it would take the only one). Each
/// (re)connection gets a fresh one-connection pool, so that a silent connection being given up
/// cannot hold the slot its replacement needs.
///
/// Every `check_every` a round trip on the connection checks that it still answers: a NAT or
/// load balancer that dropped the flow, or a frozen backend, gives no error, only silence. A
/// connection that fails the check, or any error, is replaced; meanwhile `ready` is false and
/// waiters re-try by timer.
pub(crate) async fn listen(
    config: ListenConfig,
    waiters: Arc<Waiters>,
    ready: watch::Sender<bool>,
) {
    let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(5));
    let limit = config.timeout.min(FOREVER);
    loop {
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .min_connections(0)
            .max_lifetime(None)
            .idle_timeout(None)
            .test_before_acquire(false)
            .acquire_timeout(limit)
            .connect_lazy_with(config.connect.clone());
        let connected = tokio::time::timeout(limit, async {
            let mut l = PgListener::connect_with(&pool).await?;
            l.ignore_pool_close_event(true);
            // A lost connection is replaced here, by a new pool, not inside the listener.
            l.eager_reconnect(false);
            l.listen(CHANNEL).await?;
            Ok::<_, sqlx::Error>(l)
        })
        .await;
        let mut listener = match connected {
            Ok(Ok(l)) => l,
            Ok(Err(error)) => {
                tracing::debug!(error = %redact_url(&error.to_string()), "LISTEN failed; waiters re-try by timer");
                tokio::time::sleep(backoff.next_delay()).await;
                continue;
            }
            Err(_) => {
                tracing::debug!("LISTEN got no answer in time; waiters re-try by timer");
                tokio::time::sleep(backoff.next_delay()).await;
                continue;
            }
        };
        ready.send_replace(true);
        // Anything released before LISTEN took effect was missed: let waiters look again.
        waiters.wake_all();
        backoff.reset();
        let mut next_check = deadline_in(config.check_every);
        loop {
            tokio::select! {
                // try_recv is cancel-safe: a notification half read stays in the buffer.
                received = listener.try_recv() => match received {
                    Ok(Some(n)) => {
                        if let Some((t, key)) = n.payload().split_once(' ') {
                            if t == config.table {
                                waiters.wake(key);
                            }
                        }
                    }
                    Ok(None) => {
                        tracing::debug!("the listening connection was lost");
                        break;
                    }
                    Err(error) => {
                        tracing::debug!(error = %redact_url(&error.to_string()), "the listening connection failed");
                        break;
                    }
                },
                _ = tokio::time::sleep_until(next_check) => {
                    let check = sqlx::query(CHECK).execute(&mut listener);
                    match tokio::time::timeout(limit, check).await {
                        Ok(Ok(_)) => next_check = deadline_in(config.check_every),
                        Ok(Err(error)) => {
                            tracing::debug!(error = %redact_url(&error.to_string()), "the listening connection failed its check");
                            break;
                        }
                        Err(_) => {
                            tracing::debug!("the listening connection did not answer its check in time");
                            break;
                        }
                    }
                }
            }
        }
        // Releases may have been missed: waiters look again, then re-try by timer until a new
        // connection listens.
        ready.send_replace(false);
        waiters.wake_all();
        drop(listener);
        drop(pool);
        tokio::time::sleep(backoff.next_delay()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_conformance::kit::{OrFail, TestResult};

    #[test]
    fn last_seen_tells_a_change_from_the_read_before() -> TestResult {
        let seen = LastSeen::default();
        // Nothing read before: no change can be told.
        assert!(!seen.changed("k", 3, true));
        assert!(!seen.changed("k", 3, true));
        assert!(seen.changed("k", 3, false), "released");
        assert!(seen.changed("k", 4, true), "taken again");
        assert!(seen.changed("k", 5, true), "another grant");
        // A try that found the key held knows no fence: only liveness counts.
        seen.record("k", None, true);
        assert!(!seen.changed("k", 9, true));
        seen.record("k", None, true);
        assert!(seen.changed("k", 9, false));
        // Bounded: the memory starts again instead of growing.
        for i in 0..LastSeen::MAX_KEYS + 10 {
            seen.record(&format!("key{i}"), Some(1), true);
        }
        assert!(seen.by_key.lock().or_fail("the last-seen map")?.len() <= LastSeen::MAX_KEYS);
        Ok(())
    }

    #[tokio::test]
    async fn registrations_wake_their_key_and_leave_nothing_behind() -> TestResult {
        let waiters = Waiters::default();
        let (a1, a2, b) = (
            waiters.for_key("a"),
            waiters.for_key("a"),
            waiters.for_key("b"),
        );
        assert!(Arc::ptr_eq(&a1.notify, &a2.notify));
        assert_eq!(waiters.len(), 2);
        {
            let woken = a1.notify().notified();
            let other = b.notify().notified();
            tokio::pin!(woken, other);
            woken.as_mut().enable();
            other.as_mut().enable();
            waiters.wake("a");
            tokio::time::timeout(Duration::from_secs(1), woken)
                .await
                .or_fail("a's waiter is woken")?;
            assert!(
                tokio::time::timeout(Duration::from_millis(20), other)
                    .await
                    .is_err(),
                "b's waiter is not woken by a's notification"
            );
        }
        drop(a1);
        assert_eq!(waiters.len(), 2, "a still has a waiter");
        drop(a2);
        drop(b);
        assert_eq!(waiters.len(), 0);
        // A key registered again after it was forgotten gets a fresh entry, and is forgotten
        // again.
        drop(waiters.for_key("a"));
        assert_eq!(waiters.len(), 0);
        Ok(())
    }
}
