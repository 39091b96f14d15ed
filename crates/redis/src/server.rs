//! What the server's configuration says about its locks and fences, read at connect.

use leasehold_core::ExclusionSafety;

/// The server settings that decide whether locks and fences survive memory pressure and
/// restarts, read with `CONFIG GET` when the authority connects (where the server allows it:
/// an ACL user without `CONFIG`, or a managed service that renamed the command, gets none).
///
/// A snapshot: the authority does not notice a later `CONFIG SET`, nor a different server
/// behind the same address after a failover.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerSettings {
    maxmemory_policy: String,
    appendonly: bool,
    appendfsync: String,
}

impl ServerSettings {
    /// The parameters read, in the order [`ServerSettings::from_values`] takes them.
    pub(crate) const PARAMETERS: [&'static str; 3] =
        ["maxmemory-policy", "appendonly", "appendfsync"];

    pub(crate) fn from_values(maxmemory_policy: &str, appendonly: &str, appendfsync: &str) -> Self {
        ServerSettings {
            maxmemory_policy: maxmemory_policy.to_ascii_lowercase(),
            appendonly: appendonly.eq_ignore_ascii_case("yes"),
            appendfsync: appendfsync.to_ascii_lowercase(),
        }
    }

    /// `maxmemory-policy`: what the server evicts when it reaches `maxmemory`.
    pub fn maxmemory_policy(&self) -> &str {
        &self.maxmemory_policy
    }

    /// `appendonly`: whether writes go to the append-only file.
    pub fn appendonly(&self) -> bool {
        self.appendonly
    }

    /// `appendfsync`: when the append-only file is flushed to disk (`always`, `everysec`, `no`).
    pub fn appendfsync(&self) -> &str {
        &self.appendfsync
    }

    /// Whether the server may evict a lock key, ending a lease early: every policy but
    /// `noeviction` (`volatile-*` policies evict keys with an expiry, which lock keys have;
    /// `allkeys-*` any key).
    pub fn may_evict_lock_keys(&self) -> bool {
        self.maxmemory_policy != "noeviction"
    }

    /// Whether the server may evict a fence counter, so that the key's fences start at 1 again:
    /// every policy but `noeviction` and the `volatile-*` ones (a counter has no expiry). A
    /// policy this crate does not know counts as evicting.
    pub fn may_evict_fence_counters(&self) -> bool {
        self.may_evict_lock_keys() && !self.maxmemory_policy.starts_with("volatile-")
    }

    /// Whether fences survive a restart of this server: every write is in the append-only file
    /// and on disk before the server acknowledges it (`appendonly yes`, `appendfsync always`),
    /// and no counter is evicted. This is what the authority declares as
    /// [`Capabilities::durable_fences`](leasehold_core::Capabilities::durable_fences). A failover
    /// is another matter: Redis fences are failover-unsafe whatever the settings.
    pub fn durable_fences(&self) -> bool {
        self.appendonly && self.appendfsync == "always" && !self.may_evict_fence_counters()
    }
}

/// Whether a lease stays exclusive for its TTL, from the settings read at connect (`None`:
/// the server refused `CONFIG GET`). Every policy but `noeviction` may evict a live lock key
/// under memory pressure, and then another client is granted the key while its holder's lease
/// is valid by the holder's clock: that is an early revocation by the authority, declared as
/// one. A policy that cannot be read cannot be ruled out, so it is declared too.
pub(crate) fn exclusion(settings: Option<&ServerSettings>) -> ExclusionSafety {
    let reason = match settings {
        Some(settings) if !settings.may_evict_lock_keys() => return ExclusionSafety::Exclusive,
        Some(settings) => format!(
            "Redis maxmemory-policy {} evicts lock keys under memory pressure, ending live \
             leases; only noeviction keeps them",
            settings.maxmemory_policy()
        ),
        None => "the Redis server's maxmemory-policy could not be read (CONFIG GET refused), \
                 so the eviction of live lock keys cannot be ruled out"
            .to_string(),
    };
    ExclusionSafety::EarlyRevocation { reason }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_and_persistence_decide() {
        let s = |p, a, f| ServerSettings::from_values(p, a, f);
        assert!(s("noeviction", "yes", "always").durable_fences());
        assert!(!s("noeviction", "yes", "always").may_evict_lock_keys());
        let volatile = s("volatile-ttl", "yes", "always");
        assert!(volatile.may_evict_lock_keys() && !volatile.may_evict_fence_counters());
        assert!(volatile.durable_fences());
        for policy in [
            "allkeys-lru",
            "allkeys-lfu",
            "allkeys-random",
            "some-future-policy",
        ] {
            let settings = s(policy, "yes", "always");
            assert!(settings.may_evict_fence_counters(), "{policy}");
            assert!(!settings.durable_fences(), "{policy}");
        }
        assert!(!s("noeviction", "no", "always").durable_fences());
        assert!(!s("noeviction", "yes", "everysec").durable_fences());
        assert!(s("NoEviction", "YES", "Always").durable_fences());
    }

    #[test]
    fn only_noeviction_keeps_leases_exclusive() {
        let s = |p| ServerSettings::from_values(p, "no", "everysec");
        assert_eq!(
            exclusion(Some(&s("noeviction"))),
            ExclusionSafety::Exclusive
        );
        for policy in [
            "volatile-lru",
            "volatile-ttl",
            "allkeys-lru",
            "some-future-policy",
        ] {
            let declared = exclusion(Some(&s(policy)));
            assert!(declared.can_end_early(), "{policy}");
            assert!(declared.to_string().contains(policy), "{declared}");
        }
        assert!(exclusion(None).can_end_early());
    }
}
