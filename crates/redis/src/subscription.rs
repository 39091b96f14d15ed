//! Pub/sub: one subscription connection per authority wakes the waiters of a released key.
//!
//! Two channels matter to an authority: its own, `<release channel>:<its waiter id>`, where a
//! release that named it in the key's waiter queue tells it its turn, and the release channel,
//! where every release and proclaim is announced. Waiters need only their own: a process that
//! read the release channel would read every hand-off of every process, though only the named
//! one acts on it. Observers (`wait_for_change`) need every change, so the release channel is
//! subscribed as well from an authority's first observer on.
//!
//! On one server (or behind Sentinel) both are plain channels. On a Redis Cluster it is one
//! cluster connection (RESP3) that subscribes, with `SSUBSCRIBE`, to the shard channels of each
//! key waited on (`<lock key>:<own channel>` for a waiter, `<lock key>:<release channel>` for an
//! observer), at the primary that owns the key's slot, and unsubscribes when nobody waits on the
//! key any more (see [`crate::cluster`]).

use std::collections::HashSet;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_core::backend::Backoff;
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, Msg, ProtocolVersion, PushInfo, PushKind, RedisError, Value};
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

use crate::cluster::{lock_key_of, shard_channel, ClusterTarget};
use crate::errors::is_transient;
use crate::link::Source;
use crate::sentinel::NodeAddr;
use crate::waiters::Waiters;

/// How often the subscription connection is checked with a `PING`, so a connection whose server
/// vanished without closing it is noticed and replaced (waiters rely on their retries meanwhile).
const HEALTH_CHECK_EVERY: Duration = Duration::from_secs(1);

/// Where the subscription connection is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum State {
    /// The first attempt to subscribe has not finished.
    Starting,
    /// Subscribed: every release announced from now on reaches the waiters.
    Ready,
    /// Not subscribed (server unreachable, or pub/sub refused): waiters find releases by their
    /// retries alone until it is back.
    Down,
}

/// The subscription connection of one authority, shared by all its waiters.
///
/// It uses RESP3, where a subscribed connection still answers commands, so it can be checked
/// with `PING`; messages arrive as pushes and are dispatched to the waiters of the key named in
/// the payload. It is started by the first waiter and ends with the authority. Behind Sentinel
/// it subscribes on the primary the sentinels name, and moves (subscribing again, waking every
/// waiter) when its connection fails or the authority's requests found another primary.
pub(crate) struct Subscription {
    notifications: Notifications,
    channel: String,
    /// This authority's own channel: `<channel>:<waiter id>`.
    own: String,
    /// Set by the first observer: the release channel is wanted too.
    observe: Arc<watch::Sender<bool>>,
    /// Whether the release channel is subscribed on the connection now (one server).
    observing: Arc<watch::Sender<bool>>,
    /// Set while the server refuses this authority's own channel (an ACL user with rights on
    /// the release channel alone): waiters then read the release channel, where every
    /// announcement names its waiter, as before there were own channels.
    own_refused: Arc<AtomicBool>,
    timeout: Duration,
    waiters: Arc<Waiters>,
    state: Arc<watch::Sender<State>>,
    task: Mutex<Option<JoinHandle<()>>>,
    /// On a Redis Cluster: the connection and the shard channels subscribed.
    sharded: Arc<Sharded>,
}

/// Where announcements come from.
#[derive(Clone)]
pub(crate) enum Notifications {
    /// The release channel, on one server or the primary Sentinel names (`source` must speak
    /// RESP3).
    PubSub(Source),
    /// One shard channel per key waited on, on a Redis Cluster.
    Sharded(ClusterTarget),
}

/// The sharded subscriptions of a Redis Cluster authority.
#[derive(Default)]
struct Sharded {
    /// The cluster connection, once open.
    con: Mutex<Option<ClusterConnection>>,
    /// The shard channels subscribed now. Held while subscribing and while unsubscribing, so a
    /// channel is never unsubscribed under a waiter that just found it subscribed.
    subscribed: tokio::sync::Mutex<HashSet<String>>,
    /// Set when the subscriptions must be made again (a node's connection dropped, or a node
    /// stopped serving a channel's slot).
    again: Notify,
    /// The lock keys an observer waits on: their shard channels of the release channel are
    /// subscribed again with the waiters' own ones.
    observed: Mutex<HashSet<String>>,
}

