//! etcd and ZooKeeper: a cluster of members (killed, their leader killed or paused, one cut off
//! from the others) or one server (killed and restarted on the same data).

use std::sync::Mutex;

use leasehold_conformance::workload::FaultKind;
use leasehold_servers::{EtcdCluster, EtcdServer, Partition, ZkEnsemble, ZkServer};

use super::{blocking, boxed, not_a_fault_of, DeploymentError, Form, Heal, Injected};

enum Servers {
    Etcd(Box<EtcdServer>),
    EtcdCluster(EtcdCluster),
    Zk(Box<ZkServer>),
    ZkEnsemble(ZkEnsemble),
}

/// etcd or ZooKeeper, one server or a cluster.
pub(super) struct Consensus {
    servers: Servers,
    /// The member cut off from the others, while an isolation fault lasts.
    partition: Mutex<Option<Partition>>,
}

impl Consensus {
    fn new(servers: Servers) -> Consensus {
        Consensus {
            servers,
            partition: Mutex::new(None),
        }
    }

    /// etcd: a cluster of `nodes` members that can be isolated, or one server.
    pub(super) async fn start_etcd(nodes: usize) -> Result<Consensus, DeploymentError> {
        let servers = if nodes > 1 {
            Servers::EtcdCluster(
                blocking(move || EtcdCluster::start_isolatable(nodes).map_err(boxed)).await?,
            )
        } else {
            Servers::Etcd(Box::new(
                blocking(|| EtcdServer::start().map_err(boxed)).await?,
            ))
        };
        Ok(Consensus::new(servers))
    }

    /// ZooKeeper: an ensemble of `nodes` members that can be isolated, or one server.
    pub(super) async fn start_zookeeper(nodes: usize) -> Result<Consensus, DeploymentError> {
        let servers = if nodes > 1 {
            Servers::ZkEnsemble(
                blocking(move || ZkEnsemble::start_isolatable(nodes).map_err(boxed)).await?,
            )
        } else {
            Servers::Zk(Box::new(
                blocking(|| ZkServer::start().map_err(boxed)).await?,
            ))
        };
        Ok(Consensus::new(servers))
    }

    fn leader(&self) -> Result<usize, DeploymentError> {
        match &self.servers {
            Servers::EtcdCluster(c) => c.leader().map_err(boxed),
            Servers::ZkEnsemble(e) => e.leader().map_err(boxed),
            _ => Ok(0),
        }
    }

    fn node_name(&self, i: usize) -> String {
        match &self.servers {
            Servers::EtcdCluster(c) => format!("etcd-{} {}", i + 1, c.member(i).endpoint()),
            Servers::ZkEnsemble(e) => format!("zk-{} {}", i + 1, e.member(i).connect_string()),
            Servers::Etcd(s) => format!("etcd {}", s.endpoint()),
            Servers::Zk(s) => format!("zk {}", s.connect_string()),
        }
    }

    fn kill(&self, i: usize) -> Result<(), DeploymentError> {
        match &self.servers {
            Servers::Etcd(s) => s.kill(),
            Servers::EtcdCluster(c) => c.member(i).kill(),
            Servers::Zk(s) => s.kill(),
            Servers::ZkEnsemble(e) => e.member(i).kill(),
        }
        .map_err(boxed)
    }

    fn restart(&self, i: usize) -> Result<(), DeploymentError> {
        match &self.servers {
            Servers::Etcd(s) => s.restart(),
            Servers::EtcdCluster(c) => c.member(i).restart(),
            Servers::Zk(s) => s.restart(),
            Servers::ZkEnsemble(e) => e.member(i).restart(),
        }
        .map_err(boxed)
    }

    fn pause(&self, i: usize, pause: bool) -> Result<(), DeploymentError> {
        let r = match &self.servers {
            Servers::EtcdCluster(c) if pause => c.member(i).pause(),
            Servers::EtcdCluster(c) => c.member(i).resume(),
            Servers::ZkEnsemble(e) if pause => e.member(i).pause(),
            Servers::ZkEnsemble(e) => e.member(i).resume(),
            _ => return Err("only cluster members are paused".into()),
        };
        r.map_err(boxed)
    }

