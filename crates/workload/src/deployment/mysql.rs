//! MySQL/MariaDB: one MariaDB server from Debian's packages, killed and restarted on the same
//! data (InnoDB crash recovery), as PostgreSQL's form is.

use leasehold_conformance::workload::FaultKind;
use leasehold_servers::MariaDbServer;

use super::{blocking, boxed, not_a_fault_of, DeploymentError, Form, Heal, Injected};

/// One MariaDB server.
pub(super) struct MySql {
    server: MariaDbServer,
}

impl MySql {
    pub(super) async fn start() -> Result<MySql, DeploymentError> {
        let server = blocking(|| MariaDbServer::start().map_err(boxed)).await?;
        Ok(MySql { server })
    }
}

impl Form for MySql {
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
                    node: Some(format!("mariadb 127.0.0.1:{}", self.server.port())),
                    heal: Heal::Restart(0),
                })
            }
            other => Err(not_a_fault_of(other, "MariaDB")),
        }
    }

    fn heal(&self, heal: Heal) -> Result<(), DeploymentError> {
        match heal {
            Heal::Restart(_) => self.server.restart().map_err(boxed),
            other => Err(format!("{other:?} does not heal MariaDB").into()),
        }
    }
}
