//! Where a key's lease object and the clock objects live in the store.
//!
//! A key is one path segment under the prefix, percent-encoded by `object_store`'s own rules
//! (`/`, `%`, `#`, `?` and the like are escaped; `.` and `..` too), so every key has exactly one
//! object whatever characters it has, and a listing turns names back into keys by decoding.

use leasehold_core::backend::percent_decode;
use leasehold_core::LockKey;
use object_store::path::{Path, PathPart};

/// The folder under the prefix that holds the clock objects (see `store_clock`). Its name
/// starts with a dot, which no encoded key segment can be confused with in a listing: a key
/// named `.leasehold-clock` is an object, this is a folder.
const CLOCKS: &str = ".leasehold-clock";

/// The object names of one authority: `{prefix}/{key}`, `{prefix}/.leasehold-clock/{key}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Names {
    prefix: Path,
}

impl Names {
    /// Names under `prefix` (`a/b` or empty for the bucket's root).
    pub(crate) fn new(prefix: &str) -> Self {
        Names {
            prefix: Path::from(prefix),
        }
    }

    /// The prefix, as a path.
    pub(crate) fn prefix(&self) -> &Path {
        &self.prefix
    }

    /// The lease object of `key`.
    pub(crate) fn lease(&self, key: &LockKey) -> Path {
        self.prefix.clone().join(PathPart::from(key.as_str()))
    }

    /// The clock object a contender of `key` writes to read the store's time: one per key, so
    /// the store holds at most one clock object per key ever contended.
    pub(crate) fn clock(&self, key: &LockKey) -> Path {
        self.prefix
            .clone()
            .join(CLOCKS)
            .join(PathPart::from(key.as_str()))
    }

    /// The key whose lease object is `path`, if it is one (directly under the prefix).
    pub(crate) fn key_of(&self, path: &Path) -> Option<LockKey> {
        let mut rest = path.prefix_match(&self.prefix)?;
        let part = rest.next()?;
        if rest.next().is_some() {
            return None;
        }
        LockKey::new(percent_decode(part.as_ref())?).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_is_one_segment_that_decodes_back() -> leasehold_core::Result<()> {
        let names = Names::new("locks/team");
        for k in [
            "a",
            "a/b/c",
            "..",
            ".",
            "x%2Fy",
            "q?#[]~*|{}",
            ".leasehold-clock",
        ] {
            let key = LockKey::new(k)?;
            let path = names.lease(&key);
            assert_eq!(path.parts().count(), 3, "{k}: {path}");
            assert_eq!(names.key_of(&path), Some(key.clone()), "{k}: {path}");
            assert_eq!(names.key_of(&names.clock(&key)), None, "{k}");
        }
        let root = Names::new("");
        let key = LockKey::new("a/b")?;
        assert_eq!(root.key_of(&root.lease(&key)), Some(key));
        Ok(())
    }
}
