//! # leasehold-gate-object
//!
//! The resource side of a lease, for objects in an object store (S3, Google Cloud Storage,
//! Azure Blob, or anything else behind the [`object_store`] crate's [`ObjectStore`]): a
//! **gate** that refuses writes carrying a fence older than one the object has already seen,
//! through the store's own compare-and-set.
//!
//! A lease decides who may *try* to write an object; it cannot stop a holder that paused past
//! its lease from writing late. The object can, if every write goes through the gate:
//!
//! * the object keeps the greatest fence that wrote it, in a one-line header in front of the
//!   content (`leasehold-fence:42\n`, see [`FENCE_HEADER`] for why not metadata);
//! * a write reads the object (fence, content and version), refuses with
//!   [`Guarded::Stale`] if the object's fence is greater, and otherwise writes with
//!   [`PutMode::Update`] on the version it read
//!   ([`PutMode::Create`] when there was no object);
//! * if someone wrote in between, the store refuses that conditional write (a precondition
//!   failure), and the gate reads again and decides again, a bounded number of times.
//!
//! So a stale write is refused by the store's compare-and-set, never by a read-then-write: the
//! decision holds for exactly the version it was made on. [`ObjectGate::claim`] raises the
//! fence without changing the content, which a new holder calls first, so that a former
//! holder's late write that has not reached the store yet is refused when it does.
//!
//! ```no_run
//! # async fn pay(store: std::sync::Arc<dyn object_store::ObjectStore>, fence: leasehold_core::Fence)
//! # -> leasehold_core::Result<()> {
//! use leasehold_core::Guarded;
//! use leasehold_gate_object::ObjectGate;
//! use object_store::path::Path;
//!
//! let gate = ObjectGate::new(store);
//! let ledger = Path::from("ledgers/inv_72.json");
//! match gate.write(&ledger, fence, br#"{"state":"paid"}"#).await? {
//!     Guarded::Accepted => { /* written under our fence */ }
//!     Guarded::Stale { newest } => { /* a newer holder (fence {newest}) wrote: abandon */ }
//! }
//! # Ok(()) }
//! ```
//!
//! What the stores promise, and what was tested against which server:
//!
//! | store | feature | compare-and-set | tested against |
//! |---|---|---|---|
//! | S3 | `aws` | `If-Match` / `If-None-Match: *` on `PutObject` (AWS since 2024) | moto's server mode |
//! | Google Cloud Storage | `gcp` | `x-goog-if-generation-match` | fake-gcs-server (see the README) |
//! | Azure Blob | `azure` | `If-Match` / `If-None-Match: *` | Azurite |
//! | in memory | none | [`InMemory`](object_store::memory::InMemory)'s own | in process |
//! | local filesystem | none | none: `PutMode::Update` is not implemented | refused with an error |
//!
//! An S3-compatible store without conditional writes cannot be gated: the write fails with a
//! permanent error rather than falling back to an unconditional put.
//!
//! [`FencedObject`] is one object as a [`FencedResource`](leasehold_core::FencedResource),
//! which the resource suite in `leasehold-conformance` runs against each server.
#![deny(missing_docs)]

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{telemetry, Error, Fence, Guarded, Result};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, UpdateVersion};
use rand::Rng;

mod error;
mod format;
mod object;

pub use error::{map_error, map_error_for, redact};
pub use format::FENCE_HEADER;
pub use object::FencedObject;

/// How many times a write or claim reads and decides again after someone else wrote in
/// between, unless [`ObjectGate::with_attempts`] says otherwise.
pub const DEFAULT_ATTEMPTS: u32 = 32;

/// The longest pause between two attempts (each pause is drawn at random up to a bound that
/// doubles from 5 ms), so contending writers spread out.
const MAX_BACKOFF: Duration = Duration::from_millis(100);

/// The `resource` label of the rejections this gate counts
/// (`leasehold_fence_rejections_total`).
pub const REJECTED_BY: &str = "object_store";

/// An object as the gate read it: its fence, its content and the version the store gave it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FencedContent {
    /// The greatest fence that has claimed or written the object.
    pub fence: u64,
    /// The content, without the fence header.
    pub content: Vec<u8>,
    /// The store's version of the object (ETag, and a version or generation where the store
    /// has one): what a conditional write compares.
    pub version: UpdateVersion,
}

/// A fence gate on an object store: every write and claim is a conditional put on the version
/// the decision was made on.
#[derive(Clone, Debug)]
pub struct ObjectGate {
    store: Arc<dyn ObjectStore>,
    attempts: u32,
}

