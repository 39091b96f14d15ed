//! The etcd authority: contender keys on session leases, the oldest key holds the lock.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, KeyValue, PutOptions, SortOrder,
    SortTarget, Txn, TxnOp, TxnOpResponse, TxnResponse,
};
use leasehold_core::backend::{check_proclaimed, SmallestKeys};
use leasehold_core::time::{deadline_in, saturating_add};
use leasehold_core::{
    Authority, Capabilities, Error, ExclusionSafety, FenceSafety, FencingToken, Grant, Inspection,
    Instant, KeyPrefix, LockKey, LossSignal, LostReason, OwnerToken, Released, Result,
    RevocationNotice, Revoked, TtlRange, WaitStrategy,
};
use tokio::sync::{oneshot, watch};

use crate::config::{EtcdConfig, TlsFiles};
use crate::contenders::Withdrawal;
use crate::errors::{self, BACKEND};
use crate::keys::{self, KeySpace};
use crate::server_version;
use crate::session::{delete_contender, lease_gone, Registry, Session, SessionSettings};
use crate::stored;
use crate::token::EtcdRevision;
use crate::wait::{self, Change, Seen, Turn};

mod acquire_all;
mod revocation;

/// etcd's longest lease TTL (`MaxLeaseTTL` in its lessor): about 285 years.
const MAX_TTL: Duration = Duration::from_secs(9_000_000_000);

/// How late etcd may notice that a lease ran out: its lessor looks for expired leases every
/// 500 ms.
const EXPIRY_SLACK: Duration = Duration::from_millis(500);

/// How long `wait_for_change` pauses before returning when its watch ended without an event.
const BROKEN_WATCH_PAUSE: Duration = Duration::from_millis(100);

/// How often an acquire starts over when its session ends under it, before giving up.
const SESSION_RETRIES: usize = 3;

/// The backend bookkeeping of one grant: which contender key of which session holds the lock.
#[derive(Debug)]
pub(crate) struct Contender {
    pub(crate) session: Arc<Session>,
    pub(crate) name: String,
    pub(crate) owner: OwnerToken,
    pub(crate) revision: i64,
}

struct Inner {
    /// Shared by reference: an etcd `Client` holds a handle to every gRPC service, and cloning
    /// one (for a write's task, a held key's watch) cost several microseconds of allocation per
    /// acquisition, measured with perf in the bench.
    client: Arc<Client>,
    config: EtcdConfig,
    space: KeySpace,
    capabilities: Capabilities,
    registry: Arc<Registry>,
    settings: SessionSettings,
    /// Where `wait_for_change` watches each lock from: the revision of our last read of it.
    seen: Seen,
    // Dropped with the authority: every session's task sees the channel close, revokes its
    // lease (freeing all its keys at once) and stops.
    _closing: watch::Sender<()>,
}

/// etcd as an [`Authority`], with the layout and algorithm of etcd's own lock recipe
/// (`client/v3/concurrency` Mutex, `etcdctl lock`) and its known holes closed.
///
/// * **Sessions.** One etcd lease per TTL, kept alive by one stream, shared by every lock this
///   authority holds with that TTL (see the crate docs). An acquire is one transaction.
/// * **Layout.** Lock key `k` is the prefix `<namespace>/<k escaped>/`; each contender writes
///   its own key `<prefix><lease id hex>` (with `_<n>` for a second concurrent contender of the
///   same session) attached to its session lease. The contender with the lowest create revision
///   holds the lock.
/// * **Try-acquire** is one transaction that writes our key only if the prefix is empty: a
///   try that finds the lock held writes nothing, so there is nothing to clean up.
/// * **A set of keys** is one transaction with every prefix's try-acquire compare (see
///   `acquire_all.rs`): all keys written, or none.
/// * **Acquire** writes our key and reads the oldest key under the prefix in one transaction; if
///   ours is not the oldest, it watches only the key just ahead of ours, looks again when that
///   one is deleted, and gives up at `max_wait`. A waiter that gives up or is cancelled deletes
///   its key.
/// * **Fence**: our key's create revision ([`EtcdRevision`]).
/// * **Renew** checks that our key still exists with the same create revision and returns the
///   session's deadline; the lease itself is extended by the session's keep-alive. A grant that
///   is not renewed is withdrawn (its key deleted) when its TTL ends.
/// * **Release** deletes our key only if its create revision is still ours, so a stale or
///   retried release never deletes a newer holder's key (etcd #22082).
///
/// Clones share the client and the sessions. Dropping the last clone revokes its sessions'
/// leases.
#[derive(Clone)]
pub struct EtcdAuthority {
    inner: Arc<Inner>,
}

impl fmt::Debug for EtcdAuthority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdAuthority")
            .field("config", &self.inner.config)
            .field("ttl", &self.inner.capabilities.ttl)
            .finish_non_exhaustive()
    }
}

