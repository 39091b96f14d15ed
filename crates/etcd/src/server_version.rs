//! The etcd server's version, read at connect, and what it tells about lease exclusivity.
//!
//! etcd before 3.4.31 (3.4 line) and 3.5.13 (3.5 line) has a defect (etcd-io/etcd#15247,
//! fixed by #16822): a leader whose raft loop stalls (its process paused, its disk or CPU too
//! slow) keeps believing it leads, and when it resumes it revokes every lease it saw no
//! keep-alive for, even leases the new leader renewed meanwhile. A holder's key then vanishes
//! before its TTL while the holder still believes itself the holder, and the lock is granted to
//! someone else. leasehold cannot prevent it; it notices the deleted key at once (the held
//! key's watch) and fences keep the writes ordered, so it declares it.

use etcd_client::Client;
use leasehold_core::{Error, ExclusionSafety};
use std::time::Duration;

use crate::errors;

/// The first release of each line with the fix; lines before 3.4 never got it.
const FIXED: [(u64, u64, u64); 2] = [(3, 4, 31), (3, 5, 13)];

/// Whether etcd `version` ("3.4.23", "3.5.12-rc.0") can revoke live leases after a leader
/// stalls. A version that cannot be read could be an affected one.
pub(crate) fn revokes_after_a_stall(version: &str) -> bool {
    let mut numbers = version.trim_start_matches('v').split('.').map(|part| {
        let digits: String = part.chars().take_while(char::is_ascii_digit).collect();
        digits.parse::<u64>().ok()
    });
    let (Some(Some(major)), Some(Some(minor)), Some(Some(patch))) =
        (numbers.next(), numbers.next(), numbers.next())
    else {
        return true;
    };
    match FIXED.iter().find(|(a, b, _)| (*a, *b) == (major, minor)) {
        Some((_, _, fixed)) => patch < *fixed,
        None => (major, minor) < (3, 4),
    }
}

/// What the member the client reaches says about lease exclusivity. Members of one cluster run
/// one version outside a rolling upgrade; connect again after one. A status call refused for
/// want of permission comes from a server recent enough to restrict it to root (etcd 3.6, and
/// 3.5.28 on), all of which have the fix. A version that cannot be read for any other reason is
/// declared: the defect cannot be ruled out.
pub(crate) async fn exclusion(client: &Client, timeout: Duration) -> ExclusionSafety {
    let status = errors::call("read the server's version", timeout, || {
        let mut maintenance = client.maintenance_client();
        async move { maintenance.status().await }
    })
    .await;
    let reason = match status {
        Ok(status) if !revokes_after_a_stall(status.version()) => {
            return ExclusionSafety::Exclusive;
        }
        Ok(status) => format!(
            "etcd {} revokes live leases when a stalled leader resumes (etcd-io/etcd#15247, fixed \
             in 3.4.31 and 3.5.13)",
            status.version()
        ),
        Err(Error::Unauthorized { .. }) => {
            tracing::debug!("etcd refused its status to this user: a server with the fix");
            return ExclusionSafety::Exclusive;
        }
        Err(error) => format!(
            "the etcd server's version could not be read ({error}), so etcd-io/etcd#15247 (a \
             stalled leader revoking live leases when it resumes, fixed in 3.4.31 and 3.5.13) \
             cannot be ruled out"
        ),
    };
    ExclusionSafety::EarlyRevocation { reason }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_before_the_fix_of_each_line_revoke_after_a_stall() {
        for affected in [
            "3.4.23",
            "3.4.30",
            "v3.4.0",
            "3.5.0",
            "3.5.12",
            "3.3.27",
            "3.5.12-rc.1",
        ] {
            assert!(revokes_after_a_stall(affected), "{affected}");
        }
        for fixed in [
            "3.4.31",
            "3.4.37",
            "3.5.13",
            "3.5.21",
            "3.6.0",
            "3.6.0-alpha.0",
            "4.0.1",
        ] {
            assert!(!revokes_after_a_stall(fixed), "{fixed}");
        }
    }

    #[test]
    fn an_unreadable_version_cannot_rule_the_defect_out() {
        for unreadable in ["", "3", "3.4", "three.four.five", "3.x.1"] {
            assert!(revokes_after_a_stall(unreadable), "{unreadable:?}");
        }
    }
}
