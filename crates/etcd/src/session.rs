//! Sessions: one etcd lease per TTL, kept alive by one stream, shared by every lock on it.
//!
//! This is etcd's own `concurrency.Session` design. A session is granted once (the only lease
//! grant, off the hot path), and from then on an acquire is a single transaction that writes a
//! contender key attached to the session's lease. One keep-alive stream per session extends the
//! lease every third of its TTL, however many locks it holds, so renewal traffic to etcd's lessor
//! does not grow with the number of locks.
//!
//! The session knows how long its lease lasts only from its own clock: the instant read before
//! the keep-alive request whose answer last extended it, plus the TTL, minus the safety margin.
//! When etcd answers a keep-alive with "lease not found" (TTL 0: revoked or expired), or when
//! that deadline passes without a successful keep-alive, the session has ended and every lease
//! on it is lost.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, LeaseKeepAliveStream, LeaseKeeper, Txn, TxnOp};
use leasehold_core::backend::Backoff;
use leasehold_core::time::{deadline_in, saturating_add};
use leasehold_core::{Error, LossSignal, LostReason, OwnerToken, Result, SafetyMargin};
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use crate::contenders::{Contenders, Withdrawal};
use crate::errors::{self, BACKEND};
use crate::held_watch_stream::{HeldWatch, HeldWatchStream};
use crate::held_watches::{HeldWatches, PendingWatch};

/// What the session knows about its lease.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Liveness {
    /// Until when the lease certainly lasts at the server (local monotonic clock).
    pub deadline: Instant,
    /// The session has ended: its lease is gone or no longer trusted.
    pub ended: bool,
}

/// One etcd lease, kept alive, and the contender keys attached to it.
#[derive(Debug)]
pub(crate) struct Session {
    lease: i64,
    ttl: Duration,
    liveness: watch::Sender<Liveness>,
    pub(crate) contenders: Contenders,
    /// Grants whose key watch the session's task opens a little later.
    watches: HeldWatches,
    wake: Notify,
    /// A renewal asked for a keep-alive now (the last one is late).
    refresh: AtomicBool,
}

impl Session {
    /// The lease id.
    pub fn lease(&self) -> i64 {
        self.lease
    }

    /// The lease's TTL.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Until when the lease lasts, by our clock.
    pub fn deadline(&self) -> Instant {
        self.liveness.borrow().deadline
    }

    /// Whether the session ended (every lease on it is lost).
    pub fn is_ended(&self) -> bool {
        self.liveness.borrow().ended || self.contenders.is_ended()
    }

    /// Watch the session's liveness (waiters stop when it ends).
    pub fn subscribe(&self) -> watch::Receiver<Liveness> {
        self.liveness.subscribe()
    }

    /// Ends the session: no new contender key is reserved, waiters are told, and every grant
    /// on it is lost at once (its loss signal fires).
    pub fn end(&self) {
        self.contenders.end(LostReason::SessionEnded);
        self.liveness.send_modify(|l| l.ended = true);
    }

    /// Asks the session's task to look at its book again (a key to withdraw, a new deadline).
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// Has the session's task send a keep-alive now and waits (at most `timeout`) until one
    /// extends the lease or the session ends. For a renewal that finds the session's deadline
    /// lagging: after an outage the keep-alive may still be in its retry backoff when the
    /// renewal's own read already succeeds.
    pub async fn refresh(&self, timeout: Duration) {
        let before = self.deadline();
        let mut liveness = self.subscribe();
        self.refresh.store(true, Ordering::Release);
        self.wake();
        let _ = tokio::time::timeout(
            timeout,
            liveness.wait_for(|l| l.ended || l.deadline > before),
        )
        .await;
    }

    /// Has the session's task watch the key of `held`, granted now, a little later (see
    /// [`HeldWatches`]), and fire `loss` if it is deleted behind our back.
    pub fn watch_later(&self, held: Withdrawal, loss: LossSignal) {
        if self.watches.push(held, loss) {
            self.wake();
        }
    }