impl EtcdAuthority {
    /// Connects with an `etcd://` or `etcds://` URL (see [`EtcdConfig::from_url`]).
    ///
    /// Connecting grants (and at once revokes) one lease of 1 s to learn the server's minimum
    /// lease TTL, which [`Capabilities::ttl`] then declares. Fails with `Unauthorized` on bad
    /// credentials and `Unavailable` when no endpoint answers within the request timeout.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::with_config(EtcdConfig::from_url(url)?).await
    }

    /// Connects with a parsed configuration.
    pub async fn with_config(config: EtcdConfig) -> Result<Self> {
        let timeout = config.client.request_timeout;
        let mut options = ConnectOptions::new()
            .with_connect_timeout(timeout)
            // A member cut off from its leader fails requests and watches at once instead of
            // letting them hang.
            .with_require_leader(true);
        if let Some((user, password)) = &config.user {
            options = options
                .with_user(user.clone(), password.expose())
                .with_auto_token_refresh(true);
        }
        if let Some(files) = &config.tls {
            options = options.with_tls(tls_options(files)?);
        }
        let client = errors::bounded(
            "connect",
            timeout,
            Client::connect(config.endpoints.clone(), Some(options.clone())),
        )
        .await?;
        let min_ttl = probe_min_ttl(&client, timeout).await?;
        // The lease API needs no permission in etcd 3.4: read the namespace once, so that
        // missing or wrong credentials fail here and not at the first acquire.
        let probe = GetOptions::new()
            .with_prefix()
            .with_keys_only()
            .with_limit(1);
        let namespace = format!("{}/", config.namespace);
        errors::call("read the namespace", timeout, || {
            let (mut kv, probe, namespace) = (client.kv_client(), probe.clone(), namespace.clone());
            async move { kv.get(namespace, Some(probe)).await }
        })
        .await?;
        let ttl = TtlRange::new(min_ttl, MAX_TTL, Duration::from_secs(1));
        // Every member, each through a client of its own with the same credentials and TLS.
        let exclusion = server_version::exclusion(&client, &options, timeout).await;
        if let ExclusionSafety::EarlyRevocation { reason } = &exclusion {
            tracing::warn!(
                "{reason}: a holder's lease can end before its TTL; write through fences"
            );
        }
        let capabilities = Capabilities::new(BACKEND, FenceSafety::Linearizable, true, ttl)
            .with_exclusion(exclusion)
            .with_wait(WaitStrategy::Notification)
            .with_renew_with_other_ttl(false)
            .with_batch_renewal(true)
            .with_atomic_acquire_all(true)
            .with_revocation(RevocationNotice::Pushed)
            .with_counts_waiters(true)
            .with_expiry_slack(EXPIRY_SLACK);
        let (closing, closed) = watch::channel(());
        let client = Arc::new(client);
        let settings = SessionSettings {
            client: client.clone(),
            margin: config.client.safety_margin,
            request_timeout: timeout,
            idle: config.session_idle,
            closing: closed,
        };
        Ok(EtcdAuthority {
            inner: Arc::new(Inner {
                space: KeySpace::new(&config.namespace),
                client,
                config,
                capabilities,
                registry: Arc::default(),
                settings,
                seen: Seen::default(),
                _closing: closing,
            }),
        })
    }

    /// The etcd client (for guarded writes in etcd transactions, see [`crate::guarded`]).
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// The configuration.
    pub fn config(&self) -> &EtcdConfig {
        &self.inner.config
    }

    /// The etcd prefix under which `key`'s contenders queue, ending in `/`.
    pub fn prefix(&self, key: &LockKey) -> String {
        self.inner.space.prefix(key)
    }

    /// The name to give `etcdctl lock` (or etcd's `concurrency.NewMutex`) to share `key`'s lock
    /// with leasehold: the prefix without its trailing `/`.
    pub fn etcdctl_lock_name(&self, key: &LockKey) -> String {
        keys::lock_name(&self.inner.space, key)
    }

    /// The lease ids of this authority's live sessions (one per TTL in use).
    pub fn session_leases(&self) -> Vec<i64> {
        self.inner
            .registry
            .sessions()
            .iter()
            .map(|s| s.lease())
            .collect()
    }

    /// Ends every session of this authority now and revokes their etcd leases, waiting for etcd's
    /// answers (each bounded by the request timeout), so that nothing of ours outlives the call:
    /// every contender key is deleted with its lease, and every grant still held through this
    /// authority is lost (its loss signal fires). Call it before a process exits: dropping the
    /// authority also revokes, but from a background task that an exiting runtime may never run.
    ///
    /// The authority stays usable; a later acquire starts a new session. Fails with the first
    /// error met (`Unavailable` if etcd did not answer: the leases then expire within their TTL).
    pub async fn close(&self) -> Result<()> {
        // Each revoke in a task of its own: the sessions are ended (their tasks will not revoke
        // any more), so a caller dropped mid-way must not stop the revokes.
        let revokes: Vec<_> = self
            .inner
            .registry
            .take_all()
            .into_iter()
            .map(|session| {
                session.end();
                let (client, timeout) = (self.inner.client.clone(), self.timeout());
                tokio::spawn(async move { errors::revoke(&client, session.lease(), timeout).await })
            })
            .collect();
        let mut first_error = None;
        for revoke in revokes {
            if let Ok(Err(e)) = revoke.await {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    fn check_ttl(&self, ttl: Duration) -> Result<()> {
        self.inner.capabilities.ttl.check(ttl)
    }

    async fn session(&self, ttl: Duration) -> Result<Arc<Session>> {
        self.inner.registry.session(ttl, &self.inner.settings).await
    }

    fn timeout(&self) -> Duration {
        self.inner.config.client.request_timeout
    }

    /// The grant for contender `won`, which holds the lock as of the request sent at `sent`.
    fn grant(&self, key: &LockKey, won: Contender, ttl: Duration, sent: Instant) -> Result<Grant> {
        let Contender {
            session,
            name,
            owner,
            revision,
        } = &won;
        let fence = EtcdRevision::from_revision(*revision)
            .and_then(|r| r.to_fence(BACKEND, self.inner.config.client.epoch));
        let fence = match fence {
            Ok(fence) => fence,
            Err(error) => {
                session.withdraw_later(name, *owner, Some(*revision));
                return Err(error);
            }
        };
        let loss = LossSignal::new();
        session.contenders.held(
            name,
            *owner,
            *revision,
            saturating_add(sent, ttl),
            loss.clone(),
        );
        if session.is_ended() {
            // Ended between the write and now: `end` may have missed this key.
            loss.fire(LostReason::SessionEnded);
        } else {
            let held = Withdrawal {
                name: name.clone(),
                owner: *owner,
                revision: Some(*revision),
            };
            session.watch_later(held, loss.clone());
        }
        // The key lives as long as the session's lease, and the session withdraws it at
        // `sent + ttl` unless renewed: the grant is good until the earlier of the two.
        let deadline = self
            .inner
            .config
            .client
            .safety_margin
            .deadline(sent, ttl)
            .min(session.deadline());
        Ok(
            leasehold_core::backend::grant(key.clone(), *owner, fence, ttl, deadline)
                .with_loss_signal(loss)
                .with_backend_state(won),
        )
    }
}

/// etcd's default limit on operations in one transaction (`--max-txn-ops`).
const MAX_TXN_OPS: usize = 128;

impl EtcdAuthority {
    /// What renew checks before its read: the TTL, the session, and the session's own record
    /// of the contender (moved so the session cannot withdraw the key while we look).
    fn renew_begin<'g>(&self, grant: &'g Grant, ttl: Duration) -> Result<(&'g Contender, Instant)> {
        self.check_ttl(ttl)?;
        if ttl != grant.ttl() {
            return Err(Error::InvalidTtl {
                ttl,
                reason: format!(
                    "an etcd grant lives on its session's lease, whose TTL is fixed: renew with \
                     the TTL it was granted with ({:?})",
                    grant.ttl()
                ),
            });
        }
        let c = contender(grant)?;
        let lost = |reason| Err(Error::lease_lost(grant.key().as_str(), reason));
        if c.session.is_ended() {
            return lost(LostReason::SessionEnded);
        }
        let sent = Instant::now();
        // First move the session's withdrawal time, so it cannot delete the key while we look.
        if !c
            .session
            .contenders
            .renew(&c.name, c.revision, saturating_add(sent, ttl))
        {
            return lost(LostReason::Refused);
        }
        Ok((c, sent))
    }

    /// What renew decides from its read: `found` is the contender key as etcd has it now.
    async fn renew_end(
        &self,
        grant: &Grant,
        c: &Contender,
        ttl: Duration,
        sent: Instant,
        found: Option<&KeyValue>,
    ) -> Result<Instant> {
        let lost = |reason| Err(Error::lease_lost(grant.key().as_str(), reason));
        let ours = found.is_some_and(|kv| {
            kv.create_revision() == c.revision && kv.lease() == c.session.lease()
        });
        if c.session.is_ended() {
            return lost(LostReason::SessionEnded);
        }
        if !ours {
            // Deleted behind our back: by an operator (`etcdctl del`), or with the whole lease
            // revoked or expired. Ask which, so that a lost session ends every lease on it now
            // rather than at its next keep-alive. (Only on this rare path: an extra request.)
            c.session.contenders.forget(&c.name, c.owner);
            if lease_gone(&self.inner.client, c.session.lease(), self.timeout()).await {
                c.session.end();
                return lost(LostReason::SessionEnded);
            }
            return lost(LostReason::Refused);
        }
        let wanted = self.inner.config.client.safety_margin.deadline(sent, ttl);
        // Against the time of the answer, not of the request: a read sent just before an
        // outage and answered after it must not vouch for a lease the keep-alive has not
        // extended since.
        if c.session.deadline() < deadline_in(ttl / 2) {
            // The session's keep-alive is late (normally its deadline is at least two thirds
            // of a TTL ahead): after an outage it may still be backing off while this read
            // already succeeded. Have it extend the lease now, so a renewal that succeeds also
            // moves the deadline.
            c.session.refresh(self.timeout()).await;
            if !c.session.is_ended() && c.session.deadline() < deadline_in(ttl / 3) {
                // The key is there, but etcd has not confirmed extending the lease within a
                // request timeout: the renewal's outcome is unknown, not a success that leaves
                // the deadline where it was.
                return Err(Error::Unavailable {
                    backend: BACKEND,
                    message: format!(
                        "renew `{}`: no keep-alive extended the session lease within {:?}",
                        grant.key(),
                        self.timeout()
                    ),
                    source: None,
                });
            }
        }
        let deadline = wanted.min(c.session.deadline());
        if c.session.is_ended() {
            return lost(LostReason::SessionEnded);
        }
        if deadline <= Instant::now() {
            // The session's keep-alive has been failing for a whole TTL.
            return lost(LostReason::SessionEnded);
        }
        Ok(deadline)
    }
}

fn contender(grant: &Grant) -> Result<&Contender> {
    grant
        .backend_state::<Contender>()
        .ok_or_else(|| Error::InvalidConfig {
            reason: format!(
                "the grant on `{}` was not made by an etcd authority",
                grant.key()
            ),
        })
}

fn kvs(response: &TxnResponse, op: usize) -> Vec<KeyValue> {
    match response.op_responses().into_iter().nth(op) {
        Some(TxnOpResponse::Get(mut get)) => get.take_kvs(),
        _ => Vec::new(),
    }
}

/// How many etcd keys one listing read returns at most.
const LIST_PAGE: i64 = 500;

fn oldest() -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(1)
}

