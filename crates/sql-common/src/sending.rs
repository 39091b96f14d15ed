//! How a lease statement is sent on a lane's connection: run to its answer, sent again after a
//! conflict, bounded by its caller's time; or, for an acquisition, given up unanswered with its
//! connection kept for its late answer, and raced against the same acquisition sent again.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::backend::Backoff;
use leasehold_core::time::saturating_add;
use leasehold_core::{Error, Instant, Result};
use sqlx::ConnectOptions;
use tokio::sync::Semaphore;

use crate::errors::{timed_out, unanswered};
use crate::url::ConnectOptionsOf;
use crate::{Lane, Lanes, SqlDialect};

/// One try at a lease statement on one connection, with the driver's error.
pub type Once<'c, T> =
    Pin<Box<dyn Future<Output = std::result::Result<T, sqlx::Error>> + Send + 'c>>;

/// One try at a lease statement on one connection, as the backend sends it (see [`Failed`]).
pub type Attempt<'c, T> =
    Pin<Box<dyn Future<Output = std::result::Result<T, Failed<T>>> + Send + 'c>>;

/// A lease statement that can be sent again, or waited on by a task of its own.
pub type Statement<C, T> = Arc<dyn for<'c> Fn(&'c mut C) -> Attempt<'c, T> + Send + Sync>;

/// A statement unanswered when its caller stopped waiting, still owning its connection.
pub type LateStatement<T> = Pin<Box<dyn Future<Output = std::result::Result<T, Failed<T>>> + Send>>;

/// Why a statement failed.
#[derive(Debug)]
pub enum Failed<T> {
    /// The statement failed (and where it ran in a transaction of its own, that ended).
    Statement(sqlx::Error),
    /// The statement answered, but the COMMIT of the transaction it ran in failed, so whether
    /// it took effect is not known (a backend that sends statements in transactions of their
    /// own, through a transaction-pooling proxy).
    Commit {
        /// What the statement answered.
        answer: T,
        /// How the COMMIT failed.
        error: sqlx::Error,
    },
}

impl<T> Failed<T> {
    /// The driver's error, whatever the statement answered.
    pub fn into_error(self) -> sqlx::Error {
        match self {
            Failed::Statement(error) | Failed::Commit { error, .. } => error,
        }
    }
}

/// What became of a statement sent by [`Sender::send`].
pub enum Sent<T> {
    /// Answered in time, or failed.
    Answered(std::result::Result<T, Failed<T>>),
    /// Unanswered in time; it may still take effect.
    Late(LateStatement<T>),
}

impl<T: std::fmt::Debug> std::fmt::Debug for Sent<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Sent::Answered(answer) => f.debug_tuple("Answered").field(answer).finish(),
            Sent::Late(_) => f.write_str("Late"),
        }
    }
}

/// A statement that runs on its connection as it is: its only failure is its own.
pub fn plain<C, T>(
    once: impl for<'c> Fn(&'c mut C) -> Once<'c, T> + Send + Sync + 'static,
) -> Statement<C, T>
where
    C: 'static,
    T: 'static,
{
    Arc::new(move |c: &mut C| -> Attempt<'_, T> {
        let answer = once(c);
        Box::pin(async move { answer.await.map_err(Failed::Statement) })
    })
}

/// An authority's lanes (see [`Lanes`]) and the statements sent on them.
pub struct Sender<D: SqlDialect> {
    lanes: Lanes<D::Connection>,
    /// Connections kept open past their caller for an acquisition's late answer (see
    /// [`Sender::outlive`]): at most one per lane.
    outliving: Arc<Semaphore>,
}

impl<D: SqlDialect> std::fmt::Debug for Sender<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sender")
            .field("lanes", &self.lanes)
            .field("outliving", &self.outliving.available_permits())
            .finish()
    }
}

