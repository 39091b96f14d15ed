//! Taking a set of keys in one transaction (`Authority::try_acquire_all`): all of them if
//! every one is free or expired by the server's clock, none otherwise.
//!
//! MySQL's `INSERT` returns no rows, and a statement cannot undo part of itself, so the set is
//! one transaction on one connection:
//! 1. `acquire_set`: the single-key upsert for every key of the set at once (the set passed as
//!    one JSON array through `JSON_TABLE`, as renewal batches are), in the canonical order:
//!    each key's row is locked, taken if its lease is over (fence `1` for a new row, the row's
//!    `fence + 1` for an expired one, exactly as a single acquisition raises it) and left as it
//!    is if live.
//! 2. `taken_of_set`: which of the set's rows now carry this set's owner tokens (fresh for
//!    every attempt, so nobody else's lease has them), in the order given.
//! 3. `COMMIT` when that is every key; otherwise `ROLLBACK`, which puts back the rows and
//!    fences the upsert changed: a held set leaves nothing taken or extended.
//!
//! The rows stay locked from the upsert to the end of the transaction (two round trips more),
//! so other acquisitions of those keys wait that long; any error rolls the transaction back
//! before the connection is used again. `JSON_TABLE` needs MySQL 8.0.4 or MariaDB 10.6.

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::backend::{check_canonical, claim_or_give_back, Left};
use leasehold_core::time::saturating_add;
use leasehold_core::{Grant, Instant, LockKey, OwnerToken, Result};
use leasehold_sql_common::{Attempt, Failed, Statement};
use sqlx::{AssertSqlSafe, MySqlConnection, SqlSafeStr, SqlStr};

use super::{ttl_us, Inner, MysqlAuthority, TTL};
use crate::errors::{self, BACKEND};
use crate::table::TableName;

/// A set (one JSON array parameter of `[key, owner]` pairs) as a table, with each pair's place.
const SET: &str = "JSON_TABLE(?, '$[*]' COLUMNS (\
    set_place FOR ORDINALITY, \
    set_key VARBINARY(800) PATH '$[0]', set_owner VARBINARY(64) PATH '$[1]'))";

/// The condition "the lease on this row is over", by the server's clock.
const EXPIRED: &str = "expires_at <= UTC_TIMESTAMP(6)";

/// The set's two statements for the lease table `t`: `(acquire_set, taken_of_set)`.
///
/// `acquire_set`: ?1 the TTL in microseconds, ?2 the set. The set's columns are named apart
/// from the table's, so the `UPDATE` part reads the table's row; its assignments go left to
/// right, each seeing the ones before, so `expires_at` goes last and every condition reads the
/// old expiry. `taken_of_set`: ?1 the set; the fences of the set's rows held under its owner
/// tokens, in the order given.
pub(crate) fn set_statements(t: &TableName) -> (SqlStr, SqlStr) {
    let sql = |s: String| AssertSqlSafe(s).into_sql_str();
    (
        sql(format!(
            "INSERT INTO {t} (lock_key, owner, fence, expires_at) \
             SELECT s.set_key, s.set_owner, 1, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND \
             FROM {SET} AS s ORDER BY s.set_place \
             ON DUPLICATE KEY UPDATE \
               owner = IF({EXPIRED}, VALUES(owner), owner), \
               fence = IF({EXPIRED}, fence + 1, fence), \
               expires_at = IF({EXPIRED}, VALUES(expires_at), expires_at)"
        )),
        sql(format!(
            "SELECT l.fence FROM {SET} AS s \
             JOIN {t} AS l ON l.lock_key = s.set_key AND l.owner = s.set_owner \
             ORDER BY s.set_place"
        )),
    )
}

/// What one set transaction returned: each key's fence in the order given, or none (held).
type SetAcquired = std::result::Result<Vec<u64>, sqlx::Error>;

/// The keys and owner tokens of a set, in the order given.
type Claims = Arc<Vec<(String, String)>>;

/// Whether a set transaction took its keys: their fences, to give them back by.
fn won_set(acquired: &SetAcquired) -> Option<Vec<u64>> {
    acquired.as_ref().ok().filter(|f| !f.is_empty()).cloned()
}

/// Ends the open transaction with `end` (`COMMIT` or `ROLLBACK`).
async fn end(c: &mut MySqlConnection, end: &'static str) -> std::result::Result<(), sqlx::Error> {
    sqlx::raw_sql(AssertSqlSafe(end)).execute(c).await.map(drop)
}