    fn killed(&self, i: usize) -> Result<Injected, DeploymentError> {
        self.kill(i)?;
        Ok(Injected {
            node: Some(self.node_name(i)),
            heal: Heal::Restart(i),
        })
    }
}

impl Form for Consensus {
    fn url(&self) -> String {
        match &self.servers {
            Servers::Etcd(s) => format!("etcd://{}?timeout_ms=1000", s.endpoint()),
            Servers::EtcdCluster(c) => {
                format!("etcd://{}?timeout_ms=1000", c.endpoints().join(","))
            }
            Servers::Zk(s) => format!("zk://{}/workload?timeout_ms=1000", s.connect_string()),
            Servers::ZkEnsemble(e) => {
                format!("zk://{}/workload?timeout_ms=1000", e.connect_string())
            }
        }
    }

    fn faults(&self) -> Vec<FaultKind> {
        match &self.servers {
            Servers::Etcd(_) | Servers::Zk(_) => vec![FaultKind::KillAuthority],
            Servers::EtcdCluster(_) | Servers::ZkEnsemble(_) => vec![
                FaultKind::KillMember,
                FaultKind::KillLeader,
                FaultKind::PauseLeader,
                FaultKind::IsolateMember,
                FaultKind::HandoffLeaderChange,
            ],
        }
    }

    fn members(&self) -> usize {
        match &self.servers {
            Servers::EtcdCluster(c) => c.len(),
            Servers::ZkEnsemble(e) => e.len(),
            _ => 1,
        }
    }

    fn inject(&self, kind: FaultKind, pick: usize) -> Result<Injected, DeploymentError> {
        match kind {
            FaultKind::KillAuthority => self.killed(0),
            FaultKind::KillMember => self.killed(pick),
            FaultKind::KillLeader => self.killed(self.leader()?),
            FaultKind::PauseLeader => {
                let i = self.leader()?;
                self.pause(i, true)?;
                Ok(Injected {
                    node: Some(self.node_name(i)),
                    heal: Heal::Resume(i),
                })
            }
            FaultKind::IsolateMember => {
                let partition = match &self.servers {
                    Servers::EtcdCluster(c) => Partition::isolate(c.member(pick)),
                    Servers::ZkEnsemble(e) => Partition::isolate(e.member(pick)),
                    _ => return Err("only cluster members are isolated".into()),
                }
                .map_err(boxed)?;
                *self.partition.lock().unwrap_or_else(|e| e.into_inner()) = Some(partition);
                Ok(Injected {
                    node: Some(self.node_name(pick)),
                    heal: Heal::Rejoin,
                })
            }
            other => Err(not_a_fault_of(other, "etcd or ZooKeeper")),
        }
    }

    fn leader(&self) -> Result<usize, DeploymentError> {
        Consensus::leader(self)
    }

    fn strike(&self, i: usize, pause: bool) -> Result<Injected, DeploymentError> {
        let heal = if pause {
            self.pause(i, true)?;
            Heal::Resume(i)
        } else {
            self.kill(i)?;
            Heal::Restart(i)
        };
        let how = if pause { "paused" } else { "killed" };
        Ok(Injected {
            node: Some(format!("{} ({how})", self.node_name(i))),
            heal,
        })
    }

    fn heal(&self, heal: Heal) -> Result<(), DeploymentError> {
        match heal {
            Heal::Restart(i) => self.restart(i),
            Heal::Resume(i) => self.pause(i, false),
            Heal::Rejoin => {
                let partition = self
                    .partition
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .take();
                match partition {
                    Some(p) => p.heal().map_err(boxed),
                    None => Ok(()),
                }
            }
            other => Err(format!("{other:?} does not heal etcd or ZooKeeper").into()),
        }
    }
}
