//! How a backend pushes loss into every lease it backs.

use std::fmt;
use std::sync::Arc;

use tokio::sync::watch;

use crate::contract::lost::LostReason;

/// A one-way switch a backend flips when something that carries many grants ends: an etcd
/// session lease revoked or reported expired by keep-alive, a ZooKeeper session expired.
///
/// The backend makes one signal per session and attaches it to every grant on that session
/// ([`crate::Grant::with_loss_signal`]). A [`crate::Lease`] watches it, so `lost()` resolves and
/// `ensure_valid()` fails the moment the backend learns of the loss, not at the next renewal a
/// third of a TTL later (etcd's `Session.Done()`, Curator's `LOST`).
///
/// Flipping it is final: the first reason sticks, later calls change nothing.
#[derive(Clone)]
pub struct LossSignal {
    tx: Arc<watch::Sender<Option<LostReason>>>,
}

impl Default for LossSignal {
    fn default() -> Self {
        LossSignal::new()
    }
}

impl LossSignal {
    /// A signal that has not fired.
    pub fn new() -> Self {
        let (tx, _) = watch::channel(None);
        LossSignal { tx: Arc::new(tx) }
    }

    /// Fires the signal: every lease carrying it is lost for `reason`. Returns whether this call
    /// fired it (false if it had already fired).
    pub fn fire(&self, reason: LostReason) -> bool {
        self.tx.send_if_modified(|current| {
            if current.is_none() {
                *current = Some(reason);
                true
            } else {
                false
            }
        })
    }

    /// The reason, once fired.
    pub fn fired(&self) -> Option<LostReason> {
        self.tx.borrow().clone()
    }

    /// Resolves when the signal fires, with its reason.
    pub async fn wait(&self) -> LostReason {
        let mut rx = self.tx.subscribe();
        let reason = match rx.wait_for(Option::is_some).await {
            Ok(reason) => reason.clone(),
            // The sender lives in `self`, so the channel cannot close while we wait.
            Err(_) => None,
        };
        reason.unwrap_or(LostReason::SessionEnded)
    }
}

impl fmt::Debug for LossSignal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LossSignal")
            .field("fired", &self.fired())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    type TestResult<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

    #[tokio::test]
    async fn fires_once_and_wakes_waiters() -> TestResult {
        let signal = LossSignal::new();
        let waiter = tokio::spawn({
            let signal = signal.clone();
            async move { signal.wait().await }
        });
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert!(signal.fired().is_none());
        assert!(signal.fire(LostReason::SessionEnded));
        assert!(!signal.fire(LostReason::Refused), "the first reason sticks");
        let reason = tokio::time::timeout(Duration::from_secs(1), waiter)
            .await
            .map_err(|e| format!("waiter woken: {e}"))?
            .map_err(|e| format!("the loss reason sent to the waiter: {e}"))?;
        assert!(matches!(reason, LostReason::SessionEnded));
        assert!(matches!(signal.fired(), Some(LostReason::SessionEnded)));
        // A late waiter sees it at once.
        assert!(matches!(signal.wait().await, LostReason::SessionEnded));
        Ok(())
    }
}
