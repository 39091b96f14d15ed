//! The etcd members' versions, read at connect, and what they tell about lease exclusivity.
//!
//! etcd before 3.4.31 (3.4 line) and 3.5.13 (3.5 line) has a defect (etcd-io/etcd#15247,
//! fixed by #16822): a leader whose raft loop stalls (its process paused, its disk or CPU too
//! slow) keeps believing it leads, and when it resumes it revokes every lease it saw no
//! keep-alive for, even leases the new leader renewed meanwhile. A holder's key then vanishes
//! before its TTL while the holder still believes itself the holder, and the lock is granted to
//! someone else. leasehold cannot prevent it; it notices the deleted key at once (the held
//! key's watch) and fences keep the writes ordered, so it declares it.

use etcd_client::{Client, ConnectOptions, Member};
use futures_util::future::join_all;
use leasehold_core::ExclusionSafety;
use std::time::Duration;

use crate::errors;

/// The first release of each line with the fix; lines before 3.4 never got it.
const FIXED: [(u64, u64, u64); 2] = [(3, 4, 31), (3, 5, 13)];

/// `version` ("3.4.23", "v3.5.12-rc.0") as numbers, if it has three.
fn numbers(version: &str) -> Option<(u64, u64, u64)> {
    let mut parts = version.trim_start_matches('v').split('.').map(|part| {
        let digits: String = part.chars().take_while(char::is_ascii_digit).collect();
        digits.parse::<u64>().ok()
    });
    match (parts.next(), parts.next(), parts.next()) {
        (Some(Some(major)), Some(Some(minor)), Some(Some(patch))) => Some((major, minor, patch)),
        _ => None,
    }
}

/// Whether etcd `version` ("3.4.23", "3.5.12-rc.0") can revoke live leases after a leader
/// stalls. A version that cannot be read could be an affected one.
pub(crate) fn revokes_after_a_stall(version: &str) -> bool {
    let Some((major, minor, patch)) = numbers(version) else {
        return true;
    };
    match FIXED.iter().find(|(a, b, _)| (*a, *b) == (major, minor)) {
        Some((_, _, fixed)) => patch < *fixed,
        None => (major, minor) < (3, 4),
    }
}

/// What one member of the cluster said its version was, or why it could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MemberVersion {
    /// The member's name (its id in hex while it has none).
    pub member: String,
    pub version: Result<String, String>,
}

/// What the members' versions say about lease exclusivity. Any member can lead, so the cluster
/// is as safe as its least safe member: one that runs an affected version, or whose version
/// could not be read (a member down, unreachable at its advertised client URL, or refusing its
/// status to this user: the defect cannot be ruled out for it), makes leases able to end early.
/// The fix came per release line (3.4.31 is fixed, 3.5.12 is not), so every member is judged,
/// and the lowest affected version is named. `Err` is a member list that could not be read.
pub(crate) fn judge(members: Result<Vec<MemberVersion>, String>) -> ExclusionSafety {
    const FIXED_IN: &str = "etcd-io/etcd#15247, fixed in 3.4.31 and 3.5.13";
    const DEFECT: &str = "etcd-io/etcd#15247 (a stalled leader revoking live leases when it \
                          resumes, fixed in 3.4.31 and 3.5.13)";
    let members = match members.and_then(|m| {
        if m.is_empty() {
            Err("it named no member".to_string())
        } else {
            Ok(m)
        }
    }) {
        Ok(members) => members,
        Err(reason) => {
            return ExclusionSafety::EarlyRevocation {
                reason: format!(
                    "the etcd cluster's member list could not be read ({reason}), so \
                     {DEFECT} cannot be ruled out"
                ),
            }
        }
    };
    let total = members.len();
    let lowest_affected = members
        .iter()
        .filter_map(|m| m.version.as_ref().ok().map(|v| (m, v)))
        .filter(|(_, v)| revokes_after_a_stall(v))
        .min_by_key(|(_, v)| numbers(v));
    let unread: Vec<String> = members
        .iter()
        .filter_map(|m| {
            m.version
                .as_ref()
                .err()
                .map(|why| format!("member {} ({why})", m.member))
        })
        .collect();
    let mut reasons = Vec::new();
    if let Some((member, version)) = lowest_affected {
        reasons.push(format!(
            "etcd {version} on member {} (the lowest affected version of the cluster's {total} \
             members) revokes live leases when a stalled leader resumes ({FIXED_IN})",
            member.member
        ));
    }
    if !unread.is_empty() {
        reasons.push(format!(
            "the version of {} of the cluster's {total} members could not be read, so {DEFECT} \
             cannot be ruled out: {}",
            unread.len(),
            unread.join(", ")
        ));
    }
    if reasons.is_empty() {
        ExclusionSafety::Exclusive
    } else {
        ExclusionSafety::EarlyRevocation {
            reason: reasons.join("; "),
        }
    }
}

