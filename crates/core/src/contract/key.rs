//! Validated lock keys.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use crate::contract::error::{Error, Result};

/// The longest key, in bytes. Long enough for `tenant:invoice:<uuid>`-style names, short enough
/// to fit every backend's key or node-name limit after its own prefix and escaping.
pub const MAX_KEY_LEN: usize = 200;

/// The name of a lock, validated once so every backend can map it into its own namespace.
///
/// # What is allowed
/// 1 to [`MAX_KEY_LEN`] bytes of printable ASCII without spaces: the characters `!` (0x21)
/// through `~` (0x7E). So letters, digits and punctuation such as `: / _ - . @ # = +` are
/// fine; spaces, control characters, and non-ASCII text are not.
///
/// Why so strict: keys show up in logs, metrics, ZooKeeper paths, etcd prefixes, Redis keys and
/// PostgreSQL rows. A key that means the same bytes everywhere, prints unambiguously and cannot
/// smuggle a newline into a log line is worth more than Unicode names. Each backend escapes what
/// it must (for example `/` in ZooKeeper node names) reversibly.
///
/// ```
/// use leasehold_core::LockKey;
/// let key = LockKey::new("invoice:inv_72").unwrap();
/// assert_eq!(key.as_str(), "invoice:inv_72");
/// assert!(LockKey::new("").is_err());
/// assert!(LockKey::new("has space").is_err());
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockKey(Arc<str>);

impl LockKey {
    /// Validates `key` and wraps it.
    pub fn new(key: impl AsRef<str>) -> Result<Self> {
        let key = key.as_ref();
        validate(key)?;
        Ok(LockKey(Arc::from(key)))
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

fn validate(key: &str) -> Result<()> {
    if key.is_empty() {
        return Err(Error::InvalidKey {
            reason: "the key is empty".into(),
        });
    }
    if key.len() > MAX_KEY_LEN {
        return Err(Error::InvalidKey {
            reason: format!(
                "the key is {} bytes long; at most {MAX_KEY_LEN} are allowed",
                key.len()
            ),
        });
    }
    if let Some((index, ch)) = key.char_indices().find(|(_, c)| !(c.is_ascii_graphic())) {
        return Err(Error::InvalidKey {
            reason: format!(
                "byte {index} is {:?}; only printable ASCII without spaces ('!' to '~') is allowed",
                ch
            ),
        });
    }
    Ok(())
}

impl fmt::Display for LockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for LockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LockKey({:?})", &*self.0)
    }
}

impl AsRef<str> for LockKey {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl FromStr for LockKey {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        LockKey::new(s)
    }
}

impl TryFrom<&str> for LockKey {
    type Error = Error;
    fn try_from(s: &str) -> Result<Self> {
        LockKey::new(s)
    }
}

impl TryFrom<String> for LockKey {
    type Error = Error;
    fn try_from(s: String) -> Result<Self> {
        LockKey::new(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type TestResult<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

    #[test]
    fn accepts_printable_ascii() -> TestResult {
        for ok in [
            "a",
            "invoice:inv_72",
            "a/b/c",
            "!~",
            &"k".repeat(MAX_KEY_LEN),
        ] {
            assert_eq!(
                LockKey::new(ok)
                    .map_err(|e| format!("a valid key: {e}"))?
                    .as_str(),
                ok
            );
        }
        Ok(())
    }

    #[test]
    fn rejects_everything_else() -> TestResult {
        let long = "k".repeat(MAX_KEY_LEN + 1);
        for bad in [
            "",
            " ",
            "a b",
            "tab\there",
            "nl\n",
            "nul\0",
            "é",
            "\u{7f}",
            &long,
        ] {
            let err = LockKey::new(bad)
                .err()
                .ok_or("an invalid key: it succeeded")?;
            assert!(matches!(err, Error::InvalidKey { .. }), "{bad:?}: {err}");
        }
        Ok(())
    }

    #[test]
    fn debug_escapes() -> TestResult {
        let k = LockKey::new("a\"b").map_err(|e| format!("the key with a quote: {e}"))?;
        assert_eq!(format!("{k:?}"), "LockKey(\"a\\\"b\")");
        Ok(())
    }
}
