//! The acquisition statement: sent, sent again once when its connection goes silent, and its
//! lease given back when nobody was told about it.

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::time::saturating_add;
use leasehold_core::Instant;
use leasehold_sql_common::{plain, Failed, LateStatement, Sent, Statement};
use sqlx::{MySqlConnection, SqlStr};

use super::{ttl_us, Inner};

/// What an acquisition statement returns: the fence it took (0: the key is held).
pub(super) type Acquired = std::result::Result<u64, sqlx::Error>;

/// Whose acquisition a statement is: what a give-back needs.
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
    /// token, and the two race (see [`Sender::race`](leasehold_sql_common::Sender::race)). The
    /// second form (`acquire_again`) leaves a key held under its own owner token as it is and
    /// answers its fence, so whichever lands second finds the first one's lease and reports
    /// that same grant.
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
        match self.sender.send(give_up, true, first).await {
            Sent::Answered(answer) => answer.map_err(Failed::into_error),
            Sent::Late(first) => {
                let to = Claim { key, owner, ttl };
                self.race(first, again, (give_up, outlive), to).await
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
    ) -> Statement<MySqlConnection, u64> {
        let (key, owner) = (key.to_string(), owner.to_string());
        plain(move |c: &mut MySqlConnection| {
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

    /// The first statement, unanswered at half the caller's time, against `again` sent now;
    /// a lease the loser took that is not the one answered is given back.
    async fn race(
        self: &Arc<Self>,
        first: LateStatement<u64>,
        again: Statement<MySqlConnection, u64>,
        until: (Instant, Instant),
        to: Claim,
    ) -> Acquired {
        let inner = self.clone();
        let kept = |answer: &std::result::Result<u64, Failed<u64>>| {
            answer.as_ref().ok().copied().filter(|raw| *raw > 0)
        };
        let loser = move |answer: std::result::Result<u64, Failed<u64>>, kept: Option<u64>| async move {
            if let Ok(raw) = answer {
                if raw > 0 && Some(raw) != kept {
                    inner.give_back(to.key, to.owner, raw, to.ttl).await;
                }
            }
        };
        self.sender
            .race(first, again, until, kept, loser)
            .await
            .map_err(Failed::into_error)
    }
}