/// Whether `kv`, found under a lock prefix, is a key of `session`'s lease that the session does
/// not know: the orphan of a write whose answer was lost, which nobody but us will delete.
pub(crate) fn is_orphan(session: &Session, kv: &KeyValue) -> bool {
    kv.lease() == session.lease()
        && kv.key_str().is_ok_and(|k| {
            !session
                .contenders
                .knows(k, kv.value(), kv.create_revision())
        })
}

/// Deletes an orphan `kv` by its create revision: never a newer key under the same name.
pub(crate) async fn delete_orphan(client: &Client, kv: &KeyValue, timeout: Duration) -> Result<()> {
    let name = kv.key_str().unwrap_or_default();
    let guard = Compare::create_revision(name, CompareOp::Equal, kv.create_revision());
    delete_contender(client, name, guard, timeout).await?;
    Ok(())
}

fn on_lease(session: &Session) -> PutOptions {
    PutOptions::new().with_lease(session.lease())
}

/// Grants a 1 s lease and reads back what the server made of it: etcd raises any TTL below its
/// minimum (derived from the election timeout) to that minimum.
async fn probe_min_ttl(client: &Client, timeout: Duration) -> Result<Duration> {
    let probe = errors::call("probe the server's minimum lease TTL", timeout, || {
        let mut leases = client.lease_client();
        async move { leases.grant(1, None).await }
    })
    .await?;
    // Awaited, not spawned: a process that connects and exits at once must not leave the probe
    // lease behind.
    let _ = errors::revoke(client, probe.id(), timeout).await;
    let secs = u64::try_from(probe.ttl()).unwrap_or(1).max(1);
    Ok(Duration::from_secs(secs))
}