    /// Marks `owner`'s key `name` for deletion by the session's task, which retries until etcd
    /// confirms.
    pub fn withdraw_later(&self, name: &str, owner: OwnerToken, revision: Option<i64>) {
        if self
            .contenders
            .withdraw(name, owner, revision, Instant::now())
            .is_some()
        {
            self.wake();
        }
    }

    /// Deletes `w` and books the outcome: forgotten when etcd answered (deleted, or not there),
    /// marked as possibly in flight otherwise (the caller or the session's task retries). A key
    /// whose write got no answer and that was not there is kept and deleted again a third of
    /// the TTL later (see [`Contenders::doubt`]).
    pub async fn delete(&self, client: &Client, w: &Withdrawal, timeout: Duration) -> Result<()> {
        match delete_contender(client, &w.name, w.compare(), timeout).await {
            Ok(false) if w.revision.is_none() => {
                // The put may still land, on our kept-alive lease, where it would block the
                // lock for as long as the session lives: look again at the pace of a renewal,
                // so that a late key goes within a third of the TTL of landing. A put is sent
                // once (requests are resent only when they provably never left), so one that
                // was found and deleted cannot come back.
                self.contenders.doubt(
                    &w.name,
                    w.owner,
                    saturating_add(Instant::now(), self.ttl / 3),
                );
                self.wake();
                Ok(())
            }
            Ok(_) => {
                self.contenders.forget(&w.name, w.owner);
                Ok(())
            }
            Err(error) => {
                self.contenders
                    .delete_unanswered(&w.name, w.owner, deadline_in(timeout));
                Err(error)
            }
        }
    }

    fn extended(&self, deadline: Instant) {
        self.liveness.send_if_modified(|l| {
            if deadline > l.deadline && !l.ended {
                l.deadline = deadline;
                true
            } else {
                false
            }
        });
    }
}

/// The sessions of one authority, one per TTL.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    by_ttl: Mutex<HashMap<u64, Arc<Session>>>,
    creating: tokio::sync::Mutex<()>,
}

/// What a session's task needs from its authority (never the authority itself, so dropping the
/// authority ends its sessions).
#[derive(Clone)]
pub(crate) struct SessionSettings {
    pub client: Arc<Client>,
    pub margin: SafetyMargin,
    pub request_timeout: Duration,
    pub idle: Duration,
    pub closing: watch::Receiver<()>,
}

impl Registry {
    fn live(&self, secs: u64) -> Option<Arc<Session>> {
        let map = self.by_ttl.lock().unwrap_or_else(|e| e.into_inner());
        // A session whose deadline passed without its task noticing (the runtime that ran the
        // task is gone) is as good as ended: start a new one.
        map.get(&secs)
            .filter(|s| !s.is_ended() && s.deadline() > Instant::now())
            .cloned()
    }

    fn remove(&self, session: &Arc<Session>) {
        let secs = session.ttl.as_secs();
        let mut map = self.by_ttl.lock().unwrap_or_else(|e| e.into_inner());
        if map.get(&secs).is_some_and(|s| Arc::ptr_eq(s, session)) {
            map.remove(&secs);
        }
    }

    /// Takes every session out of the registry (a later acquire starts a new one).
    pub fn take_all(&self) -> Vec<Arc<Session>> {
        let mut map = self.by_ttl.lock().unwrap_or_else(|e| e.into_inner());
        map.drain().map(|(_, s)| s).collect()
    }

    /// The live sessions (for tests and introspection).
    pub fn sessions(&self) -> Vec<Arc<Session>> {
        let map = self.by_ttl.lock().unwrap_or_else(|e| e.into_inner());
        map.values().filter(|s| !s.is_ended()).cloned().collect()
    }

