//! Handing leadership to a named candidate without a gap: the leader names its successor at the
//! authority, then resigns, and for a window only that candidate may become leader.
//!
//! # How
//! The authority cannot hand a lease from one owner to another, and an acquire is one atomic
//! step that any candidate may win. So the outgoing leader first takes a **marker**: a lease on
//! `<election key>.handoff/<its epoch>` for the window, with the successor's name proclaimed on
//! it. Only then does it release the election key. Every candidate
//! ([`crate::Election::campaign`]) reads the newest marker before it tries, and waits while a
//! live one names someone else; and reads it again right after it wins the key, giving the key
//! back at once if a live marker names someone else. The second read is what makes it safe:
//! the marker was written before the key was released, so a candidate that won the key after
//! the release reads it. A third candidate may thus hold the key for one round trip (an
//! observer may see that grant, with no value), but never leads; the successor's epoch is
//! greater than the outgoing leader's, as every later grant's is. After the window, or if the
//! successor does not campaign, anyone may lead again.
//!
//! The reads must see the newest state: true of every backend here against a single server or
//! a linearizable cluster (etcd's reads are); a ZooKeeper client reading from a lagging
//! follower could miss a fresh marker and lead for a moment in the window. Candidates of other
//! libraries sharing the key know nothing of markers.

use std::time::Duration;

use crate::contract::authority::{Authority, Released};
use crate::contract::error::{Error, Result};
use crate::contract::fence::Fence;
use crate::contract::key::LockKey;
use crate::contract::key_prefix::KeyPrefix;
use crate::recipes::election::Leadership;

/// How often a candidate reads a hand-off again while it names someone else, at most: the
/// marker's end is not announced.
pub(crate) const HANDOFF_POLL: Duration = Duration::from_millis(100);

fn marker_prefix(key: &LockKey) -> Result<KeyPrefix> {
    KeyPrefix::new(format!("{key}.handoff/"))
}

fn marker_key(key: &LockKey, epoch: Fence) -> Result<LockKey> {
    // Zero-padded, so the newest hand-off sorts last.
    LockKey::new(format!("{key}.handoff/{:020}", epoch.value()))
}

/// Whether the newest hand-off on the election `key` is live and names another candidate than
/// `me`: how long it has left if so (at most [`HANDOFF_POLL`] where the backend cannot tell).
pub(crate) async fn pending_for_other(
    authority: &dyn Authority,
    key: &LockKey,
    me: Option<&str>,
) -> Result<Option<Duration>> {
    let listed = authority
        .list_keys(&marker_prefix(key)?, usize::MAX)
        .await?;
    let Some(newest) = listed.last() else {
        return Ok(None);
    };
    let seen = authority.inspect(newest).await?;
    if !seen.held {
        return Ok(None);
    }
    let named = seen.value.as_deref();
    if me.is_some_and(|me| named == Some(me.as_bytes())) {
        return Ok(None);
    }
    Ok(Some(seen.remaining.unwrap_or(HANDOFF_POLL)))
}

impl Leadership {
    /// Steps down in favour of the candidate named `successor` ([`crate::Election::with_name`]):
    /// for `window` from now only that candidate may become leader (see the module notes for
    /// how), so the hand-off has no gap another candidate could slip into. The successor must
    /// campaign within the window; after it, anyone may lead.
    ///
    /// `window` is a TTL the backend grants ([`Error::InvalidTtl`] otherwise), and the name at
    /// most [`crate::MAX_VALUE_LEN`] bytes. A leadership already lost is [`Error::LeaseLost`],
    /// and nothing is named.
    pub async fn yield_to(self, successor: &str, window: Duration) -> Result<Released> {
        self.ensure_valid()?;
        let authority = self.lease().authority().clone();
        let marker = marker_key(self.lease().key(), self.epoch())?;
        let grant = authority
            .try_acquire(&marker, window)
            .await?
            .ok_or_else(|| Error::InvalidConfig {
                reason: format!("this leadership already named a successor ({marker})"),
            })?;
        if let Err(e) = authority.proclaim(&grant, successor.as_bytes()).await {
            let _ = authority.release(&grant).await;
            return Err(e);
        }
        self.resign().await
    }
}
