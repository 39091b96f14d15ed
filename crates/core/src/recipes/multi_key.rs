//! Several keys, all or nothing: [`acquire_all`] takes every key of a set or none of them.
//!
//! The keys are taken one at a time in one canonical order (sorted by their bytes, each once),
//! so two callers whose sets overlap always meet at the first key they share: the one that has
//! it goes on, the other waits there holding only keys that come before it, which the first
//! never needs. Nobody waits for a key while holding one that a waiter for its own keys
//! needs, so overlapping sets cannot deadlock. Each key keeps its own fence (fences grow per
//! key), and the whole is released together. On an error, on `max_wait`, and when the caller
//! drops the future, every key taken so far is given back.
//!
//! Where the backend takes a set in one atomic step ([`crate::Capabilities::atomic_acquire_all`]: an
//! etcd transaction, one SQL transaction, one Redis script), the whole set is tried that way
//! first: a free set costs one request, and a held one nothing (the step takes none of it).
//! Only then are the keys taken one by one, waiting in the canonical order. The atomic step
//! holds nothing while it waits, so it cannot close a cycle with callers that take keys in
//! order.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::contract::authority::Authority;
use crate::contract::error::{Error, Result};
use crate::contract::fence::Fence;
use crate::contract::key::LockKey;
use crate::contract::lost::LostReason;
use crate::lease::{Lease, LeaseOptions};
use crate::recipes::taken::{release_all, Taken};
use crate::time::saturating_add;
use tokio::time::Instant;

/// The most keys one [`acquire_all`] takes.
pub const MAX_KEYS: usize = 1024;

/// Every key of a set, held together: one fenced lease per key, in the canonical order.
#[derive(Debug)]
pub struct MultiLease {
    leases: Vec<Lease>,
}

/// Takes every key of `keys` for `ttl`, in the canonical order (sorted, each once), waiting at
/// most `max_wait` in all; [`Error::Timeout`] (naming the key that stayed held) when one did not
/// come in time. Whatever fails, or when the future is dropped, every key taken is given back.
pub async fn acquire_all(
    authority: Arc<dyn Authority>,
    keys: &[LockKey],
    ttl: Duration,
    max_wait: Duration,
    options: LeaseOptions,
) -> Result<MultiLease> {
    let order = canonical(keys)?;
    let started = Instant::now();
    let give_up = saturating_add(started, max_wait);
    if authority.capabilities().atomic_acquire_all {
        if let Some(leases) = try_at_once(&authority, &order, ttl, &options).await? {
            return Ok(MultiLease { leases });
        }
    }
    let mut taken = Taken::default();
    for key in order {
        let left = give_up.saturating_duration_since(Instant::now());
        let lease = Lease::acquire(authority.clone(), &key, ttl, left, options.clone()).await;
        let lease = match lease {
            Err(Error::Timeout { key, .. }) => Err(Error::Timeout {
                key,
                waited: started.elapsed(),
            }),
            other => other,
        };
        let lease = taken.or_give_back(lease).await?;
        taken.push(lease);
    }
    Ok(MultiLease {
        leases: taken.finish(),
    })
}

/// The whole set in one atomic step, when every key is free: `None` when one is held or the
/// backend cannot take this set at once (then the caller takes the keys one by one).
async fn try_at_once(
    authority: &Arc<dyn Authority>,
    order: &[LockKey],
    ttl: Duration,
    options: &LeaseOptions,
) -> Result<Option<Vec<Lease>>> {
    match authority.try_acquire_all(order, ttl).await {
        Ok(Some(grants)) => Ok(Some(
            grants
                .into_iter()
                .map(|grant| Lease::from_grant(authority.clone(), grant, options.clone()))
                .collect(),
        )),
        Ok(None) | Err(Error::Unsupported { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The keys sorted by their bytes, each once: the order every caller takes them in.
pub fn canonical(keys: &[LockKey]) -> Result<Vec<LockKey>> {
    let mut order = keys.to_vec();
    order.sort_by(|a, b| a.as_str().as_bytes().cmp(b.as_str().as_bytes()));
    order.dedup();
    if order.is_empty() || order.len() > MAX_KEYS {
        return Err(Error::InvalidConfig {
            reason: format!(
                "acquire_all takes 1 to {MAX_KEYS} distinct keys, not {}",
                order.len()
            ),
        });
    }
    Ok(order)
}

/// `Ok` when `keys` are 1 to [`MAX_KEYS`] distinct keys in the canonical order, as
/// [`Authority::try_acquire_all`] takes them; [`Error::InvalidConfig`] otherwise.
pub fn check_canonical(keys: &[LockKey]) -> Result<()> {
    if canonical(keys)? == keys {
        Ok(())
    } else {
        Err(Error::InvalidConfig {
            reason: "try_acquire_all takes distinct keys sorted by their bytes".to_string(),
        })
    }
}

impl MultiLease {
    /// The keys held, in the canonical order.
    pub fn keys(&self) -> impl Iterator<Item = &LockKey> {
        self.leases.iter().map(Lease::key)
    }

    /// The fence of `key`'s lease, to send with a write to what that key protects; `None` for a
    /// key not in the set.
    pub fn fence(&self, key: &LockKey) -> Option<Fence> {
        self.lease(key).map(Lease::fence)
    }

    /// `key`'s lease; `None` for a key not in the set.
    pub fn lease(&self, key: &LockKey) -> Option<&Lease> {
        self.leases.iter().find(|l| l.key() == key)
    }

    /// Every lease, in the canonical order.
    pub fn leases(&self) -> &[Lease] {
        &self.leases
    }

    /// The leases, in the canonical order, to hold and release one by one.
    pub fn into_leases(self) -> Vec<Lease> {
        self.leases
    }

    /// `Ok` while every key is held: call it right before each side effect that needs them all.
    pub fn ensure_valid(&self) -> Result<()> {
        self.leases.iter().try_for_each(Lease::ensure_valid)
    }

    /// Resolves when the first of the keys is lost.
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        let losses: Vec<_> = self.leases.iter().map(|l| Box::pin(l.lost())).collect();
        async move {
            if losses.is_empty() {
                return std::future::pending().await;
            }
            futures_util::future::select_all(losses).await.0
        }
    }

    /// Gives every key back at once; the first error, once every release was tried.
    pub async fn release(self) -> Result<()> {
        release_all(self.leases).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(names: &[&str]) -> Vec<LockKey> {
        names.iter().filter_map(|n| LockKey::new(*n).ok()).collect()
    }

    #[test]
    fn every_caller_gets_one_order_whatever_it_names() {
        let a = canonical(&keys(&["b", "a", "c", "a"])).map_err(|e| e.to_string());
        let b = canonical(&keys(&["c", "b", "a"])).map_err(|e| e.to_string());
        assert_eq!(a, b);
        assert_eq!(a, Ok(keys(&["a", "b", "c"])));
    }

    #[test]
    fn an_empty_set_is_refused() {
        assert!(matches!(canonical(&[]), Err(Error::InvalidConfig { .. })));
    }
}
