//! What a scenario gets: clients, faults, a resource, and the timing derived from the TTL.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold_core::{
    Authority, Capabilities, FencedRegister, FencedResource, Instant, LockKey, OwnerToken,
};

use crate::faults::{Faults, NoFaults};
use crate::verdict::Failure;

/// Makes new clients of the authority under test. Each call is a separate client, as a separate
/// process would have: its own connection and, where the backend has them, its own session.
#[async_trait]
pub trait Connector: Send + Sync {
    /// A new client.
    async fn connect(&self) -> leasehold_core::Result<Arc<dyn Authority>>;
}

/// Makes a fresh, empty protected resource for a scenario.
#[async_trait]
pub trait ResourceFactory: Send + Sync {
    /// A resource that has accepted no fence yet.
    async fn resource(&self) -> leasehold_core::Result<Arc<dyn FencedResource>>;
}

/// The default resource: an in-memory [`FencedRegister`].
#[derive(Debug, Default, Clone, Copy)]
pub struct InMemoryResources;

#[async_trait]
impl ResourceFactory for InMemoryResources {
    async fn resource(&self) -> leasehold_core::Result<Arc<dyn FencedResource>> {
        Ok(Arc::new(FencedRegister::new()))
    }
}

/// Lists what a backend keeps at the authority for a key beyond what it keeps on purpose (a fence
/// counter, a lease-table row): contender keys, nodes or rows of ours. Scenarios that drop
/// futures check that nothing is left a TTL after the last holder released.
#[async_trait]
pub trait Residue: Send + Sync {
    /// A description of each leftover for `key`; empty when nothing is left.
    async fn leftovers(&self, key: &LockKey) -> leasehold_core::Result<Vec<String>>;
}

/// Everything a scenario runs against.
#[derive(Clone)]
pub struct Context {
    connector: Arc<dyn Connector>,
    faults: Arc<dyn Faults>,
    resources: Arc<dyn ResourceFactory>,
    residue: Option<Arc<dyn Residue>>,
    capabilities: Capabilities,
    ttl: Duration,
    idle_cleanup: Option<Duration>,
    run: String,
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("capabilities", &self.capabilities)
            .field("ttl", &self.ttl)
            .field("run", &self.run)
            .finish_non_exhaustive()
    }
}

impl Context {
    /// A context over `connector`; the scenarios' TTL is the backend's shortest valid TTL of at
    /// least 500 ms. Keys are namespaced by a random run id, so runs against a shared server do
    /// not see each other.
    pub async fn new(connector: Arc<dyn Connector>) -> leasehold_core::Result<Self> {
        let probe = connector.connect().await?;
        let capabilities = probe.capabilities().clone();
        let ttl = capabilities.ttl.at_least(Duration::from_millis(500));
        let run = OwnerToken::generate()?.to_hex()[..12].to_string();
        Ok(Context {
            connector,
            faults: Arc::new(NoFaults),
            resources: Arc::new(InMemoryResources),
            residue: None,
            capabilities,
            ttl,
            idle_cleanup: None,
            run,
        })
    }

    /// Offers fault injection to the scenarios that need it.
    pub fn with_faults(mut self, faults: Arc<dyn Faults>) -> Self {
        self.faults = faults;
        self
    }

    /// Uses real protected resources (for example a PostgreSQL table) instead of the in-memory
    /// register.
    pub fn with_resources(mut self, resources: Arc<dyn ResourceFactory>) -> Self {
        self.resources = resources;
        self
    }

    /// Lets the cancellation scenarios look for contender state left at the authority.
    pub fn with_residue(mut self, residue: Arc<dyn Residue>) -> Self {
        self.residue = Some(residue);
        self
    }

    /// How long a key must sit idle (released, nobody waiting) before the backend's own cleanup
    /// has certainly run (ZooKeeper reaping an empty container parent, say). The idle-fence
    /// scenario waits this long; without it the scenario waits two TTLs.
    pub fn with_idle_cleanup(mut self, idle: Duration) -> Self {
        self.idle_cleanup = Some(idle);
        self
    }

    /// The residue lister, when the backend's harness offers one.
    pub fn residue(&self) -> Option<&dyn Residue> {
        self.residue.as_deref()
    }

    /// How long the idle-fence scenario waits.
    pub fn idle_cleanup(&self) -> Duration {
        self.idle_cleanup
            .unwrap_or(self.ttl * 2 + self.capabilities.expiry_slack)
    }

    /// Overrides the scenarios' TTL (it must be valid for the backend).
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// The backend's declared capabilities.
    pub fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    /// The TTL scenarios use.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// How much later than a TTL an expiry may be observed: half the TTL (scheduling and
    /// network noise on a loaded machine) plus the backend's declared expiry slack.
    pub fn tolerance(&self) -> Duration {
        (self.ttl / 2).max(Duration::from_millis(250)) + self.capabilities.expiry_slack
    }

    /// A new client.
    pub async fn connect(&self) -> Result<Arc<dyn Authority>, Failure> {
        self.connector
            .connect()
            .await
            .map_err(|e| Failure::new(format!("connect a client: {e}")))
    }

    /// The fault injector.
    pub fn faults(&self) -> &dyn Faults {
        &*self.faults
    }

    /// A fresh protected resource.
    pub async fn resource(&self) -> Result<Arc<dyn FencedResource>, Failure> {
        self.resources
            .resource()
            .await
            .map_err(|e| Failure::new(format!("create a resource: {e}")))
    }

    /// A key unique to this run and `name`.
    pub fn key(&self, name: &str) -> LockKey {
        // The run id is hex and scenario names are identifiers, so this is always a valid key.
        LockKey::new(format!("conformance/{}/{name}", self.run))
            .unwrap_or_else(|e| panic!("scenario key for {name}: {e}"))
    }
}

/// Polls `probe` every `every` until it yields a value or `within` has passed since `start`.
pub async fn poll_until<T, F, Fut>(
    start: Instant,
    within: Duration,
    every: Duration,
    mut probe: F,
) -> Result<Option<T>, Failure>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>, Failure>>,
{
    loop {
        if let Some(v) = probe().await? {
            return Ok(Some(v));
        }
        if start.elapsed() >= within {
            return Ok(None);
        }
        tokio::time::sleep(every).await;
    }
}
