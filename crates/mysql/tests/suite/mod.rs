//! What the binaries that run the conformance suite against MariaDB share: clients of a URL,
//! faults on the server with the operator's revoke, and the residue a scenario must not leave.

#![allow(dead_code)]

use std::sync::Arc;

use async_trait::async_trait;
use leasehold_conformance::kit::{HarnessServer, ServerFaults, UrlConnector};
use leasehold_conformance::{harness_error, Residue};
use leasehold_core::LockKey;
use leasehold_mysql::MysqlAuthority;

/// Clients of the authority at `url`, for the suite.
pub fn clients(url: &str) -> UrlConnector {
    UrlConnector::new(
        url,
        |url| async move { MysqlAuthority::connect(&url).await },
    )
}

/// Crash and freeze faults on `server`, and an operator ending a lease through a connection at
/// `admin_url`.
pub fn faults<S: HarnessServer>(server: Arc<S>, admin_url: String) -> ServerFaults<S> {
    ServerFaults::new(server).with_revoke(move |key| {
        let admin_url = admin_url.clone();
        async move { revoke(&admin_url, &key).await }
    })
}

/// An operator ends the lease on `key` by hand, connected at `url`: its row expires now, and
/// the row, with its fence counter, stays.
pub async fn revoke(url: &str, key: &LockKey) -> leasehold_core::Result<()> {
    let admin = MysqlAuthority::connect(url).await?;
    sqlx::query("UPDATE leasehold_leases SET expires_at = UTC_TIMESTAMP(6) WHERE lock_key = ?")
        .bind(key.as_str())
        .execute(admin.pool())
        .await
        .map_err(harness_error)?;
    Ok(())
}

/// What is left for a key: a live lease row, read at the URL it holds (the row itself stays on
/// purpose).
pub struct LiveRows(pub String);

#[async_trait]
impl Residue for LiveRows {
    async fn leftovers(&self, key: &LockKey) -> leasehold_core::Result<Vec<String>> {
        let admin = MysqlAuthority::connect(&self.0).await?;
        let live: Vec<(u64, Vec<u8>)> = sqlx::query_as(
            "SELECT fence, owner FROM leasehold_leases \
             WHERE lock_key = ? AND expires_at > UTC_TIMESTAMP(6)",
        )
        .bind(key.as_str())
        .fetch_all(admin.pool())
        .await
        .map_err(harness_error)?;
        Ok(live
            .into_iter()
            .map(|(fence, owner)| {
                format!(
                    "a live lease row: fence {fence}, owner {}",
                    String::from_utf8_lossy(&owner)
                )
            })
            .collect())
    }
}
