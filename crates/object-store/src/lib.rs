//! # leasehold-object-store
//!
//! A leasehold [`Authority`](leasehold_core::Authority) on the object store an application
//! already has: S3, Azure Blob Storage or Google Cloud Storage, through the [`object_store`]
//! crate. No server to run: the store's own conditional writes decide who holds a key.
//!
//! * **One object per key**, `{prefix}/{key}`, never deleted, so the fence survives release.
//!   Its body is a small JSON record: held or free, the holder's owner token, the fence, the
//!   TTL, a write sequence number that every write raises, and the proclaimed value.
//! * **Every change is a conditional put**: `PutMode::Create` for the first grant,
//!   `PutMode::Update` on the version read for every later one. The store's compare-and-set is
//!   the linearization point; a takeover raises the fence in the same write that takes the key.
//! * **Expiry by the store's clock only**: a held object is over once the store's now, read
//!   through a clock object, is at least its last-modified time plus the TTL plus one second
//!   (the store's times are whole seconds). Why that is safe is derived in `store_clock` and in
//!   [docs/object-store.md](https://github.com/leasehold/leasehold/blob/main/docs/object-store.md).
//! * **Renew and release** are conditional puts over the holder's own last write: a conflict
//!   means someone else wrote (the lease is lost at once) unless the object still names the
//!   holder (a write of its own whose answer was lost).
//! * **Waiting polls**, with jitter and a floor on the interval ([`POLL_FLOOR`]): object stores
//!   bill per request.
//!
//! | store | feature | URL | conditional writes | tested against |
//! |---|---|---|---|---|
//! | S3 | `aws` | `s3://bucket/prefix` | `If-None-Match: *`, `If-Match` (AWS since 2024) | moto's server mode |
//! | Azure Blob | `azure` | `az://container/prefix` | `If-None-Match: *`, `If-Match` | Azurite |
//! | GCS | `gcp` | `gs://bucket/prefix` | generation preconditions | untested: fake-gcs-server ignores preconditions |
//!
//! ```no_run
//! # async fn run() -> leasehold_core::Result<()> {
//! use std::time::Duration;
//! use leasehold_core::{Authority, LockKey};
//! use leasehold_object_store::ObjectStoreAuthority;
//!
//! let locks = ObjectStoreAuthority::connect("s3://my-bucket/locks?region=eu-west-1").await?;
//! let key = LockKey::new("invoice:inv_72")?;
//! if let Some(grant) = locks.try_acquire(&key, Duration::from_secs(30)).await? {
//!     // write to the protected resource with grant.fence()
//!     let _ = locks.release(&grant).await?;
//! }
//! # Ok(()) }
//! ```
#![deny(missing_docs)]

use std::time::Duration;

use leasehold_core::TtlRange;

mod authority;
mod config;
mod names;
mod objects;
mod record;
mod store_clock;
mod url;

pub use authority::ObjectStoreAuthority;
pub use config::{ObjectStoreConfig, POLL_FLOOR};
pub use url::SCHEMES;

/// The backend's name in capabilities, errors and reports.
pub const BACKEND: &str = "object-store";

/// The TTLs this authority grants: 2 s to 24 h in whole seconds, the resolution of the store's
/// clock. A shorter TTL would be dominated by the second the expiry rule adds.
pub const TTL: TtlRange = TtlRange::new(
    Duration::from_secs(2),
    Duration::from_secs(24 * 3600),
    Duration::from_secs(1),
);

/// How late after its TTL a lease may be seen as expired: the one second the expiry rule adds
/// for the store's whole-second times.
pub const EXPIRY_SLACK: Duration = Duration::from_secs(1);