/// The set's transaction on `c` (see the module's documentation). A failed COMMIT leaves the
/// outcome unknown: [`Failed::Commit`] carries the fences, so they are given back.
async fn transaction(
    c: &mut MySqlConnection,
    (acquire, taken): (SqlStr, SqlStr),
    set: String,
    ttl: Duration,
    keys: usize,
) -> std::result::Result<Vec<u64>, Failed<Vec<u64>>> {
    end(&mut *c, "START TRANSACTION")
        .await
        .map_err(Failed::Statement)?;
    let work = async {
        sqlx::query(acquire)
            .bind(ttl_us(ttl))
            .bind(set.clone())
            .execute(&mut *c)
            .await?;
        sqlx::query_scalar::<_, u64>(taken)
            .bind(set)
            .fetch_all(&mut *c)
            .await
    };
    match work.await {
        Ok(fences) if fences.len() == keys => match end(&mut *c, "COMMIT").await {
            Ok(()) => Ok(fences),
            Err(error) => Err(Failed::Commit {
                answer: fences,
                error,
            }),
        },
        // A key held by someone else: the keys this transaction took are put back.
        Ok(_) => match end(&mut *c, "ROLLBACK").await {
            Ok(()) => Ok(Vec::new()),
            Err(e) => Err(Failed::Statement(e)),
        },
        // A statement rolled back by itself (a lock wait timeout) leaves the transaction open.
        Err(e) => match end(&mut *c, "ROLLBACK").await {
            Ok(()) => Err(Failed::Statement(e)),
            Err(rollback) => Err(Failed::Statement(rollback)),
        },
    }
}

impl Inner {
    /// The set's transaction, sent on a lane, run again after a conflict with a concurrent
    /// transaction while there is time, and waited for past `give_up` if unanswered, so that
    /// a set it took for a caller who left is given back.
    async fn acquire_set_transaction(
        self: &Arc<Self>,
        claims: Claims,
        ttl: Duration,
        give_up: Instant,
    ) -> SetAcquired {
        let outlive = saturating_add(give_up, ttl.max(self.timeout()));
        let set = serde_json::to_string(&*claims).map_err(|e| sqlx::Error::Encode(e.into()))?;
        let statements = (
            self.statements.acquire_set.clone(),
            self.statements.taken_of_set.clone(),
        );
        let keys = claims.len();
        let once: Statement<MySqlConnection, Vec<u64>> =
            Arc::new(move |c: &mut MySqlConnection| -> Attempt<'_, Vec<u64>> {
                Box::pin(transaction(c, statements.clone(), set.clone(), ttl, keys))
            });
        match self.sender.send_to_end(give_up, once, outlive).await {
            Ok(fences) => Ok(fences),
            Err(Failed::Statement(e)) => Err(e),
            Err(Failed::Commit { answer, error }) => {
                let inner = self.clone();
                if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                    runtime.spawn(async move { inner.give_back_set(&claims, answer, ttl).await });
                }
                Err(error)
            }
        }
    }

    /// Gives back every lease of a set nobody was told about.
    async fn give_back_set(&self, claims: &[(String, String)], fences: Vec<u64>, ttl: Duration) {
        for ((key, owner), raw) in claims.iter().zip(fences) {
            self.give_back(key.clone(), owner.clone(), raw, ttl).await;
        }
    }
}

impl MysqlAuthority {
    /// `try_acquire_all`: the set in one transaction, all or none. The input is checked before
    /// anything is sent; the grants' deadlines count from before the transaction began; a set
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
            move |_: Left| async move { inner.acquire_set_transaction(claims, ttl, give_up).await }
        };
        let give_back = {
            let (inner, claims) = (self.inner.clone(), claims.clone());
            move |fences: Vec<u64>| {
                let (inner, claims) = (inner.clone(), claims.clone());
                async move { inner.give_back_set(&claims, fences, ttl).await }
            }
        };
        let fences = claim_or_give_back(request, give_up, won_set, give_back)
            .await
            .map_err(|why| why.into_error(BACKEND, "acquire", self.inner.timeout()))?
            .map_err(|e| errors::map(e, "acquire", &self.inner.config.table))?;
        if fences.is_empty() {
            return Ok(None);
        }
        let grants = keys
            .iter()
            .zip(owners)
            .zip(&fences)
            .map(|((key, owner), raw)| self.grant(key, owner, *raw, ttl, sent))
            .collect::<Result<Vec<_>>>();
        // The transaction answers a fence for every key, or none.
        if grants.is_err() {
            let inner = self.inner.clone();
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move { inner.give_back_set(&claims, fences, ttl).await });
            }
        }
        grants.map(Some)
    }
}
