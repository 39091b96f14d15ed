//! Validated, quoted table names: never spliced from unchecked input.

use std::fmt;

use leasehold_core::{Error, Result};

/// A table name, optionally schema-qualified (`leases` or `locks.leases`), validated once and
/// always rendered quoted (`"locks"."leases"`).
///
/// Each part must be 1 to 63 bytes of ASCII letters, digits and `_`, not starting with a digit.
/// That is stricter than PostgreSQL, on purpose: a name that passes can be quoted without any
/// escaping, so no input can turn into SQL.
#[derive(Clone, PartialEq, Eq)]
pub struct TableName {
    schema: Option<String>,
    table: String,
}

/// The default lease table.
pub const DEFAULT_TABLE: &str = "leasehold_leases";

fn ident(part: &str, whole: &str) -> Result<String> {
    let ok = !part.is_empty()
        && part.len() <= 63
        && part.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && !part.as_bytes()[0].is_ascii_digit();
    if !ok {
        return Err(Error::InvalidConfig {
            reason: format!(
                "`{whole}` is not a valid table name: each part must be 1-63 ASCII letters, digits or _, not starting with a digit"
            ),
        });
    }
    Ok(part.to_string())
}

impl TableName {
    /// Parses `table` or `schema.table`.
    pub fn new(name: &str) -> Result<Self> {
        let mut parts = name.split('.');
        let (first, second, rest) = (parts.next(), parts.next(), parts.next());
        match (first, second, rest) {
            (Some(t), None, None) => Ok(TableName {
                schema: None,
                table: ident(t, name)?,
            }),
            (Some(s), Some(t), None) => Ok(TableName {
                schema: Some(ident(s, name)?),
                table: ident(t, name)?,
            }),
            _ => Err(Error::InvalidConfig {
                reason: format!(
                    "`{name}` is not a valid table name: use `table` or `schema.table`"
                ),
            }),
        }
    }

    /// The unquoted name as given (`schema.table`), used in notifications and messages.
    pub fn plain(&self) -> String {
        match &self.schema {
            Some(s) => format!("{s}.{}", self.table),
            None => self.table.clone(),
        }
    }

    /// The bare table part, for naming constraints and indexes.
    pub fn table(&self) -> &str {
        &self.table
    }
}

impl Default for TableName {
    fn default() -> Self {
        TableName {
            schema: None,
            table: DEFAULT_TABLE.to_string(),
        }
    }
}

/// Renders the quoted form, ready for SQL.
impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.schema {
            Some(s) => write!(f, "\"{s}\".\"{}\"", self.table),
            None => write!(f, "\"{}\"", self.table),
        }
    }
}

impl fmt::Debug for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TableName({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_conformance::kit::{OrFail, TestResult};

    #[test]
    fn quotes_valid_names_and_rejects_everything_else() -> TestResult {
        assert_eq!(
            TableName::new("leases")
                .or_fail("the table name leases")?
                .to_string(),
            "\"leases\""
        );
        assert_eq!(
            TableName::new("locks.Leases_2")
                .or_fail("the table name locks.Leases_2")?
                .to_string(),
            "\"locks\".\"Leases_2\""
        );
        for bad in [
            "",
            ".",
            "a.",
            ".a",
            "a.b.c",
            "1abc",
            "a-b",
            "a\"b",
            "a;drop table x",
            "x y",
            &"a".repeat(64),
            "é",
        ] {
            assert!(
                matches!(TableName::new(bad), Err(Error::InvalidConfig { .. })),
                "{bad:?}"
            );
        }
        Ok(())
    }
}
