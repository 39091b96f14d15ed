//! What the SQLite test binaries share: keys and connections that say what failed, the URL of a
//! file with a one-second request timeout, the machine's monotonic clock, and the live rows a
//! key has in a file. Each binary uses its part.
#![allow(dead_code)]

use std::path::Path;

use leasehold_conformance::harness_error;
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

/// The file at `path`, with requests giving up after one second.
pub fn url(path: &Path) -> String {
    format!("sqlite://{}?timeout_ms=1000", path.display())
}

/// Now on the machine's monotonic clock, as the authority reads it (tests run outside any time
/// namespace).
pub fn now_ns() -> i64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec * 1_000_000_000 + t.tv_nsec
}

/// The live lease rows of `key` in the file at `path`, described (the row itself, with its
/// fence counter, stays on purpose once the lease ends).
pub async fn live_rows(path: &Path, key: &str) -> leasehold_core::Result<Vec<String>> {
    let admin = SqliteAuthority::connect(&url(path)).await?;
    let live: Vec<(i64, String)> = sqlx::query_as(
        "SELECT fence, owner FROM leasehold_leases \
         WHERE lock_key = ?1 AND boot_id = ?2 AND expires_ns > ?3",
    )
    .bind(key)
    .bind(admin.boot_id())
    .bind(now_ns())
    .fetch_all(admin.pool())
    .await
    .map_err(harness_error)?;
    admin.close().await;
    Ok(live
        .into_iter()
        .map(|(fence, owner)| format!("a live lease row: fence {fence}, owner {owner}"))
        .collect())
}
