//! # leasehold-mysql
//!
//! A MySQL/MariaDB lease table as a leasehold [`Authority`](leasehold_core::Authority).
//!
//! ```no_run
//! # async fn demo() -> leasehold_core::Result<()> {
//! use leasehold_mysql::MysqlAuthority;
//! let authority = MysqlAuthority::connect("mysql://app@db/app?table=leases").await?;
//! authority.migrate().await?; // once; or apply schema_sql() yourself
//! # Ok(()) }
//! ```
//!
//! See [`MysqlAuthority`] for how leases map to rows. The user's guide (URL parameters, the
//! schema, what fences promise on each replication setup, waiting) is
//! [docs/mysql.md](https://github.com/leasehold/leasehold/blob/main/docs/mysql.md) in the
//! repository.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod authority;
mod config;
mod dialect;
mod errors;
mod replication;
mod statements;
mod table;

pub use authority::MysqlAuthority;
pub use config::MysqlConfig;
pub use leasehold_sql_common::FenceSafetyOption;
pub use statements::schema_sql;
pub use table::{TableName, DEFAULT_TABLE};
