//! An etcd member cut off from the rest of its cluster (but not from its clients) by a
//! [`Partition`]: it loses its leader and cannot serve a linearizable read or write, while the
//! other two go on; once healed it serves again. Real servers; a server that cannot start fails
//! the test (the harness never skips).

use std::process::Output;
use std::thread;
use std::time::{Duration, Instant};

type TestResult<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

use leasehold_servers::etcd::{ETCD_ELECTION_TIMEOUT, ETCD_HEARTBEAT};
use leasehold_servers::{etcdctl_command, EtcdCluster, EtcdServer, HarnessError, Partition};

/// A follower that hears no heartbeat campaigns after a randomized election timeout in
/// [T, 2T), and from then on knows no leader. Slack on top for a loaded 2-core machine.
fn loses_leader_within() -> Duration {
    ETCD_ELECTION_TIMEOUT
        .saturating_mul(2)
        .saturating_add(Duration::from_secs(2))
}

/// After the heal the member's higher term forces one more election (etcd 3.4 has no pre-vote
/// by default), then it catches up: a few election timeouts, with the same slack.
fn serves_again_within() -> Duration {
    ETCD_ELECTION_TIMEOUT
        .saturating_mul(4)
        .saturating_add(Duration::from_secs(3))
}

/// How long one etcdctl request may take before it counts as failed: a healthy cluster answers
/// in milliseconds, a member without a leader never.
fn request_timeout() -> Duration {
    ETCD_ELECTION_TIMEOUT.saturating_mul(2)
}

fn etcdctl(endpoints: &[String], args: &[&str]) -> TestResult<Output> {
    let mut command =
        etcdctl_command(endpoints).map_err(|e| format!("etcdctl is installed: {e}"))?;
    command
        .arg(format!(
            "--command-timeout={}ms",
            request_timeout().as_millis()
        ))
        .arg(format!(
            "--dial-timeout={}ms",
            request_timeout().as_millis()
        ))
        .args(args);
    Ok(command.output().map_err(|e| format!("etcdctl runs: {e}"))?)
}

fn describe(output: &Output) -> String {
    format!(
        "{}: {}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout).trim(),
        String::from_utf8_lossy(&output.stderr).trim()
    )
}

/// Polls `check` every heartbeat until it holds or `within` has passed; returns how long it took.
fn wait_until(what: &str, within: Duration, mut check: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    loop {
        if check() {
            return start.elapsed();
        }
        assert!(start.elapsed() < within, "{what} within {within:?}");
        thread::sleep(ETCD_HEARTBEAT / 2);
    }
}

#[test]
fn an_isolated_etcd_follower_cannot_serve_linearizably_until_healed() -> TestResult {
    let cluster = EtcdCluster::start_isolatable(3)
        .map_err(|e| format!("start an isolatable etcd cluster: {e}"))?;
    let endpoints = cluster.endpoints();
    for (i, member) in cluster.members().iter().enumerate() {
        assert!(
            endpoints[i].starts_with(&format!("{}:", member.addr())),
            "{endpoints:?}"
        );
        assert!(member.addr().is_loopback() && member.addr() != std::net::Ipv4Addr::LOCALHOST);
        assert!(member.uid().is_some());
    }
    let leader = cluster.leader().map_err(|e| format!("a leader: {e}"))?;
    let f = (0..3).find(|&i| i != leader).ok_or("a follower")?;
    let isolated = vec![endpoints[f].clone()];
    let rest: Vec<String> = (0..3)
        .filter(|&i| i != f)
        .map(|i| endpoints[i].clone())
        .collect();
    let before = etcdctl(&isolated, &["put", "k", "before"])?;
    assert!(
        before.status.success(),
        "a write through the follower works before the cut: {}",
        describe(&before)
    );

    let partition =
        Partition::isolate(cluster.member(f)).map_err(|e| format!("isolate the follower: {e}"))?;
    // Its client port stays reachable: it answers its status, which soon shows no leader.
    let took = wait_until(
        "the isolated follower reports no leader",
        loses_leader_within(),
        || matches!(cluster.member(f).has_leader(), Ok(false)),
    );
    eprintln!("the isolated follower had no leader {took:?} after the cut");
    let put = etcdctl(&isolated, &["put", "k", "through-the-isolated"])?;
    assert!(
        !put.status.success(),
        "a write through the isolated member fails: {}",
        describe(&put)
    );
    let get = etcdctl(&isolated, &["get", "k"])?;
    assert!(
        !get.status.success(),
        "a linearizable read through the isolated member fails: {}",
        describe(&get)
    );
    let during = etcdctl(&rest, &["put", "k", "during"])?;
    assert!(
        during.status.success(),
        "a write through the other two succeeds: {}",
        describe(&during)
    );

    partition
        .heal()
        .map_err(|e| format!("heal the partition: {e}"))?;
    let took = wait_until(
        "the healed member serves the write made during the cut",
        serves_again_within(),
        || {
            // etcdctl ran three times above, so a failure to run it here is the member's.
            etcdctl(&isolated, &["get", "k", "--print-value-only"]).is_ok_and(|get| {
                get.status.success() && String::from_utf8_lossy(&get.stdout).trim() == "during"
            })
        },
    );
    eprintln!("the healed member served again {took:?} after the heal");
    let after = etcdctl(&isolated, &["put", "k", "after"])?;
    assert!(
        after.status.success(),
        "a write through the healed member succeeds: {}",
        describe(&after)
    );

    // The member still restarts under its own uid on its own address.
    cluster
        .member(f)
        .restart()
        .map_err(|e| format!("restart the member: {e}"))?;
    assert!(cluster.member(f).is_healthy());
    Ok(())
}

#[test]
fn a_member_started_without_its_own_address_cannot_be_isolated() -> TestResult {
    let server = EtcdServer::start().map_err(|e| format!("start etcd: {e}"))?;
    match Partition::isolate(&server) {
        Err(HarnessError::Server { server, message }) => {
            assert_eq!(server, "etcd");
            assert!(message.contains("start_isolatable"), "{message}");
        }
        other => panic!("expected a not-isolatable error, got {other:?}"),
    }
    Ok(())
}
