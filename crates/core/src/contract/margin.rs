//! The safety margin between the authority's TTL and what a client believes.

use std::time::Duration;

use tokio::time::Instant;

use crate::contract::error::{Error, Result};

/// How much of a TTL the client gives up to stay on the safe side.
///
/// The authority's clock alone decides when a lease expires. The client cannot read that clock;
/// it estimates the expiry with its own monotonic clock, started *before* the request was sent
/// (the authority cannot have started the TTL earlier than that), and then subtracts this margin
/// for what the estimate cannot see: the two clocks running at slightly different rates, and the
/// time between checking validity and the protected write landing.
///
/// The margin is `fixed + ttl * drift_per_mille / 1000`, capped at the TTL. The default,
/// 5 ms + 1 %, follows Redlock's clock-drift allowance. Never set it to zero in production.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SafetyMargin {
    fixed: Duration,
    drift_per_mille: u32,
}

impl Default for SafetyMargin {
    fn default() -> Self {
        SafetyMargin {
            fixed: Duration::from_millis(5),
            drift_per_mille: 10,
        }
    }
}

impl SafetyMargin {
    /// A margin of `fixed` plus `drift_per_mille`/1000 of the TTL. The drift may be at most 500
    /// (half the TTL).
    pub fn new(fixed: Duration, drift_per_mille: u32) -> Result<Self> {
        if drift_per_mille > 500 {
            return Err(Error::InvalidConfig {
                reason: format!("a clock drift allowance of {drift_per_mille}‰ is above 500‰"),
            });
        }
        Ok(SafetyMargin {
            fixed,
            drift_per_mille,
        })
    }

    /// The margin for `ttl`.
    pub fn for_ttl(&self, ttl: Duration) -> Duration {
        let drift = ttl.saturating_mul(self.drift_per_mille) / 1000;
        self.fixed.saturating_add(drift).min(ttl)
    }

    /// The local deadline of a lease of `ttl` whose request was sent at `sent_at`.
    ///
    /// `sent_at` must be read from the monotonic clock before the request left: taken after the
    /// response, the deadline would include the request's whole round trip, time during which the
    /// authority's TTL was already running.
    pub fn deadline(&self, sent_at: Instant, ttl: Duration) -> Instant {
        crate::time::saturating_add(sent_at, ttl.saturating_sub(self.for_ttl(ttl)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type TestResult<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

    #[test]
    fn margin_is_fixed_plus_drift_and_capped() -> TestResult {
        let m = SafetyMargin::default();
        assert_eq!(
            m.for_ttl(Duration::from_secs(10)),
            Duration::from_millis(105)
        );
        assert_eq!(
            m.for_ttl(Duration::from_millis(2)),
            Duration::from_millis(2)
        );
        let none =
            SafetyMargin::new(Duration::ZERO, 0).map_err(|e| format!("a margin of zero: {e}"))?;
        assert_eq!(none.for_ttl(Duration::from_secs(1)), Duration::ZERO);
        assert!(SafetyMargin::new(Duration::ZERO, 501).is_err());
        Ok(())
    }

    #[tokio::test(start_paused = true)]
    async fn deadline_counts_from_the_send() {
        let m = SafetyMargin::default();
        let sent = Instant::now();
        let d = m.deadline(sent, Duration::from_secs(1));
        assert_eq!(d - sent, Duration::from_millis(985));
    }

    /// A send time in the past (the reply took 400 ms) must not be replaced by now: the deadline
    /// is exactly sent + TTL - margin, 400 ms earlier than one counted from the reply.
    #[tokio::test(start_paused = true)]
    async fn a_send_in_the_past_shortens_the_deadline() {
        let m = SafetyMargin::default();
        let ttl = Duration::from_secs(1);
        let sent = Instant::now();
        tokio::time::advance(Duration::from_millis(400)).await;
        let d = m.deadline(sent, ttl);
        assert_eq!(d, sent + Duration::from_millis(985));
        assert_eq!(
            d.saturating_duration_since(Instant::now()),
            Duration::from_millis(585)
        );
        // Saturates instead of panicking for a TTL of Duration::MAX.
        let _ = m.deadline(sent, Duration::MAX);
    }
}
