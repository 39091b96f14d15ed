//! Which statements the lease table takes: this version's, or, for a table an older version
//! created (no `waited_until`), the ones before it, until the table is upgraded; and noticing
//! the upgrade when `migrate()` ran in another process.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// How often a release looks again whether a table it found without `waited_until` has it now.
/// A release's previous form notifies every time, which is correct for every waiter and only
/// costs the server more, so it looks again on a timer instead of with every release.
pub(crate) const RELEASE_RECHECK: Duration = Duration::from_secs(10);

/// What this authority knows of its lease table's version.
#[derive(Debug, Default)]
pub(crate) struct TableVersion {
    /// The table lacked `waited_until` when a statement last needed it.
    previous: AtomicBool,
    /// When a release last sent this version's form while `previous` was set.
    release_checked: Mutex<Option<Instant>>,
}

impl TableVersion {
    /// Whether a release sends this version's form: always, unless the table lacked
    /// `waited_until`; then once every [`RELEASE_RECHECK`], to notice an upgrade.
    pub(crate) fn release_sends_current(&self) -> bool {
        if !self.previous.load(Ordering::Relaxed) {
            return true;
        }
        let mut checked = self
            .release_checked
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        match *checked {
            Some(at) if at.elapsed() < RELEASE_RECHECK => false,
            _ => {
                *checked = Some(Instant::now());
                true
            }
        }
    }

    /// A statement of this version's form failed for the missing column: the previous forms
    /// are used, and a waiter's attempts and marks still try this version's first (see
    /// `Inner::acquire_statement`). Warns once per switch.
    pub(crate) fn found_previous(&self, table: &str) {
        if !self.previous.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                table,
                "the lease table lacks waited_until (created by an older version): every release \
                 notifies, and waiters mark nothing, until the table is upgraded (migrate())"
            );
        }
    }

    /// A statement of this version's form ran, or `migrate()` upgraded the table: this
    /// version's statements are used from now on.
    pub(crate) fn found_current(&self, table: &str) {
        if self.previous.load(Ordering::Relaxed) && self.previous.swap(false, Ordering::Relaxed) {
            tracing::info!(
                table,
                "the lease table has waited_until now: waiters mark keys again and releases \
                 notify only marked keys"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn releases_look_again_on_a_timer_once_the_table_was_found_old(
    ) -> Result<(), &'static str> {
        let version = TableVersion::default();
        let mut looks = vec![version.release_sends_current()];
        version.found_previous("t");
        // The first look, then none until the timer, then the next.
        looks.push(version.release_sends_current());
        looks.push(version.release_sends_current());
        tokio::time::advance(RELEASE_RECHECK).await;
        looks.push(version.release_sends_current());
        looks.push(version.release_sends_current());
        version.found_current("t");
        looks.push(version.release_sends_current());
        looks.push(version.release_sends_current());
        if looks != [true, true, false, true, false, true, true] {
            return Err("releases did not look again as the timer says");
        }
        Ok(())
    }
}
