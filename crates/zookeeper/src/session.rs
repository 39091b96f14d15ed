//! Sessions: a ZooKeeper lease lives as long as the session that created its node, so the TTL
//! *is* the session timeout.
//!
//! An authority opens one session per distinct TTL, lazily, on the first acquisition with that
//! TTL, and keeps it for its lifetime (replacing it when it expires). The server decides the
//! timeout it grants (clamped to `minSessionTimeout..maxSessionTimeout`, by default 2 to 20
//! ticks); a session whose granted timeout is not exactly the TTL asked for is closed and the
//! TTL refused with `InvalidTtl`, never rounded. Applications should use few distinct TTLs:
//! each costs a session and its heartbeats.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_core::time::deadline_in;
use leasehold_core::{Error, Instant, LossSignal, LostReason, Result, TtlRange};
use zookeeper_client::{Acls, Client, CreateMode, CreateOptions, Error as ZkError, TlsOptions};

use crate::config::{AclMode, TlsFiles, ZkConfig};
use crate::errors::{self, is_definite, is_session_end, BACKEND};

/// Sessions with distinct TTLs one authority keeps open at most. Idle ones are closed to make
/// room; if all are busy, another TTL is refused.
pub(crate) const MAX_SESSIONS: usize = 8;

/// The session timeout asked for to learn the server's minimum: below any sensible
/// `minSessionTimeout`, yet long enough for the client to connect within it (the client gives
/// itself the requested timeout to set the session up).
const MIN_PROBE: Duration = Duration::from_millis(250);
/// The fallback when [`MIN_PROBE`] is too short to connect in.
const MIN_PROBE_SLOW: Duration = Duration::from_secs(2);
/// How many recent send instants a session keeps.
const SENDS_KEPT: usize = 16;

/// The session timeout asked for to learn the server's maximum; longer TTLs are not offered.
const MAX_PROBE: Duration = Duration::from_secs(24 * 3600);
/// The longest session timeout the protocol can carry: 32-bit milliseconds, under 25 days.
const MAX_SESSION_TIMEOUT: Duration = Duration::from_millis(i32::MAX as u64);

/// One ZooKeeper session and the TTL it carries.
pub(crate) struct Session {
    pub client: Client,
    /// The negotiated session timeout, which is the TTL of every lease on this session.
    pub ttl: Duration,
    /// The session id, the `ephemeralOwner` of every node it creates.
    pub id: i64,
    /// Fired when the session ends (expired, closed, refused): every grant on it carries it, so
    /// a lease knows it is lost the moment the client hears of the end, not at its next renewal.
    pub loss: LossSignal,
    /// When this client last sent requests on the session (the latest few): any request keeps
    /// the session alive, see [`Session::quiet_before`].
    sends: Mutex<VecDeque<Instant>>,
    /// Leases and contenders on this session; it is not closed to make room while any is.
    /// Shared by count, not by a reference to the session, so that a lease never keeps its
    /// session open after the authority is gone.
    active: Arc<AtomicUsize>,
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("id", &format_args!("{:#x}", self.id))
            .field("ttl", &self.ttl)
            .field("state", &self.client.state())
            .finish()
    }
}

impl Session {
    /// Whether the session can still serve: not expired, closed or refused.
    pub fn is_alive(&self) -> bool {
        !self.client.state().is_terminated()
    }

    /// Marks one more lease or contender on this session, until the returned guard drops.
    pub fn enter(&self) -> Active {
        self.active.fetch_add(1, Ordering::AcqRel);
        Active(self.active.clone())
    }

    /// Notes a request sent now, and returns now.
    pub fn note_send(&self) -> Instant {
        let now = Instant::now();
        let mut sends = self.sends.lock().unwrap_or_else(|e| e.into_inner());
        if sends.len() >= SENDS_KEPT {
            sends.pop_front();
        }
        sends.push_back(now);
        now
    }

