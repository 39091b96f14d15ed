//! Redis Cluster: primaries that split the 16384 hash slots between them, each with replicas,
//! as plain `redis-server --cluster-enabled yes` processes on loopback ports.
//!
//! Formed by hand (`CLUSTER ADDSLOTSRANGE`, `CLUSTER MEET` with the bus port, `CLUSTER
//! REPLICATE`), not by `redis-cli --cluster create`, so every node's bus port (`cluster-port`)
//! is a free port of its own instead of the client port plus 10000.

use std::time::{Duration, Instant};

use crate::error::{HarnessError, Result};
use crate::ports::free_ports;
use crate::process::{
    delegate_faults, require_program, restart_and_wait, server_dir, CommandSpec, ManagedProcess,
    READY_TIMEOUT,
};
use crate::redis::resp_command;

/// How long one harness command waits for an answer.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the cluster may take to form, or to settle after a failover.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(30);
/// The number of hash slots.
const SLOTS: usize = 16384;

/// One node of a [`RedisCluster`].
#[derive(Debug)]
pub struct ClusterNode {
    port: u16,
    bus_port: u16,
    process: ManagedProcess,
}

delegate_faults!(ClusterNode);

impl ClusterNode {
    /// The client port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Runs one command on this node and returns the reply as text (see
    /// [`crate::redis::resp_command`]).
    pub fn command(&self, args: &[&str]) -> Result<String> {
        resp_command(self.port, None, args, COMMAND_TIMEOUT).map_err(|e| {
            HarnessError::server(
                self.process.name(),
                format!("`{}` failed: {e}", args.join(" ")),
            )
        })
    }

    /// The node's cluster id.
    pub fn id(&self) -> Result<String> {
        self.command(&["CLUSTER", "MYID"])
    }

    /// Whether the node is a primary now (`ROLE` says `master`).
    pub fn is_primary(&self) -> Result<bool> {
        Ok(self.command(&["ROLE"])?.lines().next() == Some("master"))
    }

    /// Starts the node again on the same ports (it keeps its `nodes.conf`, so it rejoins as the
    /// node it was; without persistence its data is gone), and waits until it answers PING.
    pub fn restart(&self) -> Result<()> {
        restart_and_wait(&self.process, || ping(self.port))
    }
}

/// A Redis Cluster of `primaries` primaries with `replicas` replicas each.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<ClusterNode>,
    primaries: usize,
}

impl RedisCluster {
    /// Starts the nodes, assigns the slots evenly to the first `primaries` of them, makes the
    /// others replicas (round robin), and waits until every node reports `cluster_state:ok`
    /// and every replica has synced. `cluster-node-timeout` is 1 s, so a primary that stops
    /// answering is replaced by its replica within a few seconds.
    pub fn start(primaries: usize, replicas: usize) -> Result<Self> {
        let primaries = primaries.clamp(1, SLOTS);
        let count = primaries * (1 + replicas);
        let program = require_program("redis-cluster", "redis-server")?;
        let ports = free_ports(count * 2)?;
        let mut nodes = Vec::with_capacity(count);
        for i in 0..count {
            let (port, bus_port) = (ports[2 * i], ports[2 * i + 1]);
            let name = format!("redis-cluster-{i}");
            let dir = server_dir(&name)?;
            let args: Vec<String> = vec![
                "--port".into(),
                port.to_string(),
                "--cluster-port".into(),
                bus_port.to_string(),
                "--bind".into(),
                "127.0.0.1".into(),
                "--cluster-enabled".into(),
                "yes".into(),
                "--cluster-config-file".into(),
                dir.path().join("nodes.conf").display().to_string(),
                "--cluster-node-timeout".into(),
                "1000".into(),
                "--dir".into(),
                dir.path().display().to_string(),
                "--save".into(),
                String::new(),
                "--appendonly".into(),
                "no".into(),
                "--repl-diskless-sync".into(),
                "yes".into(),
                "--repl-diskless-sync-delay".into(),
                "0".into(),
            ];
            let process = ManagedProcess::spawn(name, dir, CommandSpec::new(&program, args))?;
            process.wait_ready(READY_TIMEOUT, || ping(port))?;
            nodes.push(ClusterNode {
                port,
                bus_port,
                process,
            });
        }
        let cluster = RedisCluster { nodes, primaries };
        cluster.form(replicas)?;
        Ok(cluster)
    }

    fn form(&self, replicas: usize) -> Result<()> {
        let per = SLOTS / self.primaries;
        for (i, node) in self.nodes[..self.primaries].iter().enumerate() {
            let first = i * per;
            let last = if i + 1 == self.primaries {
                SLOTS - 1
            } else {
                first + per - 1
            };
            node.command(&[
                "CLUSTER",
                "ADDSLOTSRANGE",
                &first.to_string(),
                &last.to_string(),
            ])?;
        }
        let first = &self.nodes[0];
        for node in &self.nodes[1..] {
            first.command(&[
                "CLUSTER",
                "MEET",
                "127.0.0.1",
                &node.port.to_string(),
                &node.bus_port.to_string(),
            ])?;
        }
        let count = self.nodes.len();
        self.wait("every node knows every other", |node| {
            let known = node.command(&["CLUSTER", "NODES"])?.lines().count();
            Ok(known == count)
        })?;
        if replicas > 0 {
            let ids = self.nodes[..self.primaries]
                .iter()
                .map(ClusterNode::id)
                .collect::<Result<Vec<_>>>()?;
            for (i, node) in self.nodes[self.primaries..].iter().enumerate() {
                node.command(&["CLUSTER", "REPLICATE", &ids[i % self.primaries]])?;
            }
        }
        self.settle()
    }

