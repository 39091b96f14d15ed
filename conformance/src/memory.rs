//! The reference authority wired into the suite: a connector and a fault injector.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use leasehold_core::{Authority, ClientOptions, FenceSafety, LockKey, Result};
use leasehold_memory::{MemoryServer, Snapshot};

use crate::context::{Connector, Residue};
use crate::faults::Faults;

/// Makes clients of one [`MemoryServer`].
#[derive(Debug, Clone)]
pub struct MemoryConnector {
    server: MemoryServer,
    options: ClientOptions,
    safety: FenceSafety,
}

impl MemoryConnector {
    /// Clients of `server` with `options`.
    pub fn new(server: MemoryServer, options: ClientOptions) -> Self {
        MemoryConnector {
            server,
            options,
            safety: FenceSafety::Linearizable,
        }
    }

    /// Clients that declare `safety` (to model a backend with an asynchronous standby).
    pub fn declaring(mut self, safety: FenceSafety) -> Self {
        self.safety = safety;
        self
    }
}

#[async_trait]
impl Connector for MemoryConnector {
    async fn connect(&self) -> Result<Arc<dyn Authority>> {
        Ok(Arc::new(
            self.server
                .authority(self.options.clone())
                .declaring(self.safety),
        ))
    }
}

/// How a simulated standby follows the primary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replication {
    /// The standby has every acknowledged write (consensus): a failover loses nothing.
    Synchronous,
    /// The standby stops at the moment the failover begins; what the old primary grants after
    /// that is lost (Redis-style asynchronous replication).
    Asynchronous,
}

/// Faults on a [`MemoryServer`].
#[derive(Debug)]
pub struct MemoryFaults {
    server: MemoryServer,
    replication: Replication,
    standby: Mutex<Option<Snapshot>>,
}

impl MemoryFaults {
    /// Faults on `server`, with a standby that replicates as `replication` says.
    pub fn new(server: MemoryServer, replication: Replication) -> Self {
        MemoryFaults {
            server,
            replication,
            standby: Mutex::new(None),
        }
    }
}

#[async_trait]
impl Faults for MemoryFaults {
    async fn restart(&self) -> Result<()> {
        self.server.restart();
        Ok(())
    }

    async fn pause(&self) -> Result<()> {
        self.server.pause();
        Ok(())
    }

    async fn resume(&self) -> Result<()> {
        self.server.resume();
        Ok(())
    }

    async fn revoke(&self, key: &LockKey) -> Result<()> {
        self.server.revoke(key);
        Ok(())
    }

    async fn slow_replies(&self, delay: Duration) -> Result<()> {
        self.server.slow_replies(delay);
        Ok(())
    }

    async fn begin_failover(&self) -> Result<()> {
        if self.replication == Replication::Asynchronous {
            let snapshot = self.server.unchecked().snapshot();
            *self.standby.lock().unwrap_or_else(|e| e.into_inner()) = Some(snapshot);
        }
        Ok(())
    }

    async fn complete_failover(&self) -> Result<()> {
        let standby = self
            .standby
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(snapshot) = standby {
            self.server.unchecked().restore(snapshot);
        }
        Ok(())
    }
}

/// What is left on a [`MemoryServer`] for a key: a live lease.
#[derive(Debug, Clone)]
pub struct MemoryResidue {
    server: MemoryServer,
}

impl MemoryResidue {
    /// Looks at `server`.
    pub fn new(server: MemoryServer) -> Self {
        MemoryResidue { server }
    }
}

#[async_trait]
impl Residue for MemoryResidue {
    async fn leftovers(&self, key: &LockKey) -> Result<Vec<String>> {
        Ok(self
            .server
            .holder(key)
            .map(|(_, fence)| vec![format!("a live lease with fence {fence}")])
            .unwrap_or_default())
    }
}
