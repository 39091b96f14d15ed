//! The acquisition statement: sent, sent again once when a connection goes silent, and its
//! lease given back when nobody was told about it.

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::time::saturating_add;
use leasehold_core::{Instant, Result};
use sqlx::{PgConnection, SqlStr};

use leasehold_sql_common::{Failed, LateStatement, Sent, Statement};

use super::{release_once, ttl_ms, Inner};
use crate::errors;
use crate::token::StrictBigint;

/// An acquisition statement, as it is sent.
type AcquireStatement = Statement<PgConnection, Answer>;

/// Whose acquisition a statement is: what a give-back needs.
#[derive(Clone)]
pub(super) struct Claim {
    key: String,
    owner: String,
    ttl: Duration,
}

/// What one acquisition statement returned.
pub(super) type Acquired = std::result::Result<Answer, sqlx::Error>;

/// An acquisition statement's answer: the fence if it won, and (for the waiting form) the
/// holder's remaining time in milliseconds.
pub(super) type Answer = (Option<i64>, Option<i64>);

impl Inner {
    /// One acquisition statement, for `owner`. Runs in its own task (see
    /// [`PostgresAuthority::attempt`](super::PostgresAuthority::attempt)), so it is never cut
    /// off halfway by a caller.
    ///
    /// A statement still unanswered after half the caller's time (nothing tells a silent
    /// connection from a slow server) is sent again, on a fresh connection, with the same owner
    /// token, and the two race: the first answer that says something (won, or held) is the
    /// acquisition's. Both forms leave a key held under their own owner token as it is and
    /// answer its fence (`acquire_again`; the waiting form does so already): whichever lands
    /// second finds the first one's lease and reports that same grant. The loser keeps waiting
    /// for its answer on its own connection, and a lease it took that is not the one the
    /// acquisition answered (the key was released or ran out between the two) is given back.
    /// The plain upsert itself is not changed to that form: it is the fast path. Landing after
    /// its retry took the key, it answers "held", which only matters if that answer comes first.
    pub(super) async fn acquire_statement(
        self: &Arc<Self>,
        key: String,
        owner: String,
        ttl: Duration,
        waiting: bool,
        give_up: Instant,
    ) -> Acquired {
        // Past the TTL counted from the caller's deadline, a lease the statement took (counted
        // from when the server read it) has ended unless the server sat on the statement that
        // long: nothing is left to give back worth keeping a connection open for.
        let outlive = saturating_add(give_up, ttl.max(self.timeout()));
        let named = self.named();
        let plain = |statement: SqlStr| -> AcquireStatement {
            let (key, owner) = (key.clone(), owner.clone());
            self.statement(move |c| {
                let (statement, key, owner) = (statement.clone(), key.clone(), owner.clone());
                Box::pin(async move {
                    // The fence is read strictly (see StrictBigint): it becomes a grant.
                    // The plain upsert returns the fence alone, or no row.
                    sqlx::query_scalar::<_, StrictBigint>(statement)
                        .persistent(named)
                        .bind(key)
                        .bind(owner)
                        .bind(ttl_ms(ttl))
                        .fetch_optional(c)
                        .await
                        .map(|fence| (fence.map(|f| f.0), None))
                })
            })
        };
        let (first, again) = if waiting {
            let form = self.waiting_form(key.clone(), owner.clone(), ttl);
            (form.clone(), form)
        } else {
            (
                plain(self.statements.acquire.clone()),
                plain(self.statements.acquire_again.clone()),
            )
        };
        let to = Claim { key, owner, ttl };
        match self.sender.send(give_up, true, first).await {
            // Nothing changed: sent again, alone, with a fresh snapshot.
            Sent::Answered(Err(Failed::Statement(e))) if errors::is_conflict(&e) => {
                let answer = self.sender.send_to_end(give_up, again, outlive).await;
                self.confirmed(answer, &to, None)
            }
            Sent::Answered(answer) => self.confirmed(answer, &to, None),
            Sent::Late(first) => self.race(first, again, give_up, outlive, to).await,
        }
    }

    /// The first statement, unanswered at half the caller's time, against `again` sent now
    /// (see [`Sender::race`](leasehold_sql_common::Sender::race)): a lease the loser took
    /// that is not the one the acquisition answered is given back.
    async fn race(
        self: &Arc<Self>,
        first: LateStatement<Answer>,
        again: AcquireStatement,
        give_up: Instant,
        outlive: Instant,
        to: Claim,
    ) -> Acquired {
        let kept = |answer: &std::result::Result<Answer, Failed<Answer>>| match answer {
            Ok((fence, _)) => *fence,
            Err(_) => None,
        };
        let (inner, claim) = (self.clone(), to.clone());
        let loser = move |answer, kept: Option<i64>| async move {
            if let Some(raw) = won(&inner.confirmed(answer, &claim, kept)) {
                if Some(raw) != kept {
                    inner
                        .give_back(claim.key, claim.owner, raw, claim.ttl, false)
                        .await;
                }
            }
        };
        let answer = self
            .sender
            .race(first, again, (give_up, outlive), kept, loser)
            .await;
        self.confirmed(answer, &to, None)
    }

