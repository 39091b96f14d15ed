//! PostgreSQL: one server, killed and restarted on the same data.

use leasehold_conformance::workload::FaultKind;
use leasehold_servers::PostgresServer;

use super::{blocking, boxed, not_a_fault_of, DeploymentError, Form, Heal, Injected};

/// One PostgreSQL server.
pub(super) struct Postgres {
    server: PostgresServer,
}

impl Postgres {
    pub(super) async fn start() -> Result<Postgres, DeploymentError> {
        let server = blocking(|| PostgresServer::start().map_err(boxed)).await?;
        Ok(Postgres { server })
    }
}

impl Form for Postgres {
    fn url(&self) -> String {
        self.server.url()
    }

    fn faults(&self) -> Vec<FaultKind> {
        vec![FaultKind::KillAuthority]
    }

    fn inject(&self, kind: FaultKind, _pick: usize) -> Result<Injected, DeploymentError> {
        match kind {
            FaultKind::KillAuthority => {
                self.server.kill().map_err(boxed)?;
                Ok(Injected {
                    node: Some(format!("postgres 127.0.0.1:{}", self.server.port())),
                    heal: Heal::Restart(0),
                })
            }
            other => Err(not_a_fault_of(other, "PostgreSQL")),
        }
    }

    fn heal(&self, heal: Heal) -> Result<(), DeploymentError> {
        match heal {
            Heal::Restart(_) => self.server.restart().map_err(boxed),
            other => Err(format!("{other:?} does not heal PostgreSQL").into()),
        }
    }
}
