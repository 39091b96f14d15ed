//! A lock holder that can be frozen between its validity check and its write: the child process
//! of the cluster test `a_paused_holder_process_is_fenced_out`, and a small picture of a guarded
//! etcd write.
//!
//! ```text
//! paused_holder <etcd url> <go file>
//! ```
//! It takes the lock `paused/holder`, checks its lease, prints `HELD <fence>`, waits until the
//! `go` file exists (the test freezes the process meanwhile, with SIGSTOP), then writes
//! `resources/paused` in one transaction guarded by the lock key's create revision, and prints
//! `WROTE <applied>` and `VALID <lease still valid>`.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Txn, TxnOp};
use leasehold_core::{Lease, LeaseOptions, LockKey};
use leasehold_etcd::guarded::still_holds;
use leasehold_etcd::EtcdAuthority;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), BoxError> {
    let mut args = std::env::args().skip(1);
    let (url, go) = match (args.next(), args.next()) {
        (Some(url), Some(go)) => (url, std::path::PathBuf::from(go)),
        _ => return Err("usage: paused_holder <etcd url> <go file>".into()),
    };
    let authority = Arc::new(EtcdAuthority::connect(&url).await?);
    let key = LockKey::new("paused/holder")?;
    let ttl = Duration::from_secs(1);
    let lease = Lease::acquire(authority.clone(), &key, ttl, ttl, LeaseOptions::default()).await?;
    // The check right before the side effect passes...
    lease.ensure_valid()?;
    println!("HELD {}", lease.fence().raw());
    // ...and then the process is frozen before the write (the test sends SIGSTOP).
    while !go.exists() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let txn = Txn::new()
        .when([still_holds(lease.grant())?])
        .and_then([TxnOp::put("resources/paused", "child", None)]);
    let wrote = authority.client().kv_client().txn(txn).await?;
    println!("WROTE {}", wrote.succeeded());
    println!("VALID {}", lease.ensure_valid().is_ok());
    Ok(())
}
