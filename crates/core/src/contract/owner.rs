//! Owner tokens: the secret-ish identity of one grant.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use rand::TryRngCore;

use crate::contract::error::{Error, Result};

/// A random 128-bit identity for one grant, drawn from the operating system's CSPRNG.
///
/// The authority stores it with the lease, and every renewal and release compares it, so a
/// process can only ever extend or free the lease it was given, never one granted later to
/// someone else under the same key. 128 bits from the OS make collisions and guesses
/// practically impossible; a counter or a timestamp would not.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OwnerToken([u8; 16]);

impl OwnerToken {
    /// The number of bits of randomness.
    pub const BITS: u32 = 128;

    /// Draws a new token from the OS random number generator.
    pub fn generate() -> Result<Self> {
        let mut bytes = [0u8; 16];
        rand::rngs::OsRng
            .try_fill_bytes(&mut bytes)
            .map_err(|e| Error::Entropy {
                source: Arc::new(e),
            })?;
        Ok(OwnerToken(bytes))
    }

    /// `n` fresh tokens, one per key of a set taken in one step: each grant has its own.
    pub fn generate_many(n: usize) -> Result<Vec<Self>> {
        (0..n).map(|_| OwnerToken::generate()).collect()
    }

    /// The token's raw bytes.
    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// Wraps bytes read back from an authority.
    pub fn from_bytes(bytes: [u8; 16]) -> Self {
        OwnerToken(bytes)
    }

    /// The token as 32 lowercase hex digits, the form stored in every backend.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
}

impl fmt::Display for OwnerToken {
    /// The 32 hex digits, encoded on the stack: every acquisition and release formats its
    /// token, and sixteen `{:02x}` through the formatting machinery measured 1 to 3 µs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut digits = [0u8; 32];
        hex::encode_to_slice(self.0, &mut digits).map_err(|_| fmt::Error)?;
        f.write_str(std::str::from_utf8(&digits).map_err(|_| fmt::Error)?)
    }
}

impl fmt::Debug for OwnerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OwnerToken({self})")
    }
}

impl FromStr for OwnerToken {
    type Err = Error;

    /// Parses 32 hex digits (either case).
    fn from_str(s: &str) -> Result<Self> {
        let bad = || Error::InvalidConfig {
            reason: format!("`{s}` is not an owner token (32 hex digits)"),
        };
        if s.len() != 32 || !s.is_ascii() {
            return Err(bad());
        }
        let mut bytes = [0u8; 16];
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        Ok(OwnerToken(bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    type TestResult<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

    #[test]
    fn tokens_are_distinct_and_round_trip() -> TestResult {
        let mut seen = HashSet::new();
        for _ in 0..1000 {
            let t = OwnerToken::generate().map_err(|e| format!("a generated owner token: {e}"))?;
            assert_eq!(t.to_hex().len(), 32);
            assert_eq!(
                t.to_hex()
                    .parse::<OwnerToken>()
                    .map_err(|e| format!("the token parsed back from hex: {e}"))?,
                t
            );
            assert!(seen.insert(t));
        }
        Ok(())
    }

    /// Lowercase, two digits per byte (leading zeros kept), the same from Display and to_hex.
    #[test]
    fn hex_form_is_fixed() {
        let t = OwnerToken::from_bytes([
            0x00, 0x01, 0x0a, 0x10, 0x7f, 0x80, 0xab, 0xcd, 0xef, 0xff, 0x09, 0x90, 0x11, 0x22,
            0x33, 0x44,
        ]);
        let hex = "00010a107f80abcdefff099011223344";
        assert_eq!(t.to_hex(), hex);
        assert_eq!(t.to_string(), hex);
        assert_eq!(format!("{t:?}"), format!("OwnerToken({hex})"));
    }

    #[test]
    fn rejects_malformed() {
        for bad in [
            "",
            "abc",
            &"g".repeat(32),
            &"a".repeat(33),
            "ééééééééééééééée",
        ] {
            assert!(bad.parse::<OwnerToken>().is_err(), "{bad}");
        }
    }
}
