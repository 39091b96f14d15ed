//! Saturating time arithmetic.
//!
//! `Instant + Duration` panics on overflow, and `Duration::MAX` is the natural way for a caller to
//! say "wait forever" or "hold without limit". Every deadline in leasehold is computed with
//! [`saturating_add`], which turns such a duration into a point far enough away to mean
//! "never" for any process, and never panics.

use std::time::Duration;

use tokio::time::Instant;

/// What "forever" is capped at: about 30 years, the same horizon tokio uses for a sleep that
/// never ends. Timers accept instants this far ahead on every platform.
pub const FOREVER: Duration = Duration::from_secs(86_400 * 365 * 30);

/// `at + d`, capped at `at + FOREVER` so that huge durations (up to `Duration::MAX`) mean
/// "never" instead of a panic.
pub fn saturating_add(at: Instant, d: Duration) -> Instant {
    let d = d.min(FOREVER);
    // Near the end of the clock's range, a year is still "never" for any process.
    at.checked_add(d)
        .or_else(|| at.checked_add(Duration::from_secs(86_400 * 365)))
        .unwrap_or(at)
}

/// `saturating_add(Instant::now(), d)`.
pub fn deadline_in(d: Duration) -> Instant {
    saturating_add(Instant::now(), d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duration_max_is_far_away_not_a_panic() {
        let now = Instant::now();
        let far = saturating_add(now, Duration::MAX);
        assert_eq!(far - now, FOREVER);
        assert_eq!(
            saturating_add(now, Duration::from_secs(3)) - now,
            Duration::from_secs(3)
        );
        assert!(deadline_in(Duration::MAX) > now + Duration::from_secs(86_400 * 365 * 29));
    }

    #[tokio::test(start_paused = true)]
    async fn timers_accept_forever() {
        let fired = tokio::time::timeout(
            Duration::from_millis(10),
            tokio::time::sleep_until(deadline_in(Duration::MAX)),
        )
        .await;
        assert!(fired.is_err(), "a sleep until 'forever' must not fire");
    }
}