    /// Waits until every serving (running, not paused) node reports `cluster_state:ok` and every replica's link to its
    /// primary is up (bounded; the error names what did not happen).
    pub fn settle(&self) -> Result<()> {
        self.wait("the cluster is ok and every replica synced", |node| {
            let info = node.command(&["CLUSTER", "INFO"])?;
            if !info.contains("cluster_state:ok") {
                return Ok(false);
            }
            let replication = node.command(&["INFO", "replication"])?;
            Ok(
                replication.contains("role:master")
                    || replication.contains("master_link_status:up"),
            )
        })
    }

    fn wait(&self, what: &str, mut ready: impl FnMut(&ClusterNode) -> Result<bool>) -> Result<()> {
        let started = Instant::now();
        let mut last = String::new();
        loop {
            let mut all = true;
            for node in self.nodes.iter().filter(|n| n.process.is_serving()) {
                match ready(node) {
                    Ok(true) => {}
                    Ok(false) => {
                        all = false;
                        last = format!("{} not yet", node.process.name());
                    }
                    Err(e) => {
                        all = false;
                        last = e.to_string();
                    }
                }
            }
            if all {
                return Ok(());
            }
            if started.elapsed() > SETTLE_TIMEOUT {
                return Err(HarnessError::server(
                    "redis-cluster",
                    format!("{what}: not within {SETTLE_TIMEOUT:?} (last: {last})"),
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Every node, primaries first as started (roles change after a failover: ask
    /// [`ClusterNode::is_primary`]).
    pub fn nodes(&self) -> &[ClusterNode] {
        &self.nodes
    }

    /// `redis+cluster://127.0.0.1:P1,127.0.0.1:P2,...`: every node as a seed.
    pub fn url(&self) -> String {
        let seeds: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        format!("redis+cluster://{}", seeds.join(","))
    }

    /// The node that serves `key`'s slot now (a primary), asked of any running node.
    pub fn primary_for(&self, key: &str) -> Result<&ClusterNode> {
        let asker = self
            .nodes
            .iter()
            .find(|n| n.process.is_serving())
            .ok_or_else(|| HarnessError::server("redis-cluster", "no node is running"))?;
        let slot: usize = asker
            .command(&["CLUSTER", "KEYSLOT", key])?
            .trim()
            .parse()
            .map_err(|_| HarnessError::server("redis-cluster", "CLUSTER KEYSLOT answered oddly"))?;
        for node in self.nodes.iter().filter(|n| n.process.is_serving()) {
            if node.is_primary()? && owns(&node.command(&["CLUSTER", "NODES"])?, slot) {
                return Ok(node);
            }
        }
        Err(HarnessError::server(
            "redis-cluster",
            format!("no running primary serves slot {slot}"),
        ))
    }

    /// A running replica of `primary`.
    pub fn replica_of(&self, primary: &ClusterNode) -> Result<&ClusterNode> {
        let id = primary.id()?;
        for node in self.nodes.iter().filter(|n| n.process.is_serving()) {
            let replication = node.command(&["INFO", "replication"])?;
            if replication.contains("role:slave")
                && replication.contains(&format!("master_port:{}", primary.port))
            {
                return Ok(node);
            }
        }
        Err(HarnessError::server(
            "redis-cluster",
            format!("no running replica of {id}"),
        ))
    }

    /// Makes `replica` the primary of its slots at once, without its primary's agreement
    /// (`CLUSTER FAILOVER TAKEOVER`, what an operator does when the primary is gone), and waits
    /// until it serves as a primary and the cluster is ok.
    pub fn take_over(&self, replica: &ClusterNode) -> Result<()> {
        replica.command(&["CLUSTER", "FAILOVER", "TAKEOVER"])?;
        let started = Instant::now();
        while !replica.is_primary()? {
            if started.elapsed() > SETTLE_TIMEOUT {
                return Err(HarnessError::server(
                    replica.process.name(),
                    "did not become a primary after CLUSTER FAILOVER TAKEOVER",
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.wait("the cluster is ok after the takeover", |node| {
            Ok(node
                .command(&["CLUSTER", "INFO"])?
                .contains("cluster_state:ok"))
        })
    }
}

/// Whether a `CLUSTER NODES` answer says that the `myself` node serves `slot`.
fn owns(nodes: &str, slot: usize) -> bool {
    let Some(me) = nodes.lines().find(|l| l.contains("myself")) else {
        return false;
    };
    me.split_whitespace().skip(8).any(|range| {
        let (a, b) = range.split_once('-').unwrap_or((range, range));
        matches!((a.parse::<usize>(), b.parse::<usize>()), (Ok(a), Ok(b)) if (a..=b).contains(&slot))
    })
}

fn ping(port: u16) -> std::result::Result<(), String> {
    match resp_command(port, None, &["PING"], Duration::from_secs(1))? {
        pong if pong == "PONG" => Ok(()),
        other => Err(format!("PING answered {other:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_slots_a_node_serves() {
        let nodes = "07c3 127.0.0.1:30004@31004 myself,master - 0 0 1 connected 0-5460 5462\n\
                     67ed 127.0.0.1:30002@31002 master - 0 1426238316232 2 connected 5463-10922";
        assert!(owns(nodes, 0) && owns(nodes, 5460) && owns(nodes, 5462));
        assert!(!owns(nodes, 5461) && !owns(nodes, 5463));
    }
}
