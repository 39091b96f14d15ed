//! etcd: leasehold against, on the same server with the same client library (each on a client
//! of its own),
//! * the raw **fenced** minimum on a reused lease: a put-if-absent transaction attached to a
//!   lease granted once (its revision is the fence), then a delete that compares the key's
//!   create revision (what a fence costs the release);
//! * the raw unfenced minimum: the same put-if-absent, then a plain delete;
//! * the fenced minimum again, written as leasehold writes (a `require_leader` client, the owner
//!   token as the value, the write sent from a task of its own), for reference: what those cost;
//! * etcd's own server-side Lock/Unlock RPC (v3lock), on the same kind of reused lease (no
//!   fence is handed to the caller).

use std::sync::Arc;

use async_trait::async_trait;
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, LockOptions, PutOptions, SortOrder,
    SortTarget, Txn, TxnOp,
};
use leasehold::Instrumented;
use leasehold_etcd::EtcdAuthority;

use crate::{Baseline, BoxError, RawPair, ServerOps, Subject};

/// Long enough for any run; the lease is left to expire afterwards.
const RAW_LEASE_TTL: i64 = 3600;

struct RawTxn {
    client: Client,
    lease: i64,
    fenced: bool,
    /// The etcd mutex layout (etcd's concurrency.Mutex, `etcdctl lock`): a contender key under
    /// the lock's prefix, taken only when the prefix is empty.
    layout: bool,
    /// Written as leasehold writes: on a client connected with `require_leader` (so a member cut
    /// off from its leader refuses at once), with the owner token's 32 hex digits as the value
    /// (what lets a client delete its own key after an unanswered write, and peers tell whose it
    /// is), with the read of the holder leasehold's transaction makes when the lock is taken, sent
    /// from a task of its own: what those cost, printed for reference.
    as_leasehold: bool,
}

impl std::fmt::Debug for RawTxn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawTxn")
            .field("lease", &self.lease)
            .field("fenced", &self.fenced)
            .finish()
    }
}

#[async_trait]
impl RawPair for RawTxn {
    fn name(&self) -> &'static str {
        match (self.layout, self.fenced) {
            (true, _) if self.as_leasehold => "raw mutex layout, written as leasehold writes",
            (true, _) => "raw mutex layout: prefix-empty put + delete-if-rev",
            (false, true) => "raw txn put-if-absent + delete-if-rev",
            (false, false) => "raw txn put-if-absent + delete",
        }
    }

    fn baseline(&self) -> Baseline {
        if self.as_leasehold {
            return Baseline::Reference;
        }
        Baseline::Raw {
            fenced: self.fenced,
        }
    }

    async fn pair(&self, key: &str) -> Result<(), BoxError> {
        let mut kv = self.client.kv_client();
        let (prefix, contender) = (format!("{key}/"), format!("{key}/{:x}", self.lease));
        let (compare, key) = if self.layout {
            (
                Compare::create_revision(prefix.as_str(), CompareOp::Equal, 0).with_prefix(),
                contender.as_str(),
            )
        } else {
            (Compare::create_revision(key, CompareOp::Equal, 0), key)
        };
        let value = if self.as_leasehold {
            "0123456789abcdef0123456789abcdef"
        } else {
            ""
        };
        let mut take = Txn::new().when([compare]).and_then([TxnOp::put(
            key,
            value,
            Some(PutOptions::new().with_lease(self.lease)),
        )]);
        if self.as_leasehold {
            // leasehold reads the holder in the same transaction when the lock is taken.
            let oldest = GetOptions::new()
                .with_prefix()
                .with_sort(SortTarget::Create, SortOrder::Ascend)
                .with_limit(1);
            take = take.or_else([TxnOp::get(prefix.as_str(), Some(oldest))]);
        }
        // leasehold sends the write from a task of its own, so that a dropped caller cannot
        // lose its answer (and leave a key behind).
        let taken = if self.as_leasehold {
            let mut kv = kv.clone();
            tokio::spawn(async move { kv.txn(take).await }).await??
        } else {
            kv.txn(take).await?
        };
        if !taken.succeeded() {
            return Err("raw key held".into());
        }
        if self.fenced {
            let fence = taken.header().map(|h| h.revision()).ok_or("no header")?;
            let release = Txn::new()
                .when([Compare::create_revision(key, CompareOp::Equal, fence)])
                .and_then([TxnOp::delete(key, None)]);
            if !kv.txn(release).await?.succeeded() {
                return Err("raw release found another revision".into());
            }
        } else {
            kv.delete(key, None).await?;
        }
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

    fn baseline(&self) -> Baseline {
        Baseline::Peer
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

/// gRPC calls the server handled, from its `/metrics` page (`grpc_server_handled_total`).
struct Rpcs(String);

#[async_trait]
impl ServerOps for Rpcs {
    fn unit(&self) -> &'static str {
        "RPCs"
    }

    async fn count(&self) -> Result<u64, BoxError> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(&self.0).await?;
        stream
            .write_all(b"GET /metrics HTTP/1.0\r\nHost: etcd\r\n\r\n")
            .await?;
        let mut page = String::new();
        stream.read_to_string(&mut page).await?;
        let total: f64 = page
            .lines()
            .filter(|l| l.starts_with("grpc_server_handled_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        Ok(total as u64)
    }
}

pub async fn subject(url: &str) -> Result<Subject, BoxError> {
    let authority = EtcdAuthority::connect(url).await?;
    let endpoints = authority.config().endpoints().to_vec();
    let connect = |options: Option<ConnectOptions>| Client::connect(endpoints.clone(), options);
    let mut raw: Vec<Box<dyn RawPair>> = Vec::new();
    let mut concurrent = None;
    let as_leasehold = || Some(ConnectOptions::new().with_require_leader(true));
    for (fenced, layout, options) in [
        (true, true, None),
        (true, false, None),
        (false, false, None),
        (true, true, as_leasehold()),
        (true, true, None),
    ] {
        let as_leasehold = options.is_some();
        let client = connect(options).await?;
        let lease = client.lease_client().grant(RAW_LEASE_TTL, None).await?.id();
        let pair = RawTxn {
            client,
            lease,
            fenced,
            layout,
            as_leasehold,
        };
        if raw.len() < 4 {
            raw.push(Box::new(pair));
        } else {
            concurrent = Some(Arc::new(pair) as Arc<dyn RawPair>);
        }
    }
    let client = connect(None).await?;
    let lease = client.lease_client().grant(RAW_LEASE_TTL, None).await?.id();
    raw.push(Box::new(LockRpc { client, lease }));
    let metrics = endpoints
        .first()
        .map(|e| e.trim_start_matches("http://").to_string())
        .ok_or("no etcd endpoint")?;
    Ok(Subject {
        authority: Arc::new(Instrumented::new(Arc::new(authority))),
        raw,
        concurrent_raw: concurrent,
        server_ops: Some(Box::new(Rpcs(metrics))),
        targets: true,
        raw_handoff: None,
    })
}
