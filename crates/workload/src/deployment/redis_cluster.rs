//! Redis Cluster: three primaries with a replica each (`redis+cluster://`, every node a seed).
//! Two faults: a primary killed (its replica takes its slots over by the cluster's own
//! failover; the killed node comes back empty as its replica), and the slot of one of the run's
//! keys moved to another primary while workers use it.

use std::time::Duration;

use leasehold_conformance::workload::FaultKind;
use leasehold_servers::{ClusterNode, RedisCluster};

use super::{blocking, boxed, not_a_fault_of, wait_until, DeploymentError, Form, Heal, Injected};

/// Primaries, each with one replica.
const PRIMARIES: usize = 3;

/// How long the cluster may take to fail a primary over (`cluster-node-timeout` is 1 s).
const FAILOVER_WITHIN: Duration = Duration::from_secs(20);

/// The fence counters of the run's lock keys (never deleted), as the Redis backend lays keys
/// out under its default prefix; the runner's recovery probe uses keys of its own.
const RUN_KEYS: &str = "{leasehold:workload/*}:fence";

/// A Redis Cluster.
pub(super) struct Cluster {
    cluster: RedisCluster,
}

impl Cluster {
    pub(super) async fn start() -> Result<Cluster, DeploymentError> {
        let cluster = blocking(|| RedisCluster::start(PRIMARIES, 1).map_err(boxed)).await?;
        Ok(Cluster { cluster })
    }

    fn node(&self, i: usize) -> &ClusterNode {
        &self.cluster.nodes()[i]
    }

    fn index_of(&self, node: &ClusterNode) -> usize {
        self.cluster
            .nodes()
            .iter()
            .position(|n| n.port() == node.port())
            .unwrap_or(0)
    }

