//! The authority under test as the runner starts it, and the server faults it can suffer.
//!
//! etcd and ZooKeeper run as 3-member clusters (or one server with `--nodes 1`), PostgreSQL as
//! one server, Redis as a primary and a replica behind a [`Forwarder`] that a failover switches.
//! Every server is a plain process from Debian's packages (`leasehold-servers`).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_conformance::workload::FaultKind;
use leasehold_servers::{
    EtcdCluster, EtcdServer, Partition, PostgresServer, RedisServer, ZkEnsemble, ZkServer,
};
use rand::rngs::StdRng;
use rand::Rng;

use crate::forwarder::Forwarder;

/// The backends the workload runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// etcd.
    Etcd,
    /// ZooKeeper.
    Zookeeper,
    /// PostgreSQL.
    Postgres,
    /// Redis.
    Redis,
}

impl Backend {
    /// Every backend, in the report's order.
    pub const ALL: [Backend; 4] = [
        Backend::Etcd,
        Backend::Zookeeper,
        Backend::Postgres,
        Backend::Redis,
    ];

    /// The name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Etcd => "etcd",
            Backend::Zookeeper => "zookeeper",
            Backend::Postgres => "postgres",
            Backend::Redis => "redis",
        }
    }

    /// The backend named `name`.
    pub fn parse(name: &str) -> Option<Backend> {
        Backend::ALL
            .into_iter()
            .find(|b| b.name() == name || (name == "zk" && *b == Backend::Zookeeper))
    }

    /// How many servers by default: clusters where the backend has them.
    pub fn default_nodes(self) -> usize {
        match self {
            Backend::Etcd | Backend::Zookeeper => 3,
            Backend::Postgres | Backend::Redis => 1,
        }
    }
}

/// Errors starting or faulting servers.
pub type DeploymentError = Box<dyn std::error::Error + Send + Sync>;

enum Servers {
    Etcd(Box<EtcdServer>),
    EtcdCluster(EtcdCluster),
    Zk(Box<ZkServer>),
    ZkEnsemble(ZkEnsemble),
    Postgres(Box<PostgresServer>),
    Redis(Box<RedisPair>),
}

/// A Redis primary and replica behind a forwarder that a failover switches.
struct RedisPair {
    servers: [RedisServer; 2],
    primary: AtomicUsize,
    forwarder: Forwarder,
}

/// A started authority.
pub struct Deployment {
    backend: Backend,
    servers: Servers,
    /// The member cut off from the others, while an isolation fault lasts.
    partition: Mutex<Option<Partition>>,
}

impl std::fmt::Debug for Deployment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deployment")
            .field("backend", &self.backend)
            .finish_non_exhaustive()
    }
}

/// A fault in place, and what heals it.
#[derive(Debug)]
pub struct Injected {
    /// The member or server hit, as the history names it.
    pub node: Option<String>,
    heal: Heal,
}

#[derive(Clone, Copy, Debug)]
enum Heal {
    Restart(usize),
    Resume(usize),
    /// Remove the partition's rules.
    Rejoin,
    /// The replica at this index was promoted; the other becomes its replica.
    Demote(usize),
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, DeploymentError> + Send + 'static,
) -> Result<T, DeploymentError> {
    tokio::task::spawn_blocking(f).await?
}

fn boxed(e: leasehold_servers::HarnessError) -> DeploymentError {
    Box::new(e)
}

impl Deployment {
    /// Starts `backend` with `nodes` servers (clusters for etcd and ZooKeeper).
    pub async fn start(backend: Backend, nodes: usize) -> Result<Arc<Deployment>, DeploymentError> {
        let servers = match backend {
            Backend::Etcd if nodes > 1 => Servers::EtcdCluster(
                blocking(move || EtcdCluster::start_isolatable(nodes).map_err(boxed)).await?,
            ),
            Backend::Etcd => Servers::Etcd(Box::new(
                blocking(|| EtcdServer::start().map_err(boxed)).await?,
            )),
            Backend::Zookeeper if nodes > 1 => Servers::ZkEnsemble(
                blocking(move || ZkEnsemble::start_isolatable(nodes).map_err(boxed)).await?,
            ),
            Backend::Zookeeper => Servers::Zk(Box::new(
                blocking(|| ZkServer::start().map_err(boxed)).await?,
            )),
            Backend::Postgres => Servers::Postgres(Box::new(
                blocking(|| PostgresServer::start().map_err(boxed)).await?,
            )),
            Backend::Redis => {
                let servers = blocking(|| {
                    let primary = RedisServer::start().map_err(boxed)?;
                    let replica = RedisServer::start_replica_of(&primary).map_err(boxed)?;
                    Ok([primary, replica])
                })
                .await?;
                let forwarder = Forwarder::start(redis_addr(&servers[0])).await?;
                Servers::Redis(Box::new(RedisPair {
                    servers,
                    primary: AtomicUsize::new(0),
                    forwarder,
                }))
            }
        };
        Ok(Arc::new(Deployment {
            backend,
            servers,
            partition: Mutex::new(None),
        }))
    }

