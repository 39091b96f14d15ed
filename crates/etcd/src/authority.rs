//! The etcd authority: contender keys on session leases, the oldest key holds the lock.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, KeyValue, PutOptions, SortOrder,
    SortTarget, Txn, TxnOp, TxnOpResponse, TxnResponse,
};
use leasehold_core::time::{deadline_in, saturating_add};
use leasehold_core::{
    Authority, Capabilities, Error, FenceSafety, FencingToken, Grant, Instant, LockKey, LostReason,
    OwnerToken, Released, Result, TtlRange, WaitStrategy,
};
use tokio::sync::watch;

use crate::config::{EtcdConfig, TlsFiles};
use crate::errors::{self, BACKEND};
use crate::keys::{self, KeySpace};
use crate::session::{delete_contender, Registry, Session, SessionSettings};
use crate::token::EtcdRevision;
use crate::wait::{self, Turn};

/// etcd's longest lease TTL (`MaxLeaseTTL` in its lessor): about 285 years.
const MAX_TTL: Duration = Duration::from_secs(9_000_000_000);

/// How late etcd may notice that a lease ran out: its lessor looks for expired leases every
/// 500 ms.
const EXPIRY_SLACK: Duration = Duration::from_millis(500);

/// How often an acquire starts over when its session ends under it, before giving up.
const SESSION_RETRIES: usize = 3;

/// The backend bookkeeping of one grant: which contender key of which session holds the lock.
#[derive(Debug)]
pub(crate) struct Contender {
    pub(crate) session: Arc<Session>,
    pub(crate) name: String,
    pub(crate) revision: i64,
}

struct Inner {
    client: Client,
    config: EtcdConfig,
    space: KeySpace,
    capabilities: Capabilities,
    registry: Arc<Registry>,
    settings: SessionSettings,
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
            Client::connect(config.endpoints.clone(), Some(options)),
        )
        .await?;
        let min_ttl = probe_min_ttl(&client, timeout).await?;
        // The lease API needs no permission in etcd 3.4: read the namespace once, so that
        // missing or wrong credentials fail here and not at the first acquire.
        let mut kv = client.kv_client();
        let probe = GetOptions::new()
            .with_prefix()
            .with_keys_only()
            .with_limit(1);
        errors::bounded(
            "read the namespace",
            timeout,
            kv.get(format!("{}/", config.namespace), Some(probe)),
        )
        .await?;
        let ttl = TtlRange::new(min_ttl, MAX_TTL, Duration::from_secs(1));
        let capabilities = Capabilities::new(BACKEND, FenceSafety::Linearizable, true, ttl)
            .with_wait(WaitStrategy::Notification)
            .with_renew_with_other_ttl(false)
            .with_expiry_slack(EXPIRY_SLACK);
        let (closing, closed) = watch::channel(());
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
    fn grant(
        &self,
        key: &LockKey,
        owner: OwnerToken,
        won: Contender,
        ttl: Duration,
        sent: Instant,
    ) -> Result<Grant> {
        let Contender {
            session,
            name,
            revision,
        } = &won;
        session
            .contenders
            .held(name, *revision, saturating_add(sent, ttl));
        let fence = EtcdRevision::from_revision(*revision)
            .and_then(|r| r.to_fence(BACKEND, self.inner.config.client.epoch));
        let fence = match fence {
            Ok(fence) => fence,
            Err(error) => {
                session.withdraw_later(name, Some(*revision));
                return Err(error);
            }
        };
        // The key lives as long as the session's lease, and the session withdraws it at
        // `sent + ttl` unless renewed: the grant is good until the earlier of the two.
        let deadline = self
            .inner
            .config
            .client
            .safety_margin
            .deadline(sent, ttl)
            .min(session.deadline());
        Ok(Grant::new(key.clone(), owner, fence, ttl, deadline).with_backend_state(won))
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

fn oldest() -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(1)
}

fn on_lease(session: &Session) -> PutOptions {
    PutOptions::new().with_lease(session.lease())
}

