//! The clock that decides expiry: the machine's `CLOCK_MONOTONIC`, and the boot it belongs to.
//!
//! Why this clock: every process of a SQLite authority runs on the machine that has the file, so
//! they can share one clock instead of trusting a wall clock that NTP or an operator may step.
//! `CLOCK_MONOTONIC` never steps, and it is the very clock behind every client's local deadline
//! (tokio's `Instant`): the authority's expiry and the holder's belief advance together, even
//! across a suspend of the machine (both stop), so the safety margin only has to cover the time
//! between reading the clock and the statement. `CLOCK_BOOTTIME` would keep counting through a
//! suspend while the holders' deadlines stand still, and could hand a lease on while its holder
//! still believes in it.
//!
//! The clock restarts at every boot, so each expiry is stored with the boot id
//! (`/proc/sys/kernel/random/boot_id`), and a lease from another boot counts as expired.

use std::path::Path;

use leasehold_core::{Error, Result};
use rustix::time::{clock_gettime, ClockId};

const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";
const TIME_NAMESPACE_OFFSETS: &str = "/proc/self/timens_offsets";

/// The machine's clock as this process reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct MachineClock {
    /// This boot's id: expiries of any other boot are over.
    pub(crate) boot_id: String,
    /// What this process's time namespace adds to `CLOCK_MONOTONIC` (zero outside one), taken
    /// back off so that processes in different namespaces (a restored checkpoint, a container
    /// with its own time namespace) read the same clock.
    offset_ns: i128,
}

impl MachineClock {
    /// Reads the boot id and the time namespace's offset.
    pub(crate) fn read() -> Result<Self> {
        let boot_id = std::fs::read_to_string(BOOT_ID).map_err(|e| Error::Unsupported {
            backend: crate::errors::BACKEND,
            operation: format!(
                "a SQLite authority without {BOOT_ID} ({e}): it needs Linux's boot id to tell this boot's leases from an earlier one's"
            ),
        })?;
        let boot_id = boot_id.trim().to_string();
        if boot_id.is_empty() {
            return Err(Error::Unsupported {
                backend: crate::errors::BACKEND,
                operation: format!("a SQLite authority with an empty {BOOT_ID}"),
            });
        }
        let offset_ns = match std::fs::read_to_string(Path::new(TIME_NAMESPACE_OFFSETS)) {
            Ok(text) => monotonic_offset(&text).unwrap_or(0),
            Err(_) => 0,
        };
        Ok(MachineClock { boot_id, offset_ns })
    }

    /// Now, in nanoseconds of the machine's `CLOCK_MONOTONIC`.
    pub(crate) fn now_ns(&self) -> i64 {
        let t = clock_gettime(ClockId::Monotonic);
        let ns = i128::from(t.tv_sec) * 1_000_000_000 + i128::from(t.tv_nsec) - self.offset_ns;
        i64::try_from(ns.max(0)).unwrap_or(i64::MAX)
    }
}

/// The `monotonic` line of `/proc/self/timens_offsets` (`monotonic <secs> <nanos>`), in ns.
fn monotonic_offset(text: &str) -> Option<i128> {
    text.lines().find_map(|line| {
        let mut parts = line.split_whitespace();
        let name = parts.next()?;
        if name != "monotonic" && name != "1" {
            return None;
        }
        let secs: i128 = parts.next()?.parse().ok()?;
        let nanos: i128 = parts.next()?.parse().ok()?;
        Some(secs * 1_000_000_000 + nanos)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_boot_id_and_a_clock_that_goes_forward() {
        let clock = MachineClock::read().unwrap();
        assert_eq!(clock.boot_id.len(), 36, "{:?}", clock.boot_id);
        let a = clock.now_ns();
        std::thread::sleep(std::time::Duration::from_millis(5));
        let b = clock.now_ns();
        assert!(b - a >= 5_000_000, "{a} {b}");
        // The same clock as std's Instant (on Linux, CLOCK_MONOTONIC): a 5 ms sleep measured by
        // both agrees within a millisecond.
        let (i0, c0) = (std::time::Instant::now(), clock.now_ns());
        std::thread::sleep(std::time::Duration::from_millis(5));
        let (i1, c1) = (std::time::Instant::now(), clock.now_ns());
        let by_instant = i64::try_from((i1 - i0).as_nanos()).unwrap();
        assert!(((c1 - c0) - by_instant).abs() < 1_000_000);
    }

    #[test]
    fn time_namespace_offsets_are_parsed() {
        assert_eq!(
            monotonic_offset("monotonic 100 5\nboottime 7 0\n"),
            Some(100_000_000_005)
        );
        assert_eq!(
            monotonic_offset("boottime -3 0\nmonotonic -2 500\n"),
            Some(-1_999_999_500)
        );
        assert_eq!(monotonic_offset("boottime 1 0\n"), None);
        assert_eq!(monotonic_offset(""), None);
    }
}