    /// The live session for `ttl`, granting its lease (one request) if there is none.
    pub async fn session(
        self: &Arc<Self>,
        ttl: Duration,
        settings: &SessionSettings,
    ) -> Result<Arc<Session>> {
        let secs = ttl.as_secs();
        if let Some(session) = self.live(secs) {
            return Ok(session);
        }
        // The grant runs in a task of its own: a caller dropped while it is in flight must not
        // leave a lease that nobody knows to live out its TTL at the server. The session is
        // registered whatever happens to the caller (reused by the next acquire, or revoked once
        // idle).
        let (registry, settings) = (self.clone(), settings.clone());
        let created = tokio::spawn(async move {
            // One grant per TTL even when many acquires arrive at once on a new authority.
            let _creating = registry.creating.lock().await;
            if let Some(session) = registry.live(secs) {
                return Ok(session);
            }
            let session = grant(ttl, &settings).await?;
            registry
                .by_ttl
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(secs, session.clone());
            let task = SessionTask {
                session: session.clone(),
                registry: registry.clone(),
                settings,
            };
            tokio::spawn(task.run());
            Ok(session)
        });
        created.await.unwrap_or_else(|e| {
            Err(Error::Backend {
                backend: BACKEND,
                message: format!("starting a session: {e}"),
                retryable: true,
                source: None,
            })
        })
    }
}

/// Grants a lease of exactly `ttl`, refusing (and revoking) one the server grants with another
/// TTL: etcd silently raises a TTL below its minimum, and a lease longer than asked would make the
/// caller's deadline a lie.
async fn grant(ttl: Duration, settings: &SessionSettings) -> Result<Arc<Session>> {
    let secs = i64::try_from(ttl.as_secs()).map_err(|_| Error::InvalidTtl {
        ttl,
        reason: "too long for etcd".into(),
    })?;
    let mut leases = settings.client.lease_client();
    let sent = Instant::now();
    let response = errors::call("grant the session lease", settings.request_timeout, || {
        let mut leases = settings.client.lease_client();
        async move { leases.grant(secs, None).await }
    })
    .await?;
    if !response.error().is_empty() {
        return Err(Error::Backend {
            backend: BACKEND,
            message: format!("grant the session lease: {}", response.error()),
            retryable: false,
            source: None,
        });
    }
    if response.ttl() != secs {
        let id = response.id();
        let timeout = settings.request_timeout;
        tokio::spawn(async move {
            let _ = tokio::time::timeout(timeout, leases.revoke(id)).await;
        });
        return Err(Error::InvalidTtl {
            ttl,
            reason: format!(
                "the etcd server granted a lease of {} s when asked for {secs} s (its minimum \
                 lease TTL follows from its election timeout)",
                response.ttl()
            ),
        });
    }
    let (liveness, _) = watch::channel(Liveness {
        deadline: settings.margin.deadline(sent, ttl),
        ended: false,
    });
    tracing::debug!(lease = response.id(), ttl_s = secs, "etcd session started");
    Ok(Arc::new(Session {
        lease: response.id(),
        ttl,
        liveness,
        contenders: Contenders::new(),
        watches: HeldWatches::new(ttl),
        wake: Notify::new(),
        refresh: AtomicBool::new(false),
    }))
}

impl Withdrawal {
    /// What a delete of this key compares: its create revision when known, else the owner
    /// token it stores (a key whose create request got no answer). Never the lease alone: a
    /// later acquisition through the same session may have reused the name on the same lease.
    pub fn compare(&self) -> Compare {
        match self.revision {
            Some(r) => Compare::create_revision(self.name.as_str(), CompareOp::Equal, r),
            None => Compare::value(self.name.as_str(), CompareOp::Equal, self.owner.to_hex()),
        }
    }
}

