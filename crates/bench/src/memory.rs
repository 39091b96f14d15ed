//! The reference authority, against its own unchecked map operations.

use async_trait::async_trait;
use leasehold::{LockKey, OwnerToken};
use leasehold_memory::MemoryServer;

use std::sync::Arc;

use crate::{Baseline, BoxError, RawPair, Subject, TTL};

#[derive(Debug)]
struct Raw(MemoryServer);

#[async_trait]
impl RawPair for Raw {
    fn name(&self) -> &'static str {
        "raw map insert + remove"
    }

    fn baseline(&self) -> Baseline {
        // The unchecked grant still bumps the fence counter.
        Baseline::Raw { fenced: true }
    }

    async fn pair(&self, key: &str) -> Result<(), BoxError> {
        let key = LockKey::new(key)?;
        let ops = self.0.unchecked();
        ops.grant(&key, OwnerToken::from_bytes([7; 16]), TTL);
        ops.remove(&key);
        Ok(())
    }
}

pub async fn subject() -> Result<Subject, BoxError> {
    let authority = leasehold::connect("memory://bench").await?;
    Ok(Subject {
        authority,
        raw: vec![Box::new(Raw(MemoryServer::named("bench")))],
        concurrent_raw: Some(Arc::new(Raw(MemoryServer::named("bench")))),
        server_ops: None,
        targets: false,
        raw_handoff: None,
    })
}
