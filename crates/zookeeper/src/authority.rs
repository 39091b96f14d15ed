//! The ZooKeeper authority: a lease is the lowest ephemeral-sequential node under the key's
//! parent, alive as long as its session, fenced by its czxid.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use leasehold_core::backend::SmallestKeys;
use leasehold_core::time::saturating_add;
use leasehold_core::{
    Authority, Capabilities, Error, ExclusionSafety, FenceSafety, FencingToken, Grant, Inspection,
    Instant, KeyPrefix, LockKey, LostReason, OwnerToken, Released, Result, RevocationNotice,
    Revoked, TtlRange, WaitStrategy,
};
use zookeeper_client::{Error as ZkError, Stat};

use crate::cleanup;
use crate::config::ZkConfig;
use crate::contend::{someone_queued, Contender, Failed};
use crate::errors::{self, is_session_end, BACKEND};
use crate::held::Held;
use crate::names;
use crate::session::{self, Sessions};
use crate::tenure::Tenures;
use crate::token::Czxid;

/// How often an acquisition starts over on a fresh session after its session ended under it.
const SESSION_RETRIES: usize = 3;

/// How often inspect lists again when the holder it found left before its node was read.
const INSPECT_TRIES: usize = 3;

/// Keys remembered as held by someone else, at most; past that the memory starts afresh (a
/// forgotten key only costs one queued and withdrawn node on its next try).
const KNOWN_HELD: usize = 4096;

/// Keys whose last seen state is remembered, at most; past that the memory starts afresh (a
/// forgotten key only lets a change just before a wait go unnoticed until `max_wait`).
const KNOWN_SEEN: usize = 4096;

/// How often a proclaim sets the data again after finding it written since this grant last did.
const PROCLAIM_TRIES: usize = 3;

/// What this client last saw of a key, by inspect or by a wait: the holder's node and, where
/// this client reads its data, the data's version. A wait that finds something else returns
/// at once: the key changed between the caller's read and the wait's watches, a window a
/// holder's proclaim right after its grant falls into.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Seen {
    holder: Option<String>,
    version: Option<i32>,
}

struct Inner {
    config: Arc<ZkConfig>,
    sessions: Sessions,
    tenures: Tenures,
    capabilities: Capabilities,
    /// The lock paths whose last `try_acquire` here found someone ahead: the next one lists
    /// before queueing.
    known_held: Mutex<HashSet<String>>,
    /// By lock path: what inspect or a wait last saw there.
    seen: Mutex<HashMap<String, Seen>>,
}

impl Inner {
    fn known_held(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.known_held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Remembers `now` as the state of the key at `path`; `true` if it differs from the state
    /// remembered before (nothing remembered is no difference).
    fn note_seen(&self, path: &str, now: Seen) -> bool {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if seen.len() >= KNOWN_SEEN && !seen.contains_key(path) {
            seen.clear();
        }
        seen.insert(path.to_owned(), now.clone())
            .is_some_and(|before| before != now)
    }

    /// Forgets what was seen of the key at `path`, once a watch said it changed: the caller reads
    /// the new state next, and comparing the next wait with the old one would only wake it for
    /// nothing.
    fn forget_seen(&self, path: &str) {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.remove(path);
    }
}

/// A ZooKeeper ensemble as an [`Authority`].
///
/// # How a lease maps to ZooKeeper
/// * **Layout**: one container node per key, `<chroot>/<escaped key>` (see
///   [`names::node_name_for_key`]); per contender, an ephemeral-sequential child named
///   `_c_<uuid>-lock-<sequence>`, Apache Curator's `InterProcessMutex` form, so Curator services
///   and leasehold exclude each other on the same path. Children of kazoo's `Lock`
///   (`<uuid>__lock__<sequence>`) and any other sequential recipe queue alike. The lowest
///   sequence holds the lock.
/// * **Acquire**: the create and a listing of the parent go out together (one round trip); if
///   my node is first, the lock is mine. If the create's reply is lost, my node is found again
///   by its UUID instead of creating a second one. Waiting watches only the node just ahead of
///   mine; a waiter that times out or is cancelled deletes its node.
/// * **Fence**: my node's czxid ([`crate::Czxid`]), read back from the server when the create's
///   reply carries no trustworthy `Stat`.
/// * **TTL**: the session timeout. One session per distinct TTL (see the crate docs); a TTL the
///   server does not grant exactly is `InvalidTtl`. The session's heartbeat keeps the lease at
///   the server while the process lives; `renew` confirms, through a write the leader commits
///   (never a follower's possibly stale read), that the node still exists on a live session,
///   and extends the grant's tenure on this side, so a grant nobody renews is also deleted
///   after its TTL. A grant after waiting rests on such a write too.
/// * **Lost**: the session expired (`SessionEnded`, pushed to every grant on the session
///   through its [`LossSignal`](leasehold_core::LossSignal) as soon as the client hears of it),
///   the node was deleted (`Refused`), or no renewal was confirmed before the local deadline (a
///   disconnection, Curator's SUSPENDED, stops renewals from succeeding until the session
///   answers again).
///
/// A grant lives no longer than the authority that issued it: dropping the authority closes
/// its sessions, and ZooKeeper deletes their nodes at once. Clones share the sessions.
#[derive(Clone)]
pub struct ZkAuthority {
    inner: Arc<Inner>,
}

impl fmt::Debug for ZkAuthority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkAuthority")
            .field("config", &self.inner.config)
            .field("sessions", &self.inner.sessions)
            .finish_non_exhaustive()
    }
}

