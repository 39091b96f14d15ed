//! etcd: leasehold against, on the same server with the same client library,
//! * the raw pair on a reused lease: a put-if-absent transaction attached to a lease granted
//!   once, then a plain delete (what a hand-written etcd lock does, minus every check);
//! * etcd's own server-side Lock/Unlock RPC (v3lock), on the same kind of reused lease.

use std::sync::Arc;

use async_trait::async_trait;
use etcd_client::{Client, Compare, CompareOp, LockOptions, PutOptions, Txn, TxnOp};
use leasehold::Instrumented;
use leasehold_etcd::EtcdAuthority;

use crate::{BoxError, RawPair, Subject};

/// Long enough for any run; the lease is left to expire afterwards.
const RAW_LEASE_TTL: i64 = 3600;

struct RawTxn {
    client: Client,
    lease: i64,
}

impl std::fmt::Debug for RawTxn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawTxn")
            .field("lease", &self.lease)
            .finish()
    }
}

#[async_trait]
impl RawPair for RawTxn {
    fn name(&self) -> &'static str {
        "raw txn put-if-absent + delete"
    }

    async fn pair(&self, key: &str) -> Result<(), BoxError> {
        let mut kv = self.client.kv_client();
        let take = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key,
                "",
                Some(PutOptions::new().with_lease(self.lease)),
            )]);
        if !kv.txn(take).await?.succeeded() {
            return Err("raw key held".into());
        }
        kv.delete(key, None).await?;
        Ok(())
    }
}

struct LockRpc {
    client: Client,
    lease: i64,
}

impl std::fmt::Debug for LockRpc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockRpc")
            .field("lease", &self.lease)
            .finish()
    }
}

#[async_trait]
impl RawPair for LockRpc {
    fn name(&self) -> &'static str {
        "etcd Lock + Unlock RPC"
    }

    /// Another lock implementation: leasehold, fence included, must be faster.
    fn target(&self) -> f64 {
        1.0
    }

    async fn pair(&self, key: &str) -> Result<(), BoxError> {
        let mut lock = self.client.lock_client();
        let name = format!("{key}/lock-rpc");
        let held = lock
            .lock(name, Some(LockOptions::new().with_lease(self.lease)))
            .await?;
        lock.unlock(held.key()).await?;
        Ok(())
    }
}

pub async fn subject(url: &str) -> Result<Subject, BoxError> {
    let authority = EtcdAuthority::connect(url).await?;
    let client = authority.client().clone();
    let lease = client.lease_client().grant(RAW_LEASE_TTL, None).await?.id();
    Ok(Subject {
        authority: Arc::new(Instrumented::new(Arc::new(authority))),
        raw: vec![
            Box::new(RawTxn {
                client: client.clone(),
                lease,
            }),
            Box::new(LockRpc { client, lease }),
        ],
        targets: true,
    })
}