impl<D: SqlDialect> Sender<D>
where
    ConnectOptionsOf<D>: ConnectOptions<Connection = D::Connection>,
{
    /// `size` lanes (at least one) connecting with `connect`, and as many late acquisitions
    /// waited for at most.
    pub fn new(connect: ConnectOptionsOf<D>, size: usize) -> Self {
        let size = size.max(1);
        Sender {
            lanes: Lanes::new(connect, size),
            outliving: Arc::new(Semaphore::new(size)),
        }
    }

    /// Runs `statement` on a lane's connection. A conflict with a concurrent transaction (see
    /// [`SqlDialect::is_conflict`]) changed nothing: it is run again, with a fresh snapshot,
    /// until `give_up`. A connection that broke or reaches a read-only server is closed, and
    /// its lane connects afresh next time; so is one whose statement is dropped unanswered (the
    /// caller bounds this with its own time, as [`Sender::bounded`] does).
    pub async fn run<T: Send + 'static>(
        &self,
        give_up: Instant,
        statement: &Statement<D::Connection, T>,
    ) -> std::result::Result<T, sqlx::Error> {
        let mut backoff = Backoff::new(Duration::from_millis(1), Duration::from_millis(20));
        loop {
            let mut lane = self.lanes.take(give_up).await?;
            let mut conn = lane.connection()?;
            let answer = statement(&mut conn).await;
            if let Some(settled) = settle::<D, T>(lane, conn, answer, give_up, &mut backoff).await {
                // An unconfirmed outcome is an error for everything but an acquisition (see
                // `Sender::send`).
                return settled.map_err(Failed::into_error);
            }
        }
    }

    /// [`Sender::run`] bounded by `give_up`, with leasehold's errors: `map` for the driver's,
    /// and a request timeout after `timeout` for no answer.
    pub async fn bounded<T: Send + 'static>(
        &self,
        what: &str,
        give_up: Instant,
        timeout: Duration,
        statement: Statement<D::Connection, T>,
        map: impl FnOnce(sqlx::Error) -> Error,
    ) -> Result<T> {
        tokio::time::timeout_at(give_up, self.run(give_up, &statement))
            .await
            .map_err(|_| timed_out::<D>(what, timeout))?
            .map_err(map)
    }

    /// Sends an acquisition statement on a lane's connection, as [`Sender::run`] runs one, and
    /// waits for its answer until `give_up`. An acquisition's statement may take the key after
    /// its caller stopped waiting, and its answer is needed to give that lease back: unanswered
    /// at `give_up`, the statement lets its lane go (which connects afresh for the next
    /// statement, as nobody can tell a frozen server from a slow one) and is returned still
    /// owning its connection, for [`Sender::outlive`] to wait on.
    ///
    /// `hedge`: the answer is waited for only half the time left once the statement is sent
    /// (the lane, however long it takes to get, is waited for until `give_up`), so that an
    /// acquisition can be sent again on a fresh connection in the other half.
    pub async fn send<T: Send + 'static>(
        &self,
        give_up: Instant,
        hedge: bool,
        statement: Statement<D::Connection, T>,
    ) -> Sent<T> {
        let mut backoff = Backoff::new(Duration::from_millis(1), Duration::from_millis(20));
        loop {
            // Nobody waits for a lane past `give_up` (a caller that left, or timed out).
            let mut lane = match tokio::time::timeout_at(give_up, self.lanes.take(give_up)).await {
                Ok(Ok(lane)) => lane,
                Ok(Err(e)) => return Sent::Answered(Err(Failed::Statement(e))),
                Err(_) => {
                    let why = "no lane with a working connection in time";
                    return Sent::Answered(Err(Failed::Statement(unanswered(why))));
                }
            };
            let mut conn = match lane.connection() {
                Ok(conn) => conn,
                Err(e) => return Sent::Answered(Err(Failed::Statement(e))),
            };
            let now = Instant::now();
            let answer_by = if hedge {
                saturating_add(now, give_up.saturating_duration_since(now) / 2)
            } else {
                give_up
            };
            let once = statement.clone();
            let mut sending = Box::pin(async move {
                let answer = once(&mut conn).await;
                (conn, answer)
            });
            let (conn, answer) = tokio::select! {
                biased;
                answered = &mut sending => answered,
                _ = tokio::time::sleep_until(answer_by) => {
                    drop(lane);
                    return Sent::Late(Box::pin(async move { sending.await.1 }));
                }
            };
            if let Some(settled) = settle::<D, T>(lane, conn, answer, give_up, &mut backoff).await {
                return Sent::Answered(settled);
            }
        }
    }

    /// Waits for a late statement's answer on its own connection until `until`; past that,
    /// its connection is closed, and a lease it took ends at its TTL. At most one such wait
    /// per lane goes on at a time: with as many already waiting as there are lanes, the
    /// connection is closed now, so a server that stalls every statement cannot make a
    /// process open connections without bound.
    pub async fn outlive<T>(
        &self,
        late: LateStatement<T>,
        until: Instant,
    ) -> std::result::Result<T, Failed<T>> {
        let Ok(_kept) = self.outliving.clone().try_acquire_owned() else {
            drop(late);
            let why = "no answer in time, and as many abandoned acquisitions as lanes already \
                       wait for theirs";
            return Err(Failed::Statement(unanswered(why)));
        };
        tokio::time::timeout_at(until, late)
            .await
            .unwrap_or_else(|_| {
                let why = "no answer before the lease would have ended";
                Err(Failed::Statement(unanswered(why)))
            })
    }

    /// `statement` sent until `give_up`, and waited on past it until `outlive` if unanswered
    /// (the caller, gone by then, gives back a lease it took: see
    /// [`claim_or_give_back`](leasehold_core::backend::claim_or_give_back)).
    pub async fn send_to_end<T: Send + 'static>(
        &self,
        give_up: Instant,
        statement: Statement<D::Connection, T>,
        outlive: Instant,
    ) -> std::result::Result<T, Failed<T>> {
        match self.send(give_up, false, statement).await {
            Sent::Answered(answer) => answer,
            Sent::Late(late) => self.outlive(late, outlive).await,
        }
    }

    /// An acquisition statement unanswered at half its caller's time (`first`; nothing tells a
    /// silent connection from a slow server), against `again`, the same acquisition sent now
    /// on a fresh connection with the same owner token, in a form that leaves a key held under
    /// that token as it is and answers its fence: whichever lands second finds the first one's
    /// lease and reports that same grant. The first answer that says something (anything but
    /// a failed statement) is the acquisition's; one that says nothing (no answer in time, a
    /// broken connection) waits for the other one.
    ///
    /// The loser keeps waiting for its answer on its own connection, in a task of its own,
    /// and `loser` gets that answer with what `kept` read of the winner's (the fence it
    /// answered), to give back a lease the loser took that is not the one answered (the key
    /// was released or ran out between the two).
    pub async fn race<T, K, L>(
        self: &Arc<Self>,
        first: LateStatement<T>,
        again: Statement<D::Connection, T>,
        (give_up, outlive): (Instant, Instant),
        kept: impl FnOnce(&std::result::Result<T, Failed<T>>) -> K,
        loser: impl FnOnce(std::result::Result<T, Failed<T>>, K) -> L + Send + 'static,
    ) -> std::result::Result<T, Failed<T>>
    where
        T: Send + 'static,
        K: Send + 'static,
        L: Future<Output = ()> + Send + 'static,
    {
        let sender = self.clone();
        let mut first: LateStatement<T> =
            Box::pin(async move { sender.outlive(first, outlive).await });
        let sender = self.clone();
        let mut again: LateStatement<T> =
            Box::pin(async move { sender.send_to_end(give_up, again, outlive).await });
        let says = |answer: &std::result::Result<T, Failed<T>>| {
            !matches!(answer, Err(Failed::Statement(_)))
        };
        let (answer, other) = tokio::select! {
            answer = &mut first => {
                if says(&answer) { (answer, Some(again)) } else { (again.await, None) }
            }
            answer = &mut again => {
                if says(&answer) { (answer, Some(first)) } else { (first.await, None) }
            }
        };
        let kept = kept(&answer);
        if let (Some(other), Ok(runtime)) = (other, tokio::runtime::Handle::try_current()) {
            runtime.spawn(async move { loser(other.await, kept).await });
        }
        answer
    }
}

