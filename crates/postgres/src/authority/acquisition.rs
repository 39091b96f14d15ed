//! The acquisition statement: sent, sent again once when a connection goes silent, and its
//! lease given back when nobody was told about it.

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::backend::Backoff;
use leasehold_core::time::saturating_add;
use leasehold_core::{Instant, Result};
use sqlx::{PgConnection, SqlStr};

use super::sending::{Failed, LateStatement, Sent, Statement};
use super::{release_once, ttl_ms, Inner};
use crate::errors;
use crate::token::StrictBigint;

/// An acquisition statement on its way, for [`Inner::race`].
type Pending = std::pin::Pin<
    Box<dyn std::future::Future<Output = std::result::Result<Answer, Failed<Answer>>> + Send>,
>;

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
        let plain = |statement: SqlStr| -> Statement<Answer> {
            let (key, owner) = (key.clone(), owner.clone());
            Arc::new(move |c| {
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
        match self.send(give_up, true, first).await {
            // Nothing changed: sent again, alone, with a fresh snapshot.
            Sent::Answered(Err(Failed::Statement(e))) if errors::is_conflict(&e) => {
                let answer = self.sent_to_end(give_up, again, outlive).await;
                self.confirmed(answer, &to, None)
            }
            Sent::Answered(answer) => self.confirmed(answer, &to, None),
            Sent::Late(first) => self.race(first, again, give_up, outlive, to).await,
        }
    }

    /// `again` sent until `give_up`, and waited on past it until `outlive` if unanswered (the
    /// caller, gone by then, gives back a lease it took: see
    /// [`claim_or_give_back`](leasehold_core::backend::claim_or_give_back)).
    async fn sent_to_end(
        self: &Arc<Self>,
        give_up: Instant,
        again: Statement<Answer>,
        outlive: Instant,
    ) -> std::result::Result<Answer, Failed<Answer>> {
        match self.send(give_up, false, again).await {
            Sent::Answered(answer) => answer,
            Sent::Late(late) => self.outlive(late, outlive).await,
        }
    }

    /// The first statement, unanswered at half the caller's time, against `again` sent now:
    /// see [`Inner::acquire_statement`].
    async fn race(
        self: &Arc<Self>,
        first: LateStatement<Answer>,
        again: Statement<Answer>,
        give_up: Instant,
        outlive: Instant,
        to: Claim,
    ) -> Acquired {
        let inner = self.clone();
        let mut first: Pending = Box::pin(async move { inner.outlive(first, outlive).await });
        let inner = self.clone();
        let mut again: Pending =
            Box::pin(async move { inner.sent_to_end(give_up, again, outlive).await });
        // An answer that says nothing (no answer in time, a broken connection) waits for the
        // other one.
        let says = |answer: &std::result::Result<Answer, Failed<Answer>>| {
            !matches!(answer, Err(Failed::Statement(_)))
        };
        let (answer, loser) = tokio::select! {
            answer = &mut first => {
                if says(&answer) { (answer, Some(again)) } else { (again.await, None) }
            }
            answer = &mut again => {
                if says(&answer) { (answer, Some(first)) } else { (first.await, None) }
            }
        };
        let kept = match &answer {
            Ok((fence, _)) => *fence,
            Err(_) => None,
        };
        if let (Some(loser), Ok(runtime)) = (loser, tokio::runtime::Handle::try_current()) {
            let (inner, to) = (self.clone(), to.clone());
            runtime.spawn(async move {
                let answer = loser.await;
                if let Some(raw) = won(&inner.confirmed(answer, &to, kept)) {
                    if Some(raw) != kept {
                        inner.give_back(to.key, to.owner, raw, to.ttl, false).await;
                    }
                }
            });
        }
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

    /// The waiting form of the acquisition statement, for [`Inner::send`].
    pub(super) fn waiting_form(
        &self,
        key: String,
        owner: String,
        ttl: Duration,
    ) -> Statement<Answer> {
        let named = self.named();
        let (current, before) = (
            self.statements.acquire_or_remaining.clone(),
            self.statements.previous.acquire_or_remaining.clone(),
        );
        let (version, table) = (self.version.clone(), self.config.table.plain());
        Arc::new(move |c| {
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
        // Tried until the lease would have ended anyway, each try bounded by the request
        // timeout: a try that gets no answer lets its lane go (the lane connects afresh), instead
        // of holding it for a whole TTL. A release compares owner and fence, so a try that
        // landed unseen makes the next one find nothing.
        let end = saturating_add(Instant::now(), ttl.max(self.timeout()));
        let mut backoff = Backoff::new(Duration::from_millis(10), Duration::from_millis(500));
        let released = loop {
            let give_up = saturating_add(Instant::now(), self.timeout()).min(end);
            let args = (key.clone(), owner.clone(), raw);
            let released = if unconfirmed {
                self.give_back_unconfirmed(args, give_up).await
            } else {
                self.release_statement("give back", args, give_up).await
            };
            match released {
                Err(e) if e.is_retryable() && Instant::now() < end => {
                    let next = saturating_add(Instant::now(), backoff.next_delay());
                    tokio::time::sleep_until(next.min(end)).await;
                }
                other => break other,
            }
        };
        match released {
            Ok(n) if n > 0 => tracing::debug!("gave back a lease whose acquisition nobody awaited"),
            Ok(_) => tracing::trace!("a lease nobody awaited had already ended"),
            Err(error) => {
                tracing::debug!(%error, "could not give back a lease nobody awaited; it ends at its TTL")
            }
        }
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
