//! What a `sqlite://` URL configures.

use std::path::{Path, PathBuf};

use leasehold_core::backend::{redact_url, ConnectionUrl};
use leasehold_core::{ClientOptions, Error, Result};

/// The lease table's default name.
pub const DEFAULT_TABLE: &str = "leasehold_leases";

/// Connections in the pool by default: each is a thread in SQLite's driver, and only one of
/// them can write at a time anyway.
const DEFAULT_POOL_SIZE: u32 = 4;

/// Settings of a SQLite authority.
///
/// From a URL:
/// * `sqlite:///var/lib/app/locks.db`: an absolute path (three slashes: the scheme's two and
///   the path's own);
/// * `sqlite://locks.db` or `sqlite://state/locks.db`: a path relative to the process's current
///   directory when it connects;
///
/// with the parameters `table` (default `leasehold_leases`), `pool_size` (default 4),
/// `allow_network_fs` (`true` turns the refusal of a filesystem not known to be local into a
/// warning) and the
/// common `epoch`, `safety_margin_ms`, `clock_drift_per_mille` and `timeout_ms`. `%XX` escapes in
/// the path are decoded. The file is created if missing; its directory is not (see
/// [`SqliteConfig::from_url`]).
#[derive(Clone, Debug)]
pub struct SqliteConfig {
    pub(crate) path: PathBuf,
    pub(crate) table: String,
    pub(crate) pool_size: u32,
    pub(crate) allow_network_fs: bool,
    pub(crate) client: ClientOptions,
}

impl SqliteConfig {
    /// A configuration for the database file at `path`, with the defaults.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        SqliteConfig {
            path: path.into(),
            table: DEFAULT_TABLE.to_string(),
            pool_size: DEFAULT_POOL_SIZE,
            allow_network_fs: false,
            client: ClientOptions::default(),
        }
    }

    /// Parses a `sqlite://` URL.
    ///
    /// Refused: an empty path, `:memory:` (an in-memory database is private to one connection,
    /// so it cannot coordinate processes; use `memory://` inside one process), a path starting
    /// with `~` (no shell expands it here), and any unknown parameter.
    pub fn from_url(url: &str) -> Result<Self> {
        let wrong = |reason: &str| Error::InvalidUrl {
            url: redact_url(url),
            reason: reason.into(),
        };
        match ConnectionUrl::scheme_of(url).as_deref() {
            Some("sqlite") => {}
            Some(_) => return Err(wrong("expected a sqlite:// URL")),
            None => {
                return Err(wrong(
                    "expected sqlite:///absolute/path or sqlite://relative/path",
                ))
            }
        }
        // Everything between `://` and the query is the path: `sqlite://locks.db` names no host.
        let mut url = ConnectionUrl::parse_opaque(url)?;
        let path = url.decoded_path()?;
        if path.is_empty() {
            return Err(
                url.invalid("no path: use sqlite:///absolute/path.db or sqlite://relative/path.db")
            );
        }
        if path == ":memory:" || path.starts_with("file:") || path.contains("mode=memory") {
            return Err(url.invalid(
                "an in-memory SQLite database cannot coordinate processes; name a file (or use memory:// inside one process)",
            ));
        }
        if path.starts_with('~') {
            return Err(url.invalid("`~` is not expanded; write the home directory out"));
        }
        if path.ends_with('/') {
            return Err(url.invalid("the path names a directory, not a file"));
        }
        let client = url.params().take_client_options()?;
        let table = match url.params().take("table") {
            Some(t) => table_name(&t)?,
            None => DEFAULT_TABLE.to_string(),
        };
        let pool_size = url
            .params()
            .take_parsed::<u32>("pool_size")?
            .unwrap_or(DEFAULT_POOL_SIZE);
        if pool_size == 0 || pool_size > 64 {
            return Err(url.invalid(format!("pool_size {pool_size} is not in 1..=64")));
        }
        let allow_network_fs = url
            .params()
            .take_parsed::<bool>("allow_network_fs")?
            .unwrap_or(false);
        url.finish_params()?;
        Ok(SqliteConfig {
            path: PathBuf::from(path),
            table,
            pool_size,
            allow_network_fs,
            client,
        })
    }

    /// The database file, as given (a relative path is resolved at connect).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The lease table's name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Uses another lease table: 1 to 63 ASCII letters, digits or `_`, not starting with a
    /// digit (always quoted in SQL, so no input can become SQL).
    pub fn with_table(mut self, table: &str) -> Result<Self> {
        self.table = table_name(table)?;
        Ok(self)
    }

    /// How many connections the pool keeps at most (1 to 64).
    pub fn with_pool_size(mut self, size: u32) -> Result<Self> {
        if size == 0 || size > 64 {
            return Err(Error::InvalidConfig {
                reason: format!("pool_size {size} is not in 1..=64"),
            });
        }
        self.pool_size = size;
        Ok(self)
    }

    /// Whether a database on a filesystem not known to be local to this kernel (a network,
    /// cluster or FUSE filesystem, a VM's share: anything but ext2/3/4, xfs, btrfs, bcachefs,
    /// f2fs, jfs, reiserfs, nilfs2, zfs, tmpfs, ramfs, overlay and ecryptfs) is accepted (with a
    /// warning) instead of refused. SQLite's locks are not reliable there: only for a filesystem
    /// that this machine's kernel alone uses.
    pub fn with_allow_network_fs(mut self, allow: bool) -> Self {
        self.allow_network_fs = allow;
        self
    }

    /// The client options (epoch, safety margin, request timeout).
    pub fn client_options(&self) -> &ClientOptions {
        &self.client
    }

    /// Replaces the client options.
    pub fn with_client_options(mut self, client: ClientOptions) -> Self {
        self.client = client;
        self
    }
}

