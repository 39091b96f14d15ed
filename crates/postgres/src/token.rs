//! The PostgreSQL fence: the lease row's counter.

use std::cmp::Ordering;
use std::hash::{Hash, Hasher};

use leasehold_core::{Error, FenceSafety, FencingToken, Result};

use crate::errors::BACKEND;

/// The lease row's `fence` column: raised by one on every successful acquisition of the key and
/// never lowered (release and expiry keep the row). One row in one database orders every
/// acquisition of its key, and it is a committed row.
///
/// It can go backwards only if the database itself does: a restore from a backup or a
/// point-in-time recovery rewinds the counter (raise the deployment epoch after one), and so can
/// a failover to a standby that had not received the last commits, or a crash with
/// `synchronous_commit = off`. What the connected server promises is read at connect and carried
/// by every fence (see docs/postgres.md).
///
/// Ordered, compared and hashed by the counter alone.
#[derive(Clone, Copy, Debug)]
pub struct PgFence {
    raw: u64,
    safety: FenceSafety,
}

impl PgFence {
    /// Reads the `bigint` column of a server whose fences have `safety`.
    pub fn from_column(raw: i64, safety: FenceSafety) -> Result<Self> {
        u64::try_from(raw)
            .ok()
            .filter(|r| *r > 0)
            .map(|raw| PgFence { raw, safety })
            .ok_or(Error::FenceOutOfRange {
                backend: BACKEND,
                raw: raw as u64,
            })
    }
}

/// A `bigint` column read strictly. In the binary format a PostgreSQL server always sends a
/// `bigint` as eight bytes; sqlx's decoder also takes fewer (as a shorter integer), so a
/// malformed row would read as a fence. An acquisition's fence is read with this, so a reply
/// that is not what any server sends is an error, never a grant.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StrictBigint(pub(crate) i64);

impl sqlx::Type<sqlx::Postgres> for StrictBigint {
    fn type_info() -> sqlx::postgres::PgTypeInfo {
        <i64 as sqlx::Type<sqlx::Postgres>>::type_info()
    }

    fn compatible(ty: &sqlx::postgres::PgTypeInfo) -> bool {
        <i64 as sqlx::Type<sqlx::Postgres>>::compatible(ty)
    }
}

impl<'r> sqlx::Decode<'r, sqlx::Postgres> for StrictBigint {
    fn decode(
        value: sqlx::postgres::PgValueRef<'r>,
    ) -> std::result::Result<Self, sqlx::error::BoxDynError> {
        if value.format() == sqlx::postgres::PgValueFormat::Binary {
            let len = value.as_bytes()?.len();
            if len != 8 {
                return Err(format!("a bigint sent as {len} bytes instead of 8").into());
            }
        }
        <i64 as sqlx::Decode<'r, sqlx::Postgres>>::decode(value).map(StrictBigint)
    }
}

impl PartialEq for PgFence {
    fn eq(&self, other: &Self) -> bool {
        self.raw == other.raw
    }
}

impl Eq for PgFence {}

impl PartialOrd for PgFence {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for PgFence {
    fn cmp(&self, other: &Self) -> Ordering {
        self.raw.cmp(&other.raw)
    }
}

impl Hash for PgFence {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.raw.hash(state);
    }
}

impl FencingToken for PgFence {
    fn raw(&self) -> u64 {
        self.raw
    }

    fn safety(&self) -> FenceSafety {
        self.safety
    }
}