impl Sharded {
    fn connection(&self) -> Option<ClusterConnection> {
        self.con.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl fmt::Debug for Subscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subscription")
            .field("channel", &self.channel)
            .field("state", &*self.state.borrow())
            .finish_non_exhaustive()
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        if let Some(task) = self.task.get_mut().ok().and_then(Option::take) {
            task.abort();
        }
    }
}

impl Subscription {
    /// `source` must speak RESP3.
    pub(crate) fn new(
        notifications: Notifications,
        channel: String,
        timeout: Duration,
        waiters: Waiters,
    ) -> Self {
        let own = own_channel(&channel, waiters.me());
        Subscription {
            notifications,
            channel,
            own,
            observe: Arc::new(watch::channel(false).0),
            observing: Arc::new(watch::channel(false).0),
            own_refused: Arc::default(),
            timeout,
            waiters: Arc::new(waiters),
            state: Arc::new(watch::channel(State::Starting).0),
            task: Mutex::new(None),
            sharded: Arc::default(),
        }
    }

    pub(crate) fn waiters(&self) -> &Arc<Waiters> {
        &self.waiters
    }

    /// Whether announcements reach this authority's waiters now. Only then does a waiter take
    /// a place in a key's waiter queue: a release that names a waiter who cannot hear it wakes
    /// nobody (the others leave it to the named one), so a waiter without a subscription (a
    /// server before RESP3, a user without channel rights, a connection down) stays out of the
    /// queue and relies on its timer, and releases keep waking those who can hear.
    pub(crate) fn hears(&self) -> bool {
        *self.state.borrow() == State::Ready
    }

    /// Starts the subscription on first use and waits at most `bound` for its first attempt to
    /// finish, so that the first waiter does not miss a release that happens right away. An
    /// `observer` (in `wait_for_change`) also waits until the release channel is subscribed
    /// (from then on for the authority's life), unless the subscription is down. On a Redis
    /// Cluster, also subscribes to `lock_key`'s shard channel (the observer's or the waiter's)
    /// unless it is already (the caller registered as a waiter of `lock_key` before, so it
    /// stays subscribed while the caller waits). Everything within `bound`; past it, the caller
    /// relies on its retries.
    pub(crate) async fn settled(&self, lock_key: &str, bound: Duration, observer: bool) {
        let until = leasehold_core::time::deadline_in(bound);
        let mut state = self.state.subscribe();
        if observer {
            self.observe
                .send_if_modified(|wanted| !std::mem::replace(wanted, true));
        }
        {
            let mut task = self.task.lock().unwrap_or_else(|e| e.into_inner());
            if task.as_ref().is_none_or(|t| t.is_finished()) {
                *task = Some(match &self.notifications {
                    Notifications::PubSub(source) => tokio::spawn(run(
                        source.clone(),
                        Channels {
                            release: self.channel.clone(),
                            own: self.own.clone(),
                            observe: self.observe.subscribe(),
                            observing: self.observing.clone(),
                            own_refused: self.own_refused.clone(),
                        },
                        self.timeout,
                        self.waiters.clone(),
                        self.state.clone(),
                    )),
                    Notifications::Sharded(target) => tokio::spawn(run_sharded(
                        target.clone(),
                        (
                            self.channel.clone(),
                            self.own.clone(),
                            self.own_refused.clone(),
                        ),
                        self.timeout,
                        self.waiters.clone(),
                        self.state.clone(),
                        self.sharded.clone(),
                    )),
                });
            }
        }
        let _ = tokio::time::timeout_at(until, state.wait_for(|s| *s != State::Starting)).await;
        match &self.notifications {
            Notifications::Sharded(_) => {
                if observer {
                    self.sharded
                        .observed
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(lock_key.to_string());
                }
                let subscribe = self.subscribe_shard(lock_key, observer);
                let _ = tokio::time::timeout_at(until, subscribe).await;
            }
            Notifications::PubSub(_) if observer => {
                let mut observing = self.observing.subscribe();
                let on = async {
                    loop {
                        if *observing.borrow_and_update()
                            || *state.borrow_and_update() == State::Down
                        {
                            return;
                        }
                        tokio::select! {
                            changed = observing.changed() => if changed.is_err() { return },
                            changed = state.changed() => if changed.is_err() { return },
                        }
                    }
                };
                let _ = tokio::time::timeout_at(until, on).await;
            }
            Notifications::PubSub(_) => {}
        }
    }

