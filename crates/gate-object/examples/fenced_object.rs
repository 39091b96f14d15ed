//! A ledger object behind the object gate, on S3 (moto) or Azure Blob (Azurite): a holder pauses
//! past its lease, the next holder claims the object, and the paused holder's late write is
//! refused, by the store's own conditional write on the version the gate decided on.
//!
//! ```text
//! docker compose up -d --wait moto azurite     # docker-compose.yml at the repository's root
//! cargo run -p leasehold-gate-object --features aws --example fenced_object -- s3
//! cargo run -p leasehold-gate-object --features azure --example fenced_object -- azure
//! ```
//!
//! `s3` talks to `LEASEHOLD_S3_ENDPOINT`, by default docker-compose.yml's moto at
//! `http://127.0.0.1:5000` (bucket `leasehold`, any credentials); `azure` to
//! `LEASEHOLD_AZURITE_ENDPOINT`, by default `http://127.0.0.1:10000/devstoreaccount1` (Azurite's
//! development account and key, container `leasehold`). The leases come from the in-memory
//! authority: the gate sees only their fences, so any authority works the same.
//!
//! Exits non-zero unless the late write was refused and the object holds the new holder's
//! content under its fence.

use std::fmt::Display;
use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold_core::{Authority, Guarded, LockKey, OwnerToken};
use leasehold_gate_object::ObjectGate;
use leasehold_memory::MemoryAuthority;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The lease's time to live: the first holder's lease runs out while it is paused.
const TTL: Duration = Duration::from_millis(300);

/// What happened, for a caller to check.
#[derive(Debug)]
pub struct Outcome {
    /// The fence of the holder that paused.
    pub stale_fence: u64,
    /// The fence of the holder that took over.
    pub fence: u64,
    /// The newest fence the object named when the gate refused the late write.
    pub refused_by: u64,
    /// The object's fence at the end.
    pub final_fence: u64,
    /// The object's content at the end.
    pub content: String,
}

/// An S3 client for moto at `endpoint` (`http://127.0.0.1:5000`), bucket `leasehold`. The gate needs S3's
/// conditional writes (`If-Match` on `PutObject`), which object_store sends only when told to.
#[cfg(feature = "aws")]
pub fn s3(endpoint: &str) -> Result<Arc<dyn ObjectStore>, BoxError> {
    use object_store::aws::{AmazonS3Builder, S3ConditionalPut};
    let store = AmazonS3Builder::new()
        .with_endpoint(endpoint)
        .with_allow_http(true)
        .with_bucket_name("leasehold")
        .with_region("us-east-1")
        .with_access_key_id("leasehold")
        .with_secret_access_key("leasehold")
        .with_conditional_put(S3ConditionalPut::ETagMatch)
        .build()?;
    Ok(Arc::new(store))
}

/// An Azure Blob client for Azurite's development account at `endpoint`
/// (`http://127.0.0.1:10000/devstoreaccount1`), with its published key, container `leasehold`.
#[cfg(feature = "azure")]
pub fn azure(endpoint: &str) -> Result<Arc<dyn ObjectStore>, BoxError> {
    use object_store::azure::MicrosoftAzureBuilder;
    const ACCOUNT: &str = "devstoreaccount1";
    const KEY: &str =
        "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";
    let store = MicrosoftAzureBuilder::new()
        .with_endpoint(endpoint.to_string())
        .with_allow_http(true)
        .with_account(ACCOUNT)
        .with_access_key(KEY)
        .with_container_name("leasehold")
        .build()?;
    Ok(Arc::new(store))
}

fn say(start: Instant, who: &str, what: impl Display) {
    println!("[{:>6.0?}] {who:<8} {what}", start.elapsed());
}

