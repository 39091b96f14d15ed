//! Leases a recipe took on its way to a whole (a gate and a slot, several keys), given back
//! when the whole is not reached: on an error, on a timeout, and when the caller drops the
//! future half way, whatever release-on-drop the caller chose for the finished leases.

use crate::contract::error::Result;
use crate::lease::Lease;

/// The leases taken so far, in the order they were taken. Dropped unfinished, it releases
/// them all in the background (best effort, as a dropped [`Lease`] does: a release that does
/// not arrive leaves the lease to run out at its TTL).
#[derive(Debug, Default)]
pub(crate) struct Taken {
    leases: Vec<Lease>,
}

impl Taken {
    pub(crate) fn push(&mut self, lease: Lease) {
        self.leases.push(lease);
    }

    pub(crate) fn leases(&self) -> &[Lease] {
        &self.leases
    }

    /// `result`, after giving every lease back if it is an error.
    pub(crate) async fn or_give_back<T>(&mut self, result: Result<T>) -> Result<T> {
        if result.is_err() {
            let _ = self.give_back().await;
        }
        result
    }

    /// The whole is reached: the leases are the caller's now.
    pub(crate) fn finish(mut self) -> Vec<Lease> {
        std::mem::take(&mut self.leases)
    }

    /// Gives every lease taken so far back now, waiting for the authority's answers; the first
    /// error, once all were tried.
    pub(crate) async fn give_back(&mut self) -> Result<()> {
        release_all(std::mem::take(&mut self.leases)).await
    }
}

/// Releases every lease at once and waits for all the answers; the first error, once all were
/// tried.
pub(crate) async fn release_all(leases: Vec<Lease>) -> Result<()> {
    let answers = futures_util::future::join_all(leases.into_iter().map(Lease::release)).await;
    answers.into_iter().try_for_each(|a| a.map(|_| ()))
}

impl Drop for Taken {
    fn drop(&mut self) {
        let leases = std::mem::take(&mut self.leases);
        if leases.is_empty() {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Err(error) = release_all(leases).await {
                    tracing::debug!(%error, "releasing an unfinished recipe's leases failed; their TTL will free them");
                }
            });
        }
    }
}
