//! Validated, quoted table names: never spliced from unchecked input.

use std::fmt;

use leasehold_core::{Error, Result};

/// A table name in the connection's database (`leases`), validated once and always rendered
/// quoted (`` `leases` ``).
///
/// 1 to 64 bytes of ASCII letters, digits and `_`, not starting with a digit: stricter than
/// MySQL, on purpose, so that a name that passes can be quoted without any escaping.
#[derive(Clone, PartialEq, Eq)]
pub struct TableName(String);

/// The default lease table.
pub const DEFAULT_TABLE: &str = "leasehold_leases";

impl TableName {
    /// Validates `name`.
    pub fn new(name: &str) -> Result<Self> {
        let ok = !name.is_empty()
            && name.len() <= 64
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
            && !name.as_bytes().first().is_some_and(u8::is_ascii_digit);
        if !ok {
            return Err(Error::InvalidConfig {
                reason: format!(
                    "`{name}` is not a valid table name: 1-64 ASCII letters, digits or _, not starting with a digit"
                ),
            });
        }
        Ok(TableName(name.to_string()))
    }

    /// The unquoted name, for messages.
    pub fn plain(&self) -> &str {
        &self.0
    }
}

impl Default for TableName {
    fn default() -> Self {
        TableName(DEFAULT_TABLE.to_string())
    }
}

impl fmt::Display for TableName {
    /// Quoted, ready for SQL.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}`", self.0)
    }
}

impl fmt::Debug for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_identifiers_pass() {
        assert_eq!(
            TableName::new("leases").map(|t| t.to_string()).ok(),
            Some("`leases`".into())
        );
        for bad in ["", "1x", "a`b", "a.b", "a b", &"x".repeat(65)] {
            assert!(TableName::new(bad).is_err(), "{bad:?}");
        }
    }
}