    /// The backend.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The URL workers connect with: every member of a cluster, a 1 s request timeout.
    pub fn url(&self) -> String {
        match &self.servers {
            Servers::Etcd(s) => format!("etcd://{}?timeout_ms=1000", s.endpoint()),
            Servers::EtcdCluster(c) => {
                format!("etcd://{}?timeout_ms=1000", c.endpoints().join(","))
            }
            Servers::Zk(s) => format!("zk://{}/workload?timeout_ms=1000", s.connect_string()),
            Servers::ZkEnsemble(e) => {
                format!("zk://{}/workload?timeout_ms=1000", e.connect_string())
            }
            Servers::Postgres(s) => s.url(),
            Servers::Redis(pair) => {
                format!(
                    "redis://127.0.0.1:{}?timeout_ms=1000",
                    pair.forwarder.port()
                )
            }
        }
    }

    /// The server faults this deployment can suffer.
    pub fn faults(&self) -> Vec<FaultKind> {
        match &self.servers {
            Servers::Etcd(_) | Servers::Zk(_) | Servers::Postgres(_) => {
                vec![FaultKind::KillAuthority]
            }
            Servers::EtcdCluster(_) | Servers::ZkEnsemble(_) => vec![
                FaultKind::KillMember,
                FaultKind::KillLeader,
                FaultKind::PauseLeader,
                FaultKind::IsolateMember,
                FaultKind::HandoffLeaderChange,
            ],
            Servers::Redis(_) => vec![FaultKind::KillAuthority, FaultKind::PromoteReplica],
        }
    }

