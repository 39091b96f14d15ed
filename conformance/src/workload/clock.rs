//! `CLOCK_MONOTONIC` in nanoseconds: the one time base of every history line.
//!
//! Why this clock: the workers are separate processes, and a history is only worth something if
//! their events can be put in one order. `CLOCK_MONOTONIC` is shared by every process on the
//! machine, never jumps with NTP steps, and keeps counting while a process is `SIGSTOP`ped, so a
//! paused holder's late events land after everything that happened meanwhile.

use std::time::Instant;

use super::event::Nanos;

/// Now, in nanoseconds of `CLOCK_MONOTONIC`.
#[allow(unsafe_code)]
pub fn now_ns() -> Nanos {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC is always supported on Linux,
    // and clock_gettime writes nothing else.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    if rc != 0 {
        // Cannot happen for CLOCK_MONOTONIC; a zero time would sort first and stand out.
        return 0;
    }
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// An [`Instant`] (for example a lease's deadline, `tokio::time::Instant::into_std`) as
/// nanoseconds of `CLOCK_MONOTONIC`, by its distance from now. Rust's `Instant` reads the same
/// clock on Linux but does not expose its value, so the error is the few nanoseconds between the
/// two readings.
pub fn instant_ns(at: Instant) -> Nanos {
    let now = Instant::now();
    let now_ns = now_ns();
    if at >= now {
        now_ns.saturating_add(nanos(at - now))
    } else {
        now_ns.saturating_sub(nanos(now - at))
    }
}

fn nanos(d: std::time::Duration) -> Nanos {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn clock_is_monotonic_and_matches_instant() {
        let a = now_ns();
        let b = now_ns();
        assert!(b >= a);
        let later = Instant::now() + Duration::from_secs(5);
        let at = instant_ns(later);
        let gap = at.saturating_sub(now_ns());
        assert!(
            (4_900_000_000..=5_000_000_000).contains(&gap),
            "an instant 5 s ahead mapped {gap} ns ahead"
        );
    }
}
