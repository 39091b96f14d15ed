//! The store's clock: the only clock that decides whether a lease has expired.
//!
//! # The rule
//! A held object's last-modified time `L` is the store's time of its holder's last write,
//! truncated to whole seconds (HTTP dates have no fractions). To judge it, a contender needs the
//! store's *now*: it writes its clock object (an unconditional put) and reads that object's
//! last-modified time `C` back. `C` is the store's time of a write that finished before the
//! read answered, so the store's now is at least `C` from then on. The lease is expired iff
//!
//! ```text
//! C >= L + ttl + 1 s
//! ```
//!
//! # Why that is safe
//! Let `W` be the store's exact time of the holder's write, so `L <= W < L + 1 s`. The holder
//! read its monotonic clock at `s` before sending that write, and its deadline is
//! `s + ttl - margin` on that clock. A takeover is a write the store applies at some `T` with
//! `T >= C >= L + 1 s + ttl > W + ttl`: more than `ttl` of the store's time after the holder's
//! write, so more than `ttl` after the holder read `s` (the write was sent after `s`). The two
//! clocks are compared only as elapsed time, never as dates: more than `ttl` went by on the
//! store's clock, so at least `ttl - margin` went by on the holder's (the margin covers their
//! rates differing), and the holder stopped trusting its lease before the takeover. The
//! takeover itself is a conditional put on the version the contender read, so a renewal that
//! lands in between makes it fail. No worker's wall clock takes part: a worker whose clock is
//! wrong by minutes judges the same. `L` and `C` may be stamped by different machines of the
//! store: the rule treats them as one clock, so a difference between them comes off the
//! holder's safety margin.
//!
//! # What it costs
//! The expiry is seen at most one second after `W + ttl` (the truncation of `L`, which the
//! `+ 1 s` undoes), plus the waiter's polling delay: [`crate::EXPIRY_SLACK`].
//! The probe is two requests (a put and a head), made only when the object is held and a
//! previous probe does not already rule expiry out ([`ClockCache`]).

use std::sync::Mutex;
use std::time::Duration;

use leasehold_core::Instant;

/// Whether a lease last written at store second `last_modified` with a TTL of `ttl_ms` is over
/// when the store's now is at least `now_at_least` (seconds).
pub(crate) fn expired(last_modified: i64, ttl_ms: u64, now_at_least: i64) -> bool {
    now_at_least >= ends_at_second(last_modified, ttl_ms)
}

/// The first whole store second at which the rule calls the lease over.
fn ends_at_second(last_modified: i64, ttl_ms: u64) -> i64 {
    let ttl_s = i64::try_from(ttl_ms.div_ceil(1000)).unwrap_or(i64::MAX);
    last_modified.saturating_add(ttl_s).saturating_add(1)
}

/// How long a lease may still run by the store's clock, seen from a now of at least
/// `now_at_least`: an upper bound, for inspect and for how long a waiter sleeps.
pub(crate) fn remaining(last_modified: i64, ttl_ms: u64, now_at_least: i64) -> Duration {
    let secs = ends_at_second(last_modified, ttl_ms).saturating_sub(now_at_least);
    Duration::from_secs(u64::try_from(secs).unwrap_or(0))
}

/// The last store time this client read, and when (on its monotonic clock): what spares a
/// waiter a probe while a lease cannot have expired yet. It only ever decides *not* to probe;
/// a takeover is decided on a fresh probe alone.
#[derive(Debug, Default)]
pub(crate) struct ClockCache {
    seen: Mutex<Option<(i64, Instant)>>,
}

impl ClockCache {
    /// Remembers a probe's reading.
    pub(crate) fn record(&self, store_second: i64, read_at: Instant) {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if seen.is_none_or(|(s, _)| s <= store_second) {
            *seen = Some((store_second, read_at));
        }
    }

    /// How long before the lease could have expired, by the last reading: zero when a probe is
    /// worth making now. The reading's second may have been up to a second old when read, so
    /// the estimate of the store's now adds that second (erring towards probing early).
    pub(crate) fn wait_before_probe(&self, last_modified: i64, ttl_ms: u64) -> Duration {
        let seen = *self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let Some((second, read_at)) = seen else {
            return Duration::ZERO;
        };
        let elapsed = read_at.elapsed();
        let end_ms = i128::from(ends_at_second(last_modified, ttl_ms)) * 1000;
        let now_ms = (i128::from(second) + 1) * 1000 + elapsed.as_millis() as i128;
        let left = end_ms.saturating_sub(now_ms).max(0);
        Duration::from_millis(u64::try_from(left).unwrap_or(u64::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiry_waits_a_whole_second_past_the_ttl() {
        // Written during second 100 with a 5 s TTL: the holder's write was at most 100.999.
        assert!(!expired(100, 5000, 105));
        assert!(expired(100, 5000, 106));
        assert!(expired(100, 5000, 200));
        // A TTL that is not whole seconds is rounded up, never down.
        assert!(!expired(100, 5001, 106));
        assert_eq!(remaining(100, 5000, 103), Duration::from_secs(3));
        assert_eq!(remaining(100, 5000, 300), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_recent_reading_spares_probes_until_expiry_is_possible() {
        let cache = ClockCache::default();
        assert_eq!(cache.wait_before_probe(100, 5000), Duration::ZERO);
        cache.record(101, Instant::now());
        // Ends at second 106; the store's now is at most 102 (101 read, up to a second stale).
        assert_eq!(cache.wait_before_probe(100, 5000), Duration::from_secs(4));
        tokio::time::advance(Duration::from_millis(3500)).await;
        assert_eq!(
            cache.wait_before_probe(100, 5000),
            Duration::from_millis(500)
        );
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(cache.wait_before_probe(100, 5000), Duration::ZERO);
        // An older reading never replaces a newer one.
        cache.record(50, Instant::now());
        assert_eq!(cache.wait_before_probe(100, 5000), Duration::ZERO);
    }
}
