//! Taking a set of keys in one statement (`Authority::try_acquire_all`): all of them if every
//! one is free or expired by the database's clock, none otherwise.
//!
//! # The statement
//! * `seen` locks the set's existing rows (`FOR UPDATE`, in the canonical order, so two sets
//!   that share keys queue on their first shared key instead of deadlocking) and reads each
//!   one's newest committed version: a grant or a release that committed after the statement's
//!   snapshot is what it sees, as the single-key upsert's `ON CONFLICT` does.
//! * `won` is the single-key upsert for every key of the set, with the same fence counter
//!   (`1` for a new row, the row's `fence + 1` for an expired one), run only if no row of
//!   `seen` is live. A held set therefore changes nothing: no row, no fence, no mark.
//! * A key with no row when the statement began can be inserted by another client meanwhile:
//!   its upsert then finds that client's live lease and takes nothing. A set that took some
//!   keys but not all fails the statement on purpose (an invalid cast carrying [`PART_TAKEN`]),
//!   so the server rolls back what it took; the caller reads that as "held".
//!
//! Waiters' marks (`waited_until`) are left as they are: like the single-key upsert, the set
//! takes a key whose lease is over whoever waits for it, and a release of any of its keys
//! notifies those waiters as it would for a single grant. Nothing is announced on a grant.

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::backend::{check_canonical, claim_or_give_back, Left};
use leasehold_core::time::saturating_add;
use leasehold_core::{Grant, Instant, LockKey, OwnerToken, Result};
use leasehold_sql_common::Failed;
use sqlx::{PgConnection, SqlStr};

use super::acquisition::spawn_give_back;
use super::{ttl_ms, Inner, PostgresAuthority, TTL};
use crate::errors::{self, sqlstate, BACKEND};
use crate::statements::sql;
use crate::table::TableName;
use crate::token::StrictBigint;

/// What the statement's deliberate failure says: part of the set was taken by another client
/// while the statement ran, and the server rolled the statement back.
const PART_TAKEN: &str = "leasehold: another client took a key of the set meanwhile";

/// SQLSTATE invalid_text_representation: the cast that carries [`PART_TAKEN`].
const INVALID_TEXT: &str = "22P02";

/// The set statement for the lease table `t`. $1 the keys (canonical order), $2 their owner
/// tokens, $3 the TTL in milliseconds (`float8`). One row per key, its fence, in the order
/// given; no row when a key is held.
pub(crate) fn acquire_set_sql(t: &TableName) -> SqlStr {
    // The cast that fails carries the count of rows taken, so the planner cannot fold it into
    // a constant and fail every statement while planning it. The condition reads `counted`
    // alone, so the planner may test it before the join: a set that took nothing passes it.
    sql(format!(
        "WITH asked AS ( \
           SELECT k.lock_key, k.owner, k.place \
           FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS k(lock_key, owner, place)), \
         seen AS ( \
           SELECT l.lock_key, l.expires_at > statement_timestamp() AS live \
           FROM {t} AS l WHERE l.lock_key = ANY($1::text[]) \
           ORDER BY l.lock_key COLLATE \"C\" FOR UPDATE), \
         won AS ( \
           INSERT INTO {t} AS l (lock_key, owner, fence, expires_at) \
           SELECT a.lock_key, a.owner, 1, statement_timestamp() + $3::float8 * interval '1 millisecond' \
           FROM asked AS a WHERE NOT EXISTS (SELECT 1 FROM seen WHERE seen.live) \
           ORDER BY a.place \
           ON CONFLICT (lock_key) DO UPDATE \
           SET owner = excluded.owner, fence = l.fence + 1, expires_at = excluded.expires_at \
           WHERE l.expires_at <= statement_timestamp() \
           RETURNING l.lock_key, l.fence), \
         counted AS (SELECT count(*) AS n FROM won) \
         SELECT w.fence FROM won AS w JOIN asked AS a USING (lock_key) CROSS JOIN counted AS c \
         WHERE CASE WHEN c.n = 0 OR c.n = cardinality($1::text[]) THEN true \
                    ELSE ('{PART_TAKEN}: ' || c.n)::boolean END \
         ORDER BY a.place"
    ))
}

