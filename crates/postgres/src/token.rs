//! The PostgreSQL fence: the lease row's counter.

use leasehold_core::{Error, FenceSafety, FencingToken, Result};

use crate::errors::BACKEND;

/// The lease row's `fence` column: raised by one on every successful acquisition of the key and
/// never lowered (release and expiry keep the row). Linearizable, because one row in one
/// database orders every acquisition of its key; durable, because it is a committed row.
///
/// It can go backwards only if the database itself does: a restore from a backup or a
/// point-in-time recovery rewinds the counter. Raise the deployment epoch after such a restore.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PgFence(u64);

impl PgFence {
    /// Reads the `bigint` column.
    pub fn from_column(raw: i64) -> Result<Self> {
        u64::try_from(raw)
            .ok()
            .filter(|r| *r > 0)
            .map(PgFence)
            .ok_or(Error::FenceOutOfRange {
                backend: BACKEND,
                raw: raw as u64,
            })
    }
}

impl FencingToken for PgFence {
    fn raw(&self) -> u64 {
        self.0
    }

    fn safety(&self) -> FenceSafety {
        FenceSafety::Linearizable
    }
}
