//! What the Redis test binaries share: the bridge to the blocking harness, and replication
//! helpers for any Redis process the harness runs (a plain server, a Sentinel deployment's, a
//! cluster node).

// Each test binary uses part of this module.
#![allow(dead_code)]

use std::time::Duration;

use leasehold_servers::{ClusterNode, HarnessError, RedisServer};

/// A Redis process the harness sends commands to.
pub trait Node {
    fn command(&self, args: &[&str]) -> Result<String, HarnessError>;
}

impl Node for RedisServer {
    fn command(&self, args: &[&str]) -> Result<String, HarnessError> {
        RedisServer::command(self, args)
    }
}

impl Node for ClusterNode {
    fn command(&self, args: &[&str]) -> Result<String, HarnessError> {
        ClusterNode::command(self, args)
    }
}

/// Runs a blocking harness call off the runtime's threads.
pub async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.unwrap()
}

/// `field:value` from an `INFO` reply.
pub fn info_field(info: &str, field: &str) -> Option<String> {
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .map(|v| v.trim().to_string())
}

fn text(e: HarnessError) -> String {
    e.to_string()
}

/// Waits until `replica` has applied everything `primary` has written.
pub fn wait_in_sync(primary: &impl Node, replica: &impl Node) -> Result<(), String> {
    let started = std::time::Instant::now();
    loop {
        let p = primary.command(&["INFO", "replication"]).map_err(text)?;
        let r = replica.command(&["INFO", "replication"]).map_err(text)?;
        let written = info_field(&p, "master_repl_offset").and_then(|v| v.parse::<u64>().ok());
        let applied = info_field(&r, "slave_repl_offset").and_then(|v| v.parse::<u64>().ok());
        let up = info_field(&r, "master_link_status").as_deref() == Some("up");
        if up && written.is_some() && applied >= written {
            return Ok(());
        }
        if started.elapsed() > Duration::from_secs(20) {
            return Err(format!(
                "the replica did not catch up: primary {written:?}, replica {applied:?}, link up {up}"
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Cuts `replica` off from `primary`: the primary refuses `PSYNC`/`SYNC` from now on (an ACL
/// change; clients never send those) and its replica connection is killed. The primary keeps
/// serving clients; what they write now never reaches the replica.
pub fn cut_replication(primary: &impl Node, replica: &impl Node) -> Result<(), String> {
    primary
        .command(&["ACL", "SETUSER", "default", "-psync", "-sync"])
        .map_err(text)?;
    primary
        .command(&["CLIENT", "KILL", "TYPE", "replica"])
        .map_err(text)?;
    let started = std::time::Instant::now();
    loop {
        let r = replica.command(&["INFO", "replication"]).map_err(text)?;
        let p = primary.command(&["INFO", "replication"]).map_err(text)?;
        let down = info_field(&r, "master_link_status").as_deref() == Some("down");
        let none = info_field(&p, "connected_slaves").as_deref() == Some("0");
        if down && none {
            return Ok(());
        }
        if started.elapsed() > Duration::from_secs(10) {
            return Err("the replica's link did not go down".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