    /// `SSUBSCRIBE` to `lock_key`'s shard channel, an observer's or this authority's own, unless
    /// subscribed (no-op while the cluster connection is down: the subscription task subscribes
    /// every waited-on key again when it is back). Where the server refuses the own channel,
    /// the key's release channel instead, read as before there were own channels.
    async fn subscribe_shard(&self, lock_key: &str, observer: bool) {
        let mut subscribed = self.sharded.subscribed.lock().await;
        let Some(mut con) = self.sharded.connection() else {
            return;
        };
        let release = shard_channel(lock_key, &self.channel);
        let mut channel = if observer || self.own_refused.load(Ordering::Relaxed) {
            release.clone()
        } else {
            shard_channel(lock_key, &self.own)
        };
        loop {
            if subscribed.contains(&channel) {
                return;
            }
            match con.ssubscribe(&channel).await {
                Ok(()) => {
                    subscribed.insert(channel);
                    return;
                }
                Err(error) if is_refusal(&error) && channel != release => {
                    refused_own(&self.own_refused, &self.own, &error);
                    channel = release.clone();
                }
                Err(error) => {
                    tracing::debug!(%error, %channel, "SSUBSCRIBE failed; waiters poll");
                    if is_transient(&error) {
                        // The task subscribes every waited-on key again, on a new connection if
                        // need be.
                        self.sharded.again.notify_one();
                    }
                    return;
                }
            }
        }
    }
}

/// The server refused this authority's own channel: warned once per authority, and from now
/// on waiters read the release channel instead.
fn refused_own(own_refused: &AtomicBool, own: &str, error: &RedisError) {
    if !own_refused.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            %error,
            channel = %own,
            "Redis refused this authority's own channel (an ACL user without rights on it?): \
             its waiters read every announcement on the release channel instead; grant the \
             channel pattern `&<channel>*` so that a process reads only its own hand-offs"
        );
    }
}

/// An authority's own channel: `<channel>:<waiter id>`, where the releases that name it in a
/// key's waiter queue tell it (see [`crate::scripts::RELEASE`]).
fn own_channel(channel: &str, me: &str) -> String {
    format!("{channel}:{me}")
}

/// The lock key of a shard channel, an observer's (`<lock key>:<channel>`) or this authority's
/// own (`<lock key>:<own>`).
fn key_of<'a>(name: &'a str, channel: &str, own: &str) -> Option<&'a str> {
    lock_key_of(name, own).or_else(|| lock_key_of(name, channel))
}

/// The channels of one server's subscription, and whether the release channel is wanted.
struct Channels {
    release: String,
    own: String,
    observe: watch::Receiver<bool>,
    observing: Arc<watch::Sender<bool>>,
    own_refused: Arc<AtomicBool>,
}

