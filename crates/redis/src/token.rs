//! The Redis fence: the value of the key's `INCR` counter.

use leasehold_core::{Error, FenceSafety, FencingToken, Result};

use crate::errors::BACKEND;

/// The lock's fence counter after the `INCR` that ran in the same script as the winning
/// `SET NX PX`: one more than the fence of the previous acquisition of the key on this server.
/// The counter never expires and release leaves it alone, so fences grow across release and
/// expiry.
///
/// It is [`FenceSafety::FailoverUnsafe`]: the counter lives in one server's memory and reaches
/// replicas asynchronously. A replica promoted before it saw the last `INCR` hands the same
/// value out again, and a restart without persistence starts it from zero. Raise the deployment
/// epoch after either.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RedisFence(u64);

impl RedisFence {
    /// Reads the integer the acquire script returned.
    pub fn from_reply(raw: i64) -> Result<Self> {
        u64::try_from(raw)
            .ok()
            .filter(|r| *r > 0)
            .map(RedisFence)
            .ok_or(Error::FenceOutOfRange {
                backend: BACKEND,
                raw: raw as u64,
            })
    }
}

impl FencingToken for RedisFence {
    fn raw(&self) -> u64 {
        self.0
    }

    fn safety(&self) -> FenceSafety {
        FenceSafety::FailoverUnsafe
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_conformance::kit::{OrFail, TestResult};
    use leasehold_core::{Epoch, Fence};

    #[test]
    fn replies_map_to_fences_or_typed_errors() -> TestResult {
        let f = RedisFence::from_reply(7).or_fail("reply 7")?;
        let fence = f
            .to_fence(BACKEND, Epoch::ZERO)
            .or_fail("the fence of reply 7")?;
        assert_eq!(fence.raw(), 7);
        assert_eq!(fence.safety(), FenceSafety::FailoverUnsafe);
        for bad in [0, -1, i64::MIN] {
            assert!(matches!(
                RedisFence::from_reply(bad),
                Err(Error::FenceOutOfRange { .. })
            ));
        }
        let huge = RedisFence::from_reply(
            i64::try_from(Fence::RAW_MAX).or_fail("the largest raw fence as i64")? + 1,
        )
        .or_fail("a reply over the largest raw fence")?;
        assert!(matches!(
            huge.to_fence(BACKEND, Epoch::ZERO),
            Err(Error::FenceOutOfRange { .. })
        ));
        Ok(())
    }
}