    /// How long the session may have been quiet (no request sent) just before `at`: since the
    /// latest noted send before it, and at most a fifth of the TTL, because the client pings a
    /// session idle for `3/20` of its timeout (checked every `1/20`).
    pub fn quiet_before(&self, at: Instant) -> Duration {
        let cap = self.ttl / 5;
        let sends = self.sends.lock().unwrap_or_else(|e| e.into_inner());
        sends
            .iter()
            .filter(|s| **s < at)
            .max()
            .map_or(cap, |last| at.duration_since(*last).min(cap))
    }

    fn is_idle(&self) -> bool {
        self.active.load(Ordering::Acquire) == 0
    }
}

/// A lease or contender using a session (see [`Session::enter`]).
#[derive(Debug)]
pub(crate) struct Active(Arc<AtomicUsize>);

impl Drop for Active {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Runs `work` within the request timeout; a timeout is `Unavailable`.
pub(crate) async fn bounded<T>(
    config: &ZkConfig,
    what: &str,
    work: impl Future<Output = std::result::Result<T, zookeeper_client::Error>>,
) -> Result<T> {
    let timeout = config.client.request_timeout;
    tokio::time::timeout(timeout, work)
        .await
        .map_err(|_| errors::timed_out(what, timeout))?
        .map_err(|e| errors::map(e, what))
}

/// Runs an idempotent read within the request timeout, asking again after a lost connection.
///
/// A request in flight when the connection drops fails, but one made while the client is
/// disconnected waits until the session is re-established: so asking again turns a blip (a
/// leader election, a server restart) into a slower answer instead of an error, and the answer,
/// when it comes, proves the session alive. The outer error is the timeout.
pub(crate) async fn read<T, F, Fut>(
    config: &ZkConfig,
    what: &str,
    mut op: F,
) -> Result<std::result::Result<T, ZkError>>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = std::result::Result<T, ZkError>>,
{
    let timeout = config.client.request_timeout;
    let deadline = deadline_in(timeout);
    loop {
        match tokio::time::timeout_at(deadline, op()).await {
            Err(_) => return Err(errors::timed_out(what, timeout)),
            Ok(Err(e)) if !is_definite(&e) && !is_session_end(&e) && Instant::now() < deadline => {
                tracing::debug!(error = %e, "{what}: the connection was lost; asking again");
                // A request made now waits for the reconnection; the pause only keeps an
                // error that comes back at once from turning this into a spin.
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Ok(answer) => return Ok(answer),
        }
    }
}

/// A write that changes nothing: a multi holding one version check (any version) of `path`.
///
/// A follower answers reads from its own copy of the state, which may be stale: cut off from
/// the leader, it goes on answering for up to `syncLimit` ticks while the leader expires this
/// session and deletes its nodes. A write it cannot answer alone: it goes to the leader and
/// commits through a quorum. So its success proves that after it was sent this session was
/// alive and `path` existed in the ensemble's current state (a `sync` before a read would not:
/// it is not quorum-acknowledged, ZOOKEEPER-1675, ZOOKEEPER-2136). A version check changes no
/// data, so it wakes no watcher. Requests sent after it on the same session are answered from a
/// state that includes it.
pub(crate) fn confirm<'a>(
    client: &'a Client,
    path: &str,
) -> impl Future<Output = std::result::Result<(), ZkError>> + Send + 'a {
    let mut writer = client.new_multi_writer();
    let commit = writer.add_check_version(path, -1).map(|()| writer.commit());
    async move {
        match commit {
            Ok(commit) => commit.await.map(|_| ()).map_err(ZkError::from),
            Err(e) => Err(e),
        }
    }
}

