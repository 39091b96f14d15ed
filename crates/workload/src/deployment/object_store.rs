//! An object store as the authority: Azurite (Azure Blob) with its data on disk, the leases
//! objects under a prefix of one container. Two faults: the store paused (`SIGSTOP`), so
//! requests time out or answer late and leases run out by the store's clock while no holder
//! can renew; and the store stopped cleanly and started again on its data. Not a crash:
//! Azurite keeps its metadata in memory between saves, so a `SIGKILL` would lose objects Azure
//! keeps, and fences would go back for a reason of the emulator's.
//!
//! Credentials never go in a URL: the workers read Azurite's well-known development key from
//! the environment ([`ENV`]), which `leasehold-workload` sets for this form.

use leasehold_conformance::workload::FaultKind;
use leasehold_servers::object_stores::{AZURITE_ACCOUNT, AZURITE_KEY, BUCKET};
use leasehold_servers::AzuriteServer;

use super::{blocking, boxed, not_a_fault_of, DeploymentError, Form, Heal, Injected};

/// What the store's client reads from the environment: the account's key (Azurite's public
/// development key, the same in every install).
pub const ENV: [(&str, &str); 1] = [("AZURE_STORAGE_ACCOUNT_KEY", AZURITE_KEY)];

/// One Azurite holding the leases.
pub(super) struct ObjectStoreForm {
    server: AzuriteServer,
}

impl ObjectStoreForm {
    pub(super) async fn start() -> Result<ObjectStoreForm, DeploymentError> {
        let server = blocking(|| AzuriteServer::start().map_err(boxed)).await?;
        Ok(ObjectStoreForm { server })
    }

    fn node(&self) -> String {
        format!("azurite 127.0.0.1:{}", self.server.port())
    }
}

impl Form for ObjectStoreForm {
    fn url(&self) -> String {
        // The endpoint's port is what a worker's cut drops (`worker_cut::authority_ports`).
        let endpoint: String =
            url::form_urlencoded::byte_serialize(self.server.url().as_bytes()).collect();
        format!(
            "az://{BUCKET}/workload?account_name={AZURITE_ACCOUNT}&endpoint={endpoint}\
             &allow_http=true&timeout_ms=1000"
        )
    }

    fn faults(&self) -> Vec<FaultKind> {
        vec![FaultKind::PauseAuthority, FaultKind::RestartAuthority]
    }

    fn inject(&self, kind: FaultKind, _pick: usize) -> Result<Injected, DeploymentError> {
        match kind {
            FaultKind::PauseAuthority => {
                self.server.pause().map_err(boxed)?;
                Ok(Injected {
                    node: Some(self.node()),
                    heal: Heal::Resume(0),
                })
            }
            FaultKind::RestartAuthority => {
                self.server.stop().map_err(boxed)?;
                Ok(Injected {
                    node: Some(self.node()),
                    heal: Heal::Restart(0),
                })
            }
            other => Err(not_a_fault_of(other, "an object store")),
        }
    }

    fn heal(&self, heal: Heal) -> Result<(), DeploymentError> {
        match heal {
            Heal::Resume(_) => self.server.resume().map_err(boxed),
            // `restart` stops what runs (nothing, after `stop`) and waits until it serves.
            Heal::Restart(_) => self.server.restart().map_err(boxed),
            other => Err(format!("{other:?} does not heal an object store").into()),
        }
    }
}