/// Grants a 1 s lease and reads back what the server made of it: etcd raises any TTL below its
/// minimum (derived from the election timeout) to that minimum.
async fn probe_min_ttl(client: &Client, timeout: Duration) -> Result<Duration> {
    let mut leases = client.lease_client();
    let probe = errors::bounded(
        "probe the server's minimum lease TTL",
        timeout,
        leases.grant(1, None),
    )
    .await?;
    let id = probe.id();
    tokio::spawn(async move {
        let _ = tokio::time::timeout(timeout, leases.revoke(id)).await;
    });
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

/// A contender key a waiter wrote: deleted when the waiter gives up, is cancelled (the future
/// dropped) or fails, unless it won.
struct Enqueued {
    session: Arc<Session>,
    name: String,
    revision: Option<i64>,
    armed: bool,
}

impl Enqueued {
    /// The key now exists at `revision`.
    fn written(&mut self, revision: i64) {
        self.revision = Some(revision);
        self.session.contenders.waiting(&self.name, revision);
    }

    /// The key is known to be gone (or was never written): nothing to delete.
    fn forget(mut self) {
        self.armed = false;
        self.session.contenders.forget(&self.name, self.revision);
    }

    /// The key won: it is a held contender now, the grant's business.
    fn won(mut self) -> (Arc<Session>, String) {
        self.armed = false;
        (self.session.clone(), std::mem::take(&mut self.name))
    }

    /// Deletes the key now, so the caller returns with nothing left behind; if etcd does not
    /// answer, the session's task keeps trying.
    async fn withdraw_now(mut self, client: &Client, timeout: Duration) {
        self.armed = false;
        let retry_at = deadline_in(timeout);
        let Some(compare) = self
            .session
            .contenders
            .withdraw(&self.name, self.revision, retry_at)
        else {
            return;
        };
        let lease = self.session.lease();
        match delete_contender(client, &self.name, compare, lease, timeout).await {
            Ok(_) => self.session.contenders.forget(&self.name, compare),
            Err(_) => self.session.withdraw_later(&self.name, compare),
        }
    }
}

impl Drop for Enqueued {
    fn drop(&mut self) {
        if self.armed {
            // Cancelled or failed mid-wait: the session's task deletes the key (no runtime
            // needed here, and it retries until etcd confirms).
            self.session.withdraw_later(&self.name, self.revision);
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
        let owner = OwnerToken::generate()?;
        let prefix = self.inner.space.prefix(key);
        let timeout = self.timeout();
        let mut last_error = None;
        for _ in 0..SESSION_RETRIES {
            let session = self.session(ttl).await?;
            let Some(name) = session.contenders.reserve(&prefix, session.lease()) else {
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
                    name.as_str(),
                    owner.to_hex(),
                    Some(on_lease(&session)),
                )])
                .or_else([TxnOp::get(prefix.as_str(), Some(oldest()))]);
            let sent = Instant::now();
            let mut kv = self.inner.client.kv_client();
            let response = match errors::bounded("acquire", timeout, kv.txn(txn)).await {
                Ok(r) => r,
                Err(e) if errors::is_lease_gone(&e) => {
                    // The session's lease expired or was revoked under us: start a new one.
                    session.end();
                    session.contenders.forget(&name, None);
                    last_error = Some(e);
                    continue;
                }
                Err(e) => {
                    // The put may have happened: delete the key if it is there.
                    session.withdraw_later(&name, None);
                    return Err(e);
                }
            };
            if response.succeeded() {
                let revision = response.header().map_or(0, |h| h.revision());
                let won = Contender {
                    session,
                    name,
                    revision,
                };
                return self.grant(key, owner, won, ttl, sent).map(Some);
            }
            session.contenders.forget(&name, None);
            let holder = kvs(&response, 0).into_iter().next();
            // The oldest key is one of ours that the session does not know: the orphan of a
            // request that got no answer. Delete it and try again rather than wait on ourselves.
            let orphan = holder.filter(|kv| {
                kv.lease() == session.lease()
                    && kv.key_str().is_ok_and(|k| !session.contenders.knows(k))
            });
            match orphan {
                Some(kv) => {
                    let name = kv.key_str().unwrap_or_default();
                    Box::pin(delete_contender(
                        &self.inner.client,
                        name,
                        Some(kv.create_revision()),
                        session.lease(),
                        timeout,
                    ))
                    .await?;
                }
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

    async fn acquire(&self, key: &LockKey, ttl: Duration, max_wait: Duration) -> Result<Grant> {
        self.check_ttl(ttl)?;
        let start = Instant::now();
        let give_up = saturating_add(start, max_wait);
        let owner = OwnerToken::generate()?;
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
            let Some(name) = session.contenders.reserve(&prefix, session.lease()) else {
                // The session ended between the lookup and the reservation.
                tokio::task::yield_now().await;
                continue;
            };
            let mut entry = Enqueued {
                session: session.clone(),
                name: name.clone(),
                revision: None,
                armed: true,
            };
            // Queue up and read the oldest contender in one round trip.
            let txn = Txn::new()
                .when([Compare::create_revision(name.as_str(), CompareOp::Equal, 0)])
                .and_then([
                    TxnOp::put(name.as_str(), owner.to_hex(), Some(on_lease(&session))),
                    TxnOp::get(prefix.as_str(), Some(oldest())),
                ])
                .or_else([TxnOp::get(name.as_str(), None)]);
            let sent = Instant::now();
            let mut kv = client.kv_client();
            let response = match errors::bounded("acquire", timeout, kv.txn(txn)).await {
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
                // A fresh name that already exists is an orphan of ours from a request that got
                // no answer: dropping `entry` has the session delete it; queue under a new name.
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
                    let (session, name) = entry.won();
                    let won = Contender {
                        session,
                        name,
                        revision,
                    };
                    return self.grant(key, owner, won, ttl, checked);
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
        // A read: safe to retry on another member while an election is under way.
        let found = errors::read_with_retry("renew", self.timeout(), || {
            let mut kv = self.inner.client.kv_client();
            let name = c.name.clone();
            async move { kv.get(name, None).await }
        })
        .await?;
        let ours = found.kvs().first().is_some_and(|kv| {
            kv.create_revision() == c.revision && kv.lease() == c.session.lease()
        });
        if c.session.is_ended() {
            return lost(LostReason::SessionEnded);
        }
        if !ours {
            // Deleted behind our back: by an operator (`etcdctl del`), or with the whole lease
            // revoked or expired. Ask which, so that a lost session ends every lease on it now
            // rather than at its next keep-alive. (Only on this rare path: an extra request.)
            c.session.contenders.forget(&c.name, Some(c.revision));
            let mut leases = self.inner.client.lease_client();
            let asked = leases.time_to_live(c.session.lease(), None);
            // -1 (or "not found") means the lease is gone; 0 is a lease in its last second.
            let gone = match tokio::time::timeout(self.timeout(), asked).await {
                Ok(Ok(t)) => t.ttl() < 0,
                Ok(Err(e)) => errors::is_lease_not_found(&e),
                Err(_) => false,
            };
            if gone {
                c.session.end();
                return lost(LostReason::SessionEnded);
            }
            return lost(LostReason::Refused);
        }
        let deadline = self
            .inner
            .config
            .client
            .safety_margin
            .deadline(sent, ttl)
            .min(c.session.deadline());
        if deadline <= Instant::now() {
            // The session's keep-alive has been failing for a whole TTL.
            return lost(LostReason::SessionEnded);
        }
        Ok(deadline)
    }

    async fn release(&self, grant: &Grant) -> Result<Released> {
        let c = contender(grant)?;
        let timeout = self.timeout();
        // Stop renewals now; should the request fail, the session's task retries the delete.
        let _ = c
            .session
            .contenders
            .withdraw(&c.name, Some(c.revision), deadline_in(timeout));
        let txn = Txn::new()
            .when([Compare::create_revision(
                c.name.as_str(),
                CompareOp::Equal,
                c.revision,
            )])
            .and_then([TxnOp::delete(c.name.as_str(), None)]);
        let mut kv = self.inner.client.kv_client();
        let response = match errors::bounded("release", timeout, kv.txn(txn)).await {
            Ok(r) => r,
            Err(e) => {
                c.session.withdraw_later(&c.name, Some(c.revision));
                return Err(e);
            }
        };
        c.session.contenders.forget(&c.name, Some(c.revision));
        Ok(if response.succeeded() {
            Released::Released
        } else {
            Released::AlreadyGone
        })
    }
}
