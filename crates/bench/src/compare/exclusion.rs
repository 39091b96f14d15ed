//! Proof that a contended run's acquisitions excluded each other: every worker stamps when its
//! `acquire` returned and when it called `release` on the machine's monotonic clock (one clock
//! for every process), and the parent checks, key by key, that no two of those windows overlap
//! and, for a side that hands out fences, that the fences grow in the order the holds began.
//! Each window lies inside the server's grant (it starts after the grant and ends before the
//! release reaches the server), so an overlap here is a real double hold, never the clock's.

/// One acquisition in a worker process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hold {
    pub key: u32,
    pub fence: Option<u64>,
    /// Monotonic nanoseconds when `acquire` returned.
    pub acquired: u64,
    /// Monotonic nanoseconds when `release` was called.
    pub released: u64,
}

impl Hold {
    /// The line a worker prints for it: `r KEY FENCE|- ACQUIRED RELEASED`.
    pub fn to_line(self) -> String {
        let fence = self.fence.map_or("-".to_string(), |f| f.to_string());
        format!("r {} {fence} {} {}", self.key, self.acquired, self.released)
    }

    /// Reads a worker's line back (`None` for any other line).
    pub fn from_line(line: &str) -> Option<Hold> {
        let mut parts = line.strip_prefix("r ")?.split(' ');
        let key = parts.next()?.parse().ok()?;
        let fence = match parts.next()? {
            "-" => None,
            f => Some(f.parse().ok()?),
        };
        Some(Hold {
            key,
            fence,
            acquired: parts.next()?.parse().ok()?,
            released: parts.next()?.parse().ok()?,
        })
    }
}

/// What the check found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Verdict {
    /// Holds that began inside the window and neither overlapped another nor broke the fence
    /// order: the ones the throughput counts.
    pub proven: u64,
    /// Holds that began while another hold of the same key had not been released.
    pub overlaps: u64,
    /// Holds whose fence was not above the fence of the hold before them on the same key.
    pub fence_disorder: u64,
}

/// Checks `holds` (from every worker of one run) and counts those that began in
/// `[start, end)`. Holds outside the window still take part in the check.
pub fn check(holds: &mut [Hold], start: u64, end: u64) -> Verdict {
    holds.sort_by_key(|h| (h.key, h.acquired));
    let mut verdict = Verdict::default();
    let mut previous: Option<Hold> = None;
    let mut latest_release = 0;
    for &hold in holds.iter() {
        let same_key = previous.is_some_and(|p| p.key == hold.key);
        if !same_key {
            latest_release = 0;
        }
        let overlap = same_key && hold.acquired < latest_release;
        let disorder = same_key
            && match (previous.and_then(|p| p.fence), hold.fence) {
                (Some(before), Some(now)) => now <= before,
                _ => false,
            };
        let counted = (start..end).contains(&hold.acquired);
        if overlap {
            verdict.overlaps += 1;
        }
        if disorder {
            verdict.fence_disorder += 1;
        }
        if counted && !overlap && !disorder {
            verdict.proven += 1;
        }
        latest_release = latest_release.max(hold.released);
        previous = Some(hold);
    }
    verdict
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hold(key: u32, fence: Option<u64>, acquired: u64, released: u64) -> Hold {
        Hold {
            key,
            fence,
            acquired,
            released,
        }
    }

    #[test]
    fn a_line_reads_back_as_the_hold_it_was_printed_from() -> Result<(), String> {
        for h in [hold(3, Some(17), 10, 20), hold(0, None, 5, 6)] {
            let back = Hold::from_line(&h.to_line());
            if back != Some(h) {
                return Err(format!(
                    "{h:?} printed as {} read back as {back:?}",
                    h.to_line()
                ));
            }
        }
        if Hold::from_line("e 1 refused").is_some() {
            return Err("an error line was read as a hold".into());
        }
        Ok(())
    }

    #[test]
    fn disjoint_holds_in_fence_order_are_all_proven() -> Result<(), String> {
        let mut holds = vec![
            hold(1, Some(2), 30, 40),
            hold(1, Some(1), 10, 20),
            hold(2, Some(1), 15, 35),
        ];
        let v = check(&mut holds, 0, 100);
        if v != (Verdict {
            proven: 3,
            overlaps: 0,
            fence_disorder: 0,
        }) {
            return Err(format!("expected all three proven, got {v:?}"));
        }
        Ok(())
    }

    #[test]
    fn an_overlap_and_a_fence_out_of_order_are_reported_and_not_counted() -> Result<(), String> {
        let mut holds = vec![
            hold(1, None, 10, 50),
            // Begins before the first ends: a double hold.
            hold(1, None, 20, 30),
            // After both, but a later hold of a fenced key with a lower fence.
            hold(2, Some(5), 10, 20),
            hold(2, Some(4), 30, 40),
        ];
        let v = check(&mut holds, 0, 100);
        if v != (Verdict {
            proven: 2,
            overlaps: 1,
            fence_disorder: 1,
        }) {
            return Err(format!(
                "expected 2 proven, 1 overlap, 1 disorder, got {v:?}"
            ));
        }
        Ok(())
    }

    #[test]
    fn only_holds_that_began_inside_the_window_count() -> Result<(), String> {
        let mut holds = vec![
            hold(1, None, 5, 6),
            hold(1, None, 10, 11),
            hold(1, None, 20, 21),
        ];
        let v = check(&mut holds, 10, 20);
        if v.proven != 1 {
            return Err(format!("expected one hold in [10, 20), got {v:?}"));
        }
        Ok(())
    }
}