/// The statement failed on purpose because another client took one of the set's keys while it
/// ran (see the module's documentation): nothing was taken, the set is held.
fn part_taken(error: &sqlx::Error) -> bool {
    sqlstate(error).as_deref() == Some(INVALID_TEXT)
        && error
            .as_database_error()
            .is_some_and(|db| db.message().contains(PART_TAKEN))
}

/// What one set statement returned: each key's fence in the order given, or none (held).
type SetAcquired = std::result::Result<Vec<i64>, sqlx::Error>;

/// The keys and owner tokens of a set, in the order given.
type Claims = Arc<Vec<(String, String)>>;

/// Whether a set statement took its keys: their fences, to give them back by.
fn won_set(acquired: &SetAcquired) -> Option<Vec<i64>> {
    acquired.as_ref().ok().filter(|f| !f.is_empty()).cloned()
}

impl Inner {
    /// The set statement, sent on a lane (in a transaction of its own through a
    /// transaction-pooling proxy), retried after a conflict with a concurrent transaction
    /// while there is time, and waited for past `give_up` if unanswered, so that a set it took
    /// for a caller who left is given back. A set whose COMMIT went unanswered (through a
    /// proxy) is given back as an unconfirmed acquisition is.
    async fn acquire_set_statement(
        self: &Arc<Self>,
        claims: Claims,
        ttl: Duration,
        give_up: Instant,
    ) -> SetAcquired {
        let outlive = saturating_add(give_up, ttl.max(self.timeout()));
        let named = self.named();
        let statement = self.statements.acquire_set.clone();
        let (keys, owners): (Vec<String>, Vec<String>) = claims.iter().cloned().unzip();
        let once = self.statement(move |c: &mut PgConnection| {
            let (statement, keys, owners) = (statement.clone(), keys.clone(), owners.clone());
            Box::pin(async move {
                sqlx::query_scalar::<_, StrictBigint>(statement)
                    .persistent(named)
                    .bind(keys)
                    .bind(owners)
                    .bind(ttl_ms(ttl))
                    .fetch_all(c)
                    .await
                    .map(|fences| fences.into_iter().map(|f| f.0).collect())
            })
        });
        match self.sender.send_to_end(give_up, once, outlive).await {
            Ok(fences) => Ok(fences),
            Err(Failed::Statement(e)) if part_taken(&e) => Ok(Vec::new()),
            Err(Failed::Statement(e)) => Err(e),
            Err(Failed::Commit { answer, error }) => {
                for ((key, owner), raw) in claims.iter().zip(answer) {
                    spawn_give_back(self, key, owner, raw, ttl, true);
                }
                Err(error)
            }
        }
    }

    /// Gives back every lease of a set nobody was told about.
    async fn give_back_set(&self, claims: &[(String, String)], fences: Vec<i64>, ttl: Duration) {
        for ((key, owner), raw) in claims.iter().zip(fences) {
            self.give_back(key.clone(), owner.clone(), raw, ttl, false)
                .await;
        }
    }
}

impl PostgresAuthority {
    /// `try_acquire_all`: the set in one statement, all or none. The input is checked before
    /// anything is sent; the grants' deadlines count from before the statement was sent; a set
    /// taken for a caller that left (or whose grants cannot be made) is given back.
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
            move |_: Left| async move { inner.acquire_set_statement(claims, ttl, give_up).await }
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
            Err(e) => return Err(errors::map_lease(e, "acquire", &self.inner.config.table)),
            Ok(fences) if fences.is_empty() => return Ok(None),
            Ok(fences) => fences,
        };
        if fences.len() != keys.len() {
            // Not what the statement answers; the leases it names are given back.
            for ((key, owner), raw) in claims.iter().zip(&fences) {
                spawn_give_back(&self.inner, key, owner, *raw, ttl, false);
            }
            return Err(leasehold_core::Error::backend(
                BACKEND,
                "the set acquisition answered a fence count that is not the set's",
                std::io::Error::other(format!("{} fences for {} keys", fences.len(), keys.len())),
            ));
        }
        let grants = keys
            .iter()
            .zip(owners)
            .zip(&fences)
            .map(|((key, owner), raw)| self.grant(key, owner, *raw, ttl, sent))
            .collect::<Result<Vec<_>>>();
        if grants.is_err() {
            for ((key, owner), raw) in claims.iter().zip(&fences) {
                spawn_give_back(&self.inner, key, owner, *raw, ttl, false);
            }
        }
        grants.map(Some)
    }
}
