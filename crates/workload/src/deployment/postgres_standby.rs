//! PostgreSQL as a primary and an asynchronous streaming standby behind a [`Forwarder`] that a
//! failover switches, as a floating address or a proxy that follows the primary does. Two
//! faults: the primary killed and restarted on its data (the standby follows it again), and a
//! failover: the primary killed, the standby promoted, clients switched to it. A promoted
//! standby may lack the last grants the old primary made (replication is asynchronous), which
//! is why the authority declares its fences failover-unsafe behind such a standby. The heal of
//! a failover gives the new primary a fresh standby (a base backup), as an operator rebuilds
//! the old node rather than rewinding it.

use std::net::SocketAddr;
use std::sync::{Mutex, MutexGuard};

use leasehold_conformance::workload::FaultKind;
use leasehold_servers::PostgresServer;

use super::{blocking, boxed, not_a_fault_of, DeploymentError, Form, Heal, Injected};
use crate::forwarder::Forwarder;

/// The primary and its standby; `None` while a failover's heal rebuilds the standby.
struct Servers {
    primary: PostgresServer,
    standby: Option<PostgresServer>,
}

/// A PostgreSQL primary and standby behind a forwarder.
pub(super) struct PostgresStandby {
    servers: Mutex<Servers>,
    forwarder: Forwarder,
    /// The URL of the first primary, whose port the forwarder's replaces.
    url: String,
}

impl PostgresStandby {
    pub(super) async fn start() -> Result<PostgresStandby, DeploymentError> {
        let servers = blocking(|| {
            let primary = PostgresServer::start().map_err(boxed)?;
            let standby = PostgresServer::start_standby_of(&primary).map_err(boxed)?;
            Ok(Servers {
                primary,
                standby: Some(standby),
            })
        })
        .await?;
        let forwarder = Forwarder::start(pg_addr(&servers.primary)).await?;
        let url = servers.primary.url().replace(
            &format!(":{}/", servers.primary.port()),
            &format!(":{}/", forwarder.port()),
        );
        Ok(PostgresStandby {
            servers: Mutex::new(servers),
            forwarder,
            url,
        })
    }

    fn servers(&self) -> MutexGuard<'_, Servers> {
        // A heal that panicked leaves the servers as they were; the next heal says what is wrong.
        self.servers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Form for PostgresStandby {
    fn url(&self) -> String {
        self.url.clone()
    }

    fn faults(&self) -> Vec<FaultKind> {
        vec![FaultKind::KillAuthority, FaultKind::PromoteReplica]
    }

    fn inject(&self, kind: FaultKind, _pick: usize) -> Result<Injected, DeploymentError> {
        let mut servers = self.servers();
        match kind {
            FaultKind::KillAuthority => {
                servers.primary.kill().map_err(boxed)?;
                Ok(Injected {
                    node: Some(format!("postgres 127.0.0.1:{}", servers.primary.port())),
                    heal: Heal::Restart(0),
                })
            }
            FaultKind::PromoteReplica => {
                let standby = servers
                    .standby
                    .take()
                    .ok_or("no standby to promote: the last failover was not healed")?;
                // The old primary is stopped first, as a failover manager fences it, so that
                // no client goes on writing to it; what it had not streamed yet is lost.
                if let Err(e) = servers.primary.kill() {
                    servers.standby = Some(standby);
                    return Err(boxed(e));
                }
                if let Err(e) = standby.promote() {
                    // No failover happened: serve again from the old primary, with its standby,
                    // so that the run goes on and says why.
                    servers.standby = Some(standby);
                    servers.primary.restart().map_err(boxed)?;
                    return Err(format!("the standby could not be promoted: {e}").into());
                }
                let old = std::mem::replace(&mut servers.primary, standby);
                self.forwarder.switch(pg_addr(&servers.primary));
                let node = format!(
                    "postgres 127.0.0.1:{} (standby promoted; primary 127.0.0.1:{} killed)",
                    servers.primary.port(),
                    old.port()
                );
                drop(old);
                Ok(Injected {
                    node: Some(node),
                    heal: Heal::Demote(0),
                })
            }
            other => Err(not_a_fault_of(other, "a PostgreSQL primary and standby")),
        }
    }

    fn heal(&self, heal: Heal) -> Result<(), DeploymentError> {
        let mut servers = self.servers();
        match heal {
            // The standby reconnects to the restarted primary on its own.
            Heal::Restart(_) => servers.primary.restart().map_err(boxed),
            Heal::Demote(_) => {
                if servers.standby.is_none() {
                    let standby =
                        PostgresServer::start_standby_of(&servers.primary).map_err(boxed)?;
                    servers.standby = Some(standby);
                }
                Ok(())
            }
            other => {
                Err(format!("{other:?} does not heal a PostgreSQL primary and standby").into())
            }
        }
    }
}

fn pg_addr(server: &PostgresServer) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], server.port()))
}
