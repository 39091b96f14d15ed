//! The SQLite fence: the lease row's counter.

use std::cmp::Ordering;
use std::hash::{Hash, Hasher};

use leasehold_core::{Error, FenceSafety, FencingToken, Result};

use crate::errors::BACKEND;

/// The lease row's `fence` column: raised by one on every acquisition of the key, never
/// lowered (release and expiry keep the row), committed to the file before anyone hears of it.
/// One file's write lock orders every acquisition of the key on this machine, so the fences are
/// linearizable there.
///
/// It goes backwards only if the file does: deleted, replaced, or restored from a backup (raise
/// the deployment epoch after that).
///
/// Ordered, compared and hashed by the counter alone.
#[derive(Clone, Copy, Debug)]
pub struct SqliteFence {
    raw: u64,
}

impl SqliteFence {
    /// Reads the `fence` column.
    pub fn from_column(raw: i64) -> Result<Self> {
        u64::try_from(raw)
            .ok()
            .filter(|r| *r > 0)
            .map(|raw| SqliteFence { raw })
            .ok_or(Error::FenceOutOfRange {
                backend: BACKEND,
                raw: raw as u64,
            })
    }
}

impl PartialEq for SqliteFence {
    fn eq(&self, other: &Self) -> bool {
        self.raw == other.raw
    }
}

impl Eq for SqliteFence {}

impl PartialOrd for SqliteFence {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for SqliteFence {
    fn cmp(&self, other: &Self) -> Ordering {
        self.raw.cmp(&other.raw)
    }
}

impl Hash for SqliteFence {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.raw.hash(state);
    }
}

impl FencingToken for SqliteFence {
    fn raw(&self) -> u64 {
        self.raw
    }

    fn safety(&self) -> FenceSafety {
        FenceSafety::Linearizable
    }
}
