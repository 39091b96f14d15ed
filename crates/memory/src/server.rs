//! The in-memory "server": leases, a durable fence counter, and fault switches.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Duration;

use leasehold_core::{ClientOptions, Error, Instant, LockKey, OwnerToken, Result};
use tokio::sync::{watch, Notify};

use crate::authority::MemoryAuthority;

pub(crate) const BACKEND: &str = "memory";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Status {
    Up,
    Paused,
    Down,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Entry {
    pub owner: OwnerToken,
    pub fence: u64,
    pub expires_at: Instant,
}

#[derive(Debug, Default)]
pub(crate) struct State {
    pub leases: HashMap<LockKey, Entry>,
    /// The last fence handed out. Durable: survives [`MemoryServer::restart`].
    pub last_fence: u64,
    /// Proclaimed values by key, with the fence of the grant that proclaimed each: shown only
    /// while that grant holds the key.
    pub values: HashMap<LockKey, (u64, Vec<u8>)>,
    waiters: HashMap<LockKey, Arc<Notify>>,
}

impl State {
    /// The live lease on `key` at `now`, if any (an expired entry counts as free).
    pub fn live(&self, key: &LockKey, now: Instant) -> Option<&Entry> {
        self.leases.get(key).filter(|e| e.expires_at > now)
    }

    pub fn grant(&mut self, key: &LockKey, owner: OwnerToken, ttl: Duration, now: Instant) -> u64 {
        self.last_fence += 1;
        self.values.remove(key);
        self.changed(key);
        self.leases.insert(
            key.clone(),
            Entry {
                owner,
                fence: self.last_fence,
                expires_at: now + ttl,
            },
        );
        self.last_fence
    }

    /// Removes the lease on `key` and wakes its waiters.
    pub fn remove(&mut self, key: &LockKey) -> Option<Entry> {
        let entry = self.leases.remove(key);
        self.values.remove(key);
        self.changed(key);
        entry
    }

    /// Wakes whoever waits for `key` to change.
    pub fn changed(&self, key: &LockKey) {
        if let Some(n) = self.waiters.get(key) {
            n.notify_waiters();
        }
    }

    fn waiter(&mut self, key: &LockKey) -> Arc<Notify> {
        // Drop notifiers nobody waits on any more, so the map does not grow with every key.
        self.waiters.retain(|_, n| Arc::strong_count(n) > 1);
        self.waiters.entry(key.clone()).or_default().clone()
    }
}

#[derive(Debug)]
struct Inner {
    state: Mutex<State>,
    status: watch::Sender<Status>,
    /// How long each reply takes back to its client (a slow network), zero normally.
    reply_delay: watch::Sender<Duration>,
}

/// An in-process lock "server" holding leases and a fence counter.
///
/// Clones share the same server.
#[derive(Clone, Debug)]
pub struct MemoryServer {
    inner: Arc<Inner>,
}

impl Default for MemoryServer {
    fn default() -> Self {
        Self::new()
    }
}

fn registry() -> &'static Mutex<HashMap<String, Weak<Inner>>> {
    static REGISTRY: OnceLock<Mutex<HashMap<String, Weak<Inner>>>> = OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

impl MemoryServer {
    /// A fresh server with no leases.
    pub fn new() -> Self {
        let (status, _) = watch::channel(Status::Up);
        let (reply_delay, _) = watch::channel(Duration::ZERO);
        MemoryServer {
            inner: Arc::new(Inner {
                state: Mutex::new(State::default()),
                status,
                reply_delay,
            }),
        }
    }

    /// The process-wide server called `name`, created on first use and kept while any client of
    /// it lives. This is what `memory://name` URLs share.
    pub fn named(name: &str) -> Self {
        let mut map = registry().lock().unwrap_or_else(|e| e.into_inner());
        map.retain(|_, w| w.strong_count() > 0);
        if let Some(inner) = map.get(name).and_then(Weak::upgrade) {
            return MemoryServer { inner };
        }
        let server = MemoryServer::new();
        map.insert(name.to_string(), Arc::downgrade(&server.inner));
        server
    }

    /// A client of this server.
    pub fn authority(&self, options: ClientOptions) -> MemoryAuthority {
        MemoryAuthority::new(self.clone(), options)
    }

    /// Holds every reply back by `delay` after the server acted on its request, as a slow
    /// network does: a client that counts its deadline from the reply instead of from its
    /// request overstates it by `delay`. `Duration::ZERO` restores normal replies.
    pub fn slow_replies(&self, delay: Duration) {
        self.inner.reply_delay.send_replace(delay);
    }

    /// Makes requests hang until [`MemoryServer::resume`], as if the server process were
    /// stopped. Time keeps running: leases still expire.
    pub fn pause(&self) {
        self.inner.status.send_replace(Status::Paused);
    }

    /// Ends a [`MemoryServer::pause`] or a [`MemoryServer::kill`].
    pub fn resume(&self) {
        self.inner.status.send_replace(Status::Up);
    }

    /// Makes every request fail with [`Error::Unavailable`] until [`MemoryServer::resume`].
    pub fn kill(&self) {
        self.inner.status.send_replace(Status::Down);
    }

    /// A crash and restart: leases (volatile) are gone, the fence counter (durable) is kept.
    pub fn restart(&self) {
        let mut state = self.lock();
        let keys: Vec<LockKey> = state.leases.keys().cloned().collect();
        for key in keys {
            state.remove(&key);
        }
        drop(state);
        self.resume();
    }

    /// Deletes the lease on `key` whoever holds it, as an operator would. Returns whether there
    /// was one. The holder's next renewal is refused.
    pub fn revoke(&self, key: &LockKey) -> bool {
        self.lock().remove(key).is_some()
    }

    /// The current holder's owner token and raw fence, if the key is held.
    pub fn holder(&self, key: &LockKey) -> Option<(OwnerToken, u64)> {
        self.lock()
            .live(key, Instant::now())
            .map(|e| (e.owner, e.fence))
    }

    /// Operations that break the guarantees on purpose, for the conformance suite's mutants.
    /// Never use them to coordinate anything.
    pub fn unchecked(&self) -> Unchecked {
        Unchecked {
            server: self.clone(),
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        // Every update under this lock is completed before anything can panic, so a poisoned
        // lock still holds a consistent state.
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn waiter(&self, key: &LockKey) -> Arc<Notify> {
        self.lock().waiter(key)
    }

    /// Runs `op` on the state as one atomic request, honouring pause and kill like a real server
    /// would: a paused server makes the caller wait up to its request timeout.
    pub(crate) async fn request<T>(
        &self,
        options: &ClientOptions,
        operation: &'static str,
        op: impl FnOnce(&mut State, Instant) -> T,
    ) -> Result<T> {
        let mut status = self.inner.status.subscribe();
        let ready = tokio::time::timeout(
            options.request_timeout,
            status.wait_for(|s| *s != Status::Paused),
        )
        .await
        .map(|woke| woke.map(|_| ()));
        let answer = match ready {
            Err(_) => Err(Error::request_timeout(
                BACKEND,
                operation,
                options.request_timeout,
            )),
            Ok(Err(_)) | Ok(Ok(_)) if *self.inner.status.borrow() == Status::Down => {
                Err(Error::Unavailable {
                    backend: BACKEND,
                    message: format!("{operation}: the server is down"),
                    source: None,
                })
            }
            Ok(_) => Ok(op(&mut self.lock(), Instant::now())),
        };
        // A slow network: the server has acted, the reply is still on its way.
        let delay = *self.inner.reply_delay.borrow();
        if answer.is_ok() && !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        answer
    }
}

/// A copy of a [`MemoryServer`]'s state, as an asynchronous replica would hold it.
#[derive(Debug, Clone)]
pub struct Snapshot {
    leases: HashMap<LockKey, Entry>,
    last_fence: u64,
}

/// Guarantee-breaking operations on a [`MemoryServer`], for mutants only.
#[derive(Debug, Clone)]
pub struct Unchecked {
    server: MemoryServer,
}

impl Unchecked {
    /// Deletes the lease on `key` without comparing anything.
    pub fn remove(&self, key: &LockKey) -> bool {
        self.server.lock().remove(key).is_some()
    }

    /// Grants `key` to `owner` even if someone holds it; returns the raw fence.
    pub fn grant(&self, key: &LockKey, owner: OwnerToken, ttl: Duration) -> u64 {
        self.server.lock().grant(key, owner, ttl, Instant::now())
    }

    /// The state now, as a replica that stops replicating now would keep it.
    pub fn snapshot(&self) -> Snapshot {
        let state = self.server.lock();
        Snapshot {
            leases: state.leases.clone(),
            last_fence: state.last_fence,
        }
    }

    /// Replaces the state with `snapshot`: a failover to that replica, losing every write made
    /// since, the fence counter's included.
    pub fn restore(&self, snapshot: Snapshot) {
        let mut state = self.server.lock();
        let keys: Vec<LockKey> = state.leases.keys().cloned().collect();
        state.leases = snapshot.leases;
        state.last_fence = snapshot.last_fence;
        for key in keys {
            if let Some(n) = state.waiters.get(&key) {
                n.notify_waiters();
            }
        }
    }

    /// Extends whatever lease `key` has (or resurrects the expired one) without comparing the
    /// owner. Returns whether there was an entry.
    pub fn extend(&self, key: &LockKey, ttl: Duration) -> bool {
        let mut state = self.server.lock();
        match state.leases.get_mut(key) {
            Some(e) => {
                e.expires_at = Instant::now() + ttl;
                true
            }
            None => false,
        }
    }
}
