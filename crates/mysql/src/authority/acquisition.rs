//! The acquisition statement: sent, sent again once when its connection goes silent, and its
//! lease given back when nobody was told about it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::time::saturating_add;
use leasehold_core::Instant;
use sqlx::SqlStr;

use super::{ttl_us, Inner};
use crate::errors;
use crate::running::{send, LateStatement, Sent, Statement};

/// What an acquisition statement returns: the fence it took (0: the key is held).
pub(super) type Acquired = std::result::Result<u64, sqlx::Error>;

/// An acquisition statement on its way, for [`Inner::race`].
type Pending = Pin<Box<dyn Future<Output = Acquired> + Send>>;

/// Whose acquisition a statement is: what a give-back needs.
#[derive(Clone)]
struct Claim {
    key: String,
    owner: String,
    ttl: Duration,
}

impl Inner {
    /// One acquisition, for `owner`. It runs inside
    /// [`claim_or_give_back`](leasehold_core::backend::claim_or_give_back), which finishes it
    /// in a task of its own once the caller stops waiting and gives back a lease it took for
    /// nobody.
    ///
    /// A statement still unanswered after half the caller's time (nothing tells a silent
    /// connection from a slow server) is sent again, on a fresh connection, with the same owner
    /// token, and the two race: the first answer is the acquisition's. The second form
    /// (`acquire_again`) leaves a key held under its own owner token as it is and answers its
    /// fence, so whichever lands second finds the first one's lease and reports that same
    /// grant. The loser keeps waiting for its answer on its own connection, and a lease it took
    /// that is not the one the acquisition answered (the key was released or ran out between
    /// the two) is given back.
    ///
    /// A statement unanswered at `give_up` keeps its connection open for the late answer (its
    /// lane goes back, to connect afresh): a frozen server that wakes runs what it had
    /// received, and only the answer says which fence to give back. Not past the TTL counted
    /// from the caller's deadline (a lease it took has ended by then unless the server sat on
    /// the statement that long), and at most one such wait per lane.
    pub(super) async fn acquire_statement(
        self: &Arc<Self>,
        key: String,
        owner: String,
        ttl: Duration,
        give_up: Instant,
    ) -> Acquired {
        let outlive = saturating_add(give_up, ttl.max(self.timeout()));
        let first = self.acquire_form(self.statements.acquire.clone(), &key, &owner, ttl);
        let again = self.acquire_form(self.statements.acquire_again.clone(), &key, &owner, ttl);
        match send(&self.lanes, give_up, true, first).await {
            Sent::Answered(answer) => answer,
            Sent::Late(first) => {
                let to = Claim { key, owner, ttl };
                self.race(first, again, give_up, outlive, to).await
            }
        }
    }

    /// `statement` (one of the acquisition forms) with its parameters.
    fn acquire_form(
        &self,
        statement: SqlStr,
        key: &str,
        owner: &str,
        ttl: Duration,
    ) -> Statement<u64> {
        let (key, owner) = (key.to_string(), owner.to_string());
        Arc::new(move |c| {
            let (statement, key, owner) = (statement.clone(), key.clone(), owner.clone());
            Box::pin(async move {
                sqlx::query(statement)
                    .bind(key)
                    .bind(owner)
                    .bind(ttl_us(ttl))
                    .execute(c)
                    .await
                    .map(|done| done.last_insert_id())
            })
        })
    }

    /// The first statement, unanswered at half the caller's time, against `again` sent now.
    async fn race(
        self: &Arc<Self>,
        first: LateStatement<u64>,
        again: Statement<u64>,
        give_up: Instant,
        outlive: Instant,
        to: Claim,
    ) -> Acquired {
        let inner = self.clone();
        let mut first: Pending = Box::pin(async move { inner.outlive(first, outlive).await });
        let inner = self.clone();
        let mut again: Pending = Box::pin(async move {
            match send(&inner.lanes, give_up, false, again).await {
                Sent::Answered(answer) => answer,
                Sent::Late(late) => inner.outlive(late, outlive).await,
            }
        });
        // An answer that says nothing (no answer in time, a broken connection) waits for the
        // other one.
        let (answer, loser) = tokio::select! {
            answer = &mut first => {
                if answer.is_ok() { (answer, Some(again)) } else { (again.await, None) }
            }
            answer = &mut again => {
                if answer.is_ok() { (answer, Some(first)) } else { (first.await, None) }
            }
        };
        let kept = answer.as_ref().ok().copied().filter(|raw| *raw > 0);
        if let (Some(loser), Ok(runtime)) = (loser, tokio::runtime::Handle::try_current()) {
            let inner = self.clone();
            runtime.spawn(async move {
                if let Ok(raw) = loser.await {
                    if raw > 0 && Some(raw) != kept {
                        inner.give_back(to.key, to.owner, raw, to.ttl).await;
                    }
                }
            });
        }
        answer
    }

    /// Waits for a late statement's answer on its own connection until `until`; past that,
    /// its connection is closed, and a lease it took ends at its TTL. At most one such wait per
    /// lane goes on at a time: with as many already waiting as there are lanes, the connection
    /// is closed now, so a server that stalls every statement cannot make a process open
    /// connections without bound.
    async fn outlive(&self, late: LateStatement<u64>, until: Instant) -> Acquired {
        let Ok(_kept) = self.outliving.clone().try_acquire_owned() else {
            return Err(errors::unanswered(
                "no answer in time, and as many abandoned acquisitions as lanes already wait for theirs",
            ));
        };
        tokio::time::timeout_at(until, late)
            .await
            .unwrap_or_else(|_| {
                Err(errors::unanswered(
                    "no answer before the lease would have ended",
                ))
            })
    }
}