/// Validates a table name; stricter than SQLite on purpose, so quoting needs no escaping.
pub(crate) fn table_name(name: &str) -> Result<String> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && !name.as_bytes()[0].is_ascii_digit()
        && !name.to_ascii_lowercase().starts_with("sqlite_");
    if ok {
        Ok(name.to_string())
    } else {
        Err(Error::InvalidConfig {
            reason: format!(
                "`{name}` is not a valid table name: 1-63 ASCII letters, digits or _, not starting with a digit or sqlite_"
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_conformance::kit::{ErrOrFail, OrFail, TestResult};
    use std::time::Duration;

    #[test]
    fn absolute_and_relative_paths() -> TestResult {
        let c = SqliteConfig::from_url("sqlite:///var/lib/app/locks.db")
            .or_fail("the absolute sqlite URL")?;
        assert_eq!(c.path, PathBuf::from("/var/lib/app/locks.db"));
        assert_eq!(c.table, DEFAULT_TABLE);
        assert_eq!(c.pool_size, DEFAULT_POOL_SIZE);
        assert!(!c.allow_network_fs);
        let c = SqliteConfig::from_url("sqlite://locks.db").or_fail("the relative sqlite URL")?;
        assert_eq!(c.path, PathBuf::from("locks.db"));
        let c = SqliteConfig::from_url("SQLite://state/my%20locks.db?table=locks&pool_size=2&allow_network_fs=true&epoch=3&timeout_ms=250")
            .or_fail("the sqlite URL with every parameter")?;
        assert_eq!(c.path, PathBuf::from("state/my locks.db"));
        assert_eq!(c.table, "locks");
        assert_eq!(c.pool_size, 2);
        assert!(c.allow_network_fs);
        assert_eq!(c.client.epoch.get(), 3);
        assert_eq!(c.client.request_timeout, Duration::from_millis(250));
        Ok(())
    }

    #[test]
    fn bad_urls_are_typed_errors() -> TestResult {
        for (url, says) in [
            ("sqlite://", "no path"),
            ("sqlite:///", "directory"),
            ("sqlite://?table=x", "no path"),
            ("sqlite://:memory:", "in-memory"),
            ("sqlite://file:x.db?mode=memory", "in-memory"),
            ("sqlite://~/locks.db", "`~`"),
            ("sqlite:///a.db?bogus=1", "unknown parameter `bogus`"),
            ("sqlite:///a.db?pool_size=0", "pool_size"),
            ("sqlite:///a.db?allow_network_fs=yes", "allow_network_fs"),
            ("sqlite:///a.db?table=a;b", "table name"),
            ("sqlite:///a.db?table=sqlite_master", "table name"),
            ("sqlite:///a%zz.db", "percent"),
            ("postgres:///a.db", "sqlite://"),
            ("sqlite:a.db", "sqlite:///"),
        ] {
            let err = SqliteConfig::from_url(url).err_or_fail("a bad URL")?;
            assert!(
                matches!(err, Error::InvalidUrl { .. } | Error::InvalidConfig { .. }),
                "{url}: {err}"
            );
            assert!(err.to_string().contains(says), "{url}: {err}");
        }
        Ok(())
    }
}
