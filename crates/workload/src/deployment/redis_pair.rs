//! Redis as a primary and a replica behind a [`Forwarder`] that a failover switches: the
//! primary killed (restarted empty), or the replica promoted by hand while the old primary may
//! still answer.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use leasehold_conformance::workload::FaultKind;
use leasehold_servers::RedisServer;

use super::{blocking, boxed, not_a_fault_of, DeploymentError, Form, Heal, Injected};
use crate::forwarder::Forwarder;

/// A Redis primary and replica behind a forwarder that a failover switches.
pub(super) struct RedisPair {
    servers: [RedisServer; 2],
    primary: AtomicUsize,
    forwarder: Forwarder,
}

impl RedisPair {
    pub(super) async fn start() -> Result<RedisPair, DeploymentError> {
        let servers = blocking(|| {
            let primary = RedisServer::start().map_err(boxed)?;
            let replica = RedisServer::start_replica_of(&primary).map_err(boxed)?;
            Ok([primary, replica])
        })
        .await?;
        let forwarder = Forwarder::start(redis_addr(&servers[0])).await?;
        Ok(RedisPair {
            servers,
            primary: AtomicUsize::new(0),
            forwarder,
        })
    }

    fn node_name(&self, i: usize) -> String {
        format!("redis 127.0.0.1:{}", self.servers[i].port())
    }

    /// A restarted Redis comes back empty with its original command line, which may name the
    /// other server as its primary. If it was the primary, it stays the primary (empty: that is
    /// the fault) and the other server follows it again.
    fn roles_after_restart(&self, restarted: usize) -> Result<(), DeploymentError> {
        if self.primary.load(Ordering::SeqCst) != restarted {
            return Ok(());
        }
        self.servers[restarted]
            .command(&["REPLICAOF", "NO", "ONE"])
            .map_err(boxed)?;
        self.demote_old_primary(restarted)
    }

    /// After a promotion: the old primary follows the new one, as Sentinel reconfigures it.
    fn demote_old_primary(&self, new_primary: usize) -> Result<(), DeploymentError> {
        let port = self.servers[new_primary].port().to_string();
        let old = &self.servers[1 - new_primary];
        old.command(&["REPLICAOF", "127.0.0.1", &port])
            .map_err(boxed)?;
        // Wait for the link, so the next promotion has a replica that holds the data.
        super::wait_until(
            "the demoted Redis primary links to the new one",
            Duration::from_secs(20),
            || {
                let info = old.command(&["INFO", "replication"]).map_err(boxed)?;
                Ok(info.contains("master_link_status:up"))
            },
        )
    }
}

impl Form for RedisPair {
    fn url(&self) -> String {
        format!(
            "redis://127.0.0.1:{}?timeout_ms=1000",
            self.forwarder.port()
        )
    }

    fn faults(&self) -> Vec<FaultKind> {
        vec![FaultKind::KillAuthority, FaultKind::PromoteReplica]
    }

    fn inject(&self, kind: FaultKind, _pick: usize) -> Result<Injected, DeploymentError> {
        match kind {
            FaultKind::KillAuthority => {
                let i = self.primary.load(Ordering::SeqCst);
                self.servers[i].kill().map_err(boxed)?;
                Ok(Injected {
                    node: Some(self.node_name(i)),
                    heal: Heal::Restart(i),
                })
            }
            FaultKind::PromoteReplica => {
                let replica = 1 - self.primary.load(Ordering::SeqCst);
                self.servers[replica].promote().map_err(boxed)?;
                self.primary.store(replica, Ordering::SeqCst);
                self.forwarder.switch(redis_addr(&self.servers[replica]));
                Ok(Injected {
                    node: Some(self.node_name(replica)),
                    heal: Heal::Demote(replica),
                })
            }
            other => Err(not_a_fault_of(other, "a Redis primary and replica")),
        }
    }

    fn heal(&self, heal: Heal) -> Result<(), DeploymentError> {
        match heal {
            Heal::Restart(i) => {
                self.servers[i].restart().map_err(boxed)?;
                self.roles_after_restart(i)
            }
            Heal::Demote(new_primary) => self.demote_old_primary(new_primary),
            other => Err(format!("{other:?} does not heal a Redis primary and replica").into()),
        }
    }
}

fn redis_addr(server: &RedisServer) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], server.port()))
}
