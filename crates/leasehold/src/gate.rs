//! Gates: the resource side of a lease, where the fence is checked.
//!
//! A lease decides who may *try*; a gate at the resource decides which writes count. Each keeps
//! the newest fence it has accepted next to the data it protects, and refuses an older one
//! atomically with the write. Every gate has a `claim`, which a new holder calls first, so that
//! a paused former holder's late write is refused even before the new holder writes.
//!
//! | module | store | feature |
//! |---|---|---|
//! | `sql` | PostgreSQL, SQLite, MySQL/MariaDB rows through sqlx | `gate-sql-postgres`, `gate-sql-sqlite`, `gate-sql-mysql`; `gate-sql` for all three |
//! | `object` | objects in any `object_store` store; S3, Google Cloud Storage, Azure Blob with their clients | `gate-object`; `gate-object-aws`, `gate-object-gcp`, `gate-object-azure` |
//! | `redis` | Redis hashes, on one server or a Cluster | `redis` |
//! | `http` | HTTP services: the caller sends the fence, the service checks it at its store | `gate-http-client`, `gate-http-server`; `gate-http` for both |
//!
//! [`FencedRegister`](crate::FencedRegister) is the in-memory gate, for tests.
//!
//! ```no_run
//! # #[cfg(feature = "gate-sql-postgres")]
//! # async fn charge(pool: &sqlx::PgPool, lease: &leasehold::Lease) -> leasehold::Result<()> {
//! use leasehold::gate::sql::{map_error, Claimed, SqlGate};
//!
//! let invoices = SqlGate::new("invoices", "id")?;
//! let mut tx = pool.begin().await.map_err(map_error)?;
//! if invoices.claim(&mut tx, "inv_72", lease.fence()).await? == Claimed::Claimed {
//!     // ... the charge, in the same transaction ...
//!     tx.commit().await.map_err(map_error)?;
//! }
//! # Ok(()) }
//! ```

/// Rows of a SQL database: [`SqlGate::claim`](sql::SqlGate::claim) raises the row's fence as the
/// first statement of your transaction and holds the row until it ends (`leasehold-gate-sql`).
#[cfg(any(
    feature = "gate-sql-postgres",
    feature = "gate-sql-sqlite",
    feature = "gate-sql-mysql"
))]
pub mod sql {
    pub use leasehold_gate_sql::{
        map_error, Claimed, GateDatabase, SqlGate, SqlRegister, DEFAULT_FENCE_COLUMN,
    };
}

/// Objects in an object store: every write is the store's own conditional put on the version
/// the gate decided on (`leasehold-gate-object`).
#[cfg(feature = "gate-object")]
pub mod object {
    pub use leasehold_gate_object::{
        map_error, FencedContent, FencedObject, ObjectGate, DEFAULT_ATTEMPTS, FENCE_HEADER,
        REJECTED_BY,
    };
}

/// Redis hashes: one script compares the hash's fence field, writes and raises it
/// (`leasehold-redis`'s gate).
#[cfg(feature = "redis")]
pub mod redis {
    pub use leasehold_redis::gate::{RedisFencedHash, RedisGate, FENCE_FIELD};
}

/// The fence across HTTP: the headers both sides agree on, a reqwest helper that sends the fence
/// (`gate-http-client`) and an axum extractor that reads it (`gate-http-server`), from
/// `leasehold-gate-http`.
#[cfg(any(feature = "gate-http-client", feature = "gate-http-server"))]
pub mod http {
    pub use leasehold_gate_http::{
        fence_from_headers, newest_fence, stale_parts, FENCE_HEADER, FENCE_SAFETY_HEADER,
        NEWEST_FENCE_HEADER,
    };

    #[cfg(feature = "gate-http-client")]
    pub use leasehold_gate_http::FencedRequest;

    #[cfg(feature = "gate-http-server")]
    pub use leasehold_gate_http::{stale_response, RequireFence};
}
