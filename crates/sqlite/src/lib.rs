//! # leasehold-sqlite
//!
//! An embedded leasehold [`Authority`](leasehold_core::Authority): a lease table in one SQLite
//! file, shared by the processes of one machine, with no server to run. Like `flock(1)`, but
//! with leases that expire, renew and hand out fencing tokens that only grow.
//!
//! ```no_run
//! # async fn demo() -> leasehold_core::Result<()> {
//! use leasehold_sqlite::SqliteAuthority;
//! // The file is created if missing (its directory must exist), and the table in it.
//! let authority = SqliteAuthority::connect("sqlite:///var/lib/myapp/locks.db").await?;
//! # Ok(()) }
//! ```
//!
//! What it promises, on one machine: exclusion while a lease is unexpired by the machine's
//! `CLOCK_MONOTONIC`; fences that grow across release, expiry, crashes of any process and
//! reboots (they are committed rows in the file); a lease from an earlier boot counts as expired.
//! What it cannot do: coordinate machines. A database on a filesystem not known to be local to
//! this kernel (network, cluster and FUSE filesystems, a VM's share) is refused, since SQLite's
//! locks are not reliable there, and a lease that another kernel wrote into the file since this
//! boot began is not taken over before its expiry by the wall clock. See [`SqliteAuthority`].
//!
//! The user's guide (URL parameters, schema, guarantees, filesystems, the file's write lock,
//! what can break it) is [docs/sqlite.md](https://github.com/leasehold/leasehold/blob/main/docs/sqlite.md)
//! in the repository.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod authority;
mod clock;
mod config;
mod errors;
mod mounts;
mod token;

pub use authority::{schema_sql, SqliteAuthority};
pub use config::{SqliteConfig, DEFAULT_TABLE};
pub use token::SqliteFence;