    fn running(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.cluster.nodes().len()).filter(|&i| self.node(i).pid().is_some())
    }

    /// The running primaries, by index.
    fn primaries(&self) -> Result<Vec<usize>, DeploymentError> {
        let mut out = Vec::new();
        for i in self.running() {
            if self.node(i).is_primary().map_err(boxed)? {
                out.push(i);
            }
        }
        Ok(out)
    }

    /// The fence counter keys of the run, from every running primary.
    fn run_keys(&self) -> Result<Vec<String>, DeploymentError> {
        let mut keys = Vec::new();
        for i in self.primaries()? {
            let mut cursor = "0".to_string();
            loop {
                let answer = self
                    .node(i)
                    .command(&["SCAN", &cursor, "MATCH", RUN_KEYS, "COUNT", "1000"])
                    .map_err(boxed)?;
                let mut lines = answer.lines();
                cursor = lines.next().unwrap_or("0").to_string();
                keys.extend(
                    lines
                        .filter(|k| !k.contains("workload/recovery/"))
                        .map(str::to_string),
                );
                if cursor == "0" {
                    break;
                }
            }
        }
        keys.sort();
        Ok(keys)
    }

    /// Moves `slot` from `from` to `to` as an operator resharding does: the target imports,
    /// the source migrates, the slot's keys are `MIGRATE`d in batches, and the slot is assigned
    /// to the target on the target, the source and every other primary.
    fn migrate(&self, slot: u16, from: usize, to: usize) -> Result<(), DeploymentError> {
        let (src, dst) = (self.node(from), self.node(to));
        let (src_id, dst_id) = (src.id().map_err(boxed)?, dst.id().map_err(boxed)?);
        let slot_text = slot.to_string();
        dst.command(&["CLUSTER", "SETSLOT", &slot_text, "IMPORTING", &src_id])
            .map_err(boxed)?;
        src.command(&["CLUSTER", "SETSLOT", &slot_text, "MIGRATING", &dst_id])
            .map_err(boxed)?;
        let dst_port = dst.port().to_string();
        loop {
            let keys = src
                .command(&["CLUSTER", "GETKEYSINSLOT", &slot_text, "100"])
                .map_err(boxed)?;
            let keys: Vec<&str> = keys.lines().filter(|k| !k.is_empty()).collect();
            if keys.is_empty() {
                break;
            }
            let mut args = vec!["MIGRATE", "127.0.0.1", &dst_port, "", "0", "5000", "KEYS"];
            args.extend(keys);
            src.command(&args).map_err(boxed)?;
        }
        let mut assign = vec![to, from];
        assign.extend(
            self.primaries()?
                .into_iter()
                .filter(|&i| i != to && i != from),
        );
        for i in assign {
            self.node(i)
                .command(&["CLUSTER", "SETSLOT", &slot_text, "NODE", &dst_id])
                .map_err(boxed)?;
        }
        Ok(())
    }

    /// Whether every running node says that the node `to` serves `slot`, and the cluster is ok.
    fn slot_settled(&self, slot: u16, to: usize) -> Result<bool, DeploymentError> {
        let id = self.node(to).id().map_err(boxed)?;
        for i in self.running() {
            let node = self.node(i);
            if !node
                .command(&["CLUSTER", "INFO"])
                .map_err(boxed)?
                .contains("cluster_state:ok")
            {
                return Ok(false);
            }
            let nodes = node.command(&["CLUSTER", "NODES"]).map_err(boxed)?;
            let Some(line) = nodes.lines().find(|l| l.starts_with(&id)) else {
                return Ok(false);
            };
            if !serves(line, slot) {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// Whether a `CLUSTER NODES` line lists `slot` among its ranges (migration markers such as
/// `[93->-id]` are not ranges).
fn serves(line: &str, slot: u16) -> bool {
    line.split_whitespace().skip(8).any(|range| {
        let (a, b) = range.split_once('-').unwrap_or((range, range));
        matches!((a.parse::<u16>(), b.parse::<u16>()), (Ok(a), Ok(b)) if (a..=b).contains(&slot))
    })
}

impl Form for Cluster {
    fn url(&self) -> String {
        format!("{}?timeout_ms=1000", self.cluster.url())
    }

    fn faults(&self) -> Vec<FaultKind> {
        vec![FaultKind::KillPrimary, FaultKind::MigrateSlot]
    }

    fn members(&self) -> usize {
        self.cluster.nodes().len()
    }

    fn inject(&self, kind: FaultKind, pick: usize) -> Result<Injected, DeploymentError> {
        match kind {
            FaultKind::KillPrimary => {
                let primaries = self.primaries()?;
                let Some(&killed) = primaries.get(pick % primaries.len().max(1)) else {
                    return Err("no running primary".into());
                };
                let node = self.node(killed);
                let replica = self.index_of(self.cluster.replica_of(node).map_err(boxed)?);
                node.kill().map_err(boxed)?;
                Ok(Injected {
                    node: Some(format!("redis-cluster 127.0.0.1:{} (primary)", node.port())),
                    heal: Heal::Rejoined { killed, replica },
                })
            }
            FaultKind::MigrateSlot => {
                let keys = self.run_keys()?;
                let Some(key) = keys.get(pick % keys.len().max(1)) else {
                    return Err("no key of the run is in the cluster yet".into());
                };
                let from = self.index_of(self.cluster.primary_for(key).map_err(boxed)?);
                let slot: u16 = self
                    .node(from)
                    .command(&["CLUSTER", "KEYSLOT", key])
                    .map_err(boxed)?
                    .trim()
                    .parse()?;
                let others: Vec<usize> = self
                    .primaries()?
                    .into_iter()
                    .filter(|&i| i != from)
                    .collect();
                let Some(&to) = others.get(pick % others.len().max(1)) else {
                    return Err("no other primary to move the slot to".into());
                };
                self.migrate(slot, from, to)?;
                Ok(Injected {
                    node: Some(format!(
                        "slot {slot} ({key}) 127.0.0.1:{} -> 127.0.0.1:{}",
                        self.node(from).port(),
                        self.node(to).port()
                    )),
                    heal: Heal::SlotMoved { slot, to },
                })
            }
            other => Err(not_a_fault_of(other, "a Redis Cluster")),
        }
    }

    fn heal(&self, heal: Heal) -> Result<(), DeploymentError> {
        match heal {
            Heal::Rejoined { killed, replica } => {
                // Brought back only after the failover: a primary restarted before its replica
                // took over would be an empty primary of its slots, a restart, not a failover.
                wait_until(
                    "the replica takes the killed primary's slots over",
                    FAILOVER_WITHIN,
                    || self.node(replica).is_primary().map_err(boxed),
                )?;
                // A heal tried again after the restart (settling timed out) does not kill the
                // rejoined node a second time.
                if self.node(killed).pid().is_none() {
                    self.node(killed).restart().map_err(boxed)?;
                }
                self.cluster.settle().map_err(boxed)
            }
            // The slot stays where it was moved: moving it back would be a second migration,
            // and the next `MigrateSlot` moves some slot again anyway.
            Heal::SlotMoved { slot, to } => wait_until(
                "every node agrees on the moved slot's new primary",
                FAILOVER_WITHIN,
                || self.slot_settled(slot, to),
            ),
            other => Err(format!("{other:?} does not heal a Redis Cluster").into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::serves;

    #[test]
    fn reads_slot_ranges_and_skips_migration_markers() {
        let line = "07c3 127.0.0.1:30004@31004 master - 0 0 1 connected 0-5460 5462 [6000->-67ed]";
        assert!(serves(line, 0) && serves(line, 5460) && serves(line, 5462));
        assert!(!serves(line, 5461) && !serves(line, 6000));
    }
}
