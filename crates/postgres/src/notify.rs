//! LISTEN/NOTIFY: one listening connection per authority wakes the waiters of a released key.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_core::Backoff;
use sqlx::postgres::PgListener;
use sqlx::PgPool;
use tokio::sync::{watch, Notify};

/// The channel every leasehold release is announced on. The payload is `<table> <key>` (keys
/// have no spaces), so one channel serves every lease table of a database.
pub(crate) const CHANNEL: &str = "leasehold_release";

/// Waiters of this process, by key.
#[derive(Debug, Default)]
pub(crate) struct Waiters {
    by_key: Mutex<HashMap<String, Arc<Notify>>>,
}

impl Waiters {
    /// The notifier for `key`; hold it while waiting.
    pub fn for_key(&self, key: &str) -> Arc<Notify> {
        let mut map = self.by_key.lock().unwrap_or_else(|e| e.into_inner());
        // Forget keys nobody waits on any more, so the map does not grow with every key.
        map.retain(|_, n| Arc::strong_count(n) > 1);
        map.entry(key.to_string()).or_default().clone()
    }

    fn wake(&self, key: &str) {
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

/// Runs the listening connection until aborted. `ready` turns true while LISTEN is active.
pub(crate) async fn listen(
    pool: PgPool,
    waiters: Arc<Waiters>,
    table: String,
    ready: watch::Sender<bool>,
) {
    let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(5));
    loop {
        let listener = async {
            let mut l = PgListener::connect_with(&pool).await?;
            l.listen(CHANNEL).await?;
            Ok::<_, sqlx::Error>(l)
        }
        .await;
        let mut listener = match listener {
            Ok(l) => l,
            Err(error) => {
                tracing::debug!(%error, "LISTEN failed; waiters fall back to timers");
                ready.send_replace(false);
                tokio::time::sleep(backoff.next_delay()).await;
                continue;
            }
        };
        ready.send_replace(true);
        // Anything released before LISTEN took effect was missed: let waiters look again.
        waiters.wake_all();
        backoff.reset();
        loop {
            match listener.try_recv().await {
                Ok(Some(n)) => {
                    if let Some((t, key)) = n.payload().split_once(' ') {
                        if t == table {
                            waiters.wake(key);
                        }
                    }
                }
                // The connection dropped and was re-established (LISTEN included): releases
                // in between were missed.
                Ok(None) => waiters.wake_all(),
                Err(error) => {
                    tracing::debug!(%error, "the listening connection failed");
                    ready.send_replace(false);
                    waiters.wake_all();
                    break;
                }
            }
        }
        tokio::time::sleep(backoff.next_delay()).await;
    }
}