impl ObjectGate {
    /// A gate on `store` that tries [`DEFAULT_ATTEMPTS`] times under contention.
    pub fn new(store: Arc<dyn ObjectStore>) -> Self {
        ObjectGate {
            store,
            attempts: DEFAULT_ATTEMPTS,
        }
    }

    /// Reads and decides at most `attempts` times (at least once) when other writers keep
    /// changing the object in between; then the call fails with a retryable error.
    pub fn with_attempts(mut self, attempts: u32) -> Self {
        self.attempts = attempts.max(1);
        self
    }

    /// The store behind the gate.
    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// The object at `path` (`None` if there is none); an error if it was not written by the
    /// gate.
    pub async fn read(&self, path: &Path) -> Result<Option<FencedContent>> {
        let got = match self.store.get(path).await {
            Ok(got) => got,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(map_error(e, "read", path.as_ref())),
        };
        let version = UpdateVersion {
            e_tag: got.meta.e_tag.clone(),
            version: got.meta.version.clone(),
        };
        let body = got
            .bytes()
            .await
            .map_err(|e| map_error(e, "read", path.as_ref()))?;
        let (fence, content) = format::decode(path.as_ref(), &body)?;
        Ok(Some(FencedContent {
            fence,
            content: content.to_vec(),
            version,
        }))
    }

    /// Writes `content` to `path` under `fence`, unless the object has seen a greater fence
    /// (then [`Guarded::Stale`], and nothing is written). Creates the object if there is none.
    pub async fn write(&self, path: &Path, fence: Fence, content: &[u8]) -> Result<Guarded> {
        self.guarded(path, fence, Some(content)).await
    }

    /// Raises the fence of the object at `path` to `fence` and keeps its content, unless it has
    /// seen a greater fence ([`Guarded::Stale`]). An object whose fence already is `fence` is
    /// left as it is; a missing object is created with empty content, so the fence is there
    /// before the first write.
    pub async fn claim(&self, path: &Path, fence: Fence) -> Result<Guarded> {
        self.guarded(path, fence, None).await
    }

    /// One decision per attempt on the version just read; `content` `None` is a claim.
    async fn guarded(&self, path: &Path, fence: Fence, content: Option<&[u8]>) -> Result<Guarded> {
        let fence = fence.value();
        for attempt in 0..self.attempts {
            if attempt > 0 {
                backoff(attempt).await;
            }
            let current = self.read(path).await?;
            let (mode, keep) = match current {
                Some(c) if c.fence > fence => {
                    telemetry::fence_rejected(REJECTED_BY, fence, c.fence);
                    return Ok(Guarded::Stale { newest: c.fence });
                }
                // Already claimed at this fence: the claim holds as of the read.
                Some(c) if content.is_none() && c.fence == fence => return Ok(Guarded::Accepted),
                Some(c) => (PutMode::Update(c.version), c.content),
                None => (PutMode::Create, Vec::new()),
            };
            let updating = matches!(mode, PutMode::Update(_));
            let body = format::encode(fence, content.unwrap_or(&keep));
            let options = PutOptions {
                mode,
                ..PutOptions::default()
            };
            match self
                .store
                .put_opts(path, PutPayload::from(body), options)
                .await
            {
                Ok(_) => return Ok(Guarded::Accepted),
                // Someone wrote (or created, or deleted) the object since the read: decide again
                // on what is there now. A create that finds nothing is a missing bucket instead.
                Err(
                    object_store::Error::Precondition { .. }
                    | object_store::Error::AlreadyExists { .. },
                ) => continue,
                Err(object_store::Error::NotFound { .. }) if updating => continue,
                Err(object_store::Error::NotImplemented { .. }) => {
                    return Err(Error::Backend {
                        backend: "object gate",
                        message: format!(
                            "the store {} cannot write {path} conditionally (no \
                             PutMode::Create/Update), so it cannot refuse a stale fence",
                            error::redact(&self.store.to_string())
                        ),
                        retryable: false,
                        source: None,
                    })
                }
                Err(e) => return Err(map_error(e, "conditional write of", path.as_ref())),
            }
        }
        Err(Error::Unavailable {
            backend: "object gate",
            message: format!(
                "{path} changed under every one of {} conditional writes in a row; try again",
                self.attempts
            ),
            source: None,
        })
    }
}

/// A random pause up to 5 ms doubled `attempt - 1` times, at most [`MAX_BACKOFF`].
async fn backoff(attempt: u32) {
    let bound = Duration::from_millis(5)
        .saturating_mul(1u32 << attempt.saturating_sub(1).min(16))
        .min(MAX_BACKOFF);
    let pause = rand::rng().random_range(Duration::ZERO..=bound);
    tokio::time::sleep(pause).await;
}