/// What every member of the cluster says about lease exclusivity: the member list (through
/// `client`), then each member's status through a client of its own on its advertised client
/// URLs, made with `options` (the same credentials and TLS), all at once, each bounded by
/// `timeout`. Members of one cluster run one version outside a rolling upgrade, but during one
/// (or after one that stopped half-way) the oldest member decides; connect again after it.
pub(crate) async fn exclusion(
    client: &Client,
    options: &ConnectOptions,
    timeout: Duration,
) -> ExclusionSafety {
    let listed = errors::read_with_retry("list the cluster's members", timeout, || {
        let mut cluster = client.cluster_client();
        async move { cluster.member_list().await }
    })
    .await;
    let members = match listed {
        Ok(list) => Ok(join_all(
            list.members()
                .iter()
                .map(|member| member_version(member, options, timeout)),
        )
        .await),
        Err(error) => Err(error.to_string()),
    };
    judge(members)
}

/// One member's version, read from that member itself.
async fn member_version(
    member: &Member,
    options: &ConnectOptions,
    timeout: Duration,
) -> MemberVersion {
    let name = if member.name().is_empty() {
        format!("{:x}", member.id())
    } else {
        member.name().to_string()
    };
    let version = async {
        if member.client_urls().is_empty() {
            return Err("it has not started: no client URL".to_string());
        }
        let connect = Client::connect(member.client_urls(), Some(options.clone()));
        let own = errors::bounded("connect to a member", timeout, connect)
            .await
            .map_err(|e| e.to_string())?;
        let status = errors::read_with_retry("read a member's version", timeout, || {
            let mut maintenance = own.maintenance_client();
            async move { maintenance.status().await }
        })
        .await
        .map_err(|e| e.to_string())?;
        // An advertised URL that leads to another member would vouch for the wrong one.
        let answered = status.header().map(|h| h.member_id());
        if answered != Some(member.id()) {
            return Err(format!(
                "its client URL is answered by another member ({answered:x?})"
            ));
        }
        Ok(status.version().to_string())
    };
    MemberVersion {
        member: name,
        version: version.await,
    }
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

    fn member(name: &str, version: Result<&str, &str>) -> MemberVersion {
        MemberVersion {
            member: name.to_string(),
            version: version.map(str::to_string).map_err(str::to_string),
        }
    }

    fn reason(judged: &ExclusionSafety) -> Option<&str> {
        match judged {
            ExclusionSafety::EarlyRevocation { reason } => Some(reason),
            _ => None,
        }
    }

    #[test]
    fn a_cluster_is_as_safe_as_its_least_safe_member() {
        let fixed = judge(Ok(vec![
            member("a", Ok("3.5.13")),
            member("b", Ok("3.4.31")),
            member("c", Ok("3.6.0")),
        ]));
        assert_eq!(fixed, ExclusionSafety::Exclusive);

        // 3.4.31 is fixed and 3.5.12 is not, though 3.4.31 is the lower version.
        let judged = judge(Ok(vec![
            member("a", Ok("3.4.31")),
            member("b", Ok("3.5.12")),
            member("c", Ok("3.5.13")),
        ]));
        let shown = reason(&judged).unwrap_or_default();
        assert!(shown.contains("etcd 3.5.12 on member b"), "{judged:?}");

        let judged = judge(Ok(vec![
            member("a", Ok("3.4.30")),
            member("b", Ok("3.4.23")),
        ]));
        let shown = reason(&judged).unwrap_or_default();
        assert!(
            shown.contains("etcd 3.4.23 on member b") && shown.contains("2 members"),
            "the lowest affected version is named: {judged:?}"
        );
    }

    #[test]
    fn a_member_whose_version_is_unknown_is_declared() {
        // A status refused for want of permission says nothing about the version: etcd 3.5.28
        // and 3.6 refuse it to users without the root role, but so could a proxy in front of
        // an old server. Fail closed.
        let judged = judge(Ok(vec![
            member("a", Ok("3.6.1")),
            member("b", Err("etcd not authorized: permission denied")),
        ]));
        let shown = reason(&judged).unwrap_or_default();
        assert!(
            shown.contains("member b (etcd not authorized") && shown.contains("15247"),
            "{judged:?}"
        );
        for unknown in [Err("no answer".to_string()), Ok(Vec::new())] {
            let judged = judge(unknown);
            assert!(judged.can_end_early(), "{judged:?}");
        }
    }

    #[test]
    fn an_unreadable_version_cannot_rule_the_defect_out() {
        for unreadable in ["", "3", "3.4", "three.four.five", "3.x.1"] {
            assert!(revokes_after_a_stall(unreadable), "{unreadable:?}");
        }
    }
}