    fn member_count(&self) -> usize {
        match &self.servers {
            Servers::EtcdCluster(c) => c.len(),
            Servers::ZkEnsemble(e) => e.len(),
            _ => 1,
        }
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
            Servers::Postgres(s) => format!("postgres 127.0.0.1:{}", s.port()),
            Servers::Redis(pair) => format!("redis 127.0.0.1:{}", pair.servers[i].port()),
        }
    }

    fn kill(&self, i: usize) -> Result<(), DeploymentError> {
        match &self.servers {
            Servers::Etcd(s) => s.kill(),
            Servers::EtcdCluster(c) => c.member(i).kill(),
            Servers::Zk(s) => s.kill(),
            Servers::ZkEnsemble(e) => e.member(i).kill(),
            Servers::Postgres(s) => s.kill(),
            Servers::Redis(pair) => pair.servers[i].kill(),
        }
        .map_err(boxed)
    }

    fn restart(&self, i: usize) -> Result<(), DeploymentError> {
        match &self.servers {
            Servers::Etcd(s) => s.restart(),
            Servers::EtcdCluster(c) => c.member(i).restart(),
            Servers::Zk(s) => s.restart(),
            Servers::ZkEnsemble(e) => e.member(i).restart(),
            Servers::Postgres(s) => s.restart(),
            Servers::Redis(pair) => pair.servers[i].restart(),
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

    /// Starts a fault of `kind` (blocking calls run off the runtime).
    pub async fn inject(
        self: &Arc<Self>,
        kind: FaultKind,
        rng: &mut StdRng,
    ) -> Result<Injected, DeploymentError> {
        let me = self.clone();
        let pick = rng.random_range(0..self.member_count().max(1));
        blocking(move || me.inject_blocking(kind, pick)).await
    }

    fn inject_blocking(&self, kind: FaultKind, pick: usize) -> Result<Injected, DeploymentError> {
        match kind {
            FaultKind::KillAuthority => {
                let i = match &self.servers {
                    Servers::Redis(pair) => pair.primary.load(Ordering::SeqCst),
                    _ => 0,
                };
                self.kill(i)?;
                Ok(Injected {
                    node: Some(self.node_name(i)),
                    heal: Heal::Restart(i),
                })
            }
            FaultKind::KillMember => {
                self.kill(pick)?;
                Ok(Injected {
                    node: Some(self.node_name(pick)),
                    heal: Heal::Restart(pick),
                })
            }
            FaultKind::KillLeader => {
                let i = self.leader()?;
                self.kill(i)?;
                Ok(Injected {
                    node: Some(self.node_name(i)),
                    heal: Heal::Restart(i),
                })
            }
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
            FaultKind::PromoteReplica => {
                let Servers::Redis(pair) = &self.servers else {
                    return Err("only Redis has a replica to promote".into());
                };
                let replica = 1 - pair.primary.load(Ordering::SeqCst);
                pair.servers[replica].promote().map_err(boxed)?;
                pair.primary.store(replica, Ordering::SeqCst);
                pair.forwarder.switch(redis_addr(&pair.servers[replica]));
                Ok(Injected {
                    node: Some(self.node_name(replica)),
                    heal: Heal::Demote(replica),
                })
            }
            other => Err(format!("{other:?} is not a fault of {}", self.backend.name()).into()),
        }
    }

    /// The cluster's leader (0 for a single server), asked off the runtime.
    pub async fn leader_member(self: &Arc<Self>) -> Result<usize, DeploymentError> {
        let me = self.clone();
        blocking(move || me.leader()).await
    }

    /// Kills or pauses member `i` at once, without asking who leads: for a fault that must land
    /// within milliseconds of a moment, where that question takes a round trip per member.
    pub async fn strike(
        self: &Arc<Self>,
        i: usize,
        pause: bool,
    ) -> Result<Injected, DeploymentError> {
        let me = self.clone();
        blocking(move || {
            let heal = if pause {
                me.pause(i, true)?;
                Heal::Resume(i)
            } else {
                me.kill(i)?;
                Heal::Restart(i)
            };
            let how = if pause { "paused" } else { "killed" };
            Ok(Injected {
                node: Some(format!("{} ({how})", me.node_name(i))),
                heal,
            })
        })
        .await
    }

    /// Heals a fault and waits until the servers it hit serve again.
    pub async fn heal(self: &Arc<Self>, injected: &Injected) -> Result<(), DeploymentError> {
        let me = self.clone();
        let heal = injected.heal;
        blocking(move || match heal {
            Heal::Restart(i) => {
                me.restart(i)?;
                me.redis_roles_after_restart(i)
            }
            Heal::Resume(i) => me.pause(i, false),
            Heal::Rejoin => {
                let partition = me
                    .partition
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .take();
                match partition {
                    Some(p) => p.heal().map_err(boxed),
                    None => Ok(()),
                }
            }
            Heal::Demote(new_primary) => me.demote_old_primary(new_primary),
        })
        .await
    }

    /// A restarted Redis comes back empty with its original command line, which may name the
    /// other server as its primary. If it was the primary, it stays the primary (empty: that is
    /// the fault) and the other server follows it again.
    fn redis_roles_after_restart(&self, restarted: usize) -> Result<(), DeploymentError> {
        let Servers::Redis(pair) = &self.servers else {
            return Ok(());
        };
        if pair.primary.load(Ordering::SeqCst) != restarted {
            return Ok(());
        }
        pair.servers[restarted]
            .command(&["REPLICAOF", "NO", "ONE"])
            .map_err(boxed)?;
        self.demote_old_primary(restarted)
    }

    /// After a promotion: the old primary follows the new one, as Sentinel reconfigures it.
    fn demote_old_primary(&self, new_primary: usize) -> Result<(), DeploymentError> {
        let Servers::Redis(pair) = &self.servers else {
            return Ok(());
        };
        let port = pair.servers[new_primary].port().to_string();
        pair.servers[1 - new_primary]
            .command(&["REPLICAOF", "127.0.0.1", &port])
            .map_err(boxed)?;
        // Wait for the link, so the next promotion has a replica that holds the data.
        let give_up = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let info = pair.servers[1 - new_primary]
                .command(&["INFO", "replication"])
                .map_err(boxed)?;
            if info.contains("master_link_status:up") {
                return Ok(());
            }
            if std::time::Instant::now() > give_up {
                return Err("the demoted Redis primary did not link to the new one in 20 s".into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn redis_addr(server: &RedisServer) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], server.port()))
}