fn tls_options(files: &TlsFiles) -> Result<etcd_client::TlsOptions> {
    let read = |path: &std::path::Path, what: &str| {
        std::fs::read(path).map_err(|e| Error::InvalidConfig {
            reason: format!("reading the TLS {what} {}: {e}", path.display()),
        })
    };
    let mut tls = etcd_client::TlsOptions::new().with_enabled_roots();
    if let Some(ca) = &files.ca {
        tls = tls.ca_certificate(etcd_client::Certificate::from_pem(read(ca, "CA")?));
    }
    if let (Some(cert), Some(key)) = (&files.cert, &files.key) {
        tls = tls.identity(etcd_client::Identity::from_pem(
            read(cert, "client certificate")?,
            read(key, "client key")?,
        ));
    }
    if let Some(domain) = &files.domain {
        tls = tls.domain_name(domain.clone());
    }
    Ok(tls)
}

/// A contender key booked for one acquisition: deleted when the acquire gives up, is cancelled
/// (its future dropped at any await) or fails, unless it won or is known not to exist. Both
/// `acquire` and `try_acquire` hold one from the reservation on, so no await in between can
/// leave a key behind on the session's kept-alive lease.
struct Booked {
    session: Arc<Session>,
    name: String,
    owner: OwnerToken,
    revision: Option<i64>,
    armed: bool,
    /// The write is in flight in its own task, which settles the key if we are dropped.
    in_flight: bool,
}

impl Booked {
    /// Books a fresh contender key under `prefix` for `owner`, or `None` if the session ended.
    fn reserve(session: &Arc<Session>, prefix: &str, owner: OwnerToken) -> Option<Self> {
        let name = session.contenders.reserve(prefix, session.lease(), owner)?;
        Some(Booked {
            session: session.clone(),
            name,
            owner,
            revision: None,
            armed: true,
            in_flight: false,
        })
    }

    /// Sends `txn`, the transaction that writes this key, in a task of its own, so that dropping
    /// the caller's future cannot lose its answer. If the caller is gone when the answer comes,
    /// the task settles the key knowing the outcome: deleted by its create revision if it was
    /// written, forgotten if not. (A delete sent while the write is still in flight could reach
    /// etcd first, find nothing, and leave the key to land behind it on our kept-alive lease.)
    async fn write(
        &mut self,
        client: &Arc<Client>,
        what: &'static str,
        timeout: Duration,
        txn: Txn,
    ) -> Result<TxnResponse> {
        let (tx, rx) = oneshot::channel();
        let (client, session) = (client.clone(), self.session.clone());
        let (name, owner) = (self.name.clone(), self.owner);
        self.in_flight = true;
        tokio::spawn(async move {
            let result = errors::txn(&client, what, timeout, txn).await;
            if let Err(result) = tx.send(result) {
                settle_abandoned(&session, &name, owner, result);
            }
        });
        let mut answer = Answer {
            rx: Some(rx),
            session: self.session.clone(),
            name: self.name.clone(),
            owner: self.owner,
        };
        let result = match answer.rx.as_mut() {
            Some(rx) => rx.await,
            None => unreachable!("set just above"),
        };
        answer.rx = None;
        self.in_flight = false;
        result.unwrap_or_else(|_| {
            Err(Error::Backend {
                backend: BACKEND,
                message: format!("{what}: the request's task ended without an answer"),
                retryable: true,
                source: None,
            })
        })
    }

    /// The key now exists at `revision` and waits for its turn.
    fn written(&mut self, revision: i64) {
        self.revision = Some(revision);
        self.session
            .contenders
            .waiting(&self.name, self.owner, revision);
    }

    /// The key is known to be gone (or was never written): nothing to delete.
    fn forget(mut self) {
        self.armed = false;
        self.session.contenders.forget(&self.name, self.owner);
    }

    /// The key won at `revision`: it is a held contender now, the grant's business.
    fn won(mut self, revision: i64) -> Contender {
        self.armed = false;
        Contender {
            session: self.session.clone(),
            name: std::mem::take(&mut self.name),
            owner: self.owner,
            revision,
        }
    }

