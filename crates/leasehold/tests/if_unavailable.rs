//! Failing open or closed (`acquire_or`, and the CLI's `--if-unavailable`, which asks
//! `is_unavailable`): only an authority that cannot be reached is unavailable. An authority
//! that answers but is busy (SQLite's write lock held by another connection: another process
//! may be taking this very key) is contention, and no policy runs the work without a lock then.

#![cfg(feature = "sqlite")]

use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold::sqlite::SqliteAuthority;
use leasehold::{
    acquire_or, is_unavailable, Admission, Authority, IfUnavailable, LeaseOptions, LockKey,
};

/// The request (and busy) timeout of the clients under test: short, so each attempt gives up
/// quickly while the other connection keeps the write lock.
const TIMEOUT: Duration = Duration::from_millis(500);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_write_contention_is_not_unavailable() -> Result<(), String> {
    let dir = tempfile::tempdir().map_err(|e| format!("a temporary directory: {e}"))?;
    let url = format!(
        "sqlite://{}?timeout_ms={}",
        dir.path().join("locks.db").display(),
        TIMEOUT.as_millis()
    );
    let writer = SqliteAuthority::connect(&url)
        .await
        .map_err(|e| format!("the writer's client: {e}"))?;
    let client: Arc<dyn Authority> = Arc::new(
        SqliteAuthority::connect(&url)
            .await
            .map_err(|e| format!("the client under test: {e}"))?,
    );
    let key = LockKey::new("report:contended").map_err(|e| format!("key: {e}"))?;
    // Another connection writing: it holds the file's one write lock.
    let busy = writer
        .pool()
        .begin_with("BEGIN IMMEDIATE")
        .await
        .map_err(|e| format!("BEGIN IMMEDIATE: {e}"))?;
    let mut seen = Vec::new();
    for max_wait in [Duration::ZERO, Duration::from_secs(1)] {
        for policy in [IfUnavailable::FailOpen, IfUnavailable::FailClosed] {
            let options = LeaseOptions::default().with_auto_renew(false);
            let started = Instant::now();
            let admitted =
                acquire_or(client.clone(), &key, TIMEOUT * 4, max_wait, options, policy).await;
            let took = started.elapsed();
            match admitted {
                Ok(Admission::Unlocked(unlocked)) => {
                    return Err(format!(
                        "{policy:?}, max_wait {max_wait:?}: ran without a lock under write \
                         contention ({unlocked})"
                    ))
                }
                Ok(Admission::Leased(_)) => {
                    return Err(format!(
                        "{policy:?}, max_wait {max_wait:?}: leased while another connection \
                         held the write lock"
                    ))
                }
                Err(e) if is_unavailable(&e) => {
                    return Err(format!(
                        "{policy:?}, max_wait {max_wait:?}: write contention reported as \
                         unavailable: {e}"
                    ))
                }
                Err(e) if !e.is_retryable() => {
                    return Err(format!(
                        "{policy:?}, max_wait {max_wait:?}: a permanent error: {e}"
                    ))
                }
                Err(e) => seen.push(format!("{policy:?}, {max_wait:?}: {e} after {took:?}")),
            }
        }
    }
    busy.rollback()
        .await
        .map_err(|e| format!("ROLLBACK: {e}"))?;
    // The writer gone, the same call takes a real lease.
    let admitted = acquire_or(
        client.clone(),
        &key,
        TIMEOUT * 4,
        Duration::ZERO,
        LeaseOptions::default(),
        IfUnavailable::FailOpen,
    )
    .await
    .map_err(|e| format!("after the writer finished: {e}"))?;
    match admitted {
        Admission::Leased(lease) => {
            let _ = lease.release().await.map_err(|e| format!("release: {e}"))?;
            println!("{}", seen.join("\n"));
            Ok(())
        }
        Admission::Unlocked(unlocked) => Err(format!("after the writer finished: {unlocked}")),
    }
}
