//! What the connected server's settings promise for fences, read at connect.

use leasehold_core::FenceSafety;
use leasehold_sql_common::FenceSafetyOption;

/// The settings read at connect, by name (MySQL 8.0.26 renamed `master` to `source`; both are
/// read). A setting the server lacks (no semi-sync plugin) is absent.
pub(crate) const SETTINGS: &str = "SHOW GLOBAL VARIABLES WHERE Variable_name IN (\
    'innodb_flush_log_at_trx_commit', \
    'rpl_semi_sync_master_enabled', 'rpl_semi_sync_source_enabled', \
    'rpl_semi_sync_master_wait_point', 'rpl_semi_sync_source_wait_point', \
    'rpl_semi_sync_master_wait_no_slave', 'rpl_semi_sync_source_wait_for_replica_count', \
    'rpl_semi_sync_master_timeout', 'rpl_semi_sync_source_timeout')";

/// A semi-synchronous primary that waits at least this long for an acknowledgement before it
/// falls back to asynchronous replication: in practice it never falls back (a replica that
/// stays away a day is an outage the operator has handled).
const NEVER_FALLS_BACK_MS: u64 = 24 * 3600 * 1000;

/// What the settings say, as `(name, value)` pairs.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Settings(pub(crate) Vec<(String, String)>);

impl Settings {
    fn get(&self, names: &[&str]) -> Option<&str> {
        self.0
            .iter()
            .find(|(n, _)| names.iter().any(|want| n.eq_ignore_ascii_case(want)))
            .map(|(_, v)| v.as_str())
    }

    fn on(&self, names: &[&str]) -> bool {
        self.get(names)
            .is_some_and(|v| v.eq_ignore_ascii_case("ON") || v == "1")
    }

    /// Whether every acknowledged commit is on a replica before any client sees it, and stays
    /// so: semi-sync on, `AFTER_SYNC`, waiting even with no replica connected, and a fallback
    /// timeout so long that it does not happen.
    pub(crate) fn waits_for_replica(&self) -> bool {
        let enabled = self.on(&[
            "rpl_semi_sync_master_enabled",
            "rpl_semi_sync_source_enabled",
        ]);
        let after_sync = self
            .get(&[
                "rpl_semi_sync_master_wait_point",
                "rpl_semi_sync_source_wait_point",
            ])
            .is_some_and(|v| v.eq_ignore_ascii_case("AFTER_SYNC"));
        // MySQL's source always waits for its replica count; MariaDB's waits with no replica
        // connected only while `wait_no_slave` is on (its default).
        let waits_alone = self
            .get(&["rpl_semi_sync_master_wait_no_slave"])
            .is_none_or(|v| v.eq_ignore_ascii_case("ON") || v == "1");
        let never_falls_back = self
            .get(&[
                "rpl_semi_sync_master_timeout",
                "rpl_semi_sync_source_timeout",
            ])
            .and_then(|v| v.parse::<u64>().ok())
            .is_some_and(|ms| ms >= NEVER_FALLS_BACK_MS);
        enabled && after_sync && waits_alone && never_falls_back
    }

    /// Whether a crash of the server keeps every acknowledged commit:
    /// `innodb_flush_log_at_trx_commit` 1 (flushed at commit) or 2 (written at commit, lost
    /// only when the machine crashes); 0 acknowledges commits it may lose in a server crash.
    pub(crate) fn durable(&self) -> bool {
        self.get(&["innodb_flush_log_at_trx_commit"]) != Some("0")
    }
}

/// Declares what the server's fences promise: `(fence safety, durable across restart)`.
///
/// * Not durable: even a crash of this one server can lose the last acquisitions, so neither
///   failover-safe nor durable, whatever the operator says.
/// * Otherwise a failover loses nothing only where every commit waits for a replica's
///   acknowledgement and cannot stop waiting ([`Settings::waits_for_replica`]). Plain
///   semi-synchronous replication with its default 10 s timeout falls back to asynchronous
///   silently, so it does not count. An operator may vouch for replication the settings cannot
///   show (`fence_safety=linearizable`), or declare fences unsafe regardless.
pub(crate) fn declare(settings: &Settings, option: FenceSafetyOption) -> (FenceSafety, bool) {
    if !settings.durable() {
        return (FenceSafety::FailoverUnsafe, false);
    }
    let safety = match option {
        FenceSafetyOption::Linearizable => FenceSafety::Linearizable,
        FenceSafetyOption::FailoverUnsafe => FenceSafety::FailoverUnsafe,
        FenceSafetyOption::Auto if settings.waits_for_replica() => FenceSafety::Linearizable,
        _ => FenceSafety::FailoverUnsafe,
    };
    (safety, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(pairs: &[(&str, &str)]) -> Settings {
        Settings(
            pairs
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
        )
    }

    #[test]
    fn fences_promise_what_the_replication_settings_say() {
        use FenceSafety::{FailoverUnsafe as Unsafe, Linearizable as Lin};
        use FenceSafetyOption::{Auto, FailoverUnsafe, Linearizable};
        let semi = |timeout: &str, point: &str, alone: &str| {
            settings(&[
                ("innodb_flush_log_at_trx_commit", "1"),
                ("rpl_semi_sync_master_enabled", "ON"),
                ("rpl_semi_sync_master_wait_point", point),
                ("rpl_semi_sync_master_wait_no_slave", alone),
                ("rpl_semi_sync_master_timeout", timeout),
            ])
        };
        let forever = "4294967295";
        for (s, option, want) in [
            (settings(&[]), Auto, (Unsafe, true)),
            (
                settings(&[("innodb_flush_log_at_trx_commit", "2")]),
                Auto,
                (Unsafe, true),
            ),
            (semi("10000", "AFTER_SYNC", "ON"), Auto, (Unsafe, true)),
            (semi(forever, "AFTER_SYNC", "ON"), Auto, (Lin, true)),
            (semi(forever, "AFTER_COMMIT", "ON"), Auto, (Unsafe, true)),
            (semi(forever, "AFTER_SYNC", "OFF"), Auto, (Unsafe, true)),
            (
                settings(&[
                    ("rpl_semi_sync_source_enabled", "ON"),
                    ("rpl_semi_sync_source_wait_point", "AFTER_SYNC"),
                    ("rpl_semi_sync_source_timeout", forever),
                ]),
                Auto,
                (Lin, true),
            ),
            (
                semi(forever, "AFTER_SYNC", "ON"),
                FailoverUnsafe,
                (Unsafe, true),
            ),
            (settings(&[]), Linearizable, (Lin, true)),
            (
                settings(&[("innodb_flush_log_at_trx_commit", "0")]),
                Linearizable,
                (Unsafe, false),
            ),
        ] {
            assert_eq!(declare(&s, option), want, "{s:?} {option:?}");
        }
    }
}