/// A statement's answer on `lane`'s connection: the connection goes back to the lane unless the
/// answer says it broke or reaches a server that takes no writes (or the outcome is not known),
/// and the answer is the statement's. A conflict with a concurrent transaction changed nothing:
/// while there is time, after a short pause, `None` says to send the statement again.
async fn settle<D: SqlDialect, T>(
    mut lane: Lane<'_, D::Connection>,
    conn: D::Connection,
    answer: std::result::Result<T, Failed<T>>,
    give_up: Instant,
    backoff: &mut Backoff,
) -> Option<std::result::Result<T, Failed<T>>> {
    match answer {
        Ok(v) => {
            lane.put_back(conn);
            Some(Ok(v))
        }
        Err(Failed::Statement(e)) if D::is_conflict(&e) && Instant::now() < give_up => {
            lane.put_back(conn);
            drop(lane);
            let next = saturating_add(Instant::now(), backoff.next_delay());
            tokio::time::sleep_until(next.min(give_up)).await;
            None
        }
        Err(Failed::Statement(e)) => {
            if !D::discards_connection(&e) {
                lane.put_back(conn);
            }
            Some(Err(Failed::Statement(e)))
        }
        Err(unconfirmed) => Some(Err(unconfirmed)),
    }
}

/// Gives back a lease nobody was told about (its acquisition was cancelled or timed out, or
/// its fence could not be used), so that the key is free at once instead of after its TTL:
/// `release` (which says whether it released the lease) is tried until the lease would have
/// ended anyway, each try bounded by the request `timeout` (a try that gets no answer lets its
/// lane go, instead of holding it for a whole TTL). A release compares owner and fence, so a
/// try that landed unseen makes the next one find nothing.
pub async fn give_back<F, Fut>(ttl: Duration, timeout: Duration, mut release: F)
where
    F: FnMut(Instant) -> Fut,
    Fut: Future<Output = Result<bool>>,
{
    let end = saturating_add(Instant::now(), ttl.max(timeout));
    let mut backoff = Backoff::new(Duration::from_millis(10), Duration::from_millis(500));
    let released = loop {
        let give_up = saturating_add(Instant::now(), timeout).min(end);
        match release(give_up).await {
            Err(e) if e.is_retryable() && Instant::now() < end => {
                let next = saturating_add(Instant::now(), backoff.next_delay());
                tokio::time::sleep_until(next.min(end)).await;
            }
            other => break other,
        }
    };
    match released {
        Ok(true) => tracing::debug!("gave back a lease whose acquisition nobody awaited"),
        Ok(false) => tracing::trace!("a lease nobody awaited had already ended"),
        Err(error) => {
            tracing::debug!(%error, "could not give back a lease nobody awaited; it ends at its TTL")
        }
    }
}