/// How often a cluster subscription drops the shard channels nobody waits on any more.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// The cluster subscription: opens the cluster connection (RESP3, pushes dispatched to the
/// waiters), subscribes the waited-on keys' shard channels again whenever a node's connection
/// dropped or a node gave up a channel's slot, drops channels nobody waits on, and opens the
/// connection again after a failure, until aborted. Every (re)subscription wakes the waiters
/// concerned, since announcements may have been missed meanwhile.
async fn run_sharded(
    target: ClusterTarget,
    (channel, own, own_refused): (String, String, Arc<AtomicBool>),
    timeout: Duration,
    waiters: Arc<Waiters>,
    state: Arc<watch::Sender<State>>,
    sharded: Arc<Sharded>,
) {
    let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));
    loop {
        let sender = {
            let (waiters, sharded, channel, own, own_refused) = (
                waiters.clone(),
                sharded.clone(),
                channel.clone(),
                own.clone(),
                own_refused.clone(),
            );
            move |info: PushInfo| -> Result<(), ()> {
                match info.kind {
                    // A node's connection dropped: what it would have delivered is lost, and
                    // its slots may be served elsewhere soon.
                    PushKind::Disconnection => {
                        waiters.wake_all();
                        sharded.again.notify_one();
                    }
                    PushKind::SMessage => {
                        if let Some(msg) = Msg::from_push_info(info) {
                            let name = msg.get_channel_name();
                            if let Ok(payload) = std::str::from_utf8(msg.get_payload_bytes()) {
                                if lock_key_of(name, &own).is_some()
                                    || (lock_key_of(name, &channel).is_some()
                                        && own_refused.load(Ordering::Relaxed))
                                {
                                    waiters.announced(payload);
                                } else if lock_key_of(name, &channel).is_some() {
                                    waiters.observed(payload);
                                }
                            }
                        }
                    }
                    // (Re)subscribed: anything announced before was missed by this waiter.
                    // Unsubscribed by the server (its slot moved): subscribe again where the
                    // slot is now.
                    PushKind::SSubscribe | PushKind::SUnsubscribe => {
                        let name = info.data.first().and_then(|v| match v {
                            Value::BulkString(b) => std::str::from_utf8(b).ok(),
                            Value::SimpleString(s) => Some(s.as_str()),
                            _ => None,
                        });
                        if let Some(lock_key) = name.and_then(|n| key_of(n, &channel, &own)) {
                            waiters.wake(lock_key);
                            if info.kind == PushKind::SUnsubscribe && waiters.waited_on(lock_key) {
                                sharded.again.notify_one();
                            }
                        }
                    }
                    _ => {}
                }
                Ok(())
            }
        };
        let opened = match target.client(ProtocolVersion::RESP3, timeout, Some(sender)) {
            Ok(client) => tokio::time::timeout(timeout, client.get_async_connection())
                .await
                .map_err(|_| None)
                .and_then(|r| r.map_err(Some)),
            Err(e) => Err(Some(e)),
        };
        match opened {
            Ok(con) => {
                *sharded.con.lock().unwrap_or_else(|e| e.into_inner()) = Some(con);
                // Channels subscribed on an earlier connection are subscribed again here.
                sharded.again.notify_one();
                state.send_replace(State::Ready);
                backoff.reset();
                loop {
                    tokio::select! {
                        _ = sharded.again.notified() => {
                            let names = (channel.as_str(), own.as_str());
                            let done =
                                resubscribe(&sharded, names, &own_refused, &waiters, timeout).await;
                            waiters.wake_all();
                            if !done {
                                // Perhaps a primary died and its slots moved: a new connection
                                // reads the slot map afresh.
                                sharded.again.notify_one();
                                break;
                            }
                        }
                        _ = tokio::time::sleep(SWEEP_EVERY) => {
                            sweep(&sharded, (&channel, &own), &waiters, timeout).await;
                        }
                    }
                }
                *sharded.con.lock().unwrap_or_else(|e| e.into_inner()) = None;
                tracing::debug!("the cluster subscription failed; waiters poll");
            }
            Err(error) => {
                let error = error.map_or_else(|| "timed out".to_string(), |e| e.to_string());
                tracing::debug!(%error, "cannot open the cluster subscription; waiters poll");
            }
        }
        state.send_replace(State::Down);
        waiters.wake_all();
        tokio::time::sleep(backoff.next_delay()).await;
    }
}

