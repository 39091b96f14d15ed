//! # leasehold-sql-common
//!
//! What leasehold's SQL authorities (PostgreSQL, MySQL/MariaDB) share, so that they behave the
//! same without a copy of each other's code:
//!
//! * [`Lanes`]: the connections lease statements run on, each waited for within the caller's
//!   time and closed when a statement on it is dropped unanswered;
//! * [`FenceSafetyOption`]: what the operator says about fences (URL `fence_safety`), which
//!   each backend weighs against the replication setup it reads at connect;
//! * [`redact_text`]: a driver's message with every secret masked.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod fence_safety;
mod lanes;
mod redact;

pub use fence_safety::FenceSafetyOption;
pub use lanes::{Lane, Lanes, PING_AFTER_IDLE};
pub use redact::redact_text;