/// Opens a session asking for `timeout`; returns it with the timeout the server granted.
async fn open(config: &ZkConfig, timeout: Duration) -> Result<Session> {
    // The client would overflow (or wrap) on a longer one.
    if timeout > MAX_SESSION_TIMEOUT {
        return Err(Error::InvalidTtl {
            ttl: timeout,
            reason: format!(
                "ZooKeeper carries a session timeout (a lease's TTL) in 32-bit milliseconds: at most {MAX_SESSION_TIMEOUT:?}"
            ),
        });
    }
    let mut connector = Client::connector().with_session_timeout(timeout);
    if let Some((user, password)) = &config.credentials {
        let auth = format!("{user}:{}", password.expose());
        connector = connector.with_auth("digest", auth.as_bytes());
    }
    if let Some((major, minor, patch)) = config.server_version {
        connector = connector.with_server_version(major, minor, patch);
    }
    let client = match &config.tls {
        None => bounded(config, "connect", connector.connect(&config.hosts)).await?,
        Some(files) => {
            let connector = connector.with_tls(tls_options(files)?);
            let timeout = config.client.request_timeout;
            match tokio::time::timeout(timeout, connector.secure_connect(&config.hosts)).await {
                Ok(Ok(client)) => client,
                // A handshake the server refuses (or whose certificate does not verify) is
                // retried by the client until the session timeout, like an unreachable server.
                Err(_) => {
                    return Err(errors::timed_out(
                        "connect over TLS (a server that is down and a TLS handshake that fails look the same here; zookeeper-client logs the handshake's error at debug level)",
                        timeout,
                    ))
                }
                // Only setting TLS up fails this way, before anything is sent (network errors
                // are retried inside the client): rustls refused the certificate or key, or
                // they do not belong together.
                Ok(Err(e @ ZkError::Custom(_))) => {
                    return Err(Error::InvalidConfig {
                        reason: format!("setting up TLS with the client certificate and key: {e}"),
                    })
                }
                Ok(Err(e)) => return Err(errors::map(e, "connect over TLS")),
            }
        }
    };
    let granted = client.session_timeout();
    let id = client.session_id().0;
    let loss = LossSignal::new();
    watch_for_the_end(&client, loss.clone());
    Ok(Session {
        client,
        ttl: granted,
        id,
        loss,
        sends: Mutex::new(VecDeque::with_capacity(SENDS_KEPT)),
        active: Arc::new(AtomicUsize::new(0)),
    })
}

/// The client's TLS settings for `zks://`: the CA to verify the servers with (chain and host
/// name, always) and the client's certificate, read from their PEM files now. A file that
/// cannot be read or holds nothing usable is `InvalidConfig`, naming the file but never showing
/// its content.
fn tls_options(files: &TlsFiles) -> Result<TlsOptions> {
    // zookeeper-client builds its rustls configuration with the process-wide crypto provider,
    // and with more than one provider compiled in (ring for the workspace, aws-lc-rs by
    // zookeeper-client's default rustls features) rustls cannot pick one and would panic.
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Another thread may install one at the same time; either is fine.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
    let read = |path: &Path, what: &str| {
        std::fs::read_to_string(path).map_err(|e| Error::InvalidConfig {
            reason: format!("reading the TLS {what} {}: {e}", path.display()),
        })
    };
    let unusable = |path: &Path, what: &str, e: ZkError| Error::InvalidConfig {
        reason: format!("the TLS {what} {} is not usable: {e}", path.display()),
    };
    let ca = read(&files.ca, "CA file")?;
    let mut options = TlsOptions::new()
        .with_pem_ca(&ca)
        .map_err(|e| unusable(&files.ca, "CA file", e))?;
    if let Some((cert_path, key_path)) = &files.identity {
        let cert = read(cert_path, "client certificate")?;
        let key = read(key_path, "client key")?;
        if !cert.contains("-----BEGIN CERTIFICATE-----") {
            return Err(Error::InvalidConfig {
                reason: format!(
                    "the TLS client certificate {} holds no PEM certificate",
                    cert_path.display()
                ),
            });
        }
        options = options
            .with_pem_identity(&cert, &key)
            .map_err(|e| unusable(key_path, "client certificate and key", e))?;
    }
    Ok(options)
}

/// Fires `loss` once the session ends. The client hears of an expiry when it reconnects (the
/// server answers that the session is gone), or decides it on its own after hearing nothing for
/// longer than the timeout; a close (the authority dropped) ends the nodes at once too.
fn watch_for_the_end(client: &Client, loss: LossSignal) {
    let mut states = client.state_watcher();
    if client.state().is_terminated() {
        loss.fire(LostReason::SessionEnded);
        return;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        loop {
            let state = states.changed().await;
            if state.is_terminated() {
                tracing::debug!(?state, "the ZooKeeper session ended");
                loss.fire(LostReason::SessionEnded);
                return;
            }
        }
    });
}

