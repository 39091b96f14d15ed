//! The silent cut of one worker from the authority: each worker process runs under a uid of its
//! own, so nftables can drop what that worker sends to the authority's ports and nothing else
//! (its resource connections and every other worker stay up). No reset comes back: its
//! connections look open, its renewals and releases vanish, and the authority lets its lease
//! run out. A cut shorter than the TTL must leave the lease held (the renewals resume in time
//! or the lease is reported lost); a longer one must end it, and the worker must notice before
//! it writes.

use std::path::Path;

use leasehold_conformance::workload::WorkerId;

/// The first uid the workers of runs get: far above real users, and apart from the harness's
/// cluster members (1,000,000 and up, see `leasehold_servers::partition`).
const UID_BASE: u32 = 2_000_000_000;

/// The uid worker `worker` of this runner runs under. Runs on one machine at once get uids of
/// their own (by the runner's pid), and a cut also names the run's authority ports, so one
/// run's cut never silences another run's workers.
pub fn worker_uid(worker: WorkerId) -> u32 {
    let run = std::process::id() % 1_000_000;
    UID_BASE
        .saturating_add(run.saturating_mul(1024))
        .saturating_add(worker % 1024)
}

/// Whether this process may run workers under other uids (it is root).
pub fn can_switch_uid() -> bool {
    effective_uid() == Some(0)
}

fn effective_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

/// Makes `path` (a file, created empty if missing, or a dir) belong to `uid`, so a worker
/// running as `uid` can append to its history and work in its dir.
pub fn give_to(path: &Path, uid: u32) -> std::io::Result<()> {
    if !path.exists() {
        std::fs::File::create(path)?;
    }
    std::os::unix::fs::chown(path, Some(uid), Some(uid))
}

/// The TCP ports an authority URL names (`scheme://[user@]host:port[,host:port...][/...][?...]`,
/// or for an object store, whose host is its bucket, the port of its `endpoint` parameter):
/// what a cut drops. Hosts without a port are left out.
pub fn authority_ports(url: &str) -> Vec<u16> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let hosts = rest.split(['/', '?']).next().unwrap_or_default();
    let hosts = hosts.rsplit_once('@').map_or(hosts, |(_, h)| h);
    let endpoint = url::Url::parse(url).ok().and_then(|u| {
        let (_, value) = u.query_pairs().find(|(k, _)| k == "endpoint")?;
        url::Url::parse(&value).ok()?.port_or_known_default()
    });
    let mut ports: Vec<u16> = hosts
        .split(',')
        .filter_map(|h| h.rsplit_once(':'))
        .filter_map(|(_, p)| p.parse().ok())
        .chain(endpoint)
        .collect();
    ports.sort_unstable();
    ports.dedup();
    ports
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_of_every_backend_url() {
        assert_eq!(
            authority_ports("etcd://127.0.0.2:2379,127.0.0.3:2380?timeout_ms=1000"),
            vec![2379, 2380]
        );
        assert_eq!(
            authority_ports("zk://127.0.0.1:2181,127.0.0.1:2182/workload?timeout_ms=1000"),
            vec![2181, 2182]
        );
        assert_eq!(
            authority_ports("postgres://leasehold@127.0.0.1:5433/postgres"),
            vec![5433]
        );
        assert_eq!(
            authority_ports("postgres://u:p@ss@127.0.0.1:5433/db"),
            vec![5433]
        );
        assert_eq!(
            authority_ports("redis://127.0.0.1:6390?timeout_ms=1000"),
            vec![6390]
        );
        assert_eq!(
            authority_ports("mysql://leasehold@127.0.0.1:3307/leasehold"),
            vec![3307]
        );
        assert_eq!(
            authority_ports(
                "az://leasehold/workload?account_name=a\
                 &endpoint=http%3A%2F%2F127.0.0.1%3A10004%2Fa&allow_http=true"
            ),
            vec![10004]
        );
        assert!(authority_ports("s3://bucket/prefix?region=eu-west-1").is_empty());
        assert!(authority_ports("sqlite:///tmp/x.db").is_empty());
    }

    #[test]
    fn workers_get_distinct_uids_above_real_users() {
        assert_ne!(worker_uid(0), worker_uid(1));
        assert!(worker_uid(0) >= UID_BASE);
        assert!(worker_uid(1023) < u32::MAX);
    }
}