    /// An acquisition statement's answer, where a COMMIT that failed without an answer is an
    /// error, and a lease its statement may have taken is given back, unless it is `kept`: the
    /// grant the acquisition answered, which the same owner token's other statement reported.
    pub(super) fn confirmed(
        self: &Arc<Self>,
        answer: std::result::Result<Answer, Failed<Answer>>,
        to: &Claim,
        kept: Option<i64>,
    ) -> Acquired {
        match answer {
            Ok(answer) => Ok(answer),
            Err(Failed::Statement(e)) => Err(e),
            Err(Failed::Commit { answer, error }) => {
                if let Some(raw) = answer.0.filter(|raw| Some(*raw) != kept) {
                    spawn_give_back(self, &to.key, &to.owner, raw, to.ttl, true);
                }
                Err(error)
            }
        }
    }

    /// The waiting form of the acquisition statement, as it is sent.
    pub(super) fn waiting_form(
        &self,
        key: String,
        owner: String,
        ttl: Duration,
    ) -> AcquireStatement {
        let named = self.named();
        let (current, before) = (
            self.statements.acquire_or_remaining.clone(),
            self.statements.previous.acquire_or_remaining.clone(),
        );
        let (version, table) = (self.version.clone(), self.config.table.plain());
        self.statement(move |c| {
            let (current, before, key, owner, version, table) = (
                current.clone(),
                before.clone(),
                key.clone(),
                owner.clone(),
                version.clone(),
                table.clone(),
            );
            Box::pin(async move {
                let args = (key, owner, ttl);
                // This version's form first even on a table found without `waited_until`:
                // `migrate()` may have run in another process since, whose releases notify
                // only marked keys, and a waiter that marks nothing would sleep until the
                // holder's expiry. On a table still old that costs a waiting attempt one
                // statement more, which fails before it runs.
                let result = match waiting_attempt(current, named, &args, &mut *c).await {
                    Err(e) if errors::is_undefined_column(&e) => {
                        version.found_previous(&table);
                        waiting_attempt(before, named, &args, &mut *c).await
                    }
                    other => {
                        if other.is_ok() {
                            version.found_current(&table);
                        }
                        other
                    }
                };
                result.map(|(fence, remaining)| (fence.map(|f| f.0), remaining))
            })
        })
    }

    /// Releases a lease nobody was told about (its acquisition was cancelled or timed out, or
    /// its fence could not be used), so that the key is free at once instead of after its TTL.
    ///
    /// `unconfirmed`: the acquisition's COMMIT failed without an answer, so its transaction may
    /// still be in progress on the server (behind a pooler that lost the connection): the
    /// give-back then waits for it (see [`Inner::give_back_unconfirmed`]) instead of finding
    /// nothing yet.
    pub(super) async fn give_back(
        &self,
        key: String,
        owner: String,
        raw: i64,
        ttl: Duration,
        unconfirmed: bool,
    ) {
        // See `leasehold_sql_common::give_back`: tried until the lease would have ended
        // anyway, each try bounded by the request timeout.
        leasehold_sql_common::give_back(ttl, self.timeout(), |give_up| {
            let args = (key.clone(), owner.clone(), raw);
            async move {
                let released = if unconfirmed {
                    self.give_back_unconfirmed(args, give_up).await
                } else {
                    self.release_statement("give back", args, give_up).await
                };
                released.map(|n| n > 0)
            }
        })
        .await
    }

    /// The release of an acquisition whose COMMIT went unanswered: an upsert, because an
    /// insert that meets a row another transaction is inserting or updating waits for that
    /// transaction to end and then sees its outcome, where an UPDATE would not see a row still
    /// being inserted, nor its new owner. Whatever the acquisition's transaction did, this runs
    /// after it: it expires the row if the acquisition's grant is there, and otherwise changes
    /// nothing but, for a key that had no row, leaves one that is already expired. Notifies the
    /// key's waiters as a release does.
    pub(super) async fn give_back_unconfirmed(
        &self,
        (key, owner, fence): (String, String, i64),
        give_up: Instant,
    ) -> Result<i64> {
        let (statement, table, named) = (
            self.statements.give_back_unconfirmed.clone(),
            self.config.table.plain(),
            self.named(),
        );
        self.bounded("give back", give_up, move |c| {
            let (statement, key, owner, table) =
                (statement.clone(), key.clone(), owner.clone(), table.clone());
            Box::pin(async move {
                let args = (key, owner, fence, table);
                release_once(statement, named, &args, c).await
            })
        })
        .await
    }
}

/// Whether an acquisition answer took a lease: its fence column, to give it back by.
pub(super) fn won(acquired: &Acquired) -> Option<i64> {
    acquired.as_ref().ok().and_then(|(raw, _)| *raw)
}

/// The waiting form of the acquisition statement (`acquire_or_remaining`, or its previous
/// form): the fence if it won, and the holder's remaining time in milliseconds.
pub(super) async fn waiting_attempt(
    statement: SqlStr,
    named: bool,
    (key, owner, ttl): &(String, String, Duration),
    c: &mut PgConnection,
) -> std::result::Result<(Option<StrictBigint>, Option<i64>), sqlx::Error> {
    sqlx::query_as(statement)
        .persistent(named)
        .bind(key.clone())
        .bind(owner.clone())
        .bind(ttl_ms(*ttl))
        .fetch_one(c)
        .await
}

pub(super) fn spawn_give_back(
    inner: &Arc<Inner>,
    key: &str,
    owner: &str,
    raw: i64,
    ttl: Duration,
    unconfirmed: bool,
) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let (inner, key, owner) = (inner.clone(), key.to_string(), owner.to_string());
    runtime.spawn(async move { inner.give_back(key, owner, raw, ttl, unconfirmed).await });
}
