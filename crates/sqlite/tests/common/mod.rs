//! What the SQLite test binaries share: keys and connections that say what failed.

use leasehold_core::LockKey;
use leasehold_sqlite::SqliteAuthority;

pub fn key(name: &str) -> Result<LockKey, String> {
    LockKey::new(name).map_err(|e| format!("key {name}: {e}"))
}

pub async fn connect(url: &str) -> Result<SqliteAuthority, String> {
    SqliteAuthority::connect(url)
        .await
        .map_err(|e| format!("connect {url}: {e}"))
}
