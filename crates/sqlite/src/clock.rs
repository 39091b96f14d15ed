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
//! (`/proc/sys/kernel/random/boot_id`). A lease of another boot is over if that boot was an
//! earlier one of this machine; but a boot id alone cannot tell an earlier boot from another
//! kernel sharing the file (a second machine on a share, a VM, a sandbox), whose leases are live.
//! So every write also stores the wall clock's time and the lease's end by the wall clock, and a
//! row of another boot counts as an earlier boot's only if it was written before this boot began
//! (see [`MachineClock::boot_began_unix_ns`]); otherwise it holds until its wall-clock expiry.

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
    /// The same for `CLOCK_BOOTTIME`, which dates this boot's beginning.
    boottime_offset_ns: i128,
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
        let offsets =
            std::fs::read_to_string(Path::new(TIME_NAMESPACE_OFFSETS)).unwrap_or_default();
        let offset_ns = namespace_offset(&offsets, "monotonic", "1").unwrap_or(0);
        let boottime_offset_ns = namespace_offset(&offsets, "boottime", "7").unwrap_or(0);
        Ok(MachineClock {
            boot_id,
            offset_ns,
            boottime_offset_ns,
        })
    }

    /// Every clock a statement needs, read together.
    pub(crate) fn now(&self) -> Now {
        Now {
            ns: self.now_ns(),
            wall_ns: Self::wall_now_ns(),
            boot_began_unix_ns: self.boot_began_unix_ns(),
        }
    }

    /// Now, in nanoseconds of the machine's `CLOCK_MONOTONIC`.
    pub(crate) fn now_ns(&self) -> i64 {
        let ns = nanos(ClockId::Monotonic) - self.offset_ns;
        i64::try_from(ns.max(0)).unwrap_or(i64::MAX)
    }

    /// Now by the wall clock (`CLOCK_REALTIME`), in nanoseconds since the Unix epoch: only to
    /// tell rows of another kernel from an earlier boot's, never to decide this boot's expiry.
    pub(crate) fn wall_now_ns() -> i64 {
        i64::try_from(nanos(ClockId::Realtime).max(0)).unwrap_or(i64::MAX)
    }

    /// When this boot began, by the wall clock as it reads now, in nanoseconds since the Unix
    /// epoch: the wall clock less `CLOCK_BOOTTIME` (which counts from boot, suspends included).
    /// It is the kernel's own boot time, `btime` in `/proc/stat`, to the nanosecond instead of
    /// the second, and with the time namespace's boottime shift taken back off (which `btime`
    /// takes off only on newer kernels) so every process of the machine reads the same instant.
    /// Read afresh each time: a step of the wall clock moves it as it moves the wall clock, so
    /// rows are always compared with the boot on one clock.
    pub(crate) fn boot_began_unix_ns(&self) -> i64 {
        let began = nanos(ClockId::Realtime) - (nanos(ClockId::Boottime) - self.boottime_offset_ns);
        i64::try_from(began.max(0)).unwrap_or(i64::MAX)
    }
}

/// One reading of the clocks, taken with the write lock held.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Now {
    /// The machine's `CLOCK_MONOTONIC`: decides every lease of this boot.
    pub(crate) ns: i64,
    /// The wall clock: stored with every write, for other kernels to read.
    pub(crate) wall_ns: i64,
    /// When this boot began, by the wall clock.
    pub(crate) boot_began_unix_ns: i64,
}

fn nanos(clock: ClockId) -> i128 {
    let t = clock_gettime(clock);
    i128::from(t.tv_sec) * 1_000_000_000 + i128::from(t.tv_nsec)
}

/// A clock's line of `/proc/self/timens_offsets` (`monotonic <secs> <nanos>`, or the clock's
/// number: 1 for `CLOCK_MONOTONIC`, 7 for `CLOCK_BOOTTIME`), in ns.
fn namespace_offset(text: &str, clock: &str, number: &str) -> Option<i128> {
    text.lines().find_map(|line| {
        let mut parts = line.split_whitespace();
        let name = parts.next()?;
        if name != clock && name != number {
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
    use leasehold_conformance::kit::{OrFail, TestResult};

    #[test]
    fn reads_a_boot_id_and_a_clock_that_goes_forward() -> TestResult {
        let clock = MachineClock::read().or_fail("reading the machine clock")?;
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
        let by_instant =
            i64::try_from((i1 - i0).as_nanos()).or_fail("the elapsed nanoseconds as i64")?;
        assert!(((c1 - c0) - by_instant).abs() < 1_000_000);
        Ok(())
    }

    #[test]
    fn time_namespace_offsets_are_parsed() {
        let monotonic = |text| namespace_offset(text, "monotonic", "1");
        assert_eq!(
            monotonic("monotonic 100 5\nboottime 7 0\n"),
            Some(100_000_000_005)
        );
        assert_eq!(
            monotonic("boottime -3 0\nmonotonic -2 500\n"),
            Some(-1_999_999_500)
        );
        assert_eq!(monotonic("boottime 1 0\n"), None);
        assert_eq!(monotonic(""), None);
        assert_eq!(
            namespace_offset("1 5 0\n7 -3 0\n", "boottime", "7"),
            Some(-3_000_000_000)
        );
    }

    /// This boot began when `/proc/stat` says it did (`btime`, whole seconds, truncated), and
    /// before now.
    #[test]
    fn the_boot_began_when_proc_stat_says() -> std::result::Result<(), String> {
        let clock = MachineClock::read().map_err(|e| e.to_string())?;
        let stat = std::fs::read_to_string("/proc/stat").map_err(|e| format!("/proc/stat: {e}"))?;
        let btime: i64 = stat
            .lines()
            .find_map(|l| l.strip_prefix("btime "))
            .ok_or("no btime in /proc/stat")?
            .trim()
            .parse()
            .map_err(|e| format!("btime: {e}"))?;
        let began = clock.boot_began_unix_ns();
        // Within a second either way: btime is truncated, and the two readings are apart.
        if (began / 1_000_000_000 - btime).abs() > 1 || began >= MachineClock::wall_now_ns() {
            return Err(format!(
                "this boot began at {began} ns, btime says {btime} s"
            ));
        }
        Ok(())
    }
}