    /// Deletes the key now, so the caller returns with nothing left behind; if etcd does not
    /// answer, the session's task keeps trying.
    async fn withdraw_now(mut self, client: &Client, timeout: Duration) {
        self.armed = false;
        let Some(w) = self.session.contenders.withdraw(
            &self.name,
            self.owner,
            self.revision,
            deadline_in(timeout),
        ) else {
            return;
        };
        if self.session.delete(client, &w, timeout).await.is_err() {
            self.session.wake();
        }
    }
}

/// Settles the key of an acquire that was dropped while its write was in flight, now that the
/// write's outcome is known.
fn settle_abandoned(session: &Session, name: &str, owner: OwnerToken, result: Result<TxnResponse>) {
    match result {
        Ok(written) if written.succeeded() => {
            let revision = written.header().map(|h| h.revision());
            session.withdraw_later(name, owner, revision);
        }
        // The compare failed: nothing was written.
        Ok(_) => session.contenders.forget(name, owner),
        Err(e) if errors::is_lease_gone(&e) => session.contenders.forget(name, owner),
        // Unknown outcome, a whole request timeout after it was sent: delete by owner token.
        Err(_) => session.withdraw_later(name, owner, None),
    }
}

/// The answer to a contender write, not taken yet. Dropped before taking it (the caller's future
/// was dropped between the task sending the answer and the caller reading it), it closes the
/// channel and settles an answer already sent; one sent later fails to arrive and the task
/// settles it. Either way exactly one side settles the key, and none is left on the lease.
struct Answer {
    rx: Option<oneshot::Receiver<Result<TxnResponse>>>,
    session: Arc<Session>,
    name: String,
    owner: OwnerToken,
}

impl Drop for Answer {
    fn drop(&mut self) {
        let Some(mut rx) = self.rx.take() else {
            return;
        };
        rx.close();
        if let Ok(result) = rx.try_recv() {
            settle_abandoned(&self.session, &self.name, self.owner, result);
        }
    }
}

impl Drop for Booked {
    fn drop(&mut self) {
        if self.armed && !self.in_flight {
            // Cancelled or failed mid-request: the session's task deletes the key if it exists
            // (no runtime needed here, and it retries until etcd confirms).
            self.session
                .withdraw_later(&self.name, self.owner, self.revision);
        }
    }
}

#[async_trait]
impl Authority for EtcdAuthority {
    fn capabilities(&self) -> &Capabilities {
        &self.inner.capabilities
    }

    async fn try_acquire(&self, key: &LockKey, ttl: Duration) -> Result<Option<Grant>> {
        self.check_ttl(ttl)?;
        let prefix = self.inner.space.prefix(key);
        let timeout = self.timeout();
        let mut last_error = None;
        for _ in 0..SESSION_RETRIES {
            let session = self.session(ttl).await?;
            // A fresh owner token for every write: it is the key's value, and what a delete of
            // a key whose write got no answer compares.
            let owner = OwnerToken::generate()?;
            let Some(mut entry) = Booked::reserve(&session, &prefix, owner) else {
                // The session ended between the lookup and the reservation.
                tokio::task::yield_now().await;
                continue;
            };
            // Write our key only if no key at all is under the prefix: one atomic step, and a
            // try that finds the lock held leaves nothing behind.
            let txn = Txn::new()
                .when([
                    Compare::create_revision(prefix.as_str(), CompareOp::Equal, 0).with_prefix(),
                ])
                .and_then([TxnOp::put(
                    entry.name.as_str(),
                    stored::encode(owner, None),
                    Some(on_lease(&session)),
                )])
                .or_else([TxnOp::get(prefix.as_str(), Some(oldest()))]);
            let sent = Instant::now();
            // Cancelled here (the future dropped), or failed: the write's task or dropping
            // `entry` has the session delete the key if the put happened.
            let response = match entry
                .write(&self.inner.client, "acquire", timeout, txn)
                .await
            {
                Ok(r) => r,
                Err(e) if errors::is_lease_gone(&e) => {
                    // The session's lease expired or was revoked under us: nothing was written;
                    // start a new session.
                    session.end();
                    entry.forget();
                    last_error = Some(e);
                    continue;
                }
                Err(e) => return Err(e),
            };
            if response.succeeded() {
                let revision = response.header().map_or(0, |h| h.revision());
                return self.grant(key, entry.won(revision), ttl, sent).map(Some);
            }
            entry.forget();
            // Held: a caller that now waits for a change (a semaphore) watches from this read.
            if let Some(header) = response.header() {
                self.inner.seen.record(&prefix, header.revision());
            }
            let holder = kvs(&response, 0).into_iter().next();
            // The oldest key is one of ours that the session does not know: the orphan of a
            // request that got no answer. Delete it and try again rather than wait on ourselves.
            match holder.filter(|kv| is_orphan(&session, kv)) {
                Some(kv) => Box::pin(delete_orphan(&self.inner.client, &kv, timeout)).await?,
                None => return Ok(None),
            }
        }
        Err(last_error.unwrap_or_else(|| Error::Backend {
            backend: BACKEND,
            message: "acquire: the session kept ending; try again".into(),
            retryable: true,
            source: None,
        }))
    }

    async fn try_acquire_all(&self, keys: &[LockKey], ttl: Duration) -> Result<Option<Vec<Grant>>> {
        self.try_acquire_set(keys, ttl).await
    }

