//! The resource side: accept a write only from the newest fence.

use std::sync::Mutex;

use async_trait::async_trait;

use crate::contract::error::Result;
use crate::contract::fence::Fence;

/// What a fenced resource did with a claim or a write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Guarded {
    /// Accepted: the fence was not older than any the resource accepted before.
    Accepted,
    /// Refused: the resource already accepted `newest`, which is greater. The caller's lease is
    /// stale; it must abandon the work, not retry it.
    Stale {
        /// The greatest fence the resource has accepted.
        newest: u64,
    },
}

impl Guarded {
    /// Whether it was accepted.
    pub fn is_accepted(&self) -> bool {
        matches!(self, Guarded::Accepted)
    }
}

/// A protected resource that checks fencing tokens: the party that decides which writes count.
///
/// The lease decides who may *try*; only the resource can make a late write from a paused former
/// holder harmless, by refusing any write whose fence is older than one it already accepted.
///
/// # Contract
/// * `write(f, ..)` is accepted only if `f` is not less than every fence accepted before (by a
///   claim or a write); accepting it raises the resource's newest fence to `f`.
/// * `claim(f)` raises the newest fence to `f` without writing, under the same rule. A new holder
///   should claim right after acquiring: until it does, a paused old holder's write still
///   arrives before any newer fence and is accepted.
/// * Both are atomic at the resource (one conditional statement, a compare-and-set).
#[async_trait]
pub trait FencedResource: Send + Sync {
    /// Raises the resource's newest fence to `fence`, if that is not going backwards.
    async fn claim(&self, fence: Fence) -> Result<Guarded>;

    /// Writes `value` under `fence`, if no greater fence was accepted.
    async fn write(&self, fence: Fence, value: &str) -> Result<Guarded>;
}

/// An in-memory fenced register: the resource side of the discipline in its smallest form.
///
/// Useful to test code that holds leases, and as the model a real resource follows (a row with a
/// `last_fence` column updated by `... WHERE last_fence <= $fence`).
#[derive(Debug, Default)]
pub struct FencedRegister {
    inner: Mutex<RegisterState>,
}

#[derive(Debug, Default)]
struct RegisterState {
    newest: u64,
    value: Option<String>,
}

impl FencedRegister {
    /// An empty register that has accepted no fence yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The value last written, and the greatest fence accepted.
    pub fn read(&self) -> (Option<String>, u64) {
        let state = self.lock();
        (state.value.clone(), state.newest)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, RegisterState> {
        // A panic while holding this lock cannot leave the state half-updated (each update is
        // one assignment), so a poisoned lock is still consistent.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn guarded(&self, fence: Fence, value: Option<&str>) -> Guarded {
        let mut state = self.lock();
        if fence.value() < state.newest {
            crate::telemetry::fence_rejected("register", fence.value(), state.newest);
            return Guarded::Stale {
                newest: state.newest,
            };
        }
        state.newest = fence.value();
        if let Some(v) = value {
            state.value = Some(v.to_owned());
        }
        Guarded::Accepted
    }
}

#[async_trait]
impl FencedResource for FencedRegister {
    async fn claim(&self, fence: Fence) -> Result<Guarded> {
        Ok(self.guarded(fence, None))
    }

    async fn write(&self, fence: Fence, value: &str) -> Result<Guarded> {
        Ok(self.guarded(fence, Some(value)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::fence::{Epoch, FenceSafety};

    type TestResult<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

    fn f(n: u64) -> Fence {
        Fence::compose("t", Epoch::ZERO, n, FenceSafety::Linearizable).expect("fence n")
    }

    #[tokio::test]
    async fn refuses_older_fences_only() -> TestResult {
        let r = FencedRegister::new();
        assert!(r
            .write(f(5), "a")
            .await
            .map_err(|e| format!("the first write at fence 5: {e}"))?
            .is_accepted());
        assert!(
            r.write(f(5), "b")
                .await
                .map_err(|e| format!("the second write at fence 5: {e}"))?
                .is_accepted(),
            "same fence may write again"
        );
        assert_eq!(
            r.write(f(4), "c")
                .await
                .map_err(|e| format!("the write at stale fence 4: {e}"))?,
            Guarded::Stale { newest: 5 }
        );
        assert!(r
            .claim(f(9))
            .await
            .map_err(|e| format!("the claim at fence 9: {e}"))?
            .is_accepted());
        assert_eq!(
            r.write(f(6), "d")
                .await
                .map_err(|e| format!("the write at fence 6 under claim 9: {e}"))?,
            Guarded::Stale { newest: 9 }
        );
        assert_eq!(r.read(), (Some("b".to_string()), 9));
        Ok(())
    }
}
