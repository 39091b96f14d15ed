//! One database server, killed with SIGKILL and started again on the same data, so its crash
//! recovery decides what a grant in flight left behind: PostgreSQL alone, and MariaDB alone
//! (the `mysql` form). Both keep the fence counter in the key's row, committed with the grant.

use leasehold_conformance::workload::FaultKind;
use leasehold_servers::{HarnessError, MariaDbServer, PostgresServer};

use super::{blocking, boxed, not_a_fault_of, DeploymentError, Form, Heal, Injected};

/// What the form needs of the server: where it listens, a crash, a restart on its data.
pub(super) trait Server: Send + Sync + 'static {
    /// How the history names the program.
    const NAME: &'static str;
    fn start() -> Result<Self, HarnessError>
    where
        Self: Sized;
    fn url(&self) -> String;
    fn port(&self) -> u16;
    fn kill(&self) -> Result<(), HarnessError>;
    fn restart(&self) -> Result<(), HarnessError>;
}

impl Server for PostgresServer {
    const NAME: &'static str = "postgres";
    fn start() -> Result<Self, HarnessError> {
        PostgresServer::start()
    }
    fn url(&self) -> String {
        PostgresServer::url(self)
    }
    fn port(&self) -> u16 {
        PostgresServer::port(self)
    }
    fn kill(&self) -> Result<(), HarnessError> {
        PostgresServer::kill(self)
    }
    fn restart(&self) -> Result<(), HarnessError> {
        PostgresServer::restart(self)
    }
}

impl Server for MariaDbServer {
    const NAME: &'static str = "mariadb";
    fn start() -> Result<Self, HarnessError> {
        MariaDbServer::start()
    }
    fn url(&self) -> String {
        MariaDbServer::url(self)
    }
    fn port(&self) -> u16 {
        MariaDbServer::port(self)
    }
    fn kill(&self) -> Result<(), HarnessError> {
        MariaDbServer::kill(self)
    }
    fn restart(&self) -> Result<(), HarnessError> {
        MariaDbServer::restart(self)
    }
}

/// One server of kind `S`.
pub(super) struct OneServer<S> {
    server: S,
}

impl<S: Server> OneServer<S> {
    pub(super) async fn start() -> Result<OneServer<S>, DeploymentError> {
        let server = blocking(|| S::start().map_err(boxed)).await?;
        Ok(OneServer { server })
    }
}

impl<S: Server> Form for OneServer<S> {
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
                    node: Some(format!("{} 127.0.0.1:{}", S::NAME, self.server.port())),
                    heal: Heal::Restart(0),
                })
            }
            other => Err(not_a_fault_of(other, S::NAME)),
        }
    }

    fn heal(&self, heal: Heal) -> Result<(), DeploymentError> {
        match heal {
            Heal::Restart(_) => self.server.restart().map_err(boxed),
            other => Err(format!("{other:?} does not heal {}", S::NAME).into()),
        }
    }
}
