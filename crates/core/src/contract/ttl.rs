//! The TTLs a backend can honour exactly.

use std::time::Duration;

use crate::contract::error::{Error, Result};

/// The TTLs a backend supports: a range and a granularity.
///
/// A TTL outside the range, or not a whole multiple of the granularity, is an
/// [`Error::InvalidTtl`]. It is never rounded: rounding down would hand out a shorter lease
/// than the caller planned its work for, rounding up would hold others off longer than asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TtlRange {
    /// The shortest TTL the backend grants.
    pub min: Duration,
    /// The longest TTL the backend grants.
    pub max: Duration,
    /// TTLs must be a whole multiple of this (1 ms for Redis and PostgreSQL, 1 s for etcd).
    pub granularity: Duration,
}

impl TtlRange {
    /// A range from `min` to `max` in steps of `granularity`.
    pub const fn new(min: Duration, max: Duration, granularity: Duration) -> Self {
        TtlRange {
            min,
            max,
            granularity,
        }
    }

    /// Checks that `ttl` is one this backend grants exactly.
    pub fn check(&self, ttl: Duration) -> Result<()> {
        let invalid = |reason: String| Err(Error::InvalidTtl { ttl, reason });
        if ttl.is_zero() {
            return invalid("a TTL must be greater than zero".into());
        }
        if ttl < self.min {
            return invalid(format!(
                "shorter than this backend's minimum of {:?}",
                self.min
            ));
        }
        if ttl > self.max {
            return invalid(format!(
                "longer than this backend's maximum of {:?}",
                self.max
            ));
        }
        let step = self.granularity.as_nanos();
        if step > 1 && !ttl.as_nanos().is_multiple_of(step) {
            return invalid(format!(
                "not a whole multiple of this backend's granularity of {:?}",
                self.granularity
            ));
        }
        Ok(())
    }

    /// The longest valid TTL that is at most `want`, or `None` when even the minimum is longer.
    pub fn at_most(&self, want: Duration) -> Option<Duration> {
        let want = want.min(self.max);
        let step = self.granularity.as_nanos().max(1);
        let nanos = want.as_nanos() / step * step;
        let ttl = Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX));
        (ttl >= self.min && !ttl.is_zero()).then_some(ttl)
    }

    /// The shortest valid TTL that is at least `want` (for tests that pick short TTLs).
    pub fn at_least(&self, want: Duration) -> Duration {
        let want = want.max(self.min).min(self.max);
        let step = self.granularity.as_nanos().max(1);
        let n = want.as_nanos().div_ceil(step);
        let nanos = n.saturating_mul(step);
        let ttl = Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX));
        if ttl > self.max {
            self.max
        } else {
            ttl
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn checks_range_and_granularity() {
        let r = TtlRange::new(
            Duration::from_secs(2),
            Duration::from_secs(60),
            Duration::from_secs(1),
        );
        assert!(r.check(Duration::from_secs(2)).is_ok());
        assert!(r.check(Duration::from_secs(60)).is_ok());
        for bad in [
            Duration::ZERO,
            Duration::from_secs(1),
            Duration::from_secs(61),
            2500 * MS,
        ] {
            assert!(
                matches!(r.check(bad), Err(Error::InvalidTtl { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn at_most_rounds_down_to_a_valid_ttl_or_none() {
        let r = TtlRange::new(
            Duration::from_secs(2),
            Duration::from_secs(60),
            Duration::from_secs(1),
        );
        assert_eq!(r.at_most(2900 * MS), Some(Duration::from_secs(2)));
        assert_eq!(
            r.at_most(Duration::from_secs(3)),
            Some(Duration::from_secs(3))
        );
        assert_eq!(r.at_most(1999 * MS), None);
        assert_eq!(r.at_most(Duration::MAX), Some(Duration::from_secs(60)));
        let fine = TtlRange::new(MS, Duration::from_secs(60), MS);
        assert_eq!(fine.at_most(Duration::from_micros(270_500)), Some(270 * MS));
        assert_eq!(fine.at_most(Duration::ZERO), None);
        for want in [MS, 1234 * MS, Duration::MAX] {
            let ttl = fine.at_most(want).unwrap_or_default();
            assert!(fine.check(ttl).is_ok(), "{want:?} gave {ttl:?}");
        }
    }

    #[test]
    fn at_least_rounds_up_to_a_valid_ttl() {
        let r = TtlRange::new(
            Duration::from_secs(2),
            Duration::from_secs(60),
            Duration::from_secs(1),
        );
        assert_eq!(r.at_least(300 * MS), Duration::from_secs(2));
        assert_eq!(r.at_least(2100 * MS), Duration::from_secs(3));
        assert_eq!(
            r.at_least(Duration::from_secs(600)),
            Duration::from_secs(60)
        );
        let fine = TtlRange::new(MS, Duration::from_secs(60), MS);
        assert_eq!(fine.at_least(300 * MS), 300 * MS);
        assert!(fine.check(fine.at_least(1234 * MS)).is_ok());
    }
}
