//! The server the runner starts for the protected resource, and the faults it can suffer.

use std::sync::Arc;
use std::time::Duration;

use leasehold_conformance::workload::FaultKind;
use leasehold_servers::object_stores::BUCKET;
use leasehold_servers::{AzuriteServer, PostgresServer};

use crate::resource::{self, ResourceError, ResourceKind};
use crate::resource_faults;

/// How long a stall keeps the store stopped: past the clients' request timeout, so that every
/// request sent meanwhile fails at its client without an answer.
const STALL: Duration = resource::REQUEST_TIMEOUT.saturating_mul(2);

/// A resource server the runner started (and so may fault).
#[derive(Debug, Clone)]
pub enum ResourceServer {
    /// PostgreSQL, holding the sets in a table.
    Postgres(Arc<PostgresServer>),
    /// Azurite, holding one object per key behind the object gate.
    Azurite(Arc<AzuriteServer>),
}

impl ResourceServer {
    /// Starts a server for `kind`.
    pub async fn start(kind: ResourceKind) -> Result<ResourceServer, ResourceError> {
        Ok(match kind {
            ResourceKind::Postgres => ResourceServer::Postgres(Arc::new(
                tokio::task::spawn_blocking(PostgresServer::start).await??,
            )),
            ResourceKind::Azurite => ResourceServer::Azurite(Arc::new(
                tokio::task::spawn_blocking(AzuriteServer::start).await??,
            )),
        })
    }

    /// The URL workers reach the resource by.
    pub fn url(&self) -> String {
        match self {
            ResourceServer::Postgres(server) => server.url(),
            ResourceServer::Azurite(server) => {
                format!(
                    "{}://127.0.0.1:{}/{BUCKET}",
                    resource::SCHEME,
                    server.port()
                )
            }
        }
    }

    /// How the history names it.
    pub fn node(&self) -> String {
        match self {
            ResourceServer::Postgres(server) => format!("resource 127.0.0.1:{}", server.port()),
            ResourceServer::Azurite(server) => {
                format!("resource azurite 127.0.0.1:{}", server.port())
            }
        }
    }

    /// The faults it can suffer: both make writes of unknown outcome and must not lose what was
    /// acknowledged.
    pub fn faults(&self) -> [FaultKind; 2] {
        match self {
            // A connection killed mid-write: PostgreSQL rolls the write back.
            ResourceServer::Postgres(_) => [
                FaultKind::KillResourceConnection,
                FaultKind::RestartResource,
            ],
            // A store that stops answering: the write may still be applied after its client
            // gave up.
            ResourceServer::Azurite(_) => [FaultKind::StallResource, FaultKind::RestartResource],
        }
    }

    /// Restarts the server on its data and waits until it serves. Azurite is stopped cleanly
    /// (it saves its metadata every few seconds only, so a crash would test the emulator's
    /// persistence, not the store it stands for).
    pub async fn restart(&self) -> Result<(), ResourceError> {
        match self {
            ResourceServer::Postgres(server) => resource_faults::restart(server.clone()).await,
            ResourceServer::Azurite(server) => {
                let server = server.clone();
                tokio::task::spawn_blocking(move || server.restart()).await??;
                Ok(())
            }
        }
    }

    /// Stops the store (`SIGSTOP`) past its clients' request timeout and lets it go on; what it
    /// says about the stall for the history.
    pub async fn stall(&self) -> Result<String, ResourceError> {
        let ResourceServer::Azurite(server) = self else {
            return Err("only an object store's resource is stalled".into());
        };
        server.pause()?;
        tokio::time::sleep(STALL).await;
        server.resume()?;
        Ok(format!(
            "stopped for {STALL:?}, past the clients' {:?} request timeout",
            resource::REQUEST_TIMEOUT
        ))
    }
}