/// Deletes contender key `name` if `guard` holds (its create revision or its owner token).
/// Returns whether a key was deleted.
pub(crate) async fn delete_contender(
    client: &Client,
    name: &str,
    guard: Compare,
    timeout: Duration,
) -> Result<bool> {
    let txn = Txn::new()
        .when([guard])
        .and_then([TxnOp::delete(name, None)]);
    let response = errors::txn(client, "delete a contender key", timeout, txn).await?;
    Ok(response.succeeded())
}

/// Whether etcd says `lease` no longer exists (revoked, or expired). `false` when it exists or
/// when etcd did not answer within `timeout`.
pub(crate) async fn lease_gone(client: &Client, lease: i64, timeout: Duration) -> bool {
    let asked = errors::call("ask for a lease's time to live", timeout, || {
        let mut leases = client.lease_client();
        async move { leases.time_to_live(lease, None).await }
    })
    .await;
    // -1 (or "not found") means the lease is gone; 0 is a lease in its last second.
    match asked {
        Ok(t) => t.ttl() < 0,
        Err(e) => errors::is_lease_gone(&e),
    }
}

/// Why a session's task stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// etcd says the lease does not exist (expired or revoked): its keys are gone.
    LeaseGone,
    /// No keep-alive succeeded before the deadline: the lease may still exist, revoke it.
    DeadlinePassed,
    /// No contender key for the idle time.
    Idle,
    /// No live contender key, but a write whose outcome is unknown: revoking the lease is what
    /// stops it from ever landing.
    Doubts,
    /// The authority was dropped.
    Closed,
}

struct SessionTask {
    session: Arc<Session>,
    registry: Arc<Registry>,
    settings: SessionSettings,
}

type KeepAlive = Option<(LeaseKeeper, LeaseKeepAliveStream)>;

impl SessionTask {
    async fn run(mut self) {
        let ending = self.keep().await;
        self.session.end();
        self.session.watches.clear();
        self.registry.remove(&self.session);
        let lease = self.session.lease;
        tracing::debug!(lease, ?ending, "etcd session ended");
        if ending != Ending::LeaseGone {
            // Frees every key of the session at once; if etcd cannot be reached, the lease
            // expires by itself within its TTL.
            let timeout = self.settings.request_timeout;
            let _ = errors::revoke(&self.settings.client, lease, timeout).await;
        }
    }

