//! # leasehold
//!
//! Distributed locks that are safe to build on: time-limited leases from an authority (etcd,
//! ZooKeeper, PostgreSQL, Redis, or an embedded SQLite file), each carrying a **fencing token**
//! the protected resource checks, behind one API.
//!
//! ## Why fencing
//! A lease cannot stop a holder that paused (GC, a stopped VM, a slow disk) from acting after
//! its lease ran out and someone else got it. So every grant carries a fence, a number that only
//! grows, and the resource refuses writes with a fence older than one it has already accepted.
//! **The lease decides who may try; the resource decides which writes count.**
//!
//! Before reaching for a lock, prefer, in this order: a constraint or conditional write at the
//! resource itself (a unique key, `UPDATE ... WHERE state = 'open'`); an idempotency key; and only
//! then a lease, always with a fence checked by the resource.
//!
//! ## Use
//! ```
//! use std::time::Duration;
//! use leasehold::{connect, FencedRegister, FencedResource, Lease, LeaseOptions, LockKey};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> leasehold::Result<()> {
//! let authority = connect("memory://doc").await?;        // or sqlite://, postgres://, zk://, ...
//! let invoices = FencedRegister::new();                  // your resource, checking fences
//! let key = LockKey::new("invoice:inv_72")?;
//!
//! let lease = Lease::acquire(authority, &key, Duration::from_secs(10), Duration::from_secs(5),
//!                            LeaseOptions::default()).await?;
//! invoices.claim(lease.fence()).await?;                  // newer holders shut older ones out
//! lease.ensure_valid()?;                                 // right before the side effect
//! let outcome = invoices.write(lease.fence(), "charged").await?;
//! assert!(outcome.is_accepted());
//! lease.release().await?;
//! # Ok(()) }
//! ```
//!
//! ## Crates
//! This facade re-exports [`leasehold_core`] (the [`Authority`] trait, [`Lease`], fences,
//! errors) and enables one backend per cargo feature; [`connect`] picks it by URL scheme.
//!
//! ## Features
//! | feature | URL schemes | backend |
//! |---|---|---|
//! | `memory` (default) | `memory://name` | the in-memory reference: one process, for tests |
//! | `sqlite` | `sqlite:///path/to/locks.db` | a lease table in one file, for the processes of one machine; no server |
//! | `postgres` | `postgres://`, `postgresql://` | a lease table; hand-off by LISTEN/NOTIFY |
//! | `mysql` | `mysql://`, `mariadb://` | a MySQL/MariaDB lease table; waiters poll (declared) |
//! | `redis` | `redis://`, `rediss://` | `SET NX PX` with an `INCR` fence (failover-unsafe, declared) |
//! | `etcd` | `etcd://`, `etcds://` | etcd's lock recipe; the create revision as the fence |
//! | `zookeeper` | `zk://`, `zks://` | Curator's and kazoo's lock recipe; the czxid as the fence |
//! | `object-store` | `s3://`, `az://`, `gs://` | one object per key in S3, Azure Blob or GCS; conditional puts, expiry by the store's clock |
//! | `full` | all of the above | every backend, and the SQL and Redis gates |
//!
//! Gates, the resource side (`leasehold::gate`, one module per store): `gate-sql-postgres`,
//! `gate-sql-sqlite`, `gate-sql-mysql`, or `gate-sql` for all three (`gate::sql`); `gate-object`,
//! with `gate-object-aws`, `gate-object-gcp`, `gate-object-azure` for the clouds' clients
//! (`gate::object`); `gate-http-client`, `gate-http-server`, or `gate-http` for both
//! (`gate::http`); and `gate::redis` with `redis`. `full` leaves out the object and HTTP gates:
//! the HTTP gate brings axum and reqwest, and the object gate serves only those guarding objects.
//!
//! [`connect`] with a scheme whose feature is off answers [`Error::InvalidUrl`], naming the
//! feature to enable.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod connect;
#[cfg(any(
    feature = "gate-sql-postgres",
    feature = "gate-sql-sqlite",
    feature = "gate-sql-mysql",
    feature = "gate-object",
    feature = "gate-http-client",
    feature = "gate-http-server",
    feature = "redis"
))]
pub mod gate;

