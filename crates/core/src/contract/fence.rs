//! Fencing tokens: the numbers a protected resource compares.

use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};

use crate::contract::error::{Error, Result};

/// How far a backend's fences can be trusted to only grow.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FenceSafety {
    /// Fences come from a linearizable, replicated log (etcd revisions, ZooKeeper zxids) or a
    /// single durable database row: a fence handed out is never handed out again, whatever
    /// fails.
    Linearizable,
    /// Fences only grow while the same server keeps its memory. A failover to a replica that
    /// missed the last increments (Redis with asynchronous replication) can hand out a fence
    /// again. Use such a backend for efficiency locks, not for correctness.
    FailoverUnsafe,
}

impl fmt::Display for FenceSafety {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FenceSafety::Linearizable => "linearizable",
            FenceSafety::FailoverUnsafe => "failover-unsafe",
        })
    }
}

/// A backend's own fencing token: ordered like the grants it was issued for.
///
/// Each backend has its own type (an etcd create revision, a ZooKeeper czxid, a PostgreSQL
/// counter, a Redis `INCR` value) so code that knows its backend keeps the backend's meaning.
/// [`FencingToken::to_fence`] erases it into a [`Fence`], the form that travels through
/// `dyn Authority` and that a resource stores.
pub trait FencingToken: Copy + Ord + fmt::Debug + Send + Sync + 'static {
    /// The backend's raw number, before the deployment epoch is applied.
    fn raw(&self) -> u64;

    /// How far these tokens can be trusted.
    fn safety(&self) -> FenceSafety;

    /// The type-erased fence under `epoch`.
    fn to_fence(&self, backend: &'static str, epoch: Epoch) -> Result<Fence> {
        Fence::compose(backend, epoch, self.raw(), self.safety())
    }
}

/// A deployment-level epoch, stored in the top bits of every [`Fence`] value.
///
/// Why it exists: fences from different backends are unrelated numbers. A deployment that moves
/// from Redis to etcd, or restores PostgreSQL from a backup that rewinds its counter, raises the
/// epoch by one, and every fence it hands out from then on is greater than every fence handed out
/// before, at every resource, without touching the resources. Configure it per deployment
/// (`?epoch=N` in the connection URL); the default is 0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Epoch(u16);

impl Epoch {
    /// The largest epoch: 15 bits, so a fence value always fits a signed 64-bit integer
    /// (a PostgreSQL `bigint`, a Java `long`).
    pub const MAX: u16 = 0x7FFF;

    /// Epoch 0, the default.
    pub const ZERO: Epoch = Epoch(0);

    /// An epoch, if `n` is at most [`Epoch::MAX`].
    pub fn new(n: u16) -> Result<Self> {
        if n > Self::MAX {
            return Err(Error::InvalidConfig {
                reason: format!("epoch {n} is above the maximum of {}", Self::MAX),
            });
        }
        Ok(Epoch(n))
    }

    /// The epoch's number.
    pub fn get(&self) -> u16 {
        self.0
    }
}

/// A type-erased fencing token: the number a protected resource stores and compares.
///
/// # Layout
/// `value = epoch << 48 | raw`, with `raw` (the backend's number) in `1..=2^48-1` and the
/// [`Epoch`] in the 15 bits above it. So the value is always positive and fits a PostgreSQL
/// `bigint`; values compare by epoch first, then by the backend's own order.
///
/// A resource accepts a write carrying fence `f` only if no write with a greater fence was
/// accepted before (see [`crate::FencedResource`]).
#[derive(Clone, Copy)]
pub struct Fence {
    value: u64,
    safety: FenceSafety,
}

impl Fence {
    /// Bits available to the backend's raw number.
    pub const RAW_BITS: u32 = 48;
    /// The largest raw number.
    pub const RAW_MAX: u64 = (1 << Self::RAW_BITS) - 1;

    /// Builds the fence for a backend's `raw` number under `epoch`.
    pub fn compose(
        backend: &'static str,
        epoch: Epoch,
        raw: u64,
        safety: FenceSafety,
    ) -> Result<Fence> {
        if raw == 0 || raw > Self::RAW_MAX {
            return Err(Error::FenceOutOfRange { backend, raw });
        }
        Ok(Fence {
            value: (u64::from(epoch.get()) << Self::RAW_BITS) | raw,
            safety,
        })
    }