impl ZkAuthority {
    /// Connects with a `zk://` or `zks://` (TLS) URL (see [`ZkConfig::from_url`]).
    ///
    /// Connecting opens two short-lived sessions to learn the session timeouts the server grants
    /// (unless [`ZkConfig::with_ttl_range`] declares them) and creates the chroot if it is
    /// missing. Fails with `Unavailable` when no server answers within the request timeout (with
    /// TLS, also when the handshake fails), `Unauthorized` when the credentials may not create
    /// the chroot, `InvalidConfig` when a TLS file is missing or unusable.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::with_config(ZkConfig::from_url(url)?).await
    }

    /// Connects with a parsed configuration.
    pub async fn with_config(mut config: ZkConfig) -> Result<Self> {
        let session::Prepared {
            range: ttl,
            tick: told,
            learners,
        } = session::prepare(&config).await?;
        // Without the servers' word, half the minimum session timeout (its default is two
        // ticks) stands in; on an ensemble the deadlines then rest on a guess, which is
        // declared.
        let tick = told.unwrap_or(ttl.min / 2);
        config.half_tick = learners.then_some(tick / 2);
        let exclusion = if learners && told.is_none() {
            let reason = format!(
                "the ZooKeeper servers' tickTime could not be read (`conf` is not in                  4lw.commands.whitelist, the servers did not answer it, or the client port is                  TLS), so deadlines allow for a tick guessed as half the minimum session                  timeout ({tick:?}); with a longer tick the leader can expire a session                  talking to a follower or observer before its holder's deadline"
            );
            tracing::warn!("{reason}");
            ExclusionSafety::EarlyRevocation { reason }
        } else {
            ExclusionSafety::Exclusive
        };
        let capabilities = Capabilities::new(BACKEND, FenceSafety::Linearizable, true, ttl)
            .with_exclusion(exclusion)
            .with_wait(WaitStrategy::Notification)
            .with_renew_with_other_ttl(false)
            .with_batch_renewal(true)
            .with_revocation(RevocationNotice::Pushed)
            .with_counts_waiters(true)
            .with_expiry_slack(tick);
        let config = Arc::new(config);
        Ok(ZkAuthority {
            inner: Arc::new(Inner {
                sessions: Sessions::new(config.clone()),
                tenures: Tenures::default(),
                known_held: Mutex::default(),
                seen: Mutex::default(),
                config,
                capabilities,
            }),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &ZkConfig {
        &self.inner.config
    }

    /// The node under which `key`'s contenders queue: `<chroot>/<escaped key>`. Point a Curator
    /// `InterProcessMutex` or a kazoo `Lock` (with `extra_lock_patterns=["-lock-"]`) at this path
    /// to share the lock with them.
    pub fn lock_path(&self, key: &LockKey) -> String {
        lock_path(&self.inner.config, key)
    }

    /// A session to read with: any this client has open, or a new one of the shortest TTL (a
    /// session alone holds no lock).
    async fn reading_session(&self) -> Result<Arc<session::Session>> {
        match self.inner.sessions.any() {
            Some(session) => Ok(session),
            None => {
                self.inner
                    .sessions
                    .get(self.inner.capabilities.ttl.min)
                    .await
            }
        }
    }

    /// The TTLs this authority grants (what the server granted when probed).
    pub fn ttl_range(&self) -> TtlRange {
        self.inner.capabilities.ttl
    }

    fn check_ttl(&self, ttl: Duration) -> Result<()> {
        self.inner.capabilities.ttl.check(ttl)
    }

    fn contender(&self, key: &LockKey, session: Arc<session::Session>) -> Result<Contender> {
        Ok(Contender::new(
            self.inner.config.clone(),
            session,
            key,
            self.lock_path(key),
            OwnerToken::generate()?,
        ))
    }

    /// Watches `key` until something about it may have changed: the body of
    /// [`Authority::wait_for_change`], which bounds it by time.
    ///
    /// One-shot watches on the parent's children (a contender queues or leaves: a grant, a
    /// release, a holder's session ending) and on the holder node's data (a proclaim); an exists
    /// watch while the parent is missing. Dropping the future drops the watchers, which the
    /// client then removes, so nothing stays registered.
    async fn changed(&self, key: &LockKey) -> Result<()> {
        let session = self.reading_session().await?;
        let client = &session.client;
        let config = &self.inner.config;
        let parent = self.lock_path(key);
        // A session that ended is no reason to fail: the caller reads again, on a new session.
        let failed = |e: ZkError, what: &str| {
            if is_session_end(&e) && !matches!(e, ZkError::AuthFailed) {
                self.inner.sessions.forget(&session);
                Ok(())
            } else {
                Err(errors::map(e, what))
            }
        };
        // The parent was missing when first looked at: any contender under it is a change.
        let mut appeared = false;
        loop {
            let listed = session::read(config, "watch the contenders", || {
                client.list_and_watch_children(&parent)
            })
            .await?;
            let (children, children_changed) = match listed {
                Ok(listed) => listed,
                Err(ZkError::NoNode) => {
                    // Nobody has queued yet, or the container was removed: free.
                    if self.inner.note_seen(&parent, Seen::default()) {
                        return Ok(());
                    }
                    let exists = session::read(config, "watch the lock's parent", || {
                        client.check_and_watch_stat(&parent)
                    })
                    .await?;
                    match exists {
                        Ok((None, created)) => {
                            created.changed().await;
                            if !session.is_alive() {
                                self.inner.forget_seen(&parent);
                                return Ok(());
                            }
                        }
                        Ok((Some(_), _)) => {}
                        Err(e) => return failed(e, "watch the lock's parent"),
                    }
                    appeared = true;
                    continue;
                }
                Err(e) => return failed(e, "watch the contenders"),
            };
            let holder = names::queue(&children).into_iter().next();
            let mut version = None;
            let mut data_changed = None;
            if let Some(first) = holder.as_ref().filter(|n| !names::owner_of(n).is_peer()) {
                let path = format!("{parent}/{first}");
                let watched = session::read(config, "watch the holder", || {
                    client.get_and_watch_data(&path)
                })
                .await?;
                match watched {
                    Ok((_, stat, watcher)) => {
                        version = Some(stat.version);
                        data_changed = Some(watcher);
                    }
                    // Gone since the listing: that is a change.
                    Err(ZkError::NoNode) => {
                        self.inner.forget_seen(&parent);
                        return Ok(());
                    }
                    // Another principal's node: its value is not shown, the children tell the rest.
                    Err(ZkError::NoAuth) => {}
                    Err(e) => return failed(e, "watch the holder"),
                }
            }
            let someone = holder.is_some();
            if self.inner.note_seen(&parent, Seen { holder, version }) || (appeared && someone) {
                return Ok(());
            }
            match data_changed {
                Some(data_changed) => {
                    tokio::select! {
                        _ = children_changed.changed() => {}
                        _ = data_changed.changed() => {}
                    }
                }
                None => {
                    children_changed.changed().await;
                }
            }
            self.inner.forget_seen(&parent);
            return Ok(());
        }
    }

    /// One multi of version checks on `paths` (a write the leader commits, proving the session
    /// alive there) and one multi-read of their stats, sent together.
    async fn confirm_and_stat(
        &self,
        session: &session::Session,
        paths: Vec<&str>,
    ) -> Result<std::result::Result<Vec<zookeeper_client::MultiReadResult>, ZkError>> {
        let client = &session.client;
        session::read(&self.inner.config, "renew", || {
            let mut writer = client.new_multi_writer();
            let mut reader = client.new_multi_reader();
            let mut added = Ok(());
            for path in &paths {
                added = added
                    .and_then(|()| writer.add_check_version(path, -1))
                    .and_then(|()| reader.add_get_data(path));
            }
            let sent = added.map(|()| (writer.commit(), reader.commit()));
            async move {
                let (confirm, read) = sent?;
                confirm.await.map_err(ZkError::from)?;
                read.await
            }
        })
        .await
    }

    fn held(grant: &Grant) -> Result<&Arc<Held>> {
        grant
            .backend_state::<Arc<Held>>()
            .ok_or_else(|| Error::Backend {
                backend: BACKEND,
                message: "this grant was not issued by a ZooKeeper authority".into(),
                retryable: false,
                source: None,
            })
    }
}

/// `<chroot>/<escaped key>`.
/// The children of `path` after a `sync` (so the listing is not older than the request); none
/// when `path` does not exist. Reads only.
async fn synced_children(
    config: &ZkConfig,
    client: &zookeeper_client::Client,
    path: &str,
    what: &str,
) -> Result<Vec<String>> {
    let listed = session::read(config, what, || {
        let synced = client.sync(path);
        let listed = client.list_children(path);
        async move {
            synced.await?;
            listed.await
        }
    });
    match listed.await? {
        Ok(children) => Ok(children),
        Err(ZkError::NoNode) => Ok(Vec::new()),
        Err(e) => Err(errors::map(e, what)),
    }
}

/// The holder node's `Stat`, with its data when `with_data` and this client may read it; `None`
/// when the node is gone. A peer's data is not ours to show, so it is not asked for; another
/// principal's creator-only node cannot be read, but its `Stat` can (`exists` needs no
/// permission).
async fn read_holder(
    config: &ZkConfig,
    client: &zookeeper_client::Client,
    path: &str,
    with_data: bool,
) -> Result<Option<(Stat, Option<Vec<u8>>)>> {
    if with_data {
        match session::read(config, "inspect", || client.get_data(path)).await? {
            Ok((data, stat)) => return Ok(Some((stat, Some(data)))),
            Err(ZkError::NoNode) => return Ok(None),
            Err(ZkError::NoAuth) => {}
            Err(e) => return Err(errors::map(e, "inspect")),
        }
    }
    match session::read(config, "inspect", || client.check_stat(path)).await? {
        Ok(Some(stat)) => Ok(Some((stat, None))),
        Ok(None) | Err(ZkError::NoNode) => Ok(None),
        Err(e) => Err(errors::map(e, "inspect")),
    }
}

pub(crate) fn lock_path(config: &ZkConfig, key: &LockKey) -> String {
    let name = names::node_name_for_key(key);
    if config.chroot == "/" {
        format!("/{name}")
    } else {
        format!("{}/{name}", config.chroot)
    }
}

fn session_lost(key: &LockKey) -> Error {
    Error::Unavailable {
        backend: BACKEND,
        message: format!("the ZooKeeper session ended repeatedly while acquiring `{key}`"),
        source: None,
    }
}

/// The most nodes one batched renewal request names (see `renew_many`).
const RENEW_CHUNK: usize = 200;

#[async_trait]
impl Authority for ZkAuthority {
    fn capabilities(&self) -> &Capabilities {
        &self.inner.capabilities
    }

    async fn try_acquire(&self, key: &LockKey, ttl: Duration) -> Result<Option<Grant>> {
        let started = Instant::now();
        self.check_ttl(ttl)?;
        let path = self.lock_path(key);
        for _ in 0..SESSION_RETRIES {
            let session = self.inner.sessions.get(ttl).await?;
            // Held when last tried: list first, and queue only if nobody is there any more.
            if self.inner.known_held().contains(&path) {
                match someone_queued(&self.inner.config, &session, &path).await {
                    Ok(true) => return Ok(None),
                    Ok(false) => {
                        self.inner.known_held().remove(&path);
                    }
                    Err(Failed::Error(e)) => return Err(e),
                    Err(Failed::SessionGone) => {
                        self.inner.sessions.forget(&session);
                        continue;
                    }
                }
            }
            match self
                .contender(key, session.clone())?
                .try_once(&self.inner.tenures, ttl, started)
                .await
            {
                Ok(None) => {
                    let mut known = self.inner.known_held();
                    if known.len() >= KNOWN_HELD {
                        known.clear();
                    }
                    known.insert(path);
                    return Ok(None);
                }
                Ok(granted) => return Ok(granted),
                Err(Failed::Error(e)) => return Err(e),
                Err(Failed::SessionGone) => self.inner.sessions.forget(&session),
            }
        }
        Err(session_lost(key))
    }

    async fn acquire(&self, key: &LockKey, ttl: Duration, max_wait: Duration) -> Result<Grant> {
        self.check_ttl(ttl)?;
        let started = Instant::now();
        let give_up = saturating_add(started, max_wait);
        for _ in 0..SESSION_RETRIES {
            let session = self.inner.sessions.get(ttl).await?;
            match self
                .contender(key, session.clone())?
                .wait(&self.inner.tenures, ttl, started, give_up)
                .await
            {
                Ok(grant) => return Ok(grant),
                Err(Failed::Error(e)) => return Err(e),
                Err(Failed::SessionGone) => {
                    self.inner.sessions.forget(&session);
                    if Instant::now() >= give_up {
                        return Err(Error::Timeout {
                            key: key.to_string(),
                            waited: started.elapsed(),
                        });
                    }
                }
            }
        }
        Err(session_lost(key))
    }

    async fn renew(&self, grant: &Grant, ttl: Duration) -> Result<Instant> {
        let sent = Instant::now();
        self.check_ttl(ttl)?;
        if ttl != grant.ttl() {
            return Err(Error::InvalidTtl {
                ttl,
                reason: format!(
                    "a ZooKeeper lease's TTL is its session's timeout, fixed when granted: renew with {:?}",
                    grant.ttl()
                ),
            });
        }
        let held = Self::held(grant)?;
        let key = grant.key().as_str();
        if held.has_ended() {
            return Err(Error::lease_lost(key, LostReason::Refused));
        }
        let Some(session) = held.session.upgrade().filter(|s| s.is_alive()) else {
            held.end();
            return Err(Error::lease_lost(key, LostReason::SessionEnded));
        };
        // A conditional write on my node (which the leader must commit: a follower cut off from
        // it cannot answer from its stale copy), then a read of the node's stat from a state
        // that includes that write, in one round trip. The answer proves the session alive at
        // the leader after `sent`, so its expiry there is at least `sent + ttl`. While the client
        // is disconnected (Curator's SUSPENDED) the check waits for the session to come back, up
        // to the request timeout: no renewal succeeds without that proof, and a blip does not
        // fail it.
        let client = &session.client;
        session.note_send();
        let checked = session::read(&self.inner.config, "renew", || {
            let confirmed = session::confirm(client, &held.path);
            let stat = client.check_stat(&held.path);
            async move {
                match confirmed.await {
                    Ok(()) => stat.await,
                    // My node is gone from the ensemble's current state.
                    Err(ZkError::NoNode) => Ok(None),
                    Err(e) => Err(e),
                }
            }
        });
        let stat = match checked.await? {
            Err(e) if is_session_end(&e) => {
                held.end();
                return Err(Error::lease_lost(key, LostReason::SessionEnded));
            }
            Err(e) => return Err(errors::map(e, "renew")),
            Ok(stat) => stat,
        };
        let ours = stat
            .is_some_and(|s| s.czxid == held.czxid.get() && s.ephemeral_owner == held.session_id);
        if !ours {
            held.end();
            return Err(Error::lease_lost(key, LostReason::Refused));
        }
        if !held.extend(saturating_add(sent, ttl)) {
            return Err(Error::lease_lost(key, LostReason::Refused));
        }
        Ok(self
            .inner
            .config
            .deadline(sent, ttl, session.quiet_before(sent)))
    }

    /// Per session, one multi of version checks (the write the leader commits, as each renew
    /// sends) and one multi-read of the nodes' stats, sent together: two requests per session
    /// per tick for all its leases. Anything unusual (a node gone, a session ending, a server
    /// without multi-read) is left to `renew`, one grant at a time, which knows every case.
    async fn renew_many(&self, grants: &[Grant]) -> Vec<Result<Instant>> {
        let mut results: Vec<Option<Result<Instant>>> = grants.iter().map(|_| None).collect();
        // Grants by session, each with when its renewal was sent.
        let mut by_session: Vec<(Arc<session::Session>, Vec<(usize, Arc<Held>, Instant)>)> =
            Vec::new();
        for (i, grant) in grants.iter().enumerate() {
            let sent = Instant::now();
            let ready = self
                .check_ttl(grant.ttl())
                .and_then(|()| Self::held(grant).cloned());
            let held = match ready {
                Ok(held) => held,
                Err(e) => {
                    results[i] = Some(Err(e));
                    continue;
                }
            };
            match held.session.upgrade().filter(|s| s.is_alive()) {
                Some(session) if !held.has_ended() => {
                    match by_session
                        .iter_mut()
                        .find(|(s, _)| Arc::ptr_eq(s, &session))
                    {
                        Some((_, members)) => members.push((i, held, sent)),
                        None => by_session.push((session, vec![(i, held, sent)])),
                    }
                }
                // Ended or without a session: `renew` says which, one by one.
                _ => {}
            }
        }
        for (session, members) in by_session {
            session.note_send();
            // At most RENEW_CHUNK nodes a request, so an answer with every node's data (a
            // proclaimed value each) stays well under ZooKeeper's 1 MB `jute.maxbuffer`; the
            // chunks go out together on the session.
            let checks = members.chunks(RENEW_CHUNK).map(|chunk| {
                let paths: Vec<&str> = chunk.iter().map(|(_, h, _)| h.path.as_str()).collect();
                self.confirm_and_stat(&session, paths)
            });
            let answers = futures_util::future::join_all(checks).await;
            for (chunk, answer) in members.chunks(RENEW_CHUNK).zip(answers) {
                let stats = match answer {
                    Ok(Ok(stats)) if stats.len() == chunk.len() => stats,
                    // No answer in time: every renewal in the chunk has an unknown outcome.
                    Err(e) => {
                        for (i, _, _) in chunk {
                            results[*i] = Some(Err(e.clone()));
                        }
                        continue;
                    }
                    // A node gone, a session ending, a server without multi-read: `renew`,
                    // one by one, below.
                    Ok(_) => continue,
                };
                for ((i, held, sent), answer) in chunk.iter().zip(stats) {
                    let ours = match &answer {
                        zookeeper_client::MultiReadResult::Data { stat, .. } => {
                            stat.czxid == held.czxid.get()
                                && stat.ephemeral_owner == held.session_id
                        }
                        _ => false,
                    };
                    let ttl = grants[*i].ttl();
                    if ours && held.extend(saturating_add(*sent, ttl)) {
                        results[*i] = Some(Ok(self.inner.config.deadline(
                            *sent,
                            ttl,
                            session.quiet_before(*sent),
                        )));
                    }
                    // Not ours, or its tenure over: `renew` finds out which, and ends it.
                }
            }
        }
        let mut out = Vec::with_capacity(grants.len());
        for (grant, result) in grants.iter().zip(results) {
            out.push(match result {
                Some(result) => result,
                None => self.renew(grant, grant.ttl()).await,
            });
        }
        out
    }

    async fn release(&self, grant: &Grant) -> Result<Released> {
        let held = Self::held(grant)?;
        let was_running = held.end();
        let Some(session) = held.session.upgrade() else {
            // The session is closed, and its nodes with it.
            return Ok(Released::AlreadyGone);
        };
        // The path names this grant's own node (its UUID and sequence), so deleting it can never
        // free a lease someone else holds now.
        let deleted = tokio::time::timeout(
            self.inner.config.client.request_timeout,
            session.client.delete(&held.path, None),
        )
        .await;
        match deleted {
            Ok(Ok(())) if was_running => Ok(Released::Released),
            Ok(Ok(())) | Ok(Err(ZkError::NoNode)) => Ok(Released::AlreadyGone),
            Ok(Err(e)) if is_session_end(&e) => Ok(Released::AlreadyGone),
            Ok(Err(e)) => {
                cleanup::spawn_delete(session, self.inner.config.clone(), held.path.clone());
                Err(errors::map(e, "release"))
            }
            Err(_) => {
                cleanup::spawn_delete(session, self.inner.config.clone(), held.path.clone());
                Err(errors::timed_out(
                    "release",
                    self.inner.config.client.request_timeout,
                ))
            }
        }
    }

    /// Lists the key's parent (after a `sync`, so the listing is not older than the request)
    /// and reads the first contender's data and `Stat`: reads only, so no node is created and no
    /// watcher is woken. It uses any session this client has open, or opens one of the
    /// shortest TTL (a session alone holds no lock).
    ///
    /// * The lowest sequence is the holder, whatever recipe made it (leasehold, Curator, kazoo;
    ///   the owner id is the UUID's short id, or `peer:kazoo`, `peer:foreign`); its czxid is its fence and the last
    ///   fence issued (earlier holders' nodes were created before it). When nobody queues the
    ///   last fence is unknown: deleted nodes leave nothing to read.
    /// * The value is the holder node's data after [`names::VALUE_TAG`]: what it proclaimed. A
    ///   Curator node (named as ours) carries untagged data, so it shows none; a peer's data is
    ///   not read, and another principal's creator-only node cannot be, so neither shows one.
    /// * The remaining time is always `None`: ZooKeeper does not tell one session how long
    ///   another session has left before it expires, and a leasehold holder's client withdraws
    ///   an unrenewed grant at its own deadline, which the server does not know either.
    async fn inspect(&self, key: &LockKey) -> Result<Inspection> {
        let session = self.reading_session().await?;
        let parent = self.lock_path(key);
        let client = &session.client;
        // The holder may leave between the listing and the read of its node: look again.
        for _ in 0..INSPECT_TRIES {
            let children = synced_children(&self.inner.config, client, &parent, "inspect").await?;
            let queue = names::queue(&children);
            // Everyone queued behind the holder, whatever recipe queued them (peers too).
            let waiters = u32::try_from(queue.len().saturating_sub(1)).unwrap_or(u32::MAX);
            let Some(first) = queue.into_iter().next() else {
                self.inner.note_seen(&parent, Seen::default());
                return Ok(Inspection::free(BACKEND, key.clone()).with_waiters(Some(0)));
            };
            let path = format!("{parent}/{first}");
            let owner = names::owner_of(&first);
            let read = read_holder(&self.inner.config, client, &path, !owner.is_peer()).await?;
            let Some((stat, data)) = read else {
                continue;
            };
            let fence =
                Czxid::new(stat.czxid)?.to_fence(BACKEND, self.inner.config.client.epoch)?;
            let value = data.as_deref().and_then(names::decode_value);
            let version = data.is_some().then_some(stat.version);
            self.inner.note_seen(
                &parent,
                Seen {
                    holder: Some(first),
                    version,
                },
            );
            return Ok(Inspection::held(BACKEND, key.clone(), owner)
                .with_fence(Some(fence))
                .with_last_fence(Some(fence))
                .with_value(value)
                .with_waiters(Some(waiters)));
        }
        Err(Error::Unavailable {
            backend: BACKEND,
            message: format!("inspect `{key}`: the holder kept changing while it was read"),
            source: None,
        })
    }
    /// Reads the holder as inspect does (the lowest sequence under the key's parent, after a
    /// `sync`), then deletes that node by its path, which names one grant only (its UUID and
    /// sequence): a holder that arrived in between has another node and is spared. The
    /// holder's session lives on; its next renewal finds its node gone. The next contender's
    /// node was created later, so its czxid (its fence) is greater.
    async fn revoke(&self, key: &LockKey) -> Result<Revoked> {
        let session = self.reading_session().await?;
        let parent = self.lock_path(key);
        let client = &session.client;
        let timeout = self.inner.config.client.request_timeout;
        let children = synced_children(&self.inner.config, client, &parent, "revoke").await?;
        let Some(first) = names::queue(&children).into_iter().next() else {
            return Ok(Revoked::WasFree);
        };
        let path = format!("{parent}/{first}");
        let Some((stat, _)) = read_holder(&self.inner.config, client, &path, false).await? else {
            return Ok(Revoked::WasFree);
        };
        let fence = Czxid::new(stat.czxid)?.to_fence(BACKEND, self.inner.config.client.epoch)?;
        match tokio::time::timeout(timeout, client.delete(&path, None)).await {
            Ok(Ok(())) => Ok(Revoked::Revoked { fence }),
            // The holder it read went meanwhile (released, or its session ended).
            Ok(Err(ZkError::NoNode)) => Ok(Revoked::WasFree),
            Ok(Err(e)) => Err(errors::map(e, "revoke")),
            Err(_) => Err(errors::timed_out("revoke", timeout)),
        }
    }

    /// Lists the lock parents under the chroot (after a `sync`, as inspect), and maps each
    /// name back to its key. A parent outlives its last contender until something deletes it
    /// (ZooKeeper keeps it; Curator's reaper or a container node may remove it), so free keys
    /// may be listed; a held key always is, since its holder's node sits under its parent.
    async fn list_keys(&self, prefix: &KeyPrefix, limit: usize) -> Result<Vec<LockKey>> {
        let session = self.reading_session().await?;
        let root = self.inner.config.chroot.clone();
        let client = &session.client;
        let children = synced_children(&self.inner.config, client, &root, "list_keys").await?;
        let mut keys = SmallestKeys::new(limit);
        for key in children.iter().filter_map(|c| names::key_from_node_name(c)) {
            if prefix.matches(&key) {
                keys.offer(key);
            }
        }
        Ok(keys.into_sorted())
    }

    /// Sets my node's data to [`names::encode_value`] of `value`, on the data version this
    /// grant last wrote: the path names this grant's node alone (its UUID and sequence), and the
    /// write goes through the leader, so it succeeds only while the node exists at the ensemble,
    /// and never lands on anyone else's. A node gone (expired session, deleted) or a tenure over
    /// is `LeaseLost`, and nothing is written; a tenure that runs out while the write is in
    /// flight is `LeaseLost` too, and the value goes with the node, as every value does: a later
    /// grant, a new node, starts with none.
    async fn proclaim(&self, grant: &Grant, value: &[u8]) -> Result<()> {
        leasehold_core::backend::check_proclaimed(value)?;
        let held = Self::held(grant)?;
        let key = grant.key().as_str();
        let refused = || Error::lease_lost(key, LostReason::Refused);
        if held.is_over(Instant::now()) {
            return Err(refused());
        }
        let Some(session) = held.session.upgrade().filter(|s| s.is_alive()) else {
            held.end();
            return Err(Error::lease_lost(key, LostReason::SessionEnded));
        };
        let config = &self.inner.config;
        let client = &session.client;
        let data = names::encode_value(value);
        let mine =
            |stat: &Stat| stat.czxid == held.czxid.get() && stat.ephemeral_owner == held.session_id;
        for _ in 0..PROCLAIM_TRIES {
            let version = held.data_version();
            // A retry after a lost reply that was applied meets `BadVersion`, handled below.
            let set = session::read(config, "proclaim", || {
                client.set_data(&held.path, &data, Some(version))
            })
            .await?;
            let stat = match set {
                Ok(stat) => stat,
                Err(ZkError::BadVersion) => {
                    // Written since this grant last did (a concurrent proclaim of the same
                    // grant, or a retry of this one): make sure the node is still mine, then set
                    // on its version.
                    let read =
                        session::read(config, "proclaim", || client.check_stat(&held.path)).await?;
                    match read {
                        Ok(Some(stat)) if mine(&stat) => {
                            held.note_data_version(stat.version);
                            continue;
                        }
                        Ok(_) | Err(ZkError::NoNode) => {
                            held.end();
                            return Err(refused());
                        }
                        Err(e) if is_session_end(&e) => {
                            held.end();
                            return Err(Error::lease_lost(key, LostReason::SessionEnded));
                        }
                        Err(e) => return Err(errors::map(e, "proclaim")),
                    }
                }
                Err(ZkError::NoNode) => {
                    held.end();
                    return Err(refused());
                }
                Err(e) if is_session_end(&e) => {
                    held.end();
                    return Err(Error::lease_lost(key, LostReason::SessionEnded));
                }
                Err(e) => return Err(errors::map(e, "proclaim")),
            };
            if !mine(&stat) {
                // Only this grant's own client names a node with its UUID, so this cannot be
                // someone else's; whatever it is, it is not the grant's node.
                held.end();
                return Err(refused());
            }
            held.note_data_version(stat.version);
            // The tenure ran out while the write was in flight: the node is being deleted, and
            // the value with it.
            if held.is_over(Instant::now()) {
                return Err(refused());
            }
            return Ok(());
        }
        Err(Error::Backend {
            backend: BACKEND,
            message: format!(
                "proclaim on `{key}`: the node's data kept changing under the write ({PROCLAIM_TRIES} tries)"
            ),
            retryable: true,
            source: None,
        })
    }

    /// One-shot watches on the key's parent's children and its holder node's data (see
    /// `changed`), bounded by `max_wait`. A state other than the one inspect (or the previous
    /// wait) last saw here returns at once: the change came between that read and this wait.
    async fn wait_for_change(&self, key: &LockKey, max_wait: Duration) -> Result<()> {
        let until = saturating_add(Instant::now(), max_wait);
        tokio::time::timeout_at(until, self.changed(key))
            .await
            .unwrap_or(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use leasehold_conformance::kit::{ErrOrFail, OrFail, TestResult};
    use leasehold_servers::ZkServer;
    use tokio::net::{TcpListener, TcpStream};
    use tokio::sync::watch;

    use super::*;

    /// A TCP proxy in front of the server that can cut the connections through it and hold new
    /// ones (accepted, not forwarded) until it is healed.
    struct Proxy {
        addr: std::net::SocketAddr,
        /// (forwarding, generation): a cut bumps the generation, which ends every connection
        /// forwarded before it.
        state: watch::Sender<(bool, u64)>,
        task: tokio::task::JoinHandle<()>,
    }

    impl Proxy {
        async fn start(upstream: String) -> TestResult<Proxy> {
            let listener = TcpListener::bind("127.0.0.1:0")
                .await
                .or_fail("binding the proxy's listener")?;
            let addr = listener.local_addr().or_fail("the proxy's address")?;
            let (state, _) = watch::channel((true, 0u64));
            let states = state.clone();
            let task = tokio::spawn(async move {
                while let Ok((mut inbound, _)) = listener.accept().await {
                    let (mut states, upstream) = (states.subscribe(), upstream.clone());
                    tokio::spawn(async move {
                        let Ok(&(_, generation)) =
                            states.wait_for(|(open, _)| *open).await.as_deref()
                        else {
                            return;
                        };
                        let Ok(mut outbound) = TcpStream::connect(&upstream).await else {
                            return;
                        };
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                            _ = states.wait_for(|(_, g)| *g != generation) => {}
                        }
                    });
                }
            });
            Ok(Proxy { addr, state, task })
        }

        fn cut(&self) {
            self.state.send_modify(|(open, generation)| {
                *open = false;
                *generation += 1;
            });
        }

        fn heal(&self) {
            self.state.send_modify(|(open, _)| *open = true);
        }
    }

    impl Drop for Proxy {
        fn drop(&mut self) {
            self.task.abort();
        }
    }

    /// The session behind two grants ends while their holder is alive and well: another client
    /// takes the session over (with its id and password) and closes it, so the server deletes
    /// its nodes. Both grants' loss signal fires as soon as the holder's client hears of it, well
    /// before the next renewal would have noticed (a third of the TTL).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_ended_session_fires_the_loss_signal_of_every_grant_on_it() -> TestResult {
        let server = tokio::task::spawn_blocking(ZkServer::start)
            .await
            .or_fail("the ZooKeeper server's start task")?
            .or_fail("ZooKeeper must start for this test")?;
        let hosts = server.connect_string();
        // The holder talks to the server through a proxy, so that it cannot take its session
        // back while another client takes it over and closes it.
        let proxy = Proxy::start(hosts.clone()).await?;
        let a = ZkAuthority::connect(&format!("zk://{}/loss?timeout_ms=1000", proxy.addr))
            .await
            .or_fail("connecting through the proxy")?;
        let ttl = Duration::from_secs(9);
        let first = a
            .try_acquire(&LockKey::new("loss-1").or_fail("the key loss-1")?, ttl)
            .await
            .or_fail("trying to acquire loss-1")?
            .or_fail("acquiring loss-1")?;
        let second = a
            .try_acquire(&LockKey::new("loss-2").or_fail("the key loss-2")?, ttl)
            .await
            .or_fail("trying to acquire loss-2")?
            .or_fail("acquiring loss-2")?;
        let signals = [&first, &second]
            .iter()
            .map(|g| {
                g.loss_signal()
                    .cloned()
                    .or_fail("a ZooKeeper grant carries its session's loss signal")
            })
            .collect::<TestResult<Vec<_>>>()?;
        assert!(signals.iter().all(|s| s.fired().is_none()));
        assert!(first.is_valid() && second.is_valid());

        let session = a.inner.sessions.get(ttl).await.or_fail("the session")?;
        proxy.cut();
        let thief = zookeeper_client::Client::connector()
            .with_session(session.client.session().clone())
            .with_session_timeout(ttl)
            .connect(&hosts)
            .await
            .or_fail("the session can be taken over with its id and password")?;
        drop(session);
        thief
            .list_children("/")
            .await
            .or_fail("listing / as the thief")?;
        drop(thief);
        let raw = zookeeper_client::Client::connect(&hosts)
            .await
            .or_fail("connecting the raw client")?;
        let path = first
            .backend_state::<Arc<Held>>()
            .map(|h| h.path.clone())
            .or_fail("the held lock node's path")?;
        while raw
            .check_stat(&path)
            .await
            .or_fail("checking the lock node")?
            .is_some()
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // The session is gone at the server; the holder's client hears of it when it gets
        // through again.
        let closed = Instant::now();
        proxy.heal();
        // A ninth of the TTL: far sooner than the next renewal, a third of it.
        let within = ttl / 9;
        for signal in &signals {
            let reason = tokio::time::timeout_at(closed + within, signal.wait())
                .await
                .unwrap_or_else(|_| panic!("the loss signal did not fire within {within:?}"));
            assert!(matches!(reason, LostReason::SessionEnded), "{reason:?}");
        }
        eprintln!(
            "the loss signal fired {:?} after the close",
            closed.elapsed()
        );
        assert!(!first.is_valid() && !second.is_valid());
        let err = a
            .renew(&first, ttl)
            .await
            .err_or_fail("renewing a lost grant")?;
        assert!(
            matches!(
                err,
                Error::LeaseLost {
                    reason: LostReason::SessionEnded,
                    ..
                }
            ),
            "{err:?}"
        );
        // A new session serves the next acquisition, and its grant's signal is a fresh one.
        let next = a
            .try_acquire(&LockKey::new("loss-1").or_fail("the key loss-1")?, ttl)
            .await
            .or_fail("trying to acquire loss-1 again")?
            .or_fail("the old session's nodes are gone")?;
        assert!(next.loss_signal().is_some_and(|s| s.fired().is_none()));
        let _ = a.release(&next).await.or_fail("releasing loss-1")?;
        Ok(())
    }
}