pub use connect::connect;
/// A connection URL with its password (in the user info or a query parameter) masked, for logs.
pub use leasehold_core::backend::redact_url;
pub use leasehold_core::{
    acquire_or, claim_period, claim_ttl, is_unavailable, telemetry, Admission, ArcError, Authority,
    BoxError, Capabilities, Claim, ClientOptions, Election, Epoch, EpochGuard, Error,
    ExclusionSafety, Fence, FenceSafety, FencedRegister, FencedResource, FencingToken, Grant,
    Guarded, IfUnavailable, Inspection, Instant, Instrumented, KeyPrefix, Leader, Leadership,
    Lease, LeaseOptions, LeaseState, LeaseWatch, LockKey, LossSignal, LostReason, Observer,
    OwnerId, OwnerToken, Permit, PermitHolder, Released, Result, RevocationNotice, Revoked,
    SafetyMargin, Schedule, ScheduledRun, Semaphore, SemaphoreStatus, TtlRange, Unlocked,
    WaitStrategy, WhenHeld, DEFAULT_OBSERVE_INTERVAL, MAX_KEY_LEN, MAX_PERMITS, MAX_VALUE_LEN,
};
pub use leasehold_core::{
    canonical, MultiLease, ReadGuard, UpgradeableRead, WriteGuard, DEFAULT_MAX_READERS, MAX_KEYS,
    MAX_READERS,
};

/// Many readers or one writer on a name, writer-preferring, with one fence order for both
/// modes (docs/recipes.md).
///
/// ```
/// use std::time::Duration;
/// use leasehold::{connect, FencedRegister, FencedResource, LockKey, RwLock};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> leasehold::Result<()> {
/// let (ttl, max_wait) = (Duration::from_secs(10), Duration::from_secs(5));
/// let config = RwLock::new(connect("memory://rw-doc").await?, &LockKey::new("config")?)?;
/// let store = FencedRegister::new();                    // keeps the last writer's fence
///
/// let writer = config.write(ttl, max_wait).await?;     // waits for readers to leave
/// store.claim(writer.fence()).await?;
/// writer.ensure_valid()?;
/// assert!(store.write(writer.fence(), "v2").await?.is_accepted());
/// writer.release().await?;
///
/// let a = config.read(ttl, max_wait).await?;           // readers share
/// let b = config.read(ttl, max_wait).await?;
/// let (_, last_writer) = store.read();
/// assert!(a.fence().value() > last_writer);            // a read older than it is refusable
/// a.ensure_valid()?;
/// a.release().await?;
/// b.release().await?;
/// # Ok(()) }
/// ```
pub use leasehold_core::RwLock;

/// Several keys, all or nothing, taken in one canonical order so overlapping sets cannot
/// deadlock; one fence per key (docs/recipes.md).
///
/// ```
/// use std::time::Duration;
/// use leasehold::{acquire_all, connect, LeaseOptions, LockKey};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> leasehold::Result<()> {
/// let authority = connect("memory://multi-doc").await?;
/// let from = LockKey::new("account:alice")?;
/// let to = LockKey::new("account:bob")?;
/// let both = acquire_all(authority, &[to.clone(), from.clone()], Duration::from_secs(10),
///                        Duration::from_secs(5), LeaseOptions::default()).await?;
/// both.ensure_valid()?;                                  // before the transfer
/// let (debit, credit) = (both.fence(&from), both.fence(&to)); // one fence per account
/// assert!(debit.is_some() && credit.is_some());
/// both.release().await?;                                 // both keys at once
/// # Ok(()) }
/// ```
pub use leasehold_core::acquire_all;

/// The in-memory reference authority, for tests and single-process use.
#[cfg(feature = "memory")]
pub use leasehold_memory as memory;

/// The PostgreSQL authority and guarded writes for tables with a `last_fence` column.
#[cfg(feature = "postgres")]
pub use leasehold_postgres as postgres;

/// The MySQL/MariaDB authority (waiters poll; fences failover-unsafe on asynchronous
/// replication, declared).
#[cfg(feature = "mysql")]
pub use leasehold_mysql as mysql;

/// The embedded SQLite authority, for the processes of one machine (no server).
#[cfg(feature = "sqlite")]
pub use leasehold_sqlite as sqlite;

/// The Redis authority (fences declared failover-unsafe).
#[cfg(feature = "redis")]
pub use leasehold_redis as redis;

/// The etcd authority (the contender key's create revision as the fence).
#[cfg(feature = "etcd")]
pub use leasehold_etcd as etcd;

/// The ZooKeeper authority (the contender node's czxid as the fence).
#[cfg(feature = "zookeeper")]
pub use leasehold_zookeeper as zookeeper;

/// The object-store authority: leases as objects in S3, Azure Blob or Google Cloud Storage.
#[cfg(feature = "object-store")]
pub use leasehold_object_store as object_store;

/// docs/recipes.md, whose examples run as doctests on the in-memory backend.
#[cfg(all(doctest, feature = "memory"))]
#[doc = include_str!("../../../docs/recipes.md")]
pub struct RecipesDoc;
