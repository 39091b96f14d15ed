//! Pub/sub: one subscription connection per authority wakes the waiters of a released key.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_core::Backoff;
use redis::{AsyncConnectionConfig, Msg, PushInfo, PushKind, RedisError, Value};
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

use crate::link::Source;
use crate::sentinel::NodeAddr;

/// How often the subscription connection is checked with a `PING`, so a connection whose server
/// vanished without closing it is noticed and replaced (waiters rely on their retries meanwhile).
const HEALTH_CHECK_EVERY: Duration = Duration::from_secs(1);

/// Waiters of this authority, by Redis lock key.
#[derive(Debug, Default)]
pub(crate) struct Waiters {
    by_key: Mutex<HashMap<String, Arc<Notify>>>,
}

impl Waiters {
    /// The notifier for `lock_key`; hold it while waiting.
    pub(crate) fn for_key(&self, lock_key: &str) -> Arc<Notify> {
        let mut map = self.by_key.lock().unwrap_or_else(|e| e.into_inner());
        // Forget keys nobody waits on any more, so the map does not grow with every key.
        map.retain(|_, n| Arc::strong_count(n) > 1);
        map.entry(lock_key.to_string()).or_default().clone()
    }

    pub(crate) fn wake(&self, lock_key: &str) {
        let map = self.by_key.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = map.get(lock_key) {
            n.notify_waiters();
        }
    }

    /// Wakes everyone: while the subscription was down, releases may have been missed.
    fn wake_all(&self) {
        let map = self.by_key.lock().unwrap_or_else(|e| e.into_inner());
        for n in map.values() {
            n.notify_waiters();
        }
    }
}

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
    source: Source,
    channel: String,
    timeout: Duration,
    waiters: Arc<Waiters>,
    state: Arc<watch::Sender<State>>,
    task: Mutex<Option<JoinHandle<()>>>,
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
    pub(crate) fn new(source: Source, channel: String, timeout: Duration) -> Self {
        Subscription {
            source,
            channel,
            timeout,
            waiters: Arc::default(),
            state: Arc::new(watch::channel(State::Starting).0),
            task: Mutex::new(None),
        }
    }

    pub(crate) fn waiters(&self) -> &Waiters {
        &self.waiters
    }

    /// Starts the subscription on first use and waits at most `bound` for its first attempt to
    /// finish, so that the first waiter does not miss a release that happens right away.
    pub(crate) async fn settled(&self, bound: Duration) {
        let mut state = self.state.subscribe();
        {
            let mut task = self.task.lock().unwrap_or_else(|e| e.into_inner());
            if task.as_ref().is_none_or(|t| t.is_finished()) {
                *task = Some(tokio::spawn(run(
                    self.source.clone(),
                    self.channel.clone(),
                    self.timeout,
                    self.waiters.clone(),
                    self.state.clone(),
                )));
            }
        }
        let _ = tokio::time::timeout(bound, state.wait_for(|s| *s != State::Starting)).await;
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
    channel: String,
    timeout: Duration,
    waiters: Arc<Waiters>,
    state: Arc<watch::Sender<State>>,
) {
    let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));
    loop {
        let gone = Arc::new(Notify::new());
        let sender = {
            let (waiters, gone, channel) = (waiters.clone(), gone.clone(), channel.clone());
            move |info: PushInfo| -> Result<(), ()> {
                if info.kind == PushKind::Disconnection {
                    gone.notify_one();
                } else if let Some(msg) = Msg::from_push_info(info) {
                    if msg.get_channel_name() == channel {
                        if let Ok(lock_key) = std::str::from_utf8(msg.get_payload_bytes()) {
                            waiters.wake(lock_key);
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
        let subscribed = tokio::time::timeout(timeout, async {
            let (addr, mut con) = source.open(config).await?;
            con.subscribe(&channel).await?;
            Ok::<_, RedisError>((addr, con))
        })
        .await;
        match subscribed {
            Ok(Ok((addr, mut con))) => {
                state.send_replace(State::Ready);
                // Anything released before the subscription took effect was missed.
                waiters.wake_all();
                backoff.reset();
                let mut primary = source.watch();
                loop {
                    tokio::select! {
                        _ = gone.notified() => break,
                        _ = tokio::time::sleep(HEALTH_CHECK_EVERY) => {}
                        moved = moved_away(&mut primary, &addr) => if moved { break },
                    }
                    let cmd = redis::cmd("PING");
                    let ping = cmd.query_async::<Value>(&mut con);
                    if !matches!(tokio::time::timeout(timeout, ping).await, Ok(Ok(_))) {
                        break;
                    }
                }
                tracing::debug!(%channel, "the subscription connection failed; waiters poll");
            }
            Ok(Err(error)) => {
                tracing::debug!(%error, %channel, "SUBSCRIBE failed; waiters poll");
            }
            Err(_) => {
                tracing::debug!(%channel, "SUBSCRIBE timed out; waiters poll");
            }
        }
        state.send_replace(State::Down);
        waiters.wake_all();
        tokio::time::sleep(backoff.next_delay()).await;
    }
}
