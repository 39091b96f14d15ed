//! What one lease object holds: its body, read and written whole.
//!
//! The body is one JSON object. Every write raises `seq`, so no two writes of an object have the
//! same bytes: S3's ETag is the MD5 of the body, and a renewal that wrote the same bytes as the
//! write before it would keep the ETag, so a contender holding that ETag could still win its
//! conditional put over the renewal.

use leasehold_core::{Error, OwnerToken, Result};
use serde::{Deserialize, Serialize};

use crate::BACKEND;

/// The body format's version, checked on every read: a body of another version is refused
/// rather than guessed at.
const FORMAT: u32 = 1;

/// Whether the lease is held.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum State {
    /// A holder wrote it and has not released it; it ends by the store's clock (`ttl_ms` after
    /// the object's last-modified time).
    Held,
    /// Released (the fence stays).
    Free,
}

/// One lease object's body.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Record {
    /// [`FORMAT`].
    pub(crate) format: u32,
    /// Held or free.
    pub(crate) state: State,
    /// The holder's owner token in hex; empty when free.
    pub(crate) owner: String,
    /// The last fence issued on this key (the holder's, while held).
    pub(crate) fence: u64,
    /// The holder's TTL in milliseconds, from its last write.
    pub(crate) ttl_ms: u64,
    /// Raised by every write.
    pub(crate) seq: u64,
    /// The holder's proclaimed value, in hex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) value: Option<String>,
}

impl Record {
    /// The first grant on a key: fence 1.
    pub(crate) fn first(owner: OwnerToken, ttl_ms: u64) -> Self {
        Record {
            format: FORMAT,
            state: State::Held,
            owner: owner.to_hex(),
            fence: 1,
            ttl_ms,
            seq: 1,
            value: None,
        }
    }

    /// A new grant over this record (free, or held but expired): the next fence, no value.
    pub(crate) fn taken_by(&self, owner: OwnerToken, ttl_ms: u64) -> Self {
        Record {
            format: FORMAT,
            state: State::Held,
            owner: owner.to_hex(),
            fence: self.fence.saturating_add(1),
            ttl_ms,
            seq: self.seq.saturating_add(1),
            value: None,
        }
    }

    /// The same grant written again (a renewal, or a proclaimed value): a new `seq`.
    pub(crate) fn rewritten(&self) -> Self {
        Record {
            seq: self.seq.saturating_add(1),
            ..self.clone()
        }
    }

    /// Released: free, no owner, no value, the fence kept.
    pub(crate) fn released(&self) -> Self {
        Record {
            format: FORMAT,
            state: State::Free,
            owner: String::new(),
            fence: self.fence,
            ttl_ms: self.ttl_ms,
            seq: self.seq.saturating_add(1),
            value: None,
        }
    }

    /// Whether this record says `owner` holds the key with fence `raw`: then the version it was
    /// read at is one of that holder's own writes, since nobody else writes a held record
    /// naming another's token.
    pub(crate) fn names(&self, owner: OwnerToken, raw: u64) -> bool {
        self.state == State::Held && self.fence == raw && self.owner == owner.to_hex()
    }

    /// The proclaimed value's bytes.
    pub(crate) fn value_bytes(&self) -> Option<Vec<u8>> {
        self.value.as_deref().and_then(|v| hex::decode(v).ok())
    }

    /// The body to store.
    pub(crate) fn encode(&self) -> Result<Vec<u8>> {
        serde_json::to_vec(self).map_err(|e| Error::backend(BACKEND, "encoding a lease object", e))
    }

    /// A stored body; an error naming `path` if it is not a lease object of this format.
    pub(crate) fn decode(path: &str, body: &[u8]) -> Result<Self> {
        let record: Record = serde_json::from_slice(body).map_err(|e| {
            Error::backend(
                BACKEND,
                format!("{path} is not a leasehold lease object"),
                e,
            )
        })?;
        if record.format != FORMAT {
            return Err(Error::Backend {
                backend: BACKEND,
                message: format!(
                    "{path} has lease format {}, this client reads format {FORMAT}",
                    record.format
                ),
                retryable: false,
                source: None,
            });
        }
        Ok(record)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_write_changes_the_bytes_and_the_fence_survives_release() -> Result<()> {
        let a = OwnerToken::generate()?;
        let b = OwnerToken::generate()?;
        let first = Record::first(a, 5000);
        let renewed = first.rewritten();
        assert_ne!(first.encode()?, renewed.encode()?);
        assert!(renewed.names(a, 1) && !renewed.names(b, 1) && !renewed.names(a, 2));
        let free = renewed.released();
        assert!(!free.names(a, 1));
        assert_eq!(free.fence, 1);
        let next = free.taken_by(b, 5000);
        assert_eq!((next.fence, next.seq), (2, 4));
        assert_eq!(Record::decode("p", &next.encode()?)?, next);
        assert!(Record::decode("p", b"leasehold-fence:1\n").is_err());
        let mut future = next;
        future.format = 2;
        assert!(Record::decode("p", &future.encode()?).is_err());
        Ok(())
    }
}