    /// Keeps the lease alive, withdraws contender keys that are due, and watches for the end.
    async fn keep(&mut self) -> Ending {
        let ttl = self.session.ttl;
        let interval = ttl / 3;
        let timeout = self.settings.request_timeout;
        let mut stream: KeepAlive = None;
        let mut retry = Backoff::new(
            Duration::from_millis(20),
            (interval / 2).max(Duration::from_millis(20)),
        );
        let mut next_keep_alive = deadline_in(interval);
        let mut liveness = self.session.subscribe();
        // Opened with the first grant whose key is watched; it ends with the session.
        let mut held_stream: Option<HeldWatchStream> = None;
        loop {
            if self.session.is_ended() {
                // Ended by a request that found the lease gone.
                return Ending::LeaseGone;
            }
            let now = Instant::now();
            let deadline = self.session.deadline();
            if now >= deadline {
                return Ending::DeadlinePassed;
            }
            let idle_since = self.session.contenders.idle_since();
            let idle_at = idle_since.map(|since| saturating_add(since, self.settings.idle));
            if let (Some(since), Some(at)) = (idle_since, idle_at) {
                if now >= at && self.session.contenders.end_if_idle_since(since) {
                    return Ending::Idle;
                }
            }
            if self.session.contenders.end_if_only_doubts() {
                return Ending::Doubts;
            }
            let (due, next_withdrawal) = self.session.contenders.due(now, timeout);
            for withdrawal in due {
                // In their own tasks: a slow delete must never hold up the keep-alive.
                let (client, session) = (self.settings.client.clone(), self.session.clone());
                tokio::spawn(async move {
                    if let Err(error) = session.delete(&client, &withdrawal, timeout).await {
                        tracing::debug!(%error, key = withdrawal.name, "withdrawing a contender key failed; will retry");
                    }
                });
            }
            let (watches, next_watch) = self.session.watches.due(now);
            for PendingWatch { held, loss, .. } in watches {
                let live = held
                    .revision
                    .is_some_and(|r| self.session.contenders.is_held(&held.name, r));
                if let Some(watch) = HeldWatch::new(held, loss).filter(|_| live) {
                    held_stream
                        .get_or_insert_with(|| {
                            HeldWatchStream::start(
                                self.settings.client.clone(),
                                self.session.clone(),
                                timeout,
                            )
                        })
                        .watch(watch);
                }
            }
            let mut wake_at = next_keep_alive.min(deadline);
            for at in [next_withdrawal, idle_at, next_watch].into_iter().flatten() {
                wake_at = wake_at.min(at);
            }
            tokio::select! {
                biased;
                _ = self.settings.closing.changed() => return Ending::Closed,
                _ = self.session.wake.notified() => continue,
                _ = liveness.wait_for(|l| l.ended) => continue,
                _ = tokio::time::sleep_until(wake_at) => {}
            }
            if Instant::now() < next_keep_alive
                && !self.session.refresh.swap(false, Ordering::AcqRel)
            {
                continue;
            }
            let sent = Instant::now();
            let budget = timeout.min(self.session.deadline().saturating_duration_since(sent));
            let outcome = tokio::select! {
                biased;
                _ = self.settings.closing.changed() => return Ending::Closed,
                r = tokio::time::timeout(budget, keep_alive(&mut stream, &self.settings.client, self.session.lease)) => r,
            };
            match outcome {
                Ok(Ok(Some(granted))) => {
                    let granted = granted.min(ttl);
                    self.session
                        .extended(self.settings.margin.deadline(sent, granted));
                    next_keep_alive = saturating_add(sent, interval);
                    retry.reset();
                }
                Ok(Ok(None)) => return Ending::LeaseGone,
                Ok(Err(error)) => {
                    tracing::debug!(%error, lease = self.session.lease, "keep-alive failed; retrying");
                    stream = None;
                    next_keep_alive = deadline_in(retry.next_delay());
                }
                Err(_elapsed) => {
                    // A fresh stream next time: a late answer on this one must never be taken
                    // for the answer to a later request (its refresh happened earlier).
                    tracing::debug!(
                        lease = self.session.lease,
                        "keep-alive got no answer; retrying"
                    );
                    stream = None;
                    next_keep_alive = deadline_in(retry.next_delay());
                }
            }
        }
    }
}

/// One keep-alive round trip. `Some(ttl)` when the lease was extended to `ttl`, `None` when etcd
/// says it does not exist any more.
async fn keep_alive(
    stream: &mut KeepAlive,
    client: &Client,
    lease: i64,
) -> std::result::Result<Option<Duration>, etcd_client::Error> {
    match stream {
        None => {
            // Opening the stream sends the first keep-alive and waits for its answer.
            match client.lease_client().keep_alive(lease).await {
                Ok(opened) => {
                    *stream = Some(opened);
                    // etcd-client checked that the answer's TTL is positive; a lease keeps the
                    // TTL it was granted with.
                    Ok(Some(Duration::MAX))
                }
                Err(e) if errors::is_lease_not_found(&e) => Ok(None),
                Err(e) => Err(e),
            }
        }
        Some((keeper, responses)) => {
            keeper.keep_alive().await?;
            match responses.message().await? {
                Some(answer) if answer.ttl() > 0 => Ok(Some(Duration::from_secs(
                    u64::try_from(answer.ttl()).unwrap_or(0),
                ))),
                Some(_) => Ok(None),
                None => Err(etcd_client::Error::LeaseKeepAliveError(
                    "the keep-alive stream ended".into(),
                )),
            }
        }
    }
}