/// Subscribes again every channel in the set, this authority's own shard channel of every key
/// someone waits on (the key's release shard channel where the server refuses the own one),
/// and the release shard channel of every key an observer waits on (the cluster client sends
/// each to the primary that owns its slot now), one by one, all within `timeout`. A channel
/// stays in the set only once subscribed. `false` if that failed below the protocol or timed out
/// (perhaps a primary died and its slots moved); a server's refusal (an ACL without channel
/// rights, a server without sharded pub/sub) is logged and skipped: those waiters poll, and
/// asking again would not help.
async fn resubscribe(
    sharded: &Sharded,
    (channel, own): (&str, &str),
    own_refused: &AtomicBool,
    waiters: &Waiters,
    timeout: Duration,
) -> bool {
    let mut subscribed = sharded.subscribed.lock().await;
    let mut wanted: Vec<String> = subscribed.drain().collect();
    for lock_key in waiters.waited_keys() {
        wanted.push(shard_channel(&lock_key, own));
    }
    let observed: Vec<String> = sharded
        .observed
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .cloned()
        .collect();
    for lock_key in observed {
        wanted.push(shard_channel(&lock_key, channel));
    }
    let Some(mut con) = sharded.connection() else {
        // Nothing was subscribed on this connection: the next resubscription tries them all.
        subscribed.extend(wanted);
        return false;
    };
    let all = async {
        while let Some(mut name) = wanted.pop() {
            if let Some(lock_key) = lock_key_of(&name, own) {
                if own_refused.load(Ordering::Relaxed) {
                    name = shard_channel(lock_key, channel);
                }
            }
            if subscribed.contains(&name) {
                continue;
            }
            match con.ssubscribe(&name).await {
                Ok(()) => {
                    subscribed.insert(name);
                }
                Err(error) if is_refusal(&error) => match lock_key_of(&name, own) {
                    // Refused its own channel: the key's release channel instead.
                    Some(lock_key) => {
                        refused_own(own_refused, own, &error);
                        wanted.push(shard_channel(lock_key, channel));
                    }
                    None => tracing::debug!(%error, %name, "SSUBSCRIBE refused; waiters poll"),
                },
                Err(error) if is_transient(&error) => {
                    wanted.push(name);
                    return Err(error);
                }
                Err(error) => tracing::debug!(%error, %name, "SSUBSCRIBE failed; waiters poll"),
            }
        }
        Ok::<_, RedisError>(())
    };
    let done = matches!(tokio::time::timeout(timeout, all).await, Ok(Ok(())));
    // What was not subscribed is tried again with the next resubscription.
    subscribed.extend(wanted);
    done
}

/// Whether the server refused a subscription for want of rights (`NOPERM`), which asking again
/// would not change, as against a connection that failed.
fn is_refusal(error: &RedisError) -> bool {
    matches!(
        error.kind(),
        redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm)
    ) || error.code() == Some("NOPERM")
}

/// Unsubscribes the channels nobody waits on any more.
async fn sweep(
    sharded: &Sharded,
    (channel, own): (&str, &str),
    waiters: &Waiters,
    timeout: Duration,
) {
    let mut subscribed = sharded.subscribed.lock().await;
    sharded
        .observed
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|k| waiters.waited_on(k));
    let idle: Vec<String> = subscribed
        .iter()
        .filter(|c| key_of(c, channel, own).is_none_or(|k| !waiters.waited_on(k)))
        .cloned()
        .collect();
    if idle.is_empty() {
        return;
    }
    let Some(mut con) = sharded.connection() else {
        return;
    };
    for name in idle {
        // Forgotten whatever the answer: a later waiter subscribes again, which is harmless.
        subscribed.remove(&name);
        let _ = tokio::time::timeout(timeout, con.sunsubscribe(&name)).await;
    }
}

/// Resolves once Sentinel names a primary other than `ours` (`true`), or never (one address,
/// or an authority that is gone: then it stays pending, and the other branches decide).
async fn moved_away(
    primary: &mut Option<tokio::sync::watch::Receiver<Option<NodeAddr>>>,
    ours: &Option<NodeAddr>,
) -> bool {
    let Some(primary) = primary else {
        return std::future::pending().await;
    };
    let moved = primary
        .wait_for(|now| now.is_some() && now != ours)
        .await
        .is_ok();
    if !moved {
        std::future::pending::<()>().await;
    }
    moved
}

