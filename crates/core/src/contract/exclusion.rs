//! Whether the authority itself keeps a live lease exclusive for its whole TTL.

use std::fmt;

/// What an authority promises about ending a lease early.
///
/// A lease ends by its TTL, a refused renewal or a release. Some server versions can also end
/// a lease that its holder is still renewing in time: then a second holder can be granted the
/// key while the first still believes itself the holder, until the first notices the loss.
/// Fences still order their writes (the second grant's fence is higher), so a resource that
/// checks fences stays safe; work outside such a resource does not. A backend that finds
/// such a server declares it here, and the conformance report and the fault workload show it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ExclusionSafety {
    /// A lease stays exclusive until its TTL ends by the authority's clock, it is released,
    /// or a renewal is refused.
    Exclusive,
    /// The authority can end a live lease before its TTL: `reason` says when and why (a server
    /// defect, with the versions that fix it).
    EarlyRevocation {
        /// When and why, for people reading the report.
        reason: String,
    },
}

impl ExclusionSafety {
    /// Whether a lease can end before its TTL at the authority's hand.
    pub fn can_end_early(&self) -> bool {
        matches!(self, ExclusionSafety::EarlyRevocation { .. })
    }
}

impl fmt::Display for ExclusionSafety {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExclusionSafety::Exclusive => f.write_str("exclusive for the TTL"),
            ExclusionSafety::EarlyRevocation { reason } => {
                write!(f, "can end early ({reason})")
            }
        }
    }
}