/// The ACL this authority puts on the nodes it creates.
pub(crate) fn acls(config: &ZkConfig) -> Acls<'static> {
    match config.acl {
        AclMode::Open => Acls::anyone_all(),
        AclMode::CreatorOnly => Acls::creator_all(),
    }
}

/// Learns the TTLs the server grants (unless declared), and makes sure the chroot exists.
///
/// Returns the range, the servers' tick as they report it (see [`crate::tick`]), and whether
/// sessions can reach the leader through learners.
pub(crate) async fn prepare(config: &ZkConfig) -> Result<Prepared> {
    let (range, admin) = match config.ttl_range {
        Some(range) => {
            // A declared range may reach further than a session timeout can: offer no more.
            let range = if range.max > MAX_SESSION_TIMEOUT {
                TtlRange::new(
                    range.min.min(MAX_SESSION_TIMEOUT),
                    MAX_SESSION_TIMEOUT,
                    range.granularity,
                )
            } else {
                range
            };
            (range, open(config, range.max.min(MAX_PROBE)).await?)
        }
        None => {
            // The long one first: if the server cannot be reached, this says so within the
            // request timeout, without a second, slower attempt at the short one.
            let long = open(config, MAX_PROBE).await?;
            let min = probe_min(config).await?;
            let max = long.ttl;
            if min > max {
                return Err(Error::Backend {
                    backend: BACKEND,
                    message: format!(
                        "the server granted a {min:?} session timeout but at most {max:?} to another"
                    ),
                    retryable: false,
                    source: None,
                });
            }
            (TtlRange::new(min, max, Duration::from_millis(1)), long)
        }
    };
    ensure_chroot(config, &admin.client).await?;
    let (learners, tick) = tokio::join!(
        has_learners(config, &admin.client),
        crate::tick::read(
            &config.hosts,
            config.tls.is_some(),
            config.client.request_timeout
        )
    );
    Ok(Prepared {
        range,
        tick,
        learners,
    })
}

/// What connecting learned about the servers.
pub(crate) struct Prepared {
    /// The TTLs (session timeouts) they grant.
    pub range: TtlRange,
    /// Their tick, as `conf` reports it; `None` when no server told it.
    pub tick: Option<Duration>,
    /// Whether there are learners (followers or observers), through which the leader hears of
    /// a session only at their next ping reply: an ensemble of more than one member (or
    /// unknown).
    pub learners: bool,
}

/// Whether the servers form an ensemble with learners: `/zookeeper/config` lists more than one
/// member, voters and observers alike (a client of an observer is reported to the leader as a
/// follower's is; a standalone server leaves it empty). Unknown (unreadable, a server before
/// 3.5) counts as yes, the cautious answer.
async fn has_learners(config: &ZkConfig, client: &Client) -> bool {
    match tokio::time::timeout(config.client.request_timeout, client.get_config()).await {
        Ok(Ok((data, _))) => {
            let text = String::from_utf8_lossy(&data);
            let members = text.lines().filter(|l| l.starts_with("server.")).count();
            members > 1
        }
        _ => true,
    }
}

/// The server's minimum session timeout, or [`MIN_PROBE`] if it allows shorter ones.
async fn probe_min(config: &ZkConfig) -> Result<Duration> {
    let granted = match open(config, MIN_PROBE).await {
        Ok(session) => session.ttl,
        // Too short to connect in: ask for more, and settle for what is granted.
        Err(Error::Unavailable { .. }) => open(config, MIN_PROBE_SLOW).await?.ttl,
        Err(e) => return Err(e),
    };
    Ok(granted)
}

/// Creates the chroot (persistent nodes) when it does not exist.
async fn ensure_chroot(config: &ZkConfig, client: &Client) -> Result<()> {
    if config.chroot == "/" {
        return Ok(());
    }
    let exists = bounded(
        config,
        "check the chroot",
        client.check_stat(&config.chroot),
    )
    .await?;
    if exists.is_none() {
        let options = CreateMode::Persistent.with_acls(acls(config));
        bounded(
            config,
            "create the chroot",
            client.mkdir(&config.chroot, &options),
        )
        .await?;
    }
    Ok(())
}