/// The story in `store`, with leases from `authority`: holder-1 takes the lease and pauses past
/// it; holder-2 takes over and claims the ledger object; holder-1's late write is refused;
/// holder-2 writes. An error unless the store refused the late write and keeps holder-2's.
pub async fn run(
    authority: &dyn Authority,
    store: Arc<dyn ObjectStore>,
) -> Result<Outcome, BoxError> {
    let token = OwnerToken::generate()?.to_hex();
    let ledger = Path::from(format!("gate-example/{token}/ledger.json"));
    let key = LockKey::new(format!("ledger:{token}"))?;
    let gate = ObjectGate::new(store.clone());
    let start = Instant::now();

    let first = authority
        .try_acquire(&key, TTL)
        .await?
        .ok_or("the ledger's lease is held by someone else")?;
    say(
        start,
        "holder-1",
        format!(
            "holds the lease with fence {}, and pauses before writing",
            first.fence()
        ),
    );

    // holder-1 is paused (a GC pause, a stopped VM): its lease runs out, and holder-2 gets it.
    let second = authority.acquire(&key, TTL, Duration::from_secs(5)).await?;
    say(
        start,
        "holder-2",
        format!(
            "holds the lease with fence {} (holder-1's ran out)",
            second.fence()
        ),
    );
    match gate.claim(&ledger, second.fence()).await? {
        Guarded::Accepted => say(
            start,
            "holder-2",
            format!("claimed {ledger}: from now on it refuses every older fence"),
        ),
        other => return Err(format!("holder-2's claim was refused: {other:?}").into()),
    }

    // holder-1 wakes up and writes, believing it still holds the lease.
    let late = gate
        .write(&ledger, first.fence(), br#"{"paid_by":"holder-1"}"#)
        .await?;
    let refused_by = match late {
        Guarded::Stale { newest } => {
            say(
                start,
                "holder-1",
                format!(
                    "write REFUSED: the object has seen fence {newest} > {}",
                    first.fence()
                ),
            );
            newest
        }
        Guarded::Accepted => {
            return Err(format!(
                "holder-1's late write with fence {} was accepted",
                first.fence()
            )
            .into())
        }
    };

    match gate
        .write(&ledger, second.fence(), br#"{"paid_by":"holder-2"}"#)
        .await?
    {
        Guarded::Accepted => say(start, "holder-2", "wrote the ledger"),
        other => return Err(format!("holder-2's write was refused: {other:?}").into()),
    }
    let _ = authority.release(&second).await?;

    let stored = gate
        .read(&ledger)
        .await?
        .ok_or("the ledger object is missing")?;
    let content = String::from_utf8_lossy(&stored.content).into_owned();
    println!("\n{ledger}: {content}, fence {}", stored.fence);
    // A store's bucket outlives the run.
    store.delete(&ledger).await?;
    if content != r#"{"paid_by":"holder-2"}"# || stored.fence != second.fence().value() {
        return Err(format!(
            "the ledger should hold holder-2's write under fence {}",
            second.fence()
        )
        .into());
    }
    println!("written once, by the holder that claimed it.");
    Ok(Outcome {
        stale_fence: first.fence().value(),
        fence: second.fence().value(),
        refused_by,
        final_fence: stored.fence,
        content,
    })
}

/// `name`'s value, or `default` when it is unset or empty.
#[allow(dead_code)] // used by no store when built without aws and azure
fn env_or(name: &str, default: &str) -> String {
    std::env::var(name)
        .ok()
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| default.to_string())
}

/// The store the command line names, each behind its feature.
fn store(which: &str) -> Result<Arc<dyn ObjectStore>, BoxError> {
    match which {
        #[cfg(feature = "aws")]
        "s3" => s3(&env_or("LEASEHOLD_S3_ENDPOINT", "http://127.0.0.1:5000")),
        #[cfg(feature = "azure")]
        "azure" => azure(&env_or(
            "LEASEHOLD_AZURITE_ENDPOINT",
            "http://127.0.0.1:10000/devstoreaccount1",
        )),
        other => Err(format!(
            "usage: fenced_object s3 (built with --features aws) | azure (built with --features \
             azure), not {other:?}"
        )
        .into()),
    }
}

#[allow(dead_code)]
#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), BoxError> {
    let which = std::env::args().nth(1).unwrap_or_default();
    run(&MemoryAuthority::standalone(), store(&which)?).await?;
    Ok(())
}