    async fn acquire(&self, key: &LockKey, ttl: Duration, max_wait: Duration) -> Result<Grant> {
        self.check_ttl(ttl)?;
        let start = Instant::now();
        let give_up = saturating_add(start, max_wait);
        let prefix = self.inner.space.prefix(key);
        let timeout = self.timeout();
        let client = &self.inner.client;
        let timed_out = || Error::Timeout {
            key: key.to_string(),
            waited: start.elapsed(),
        };
        let mut restarts = 0;
        loop {
            let session = self.session(ttl).await?;
            let owner = OwnerToken::generate()?;
            let Some(mut entry) = Booked::reserve(&session, &prefix, owner) else {
                // The session ended between the lookup and the reservation.
                tokio::task::yield_now().await;
                continue;
            };
            let name = entry.name.clone();
            // Queue up and read the oldest contender in one round trip.
            let txn = Txn::new()
                .when([Compare::create_revision(name.as_str(), CompareOp::Equal, 0)])
                .and_then([
                    TxnOp::put(
                        name.as_str(),
                        stored::encode(owner, None),
                        Some(on_lease(&session)),
                    ),
                    TxnOp::get(prefix.as_str(), Some(oldest())),
                ])
                .or_else([TxnOp::get(name.as_str(), None)]);
            let sent = Instant::now();
            let response = match entry.write(client, "acquire", timeout, txn).await {
                Ok(r) => r,
                Err(e) if errors::is_lease_gone(&e) && restarts < SESSION_RETRIES => {
                    restarts += 1;
                    session.end();
                    entry.forget();
                    continue;
                }
                Err(e) => return Err(e),
            };
            if !response.succeeded() {
                // Our put did not happen: a key of that name exists already, the orphan of a
                // write of ours whose answer was lost. Delete it (by its create revision, so
                // nothing newer can be hit) and queue again.
                entry.forget();
                if let Some(orphan) = kvs(&response, 0).into_iter().next() {
                    if is_orphan(&session, &orphan) {
                        Box::pin(delete_orphan(client, &orphan, timeout)).await?;
                    }
                }
                continue;
            }
            let revision = response.header().map_or(0, |h| h.revision());
            entry.written(revision);
            let first = kvs(&response, 1).first().map(|kv| kv.create_revision());
            let turn = if first == Some(revision) {
                Turn::Mine { checked: sent }
            } else {
                wait::for_turn(client, &session, &prefix, &name, revision, give_up, timeout).await?
            };
            match turn {
                Turn::Mine { checked } => {
                    return self.grant(key, entry.won(revision), ttl, checked);
                }
                Turn::Lost => {
                    entry.forget();
                    if Instant::now() >= give_up {
                        return Err(timed_out());
                    }
                    restarts += 1;
                    if restarts > SESSION_RETRIES {
                        return Err(Error::Backend {
                            backend: BACKEND,
                            message: format!(
                                "acquire `{key}`: our contender key kept disappearing while waiting"
                            ),
                            retryable: true,
                            source: None,
                        });
                    }
                }
                Turn::TimedOut => {
                    entry.withdraw_now(client, timeout).await;
                    return Err(timed_out());
                }
            }
        }
    }

    async fn renew(&self, grant: &Grant, ttl: Duration) -> Result<Instant> {
        let (c, sent) = self.renew_begin(grant, ttl)?;
        // A read: safe to retry on another member while an election is under way.
        let found = errors::read_with_retry("renew", self.timeout(), || {
            let mut kv = self.inner.client.kv_client();
            let name = c.name.clone();
            async move { kv.get(name, None).await }
        })
        .await?;
        self.renew_end(grant, c, ttl, sent, found.kvs().first())
            .await
    }

    /// Many renewals, with their reads in transactions of at most `MAX_TXN_OPS` (128) gets (etcd's
    /// default limit), all sent at once: one round trip per tick for a client's leases, where
    /// one read per lease was sent before. Each grant is then judged as `renew` judges it.
    async fn renew_many(&self, grants: &[Grant]) -> Vec<Result<Instant>> {
        let begun: Vec<Result<(&Contender, Instant)>> = grants
            .iter()
            .map(|g| self.renew_begin(g, g.ttl()))
            .collect();
        let names: Vec<String> = begun
            .iter()
            .filter_map(|b| b.as_ref().ok().map(|(c, _)| c.name.clone()))
            .collect();
        let reads = names.chunks(MAX_TXN_OPS).map(|chunk| {
            errors::read_with_retry("renew", self.timeout(), move || {
                let mut kv = self.inner.client.kv_client();
                let gets: Vec<TxnOp> = chunk.iter().map(|n| TxnOp::get(n.as_str(), None)).collect();
                async move { kv.txn(Txn::new().and_then(gets)).await }
            })
        });
        let answers = futures_util::future::join_all(reads).await;
        // One found key (or none) per name, in order; a failed chunk fails its grants.
        let mut found: Vec<Result<Option<KeyValue>>> = Vec::with_capacity(names.len());
        for (chunk, answer) in names.chunks(MAX_TXN_OPS).zip(answers) {
            match answer {
                Ok(txn) => {
                    let mut got: Vec<Option<KeyValue>> = txn
                        .op_responses()
                        .into_iter()
                        .map(|op| match op {
                            TxnOpResponse::Get(r) => r.kvs().first().cloned(),
                            _ => None,
                        })
                        .collect();
                    got.resize(chunk.len(), None);
                    found.extend(got.into_iter().map(Ok));
                }
                Err(e) => found.extend(vec![Err(e); chunk.len()]),
            }
        }
        let mut found = found.into_iter();
        let mut results = Vec::with_capacity(grants.len());
        for (grant, begun) in grants.iter().zip(begun) {
            results.push(match begun {
                Err(e) => Err(e),
                Ok((c, sent)) => match found.next() {
                    Some(Ok(kv)) => {
                        self.renew_end(grant, c, grant.ttl(), sent, kv.as_ref())
                            .await
                    }
                    Some(Err(e)) => Err(e),
                    None => Err(Error::Backend {
                        backend: BACKEND,
                        message: "renew: a batched read answered fewer keys than it asked".into(),
                        retryable: true,
                        source: None,
                    }),
                },
            });
        }
        results
    }

