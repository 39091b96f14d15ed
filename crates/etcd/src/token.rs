//! The etcd fence: the contender key's create revision.

use leasehold_core::{Error, FenceSafety, FencingToken, Result};

use crate::errors::BACKEND;

/// The `create_revision` of the contender key that won the lock.
///
/// etcd's revision is one counter for the whole cluster, raised by every write and agreed on by
/// Raft before any client hears of it. So a later grant's key, created after the earlier holder's
/// key was deleted or expired, always has a greater create revision: linearizable, never reissued
/// after a leader failover, and durable across restarts (it is in the write-ahead log). It can go
/// backwards only if the cluster is restored from a snapshot taken before some grants: raise the
/// deployment epoch after such a restore.
///
/// The same number works as a fence inside etcd itself: compare the contender key's
/// `create_revision` in the transaction that does the protected write (see
/// [`crate::guarded::still_holds`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EtcdRevision(u64);

impl EtcdRevision {
    /// Reads a revision as etcd sends it (an `int64`, positive for any stored key).
    pub fn from_revision(revision: i64) -> Result<Self> {
        u64::try_from(revision)
            .ok()
            .filter(|r| *r > 0)
            .map(EtcdRevision)
            .ok_or(Error::FenceOutOfRange {
                backend: BACKEND,
                raw: revision as u64,
            })
    }

    /// The revision as etcd's `int64`, for a transaction's compare.
    pub fn as_i64(&self) -> i64 {
        // Built from a positive i64, so it fits.
        self.0 as i64
    }
}

impl FencingToken for EtcdRevision {
    fn raw(&self) -> u64 {
        self.0
    }

    fn safety(&self) -> FenceSafety {
        FenceSafety::Linearizable
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_conformance::kit::{OrFail, TestResult};
    use leasehold_core::Epoch;

    #[test]
    fn only_positive_revisions_that_fit_a_fence() -> TestResult {
        assert!(EtcdRevision::from_revision(0).is_err());
        assert!(EtcdRevision::from_revision(-5).is_err());
        let r = EtcdRevision::from_revision(42).or_fail("revision 42")?;
        assert_eq!(r.as_i64(), 42);
        assert_eq!(
            r.to_fence(BACKEND, Epoch::ZERO)
                .or_fail("the fence of revision 42")?
                .raw(),
            42
        );
        let huge = EtcdRevision::from_revision(1 << 50).or_fail("revision 2^50")?;
        assert!(matches!(
            huge.to_fence(BACKEND, Epoch::ZERO),
            Err(Error::FenceOutOfRange { .. })
        ));
        Ok(())
    }
}
