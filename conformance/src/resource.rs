//! A recording wrapper around the protected resource, and the history checker.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use leasehold_core::{Fence, FencedResource, Guarded, Result};

/// What was asked of the resource.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// A claim (raise the newest fence).
    Claim,
    /// A guarded write.
    Write,
}

/// One call to the resource, as seen by its caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Access {
    /// Claim or write.
    pub op: Op,
    /// The fence presented.
    pub fence: u64,
    /// Whether it was accepted.
    pub accepted: bool,
}

/// Wraps a [`FencedResource`] and records every call and its outcome, in completion order.
#[derive(Clone)]
pub struct Recorder {
    inner: Arc<dyn FencedResource>,
    log: Arc<Mutex<Vec<Access>>>,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder")
            .field("log", &self.history())
            .finish()
    }
}

impl Recorder {
    /// Records calls to `inner`.
    pub fn new(inner: Arc<dyn FencedResource>) -> Self {
        Recorder {
            inner,
            log: Arc::default(),
        }
    }

    /// Everything recorded so far.
    pub fn history(&self) -> Vec<Access> {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn record(&self, op: Op, fence: Fence, outcome: &Result<Guarded>) {
        if let Ok(g) = outcome {
            self.log
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(Access {
                    op,
                    fence: fence.value(),
                    accepted: g.is_accepted(),
                });
        }
    }
}

#[async_trait]
impl FencedResource for Recorder {
    async fn claim(&self, fence: Fence) -> Result<Guarded> {
        let outcome = self.inner.claim(fence).await;
        self.record(Op::Claim, fence, &outcome);
        outcome
    }

    async fn write(&self, fence: Fence, value: &str) -> Result<Guarded> {
        let outcome = self.inner.write(fence, value).await;
        self.record(Op::Write, fence, &outcome);
        outcome
    }
}

/// Checks a resource history: accepted fences never decrease, so no access was accepted from a
/// fence older than one accepted before it.
pub fn check_history(history: &[Access]) -> std::result::Result<(), String> {
    let mut newest = 0u64;
    for (i, a) in history.iter().enumerate() {
        if a.accepted {
            if a.fence < newest {
                return Err(format!(
                    "access #{i} ({:?} with fence {}) was accepted after fence {newest}",
                    a.op, a.fence
                ));
            }
            newest = a.fence;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(op: Op, fence: u64, accepted: bool) -> Access {
        Access {
            op,
            fence,
            accepted,
        }
    }

    #[test]
    fn checker_catches_an_accepted_stale_write() {
        let good = [
            a(Op::Claim, 1, true),
            a(Op::Write, 1, true),
            a(Op::Write, 0, false),
            a(Op::Write, 2, true),
        ];
        assert!(check_history(&good).is_ok());
        let bad = [a(Op::Claim, 3, true), a(Op::Write, 2, true)];
        assert!(check_history(&bad).is_err());
    }
}