    async fn release(&self, grant: &Grant) -> Result<Released> {
        let c = contender(grant)?;
        let timeout = self.timeout();
        // Stop renewals now; should the request fail or be cancelled, the session's task
        // retries the delete after one request timeout.
        let _ =
            c.session
                .contenders
                .withdraw(&c.name, c.owner, Some(c.revision), deadline_in(timeout));
        // Only the key created at our revision: a stale or retried release never deletes a
        // newer holder's key under the same name (etcd #22082).
        let guard = Compare::create_revision(c.name.as_str(), CompareOp::Equal, c.revision);
        match delete_contender(&self.inner.client, &c.name, guard, timeout).await {
            Ok(deleted) => {
                c.session.contenders.forget(&c.name, c.owner);
                Ok(if deleted {
                    Released::Released
                } else {
                    Released::AlreadyGone
                })
            }
            Err(e) => {
                c.session
                    .contenders
                    .delete_unanswered(&c.name, c.owner, deadline_in(timeout));
                c.session.withdraw_later(&c.name, c.owner, Some(c.revision));
                Err(e)
            }
        }
    }

    /// Two linearizable reads, both retried while the cluster elects a leader, within one request
    /// timeout in all; nothing is written, so no contender key, lease or watch is created.
    ///
    /// * The oldest key under the lock's prefix (lowest `create_revision`, the rule etcd's
    ///   Mutex and `etcdctl lock` follow) is the holder; its create revision is its fence, and
    ///   the last fence issued (any earlier holder's key was created before it). When the
    ///   prefix is empty the last fence is unknown: etcd keeps no trace of deleted keys that a
    ///   read could rely on (compaction).
    /// * The owner and the value come from the key's value (see the `stored` module): leasehold
    ///   stores its owner token there, then the proclaimed value; an `etcdctl lock` or Mutex
    ///   peer stores nothing and shows as `peer:etcd-mutex`; an `etcdctl elect` or Election peer
    ///   stores its proposal, which is its value, and shows as `peer:etcd-election`. Only the
    ///   holder's key is read, so a waiter's key never lends its value to the holder.
    /// * The remaining time is the holder's lease's `LeaseTimeToLive` on the leader's clock, in
    ///   whole seconds rounded down by etcd, so `None` in a lease's last second (and for a key on
    ///   no lease). It says how long the key outlives a holder process that vanished now: a live
    ///   leasehold holder's client withdraws an unrenewed grant at its own deadline, which
    ///   etcd does not know (its session lease is shared and kept alive).
    async fn inspect(&self, key: &LockKey) -> Result<Inspection> {
        let give_up = deadline_in(self.timeout());
        let prefix = self.inner.space.prefix(key);
        let found = errors::read_with_retry("inspect", self.timeout(), || {
            let (mut kv, prefix) = (self.inner.client.kv_client(), prefix.clone());
            async move { kv.get(prefix, Some(oldest())).await }
        })
        .await?;
        // An observer that waits for a change next watches from this read on.
        if let Some(header) = found.header() {
            self.inner.seen.record(&prefix, header.revision());
        }
        let Some(holder) = found.kvs().first() else {
            return Ok(Inspection::free(BACKEND, key.clone()).with_waiters(Some(0)));
        };
        // The range's count ignores the limit: every key under the prefix, the holder (the
        // oldest) and the contenders created after it, which wait.
        let waiters = u32::try_from(found.count().saturating_sub(1).max(0)).unwrap_or(u32::MAX);
        let fence = EtcdRevision::from_revision(holder.create_revision())?
            .to_fence(BACKEND, self.inner.config.client.epoch)?;
        let stored::Decoded { owner, value } = stored::decode(holder.value());
        let value = value.map(<[u8]>::to_vec);
        let lease = holder.lease();
        let mut remaining = None;
        if lease != 0 {
            let left = give_up.saturating_duration_since(Instant::now());
            let ttl = errors::read_with_retry("inspect (lease TTL)", left, || {
                let mut leases = self.inner.client.lease_client();
                async move { leases.time_to_live(lease, None).await }
            })
            .await;
            match ttl.map(|t| t.ttl()) {
                // The lease ran out (or was revoked) between the two reads: its keys went with
                // it, so the key is free now.
                Ok(secs) if secs < 0 => {
                    return Ok(Inspection::free(BACKEND, key.clone()).with_last_fence(Some(fence)))
                }
                Err(e) if errors::is_lease_gone(&e) => {
                    return Ok(Inspection::free(BACKEND, key.clone()).with_last_fence(Some(fence)))
                }
                Ok(secs) => {
                    remaining = u64::try_from(secs)
                        .ok()
                        .filter(|s| *s > 0)
                        .map(Duration::from_secs)
                }
                Err(e) => return Err(e),
            }
        }
        Ok(Inspection::held(BACKEND, key.clone(), owner)
            .with_fence(Some(fence))
            .with_last_fence(Some(fence))
            .with_remaining(remaining)
            .with_value(value)
            .with_waiters(Some(waiters)))
    }

