//! # leasehold-postgres
//!
//! A PostgreSQL lease table as a leasehold [`Authority`](leasehold_core::Authority), and the
//! resource side for tables that carry a `last_fence` column.
//!
//! ```no_run
//! # async fn demo() -> leasehold_core::Result<()> {
//! use leasehold_postgres::PostgresAuthority;
//! let authority = PostgresAuthority::connect("postgres://app@db/app?table=locks.leases").await?;
//! authority.migrate().await?; // once; or apply schema_sql() yourself
//! # Ok(()) }
//! ```
//!
//! See [`PostgresAuthority`] for how leases map to rows, and [`guarded`] for writes that refuse
//! stale fences.
//!
//! The user's guide (URL parameters, TLS, the schema and its upgrades, what fences promise on
//! each replication setup, waiting, failures, PgBouncer) is
//! [docs/postgres.md](https://github.com/leasehold/leasehold/blob/main/docs/postgres.md) in the
//! repository.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod authority;
mod config;
mod dialect;
mod errors;
pub mod guarded;
mod notify;
mod statements;
mod table;
mod table_version;
mod token;

pub use authority::PostgresAuthority;
pub use config::{FenceSafetyOption, Pooler, PostgresConfig};
pub use statements::schema_sql;
pub use table::{TableName, DEFAULT_TABLE};
pub use token::PgFence;
