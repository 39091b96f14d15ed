//! The ZooKeeper fence: the contender node's czxid.

use std::fmt;

use leasehold_core::{Error, FenceSafety, FencingToken, Result};
use zookeeper_client::Stat;

use crate::errors::BACKEND;

/// The czxid of the holder's contender node: the ZooKeeper transaction id that created it.
///
/// # Why it is a good fence
/// * Every write to ZooKeeper gets a zxid from one totally ordered, quorum-replicated log. A
///   node created later has a greater czxid, whatever node and whichever parent.
/// * Holders of a key follow each other in sequence order, and sequence numbers are handed out
///   in creation order, so a later holder's node was created later: its czxid is greater. That
///   holds across a parent container being removed and recreated too (its sequence counter
///   restarts; zxids do not).
/// * A zxid is `epoch << 32 | counter`. A new leader starts a new epoch, greater than any
///   before, and only writes a quorum accepted survive an election, so no czxid is ever handed
///   out twice: linearizable across failover, and durable across restarts (the log is on disk).
///
/// The stored fence keeps 48 bits: epochs up to 65535 (one per leader election or ensemble
/// restart) fit; beyond that a grant fails with `FenceOutOfRange` rather than wrap. Restoring
/// ZooKeeper from a backup can rewind zxids: raise the deployment epoch then.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Czxid(u64);

impl Czxid {
    /// Wraps a czxid read from a node's `Stat`.
    pub fn new(czxid: i64) -> Result<Self> {
        u64::try_from(czxid)
            .ok()
            .filter(|z| *z > 0)
            .map(Czxid)
            .ok_or(Error::FenceOutOfRange {
                backend: BACKEND,
                raw: czxid as u64,
            })
    }

    /// The czxid in a create's reply, if the reply's `Stat` is trustworthy for this node.
    ///
    /// A `Stat` can be missing or invalid (servers below 3.5 reply to a plain create without
    /// one; ZOOKEEPER-4026 and ZOOKEEPER-4667 are server bugs that leave it unset in some
    /// replies), so it counts only if it describes a fresh ephemeral node of `session`:
    /// a positive czxid equal to its mzxid, version 0, owned by the session. Otherwise the
    /// caller reads the node back, because a wrong fence is worse than one more round trip.
    pub(crate) fn from_create_stat(stat: &Stat, session: i64) -> Option<Czxid> {
        let fresh = !stat.is_invalid()
            && stat.czxid > 0
            && stat.mzxid == stat.czxid
            && stat.version == 0
            && stat.ephemeral_owner == session
            && session != 0;
        fresh.then_some(Czxid(stat.czxid as u64))
    }

    /// The leader epoch in which the node was created (the czxid's high 32 bits).
    pub fn epoch(&self) -> u32 {
        (self.0 >> 32) as u32
    }

    /// The czxid.
    pub fn get(&self) -> i64 {
        // Constructed from a positive i64.
        self.0 as i64
    }
}

impl fmt::Debug for Czxid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Czxid({:#x})", self.0)
    }
}

impl FencingToken for Czxid {
    fn raw(&self) -> u64 {
        self.0
    }

    fn safety(&self) -> FenceSafety {
        FenceSafety::Linearizable
    }
}

#[cfg(test)]
mod tests {
    use leasehold_conformance::kit::{OrFail, TestResult};
    use leasehold_core::Epoch;

    use super::*;

    fn stat(czxid: i64, owner: i64) -> Stat {
        Stat {
            czxid,
            mzxid: czxid,
            pzxid: czxid,
            ctime: 1,
            mtime: 1,
            version: 0,
            cversion: 0,
            aversion: 0,
            ephemeral_owner: owner,
            data_length: 0,
            num_children: 0,
        }
    }

    #[test]
    fn only_a_stat_of_our_fresh_node_is_trusted() {
        assert_eq!(
            Czxid::from_create_stat(&stat(0x2_0000_0005, 7), 7).map(|c| c.get()),
            Some(0x2_0000_0005)
        );
        let invalid = Stat {
            czxid: -1,
            mzxid: -1,
            ..stat(1, 7)
        };
        for bad in [
            invalid,
            stat(0, 7),
            stat(5, 8),
            stat(5, 0),
            Stat {
                mzxid: 9,
                ..stat(5, 7)
            },
            Stat {
                version: 1,
                ..stat(5, 7)
            },
        ] {
            assert_eq!(Czxid::from_create_stat(&bad, 7), None, "{bad:?}");
        }
    }

    #[test]
    fn epoch_is_the_high_half_and_fits_48_bits_until_65535() -> TestResult {
        let z = Czxid::new(0x3_0000_0010).or_fail("czxid 0x3_0000_0010")?;
        assert_eq!(z.epoch(), 3);
        let fence = z
            .to_fence(BACKEND, Epoch::ZERO)
            .or_fail("the fence of the czxid")?;
        assert_eq!(fence.raw(), 0x3_0000_0010);
        assert!(Czxid::new((0x1_0000_i64) << 32)
            .or_fail("czxid of epoch 0x1_0000")?
            .to_fence(BACKEND, Epoch::ZERO)
            .is_err());
        assert!(Czxid::new(0).is_err() && Czxid::new(-1).is_err());
        assert!(
            Czxid::new(0x2_0000_0001).or_fail("czxid 0x2_0000_0001")?
                > Czxid::new(0x1_ffff_fff0).or_fail("czxid 0x1_ffff_fff0")?
        );
        Ok(())
    }
}