/// The create options for a per-key parent: a container (the server removes it once its last
/// contender is gone) unless persistent parents were asked for or the server predates them.
pub(crate) fn parent_options(config: &ZkConfig) -> CreateOptions<'static> {
    let mode = if config.containers() {
        CreateMode::Container
    } else {
        CreateMode::Persistent
    };
    mode.with_acls(acls(config))
}

/// The sessions of one authority, by TTL.
pub(crate) struct Sessions {
    config: Arc<ZkConfig>,
    by_ttl: Mutex<HashMap<Duration, Arc<Session>>>,
    /// Serialises opening sessions, so two first acquisitions with one TTL share one session.
    opening: tokio::sync::Mutex<()>,
}

impl fmt::Debug for Sessions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let map = self.by_ttl.lock().unwrap_or_else(|e| e.into_inner());
        f.debug_list().entries(map.values()).finish()
    }
}

impl Sessions {
    pub fn new(config: Arc<ZkConfig>) -> Self {
        Sessions {
            config,
            by_ttl: Mutex::new(HashMap::new()),
            opening: tokio::sync::Mutex::new(()),
        }
    }

    fn cached(&self, ttl: Duration) -> Option<Arc<Session>> {
        let map = self.by_ttl.lock().unwrap_or_else(|e| e.into_inner());
        map.get(&ttl).filter(|s| s.is_alive()).cloned()
    }

    /// Some live session, whatever its TTL, for a read that needs none in particular.
    pub fn any(&self) -> Option<Arc<Session>> {
        let map = self.by_ttl.lock().unwrap_or_else(|e| e.into_inner());
        map.values().find(|s| s.is_alive()).cloned()
    }

    /// The live session for `ttl`, opened now if there is none.
    pub async fn get(&self, ttl: Duration) -> Result<Arc<Session>> {
        if let Some(session) = self.cached(ttl) {
            return Ok(session);
        }
        let _opening = self.opening.lock().await;
        if let Some(session) = self.cached(ttl) {
            return Ok(session);
        }
        {
            let mut map = self.by_ttl.lock().unwrap_or_else(|e| e.into_inner());
            map.retain(|_, s| s.is_alive());
            if map.len() >= MAX_SESSIONS {
                let idle = map
                    .iter()
                    .find(|(_, s)| s.is_idle() && Arc::strong_count(s) == 1)
                    .map(|(t, _)| *t);
                match idle {
                    Some(t) => {
                        map.remove(&t);
                    }
                    None => {
                        return Err(Error::InvalidTtl {
                            ttl,
                            reason: format!(
                                "this client already holds leases on {MAX_SESSIONS} sessions with other TTLs; \
                                 each TTL is a ZooKeeper session, so use fewer distinct TTLs"
                            ),
                        })
                    }
                }
            }
        }
        let session = open(&self.config, ttl).await?;
        if session.ttl != ttl {
            return Err(Error::InvalidTtl {
                ttl,
                reason: format!(
                    "the server granted a session timeout of {:?}, not {ttl:?}; a ZooKeeper lease's TTL is its session timeout",
                    session.ttl
                ),
            });
        }
        let session = Arc::new(session);
        let mut map = self.by_ttl.lock().unwrap_or_else(|e| e.into_inner());
        map.insert(ttl, session.clone());
        Ok(session)
    }

    /// Drops `session` from the cache if it ended, so the next call opens a new one. A live
    /// session stays: other leases may be on it (a contender whose node an operator deleted
    /// says "gone" too).
    pub fn forget(&self, session: &Arc<Session>) {
        if session.is_alive() {
            return;
        }
        let mut map = self.by_ttl.lock().unwrap_or_else(|e| e.into_inner());
        if map
            .get(&session.ttl)
            .is_some_and(|s| Arc::ptr_eq(s, session))
        {
            map.remove(&session.ttl);
        }
    }
}