    /// Rebuilds a fence from a stored value (for example read back from a resource).
    pub fn from_value(value: u64, safety: FenceSafety) -> Result<Fence> {
        let raw = value & Self::RAW_MAX;
        let epoch = u16::try_from(value >> Self::RAW_BITS).map_err(|_| Error::InvalidConfig {
            reason: format!("{value} is not a fence value"),
        })?;
        Fence::compose("stored", Epoch::new(epoch)?, raw, safety)
    }

    /// The value a resource stores and compares.
    pub fn value(&self) -> u64 {
        self.value
    }

    /// The value as a signed 64-bit integer (a PostgreSQL `bigint`); always positive.
    pub fn as_i64(&self) -> i64 {
        // value < 2^63 by construction (15-bit epoch above 48 raw bits).
        self.value as i64
    }

    /// The epoch part.
    pub fn epoch(&self) -> Epoch {
        Epoch((self.value >> Self::RAW_BITS) as u16)
    }

    /// The backend's raw number.
    pub fn raw(&self) -> u64 {
        self.value & Self::RAW_MAX
    }

    /// How far this fence can be trusted.
    pub fn safety(&self) -> FenceSafety {
        self.safety
    }
}

impl PartialEq for Fence {
    fn eq(&self, other: &Self) -> bool {
        self.value == other.value
    }
}

impl Eq for Fence {}

impl Hash for Fence {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.value.hash(state);
    }
}

impl PartialOrd for Fence {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Fence {
    fn cmp(&self, other: &Self) -> Ordering {
        self.value.cmp(&other.value)
    }
}

impl FencingToken for Fence {
    fn raw(&self) -> u64 {
        Fence::raw(self)
    }

    fn safety(&self) -> FenceSafety {
        self.safety
    }

    fn to_fence(&self, backend: &'static str, epoch: Epoch) -> Result<Fence> {
        Fence::compose(backend, epoch, Fence::raw(self), self.safety)
    }
}

impl fmt::Display for Fence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.value)
    }
}

impl fmt::Debug for Fence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Fence({} = epoch {} raw {}, {})",
            self.value,
            self.epoch().get(),
            self.raw(),
            self.safety
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type TestResult<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

    #[test]
    fn epoch_dominates_raw() -> TestResult {
        let old = Fence::compose("t", Epoch::ZERO, Fence::RAW_MAX, FenceSafety::Linearizable)
            .map_err(|e| format!("the largest raw fence in epoch 0: {e}"))?;
        let new = Fence::compose(
            "t",
            Epoch::new(1).map_err(|e| format!("epoch 1: {e}"))?,
            1,
            FenceSafety::Linearizable,
        )
        .map_err(|e| format!("fence 1 in epoch 1: {e}"))?;
        assert!(new > old);
        assert_eq!(new.epoch().get(), 1);
        assert_eq!(new.raw(), 1);
        Ok(())
    }

    #[test]
    fn always_fits_a_bigint() -> TestResult {
        let max = Fence::compose(
            "t",
            Epoch::new(Epoch::MAX).map_err(|e| format!("the largest epoch: {e}"))?,
            Fence::RAW_MAX,
            FenceSafety::Linearizable,
        )
        .map_err(|e| format!("the largest fence: {e}"))?;
        assert!(max.as_i64() > 0);
        assert_eq!(max.as_i64() as u64, max.value());
        assert!(Epoch::new(Epoch::MAX + 1).is_err());
        Ok(())
    }

    #[test]
    fn raw_out_of_range_is_an_error() -> TestResult {
        for raw in [0, Fence::RAW_MAX + 1, u64::MAX] {
            let err = Fence::compose("t", Epoch::ZERO, raw, FenceSafety::Linearizable)
                .err()
                .ok_or("a raw fence over the limit: it succeeded")?;
            assert!(matches!(err, Error::FenceOutOfRange { .. }));
        }
        Ok(())
    }

    #[test]
    fn value_round_trips() -> TestResult {
        let f = Fence::compose(
            "t",
            Epoch::new(3).map_err(|e| format!("epoch 3: {e}"))?,
            77,
            FenceSafety::FailoverUnsafe,
        )
        .map_err(|e| format!("fence 77 in epoch 3: {e}"))?;
        let back = Fence::from_value(f.value(), FenceSafety::FailoverUnsafe)
            .map_err(|e| format!("the fence read back from its value: {e}"))?;
        assert_eq!(back, f);
        assert!(Fence::from_value(0, FenceSafety::Linearizable).is_err());
        assert!(Fence::from_value(u64::MAX, FenceSafety::Linearizable).is_err());
        Ok(())
    }
}
