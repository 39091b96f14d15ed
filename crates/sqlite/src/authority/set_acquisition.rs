//! Taking a set of keys in one step (`Authority::try_acquire_all`): one `BEGIN IMMEDIATE`
//! transaction runs the acquisition upsert of every key, in the order given, and commits only
//! if each took its key; one key still held rolls the whole transaction back.
//!
//! The write lock is the file's: while the transaction holds it no other writer runs, so the
//! set is decided at one reading of the clock, and a rolled-back transaction leaves no trace
//! (no row, no raised fence). Each key's fence is the one its single-key acquisition would have
//! raised it to.

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::backend::{check_canonical, claim_or_give_back, Left};
use leasehold_core::time::saturating_add;
use leasehold_core::{Grant, Instant, LockKey, OwnerToken, Result};
use sqlx::Connection;

use super::{errors, ttl_ns, Inner, SqliteAuthority, BACKEND, TTL};

/// What one set step found: each key's fence in the order given, or `None` when a key was held.
type SetAcquired = std::result::Result<Option<Vec<i64>>, sqlx::Error>;

/// The keys and owner tokens of a set step, in the order given.
type Claims = Arc<Vec<(String, String)>>;

impl Inner {
    /// One set step, in one `BEGIN IMMEDIATE` transaction. Runs in its own task (see
    /// [`SqliteAuthority::acquire_set`]); `gone` says whether the caller stopped waiting, so a
    /// step still queued for a connection or for the write lock takes nothing.
    async fn acquire_set_step(
        &self,
        claims: &[(String, String)],
        ttl: Duration,
        gone: impl Fn() -> bool,
    ) -> SetAcquired {
        let mut conn = self.lease_pool.acquire().await?;
        if gone() {
            return Ok(None);
        }
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
        if gone() {
            tx.rollback().await?;
            return Ok(None);
        }
        let now = self.clock.now();
        let mut fences = Vec::with_capacity(claims.len());
        for (key, owner) in claims {
            let won: Option<i64> = sqlx::query_scalar(self.statements.acquire.clone())
                .bind(key)
                .bind(owner)
                .bind(&self.clock.boot_id)
                .bind(now.ns.saturating_add(ttl_ns(ttl)))
                .bind(now.ns)
                .bind(now.wall_ns)
                .bind(now.wall_ns.saturating_add(ttl_ns(ttl)))
                .bind(now.boot_began_unix_ns)
                .fetch_optional(&mut *tx)
                .await?;
            match won {
                Some(fence) => fences.push(fence),
                None => {
                    // Held: the keys this transaction took before it are put back as they were.
                    tx.rollback().await?;
                    return Ok(None);
                }
            }
        }
        tx.commit().await?;
        Ok(Some(fences))
    }

    /// Gives back every lease of a set nobody was told about.
    async fn give_back_set(&self, claims: &[(String, String)], fences: Vec<i64>, ttl: Duration) {
        for ((key, owner), raw) in claims.iter().zip(fences) {
            self.give_back(key.clone(), owner.clone(), raw, ttl).await;
        }
    }
}

/// Whether a set step took its keys: their fences, to give them back by.
fn won_set(acquired: &SetAcquired) -> Option<Vec<i64>> {
    acquired.as_ref().ok().and_then(Clone::clone)
}

impl SqliteAuthority {
    /// `try_acquire_all`: the set in one write transaction, all or none. The input is checked
    /// before anything runs; the grants' deadlines count from before the step was started; a
    /// set taken for a caller that left (or whose grants cannot be made) is given back.
    pub(super) async fn acquire_set(
        &self,
        keys: &[LockKey],
        ttl: Duration,
    ) -> Result<Option<Vec<Grant>>> {
        TTL.check(ttl)?;
        check_canonical(keys)?;
        let owners = OwnerToken::generate_many(keys.len())?;
        let claims: Claims = Arc::new(
            keys.iter()
                .zip(&owners)
                .map(|(key, owner)| (key.as_str().to_string(), owner.to_hex()))
                .collect(),
        );
        let sent = Instant::now();
        let give_up = saturating_add(sent, self.inner.timeout());
        let request = {
            let (inner, claims) = (self.inner.clone(), claims.clone());
            move |left: Left| async move { inner.acquire_set_step(&claims, ttl, || left.get()).await }
        };
        let give_back = {
            let (inner, claims) = (self.inner.clone(), claims.clone());
            move |fences: Vec<i64>| {
                let (inner, claims) = (inner.clone(), claims.clone());
                async move { inner.give_back_set(&claims, fences, ttl).await }
            }
        };
        let acquired = claim_or_give_back(request, give_up, won_set, give_back)
            .await
            .map_err(|why| why.into_error(BACKEND, "acquire", self.inner.timeout()))?;
        let fences = match acquired {
            Err(e) => return Err(errors::map(e, "acquire", &self.inner.shown)),
            Ok(None) => return Ok(None),
            Ok(Some(fences)) => fences,
        };
        let grants = keys
            .iter()
            .zip(owners)
            .zip(&fences)
            .map(|((key, owner), raw)| self.grant(key, owner, *raw, ttl, sent))
            .collect::<Result<Vec<_>>>();
        if grants.is_err() {
            let inner = self.inner.clone();
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move { inner.give_back_set(&claims, fences, ttl).await });
            }
        }
        grants.map(Some)
    }
}