    /// See [`EtcdAuthority::revoke_holder`].
    async fn revoke(&self, key: &LockKey) -> Result<Revoked> {
        self.revoke_holder(key).await
    }

    /// etcd's `Election.Proclaim`: one transaction that rewrites our contender key only if it
    /// still exists with the create revision we were granted, on our session's lease. The put
    /// keeps the key's create revision, so the fence and the queue order do not change, and
    /// waiters (who watch the key ahead for its deletion only) are not woken. The value goes
    /// after the owner token (see the `stored` module), so the key stays ours to delete and
    /// `inspect` still names its owner; a new grant writes a new key, which starts with no value.
    async fn proclaim(&self, grant: &Grant, value: &[u8]) -> Result<()> {
        check_proclaimed(value)?;
        let c = contender(grant)?;
        let lost = |reason| Err(Error::lease_lost(grant.key().as_str(), reason));
        if c.session.is_ended() {
            return lost(LostReason::SessionEnded);
        }
        if !c.session.contenders.is_held(&c.name, c.revision) {
            // Released, or withdrawn by the session at its TTL (the delete may be in flight).
            return lost(LostReason::Refused);
        }
        let name = c.name.as_str();
        let txn = Txn::new()
            .when([
                Compare::create_revision(name, CompareOp::Equal, c.revision),
                Compare::lease(name, CompareOp::Equal, c.session.lease()),
            ])
            .and_then([TxnOp::put(
                name,
                stored::encode(c.owner, Some(value)),
                Some(on_lease(&c.session)),
            )]);
        match errors::txn(&self.inner.client, "proclaim", self.timeout(), txn).await {
            Ok(applied) if applied.succeeded() => Ok(()),
            // Deleted behind our back, or with the session's lease: the watch on the held key
            // tells the grant which, as it does for any loss.
            Ok(_) if c.session.is_ended() => lost(LostReason::SessionEnded),
            Ok(_) => lost(LostReason::Refused),
            Err(e) if errors::is_lease_gone(&e) => {
                c.session.end();
                lost(LostReason::SessionEnded)
            }
            Err(e) => Err(e),
        }
    }

    /// One watch on the lock's prefix: any put or delete under it (a grant, a release, a
    /// waiter, a proclaim, a lease running out) wakes the caller. It starts just after this
    /// client's last read of the lock (an inspect, a try that found it held), so a change
    /// between that read and this call is replayed, not missed. Dropping the future cancels
    /// the watch. A watch that could not be opened is the error (the caller learns of the
    /// outage); one that broke off returns early, as a hint.
    async fn wait_for_change(&self, key: &LockKey, max_wait: Duration) -> Result<()> {
        let until = saturating_add(Instant::now(), max_wait);
        let prefix = self.inner.space.prefix(key);
        let after = self.inner.seen.get(&prefix);
        let change = tokio::select! {
            biased;
            () = tokio::time::sleep_until(until) => return Ok(()),
            change = wait::changed(&self.inner.client, &prefix, after, self.timeout()) => change?,
        };
        match change {
            Change::At(revision) => self.inner.seen.record(&prefix, revision),
            Change::Compacted => self.inner.seen.forget(&prefix),
            // The caller reads again and waits again: a short pause first, so that a watch
            // etcd keeps ending at once (a member going away, a refused watch) cannot make
            // that loop spin.
            Change::Ended => {
                tokio::time::sleep_until(until.min(deadline_in(BROKEN_WATCH_PAUSE))).await
            }
        }
        Ok(())
    }

    /// Linearizable range reads over the namespace, a page at a time, skipping past each lock
    /// key's contenders once it is seen; the whole listing within one request timeout. A key
    /// with any contender (a holder, and perhaps waiters) is listed: etcd keeps nothing of a
    /// released key, so free keys are not.
    ///
    /// etcd orders the escaped names (`a%2Fb` before `a/`, since `%` sorts before `/`), not
    /// the keys, so the whole range is read and the first `limit` keys kept.
    async fn list_keys(&self, prefix: &KeyPrefix, limit: usize) -> Result<Vec<LockKey>> {
        let give_up = deadline_in(self.timeout());
        let space = &self.inner.space;
        let (start, end) = space.range(prefix);
        let mut start = start.into_bytes();
        let mut keys = SmallestKeys::new(limit);
        loop {
            let left = give_up.saturating_duration_since(Instant::now());
            let page = errors::read_with_retry("list_keys", left, || {
                let mut kv = self.inner.client.kv_client();
                let options = GetOptions::new()
                    .with_range(end.clone())
                    .with_keys_only()
                    .with_sort(SortTarget::Key, SortOrder::Ascend)
                    .with_limit(LIST_PAGE);
                let start = start.clone();
                async move { kv.get(start, Some(options)).await }
            })
            .await?;
            let Some(last) = page.kvs().last() else {
                break;
            };
            let mut next = None;
            for kv in page.kvs() {
                if let Some(key) = space.key_of(kv.key()).filter(|k| prefix.matches(k)) {
                    next = Some(space.after(&key).into_bytes());
                    keys.offer(key);
                }
            }
            if !page.more() {
                break;
            }
            // Past the last lock key seen (its other contenders need not be read), or, when a
            // page held nothing that maps to a key, just past its last etcd key.
            start = next.unwrap_or_else(|| {
                let mut past = last.key().to_vec();
                past.push(0);
                past
            });
        }
        Ok(keys.into_sorted())
    }

    /// Revokes every session lease ([`EtcdAuthority::close`]).
    async fn close(&self) -> Result<()> {
        EtcdAuthority::close(self).await
    }
}

#[cfg(test)]
mod unanswered_writes;