/// Subscribes, dispatches, checks the connection, and subscribes again after a failure, until
/// aborted.
async fn run(
    source: Source,
    channels: Channels,
    timeout: Duration,
    waiters: Arc<Waiters>,
    state: Arc<watch::Sender<State>>,
) {
    let Channels {
        release,
        own,
        mut observe,
        observing,
        own_refused,
    } = channels;
    let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));
    loop {
        let gone = Arc::new(Notify::new());
        let sender = {
            let (waiters, gone, release, own, own_refused) = (
                waiters.clone(),
                gone.clone(),
                release.clone(),
                own.clone(),
                own_refused.clone(),
            );
            move |info: PushInfo| -> Result<(), ()> {
                if info.kind == PushKind::Disconnection {
                    gone.notify_one();
                } else if let Some(msg) = Msg::from_push_info(info) {
                    let name = msg.get_channel_name();
                    if let Ok(payload) = std::str::from_utf8(msg.get_payload_bytes()) {
                        // Where the own channel is refused, the release channel is read as before
                        // there were own channels: its announcements name their waiter.
                        if name == own || (name == release && own_refused.load(Ordering::Relaxed)) {
                            waiters.announced(payload);
                        } else if name == release {
                            waiters.observed(payload);
                        }
                    }
                }
                Ok(())
            }
        };
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(None)
            .set_push_sender(sender);
        let wanted = *observe.borrow_and_update();
        let subscribed = tokio::time::timeout(timeout, async {
            let (addr, mut con) = source.open(config).await?;
            match con.subscribe(&own).await {
                Ok(()) => own_refused.store(false, Ordering::Relaxed),
                Err(error) if is_refusal(&error) => refused_own(&own_refused, &own, &error),
                Err(error) => return Err(error),
            }
            let with_release = wanted || own_refused.load(Ordering::Relaxed);
            if with_release {
                con.subscribe(&release).await?;
            }
            Ok::<_, RedisError>((addr, con, with_release))
        })
        .await;
        match subscribed {
            Ok(Ok((addr, mut con, with_release))) => {
                observing.send_replace(with_release);
                state.send_replace(State::Ready);
                // Anything released before the subscription took effect was missed.
                waiters.wake_all();
                backoff.reset();
                let mut primary = source.watch();
                loop {
                    let observer_came = tokio::select! {
                        _ = gone.notified() => break,
                        _ = tokio::time::sleep(HEALTH_CHECK_EVERY) => false,
                        moved = moved_away(&mut primary, &addr) => if moved { break } else { false },
                        _ = first_observer(&mut observe), if !*observing.borrow() => true,
                    };
                    if observer_came {
                        let sub = con.subscribe(&release);
                        if !matches!(tokio::time::timeout(timeout, sub).await, Ok(Ok(()))) {
                            break;
                        }
                        observing.send_replace(true);
                        // What the release channel carried before is lost to the observers.
                        waiters.wake_observers();
                        continue;
                    }
                    let cmd = redis::cmd("PING");
                    let ping = cmd.query_async::<Value>(&mut con);
                    if !matches!(tokio::time::timeout(timeout, ping).await, Ok(Ok(_))) {
                        break;
                    }
                }
                tracing::debug!(channel = %own, "the subscription connection failed; waiters poll");
            }
            Ok(Err(error)) => {
                tracing::debug!(%error, channel = %own, "SUBSCRIBE failed; waiters poll");
            }
            Err(_) => {
                tracing::debug!(channel = %own, "SUBSCRIBE timed out; waiters poll");
            }
        }
        observing.send_replace(false);
        state.send_replace(State::Down);
        waiters.wake_all();
        tokio::time::sleep(backoff.next_delay()).await;
    }
}

/// Resolves when the release channel is wanted (the first observer came); never if the
/// authority is gone.
async fn first_observer(observe: &mut watch::Receiver<bool>) {
    if observe.wait_for(|wanted| *wanted).await.is_err() {
        std::future::pending::<()>().await;
    }
}
