//! # leasehold-sql-common
//!
//! What leasehold's SQL authorities (PostgreSQL, MySQL/MariaDB) share, so that they behave the
//! same without a copy of each other's code. Each backend names what differs in a
//! [`SqlDialect`]: its driver's connection, its URL schemes, which server errors mean what.
//!
//! * [`Lanes`]: the connections lease statements run on, each waited for within the caller's
//!   time and closed when a statement on it is dropped unanswered;
//! * [`Sender`]: lease statements sent on the lanes, sent again after a conflict, bounded by
//!   the caller's time, and for an acquisition, kept for a late answer and raced against the
//!   same acquisition sent again ([`give_back`] frees what such an answer took for nobody);
//! * [`open_pool`]: the driver's pool for what is not a lease statement, opened and read within
//!   the request timeout;
//! * [`parse_url`]: the URL parameters every SQL backend reads, read the same way;
//! * [`map_error`]: the driver's errors as leasehold's, with each backend's reading of its
//!   server's errors;
//! * [`FenceSafetyOption`]: what the operator says about fences (URL `fence_safety`), which
//!   each backend weighs against the replication setup it reads at connect;
//! * [`redact_text`]: a driver's message with every secret masked.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod dialect;
mod errors;
mod fence_safety;
mod lanes;
mod pool;
mod redact;
mod sending;
mod url;

pub use dialect::SqlDialect;
pub use errors::{map_error, timed_out, unanswered, ServerError, ServerErrorKind};
pub use fence_safety::FenceSafetyOption;
pub use lanes::{Lane, Lanes, PING_AFTER_IDLE};
pub use pool::{open_pool, warn_if_overridden};
pub use redact::redact_text;
pub use sending::{
    give_back, plain, Attempt, Failed, LateStatement, Once, Sender, Sent, Statement,
};
pub use url::{parse_url, ConnectOptionsOf, SqlUrl, DEFAULT_POOL_SIZE};

/// The TTLs a SQL lease table takes: whole milliseconds from 1 ms to 30 days. Its expiry column
/// has microsecond precision, and a lease longer than a month is a configuration mistake, not
/// a lock.
pub const LEASE_TTL: leasehold_core::TtlRange = leasehold_core::TtlRange::new(
    std::time::Duration::from_millis(1),
    std::time::Duration::from_secs(30 * 24 * 3600),
    std::time::Duration::from_millis(1),
);
