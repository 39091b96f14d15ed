//! Jittered exponential backoff, for backends and callers that must poll.

use std::time::Duration;

use rand::Rng;

/// Exponential backoff with "equal jitter": each delay is half the current step plus a random
/// part of the other half. The jitter keeps a crowd of waiters that woke together from retrying
/// in lockstep; the fixed half keeps a single waiter from spinning.
#[derive(Clone, Debug)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    step: Duration,
}

impl Default for Backoff {
    /// 5 ms doubling up to 500 ms.
    fn default() -> Self {
        Backoff::new(Duration::from_millis(5), Duration::from_millis(500))
    }
}

impl Backoff {
    /// Starts at `base`, doubles per attempt, never above `cap`.
    pub fn new(base: Duration, cap: Duration) -> Self {
        let base = base.max(Duration::from_micros(100));
        Backoff {
            base,
            cap: cap.max(base),
            step: base,
        }
    }

    /// The next delay to sleep.
    pub fn next_delay(&mut self) -> Duration {
        let step = self.step;
        self.step = self.step.saturating_mul(2).min(self.cap);
        let half = step / 2;
        let jitter_nanos = u64::try_from(half.as_nanos()).unwrap_or(u64::MAX);
        let jitter = Duration::from_nanos(rand::rng().random_range(0..=jitter_nanos));
        half + jitter
    }

    /// Back to the first step (after progress was made).
    pub fn reset(&mut self) {
        self.step = self.base;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_within_bounds() {
        let mut b = Backoff::new(Duration::from_millis(10), Duration::from_millis(80));
        let mut steps = vec![];
        for _ in 0..8 {
            steps.push(b.next_delay());
        }
        // step k is in [s/2, s] where s = min(10 * 2^k, 80) ms.
        for (k, d) in steps.iter().enumerate() {
            let s = Duration::from_millis((10u64 << k.min(3)).min(80));
            assert!(
                *d >= s / 2 && *d <= s,
                "step {k}: {d:?} not in [{:?}, {s:?}]",
                s / 2
            );
        }
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(10));
    }

    #[test]
    fn jitter_spreads_waiters() {
        let delays: std::collections::HashSet<_> = (0..50)
            .map(|_| Backoff::new(Duration::from_millis(100), Duration::from_secs(1)).next_delay())
            .collect();
        assert!(delays.len() > 10, "jitter should spread delays: {delays:?}");
    }
}
