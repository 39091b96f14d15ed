//! One watch stream per session for every key it holds.
//!
//! A held key is watched so that its deletion behind our back (an operator's `etcdctl del`, a
//! revoke, the session's lease gone) is pushed to the holder at once: etcd's `Session.Done()`,
//! for every grant. A watch stream of its own per key costs the client about 19 KB (an HTTP/2
//! stream, its buffers, a request channel, a task), which made a held lease cost six times what
//! it costs on the other backends. etcd multiplexes watches on one stream, each with an id the
//! client chooses, so every held key of a session shares one stream and costs a map entry.
//!
//! Each watch starts just after the key's creation and passes only deletions, so a deletion
//! that happened before the watch opened, or while the stream was broken, is replayed when it
//! opens again. A watch etcd cancels (its start revision compacted away) falls back to reading
//! the key, and watches again from that read. Our own deletes (release, the session withdrawing
//! an unrenewed grant) change the booking first, so they are never taken for a loss.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Client, EventType, WatchFilterType, WatchOptions, WatchRequestSender, WatchResponse,
    WatchResponseStream,
};
use leasehold_core::backend::Backoff;
use leasehold_core::time::saturating_add;
use leasehold_core::{LossSignal, LostReason};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::contenders::Withdrawal;
use crate::errors;
use crate::session::{lease_gone, Session};

/// A held key to watch, from `from` on.
#[derive(Debug)]
pub(crate) struct HeldWatch {
    pub held: Withdrawal,
    pub loss: LossSignal,
    /// The revision to watch from: just after the key's creation, or after a read of it.
    from: i64,
}

impl HeldWatch {
    /// `None` for a grant whose key's creation revision is not known (nothing to watch from).
    pub fn new(held: Withdrawal, loss: LossSignal) -> Option<HeldWatch> {
        let from = held.revision?.saturating_add(1);
        Some(HeldWatch { held, loss, from })
    }

    fn revision(&self) -> i64 {
        self.held.revision.unwrap_or_default()
    }

    /// Whether the watch is still wanted: the grant is booked as held and not lost.
    fn wanted(&self, session: &Session) -> bool {
        self.loss.fired().is_none() && session.contenders.is_held(&self.held.name, self.revision())
    }
}

/// The sending half the session's task hands held keys to; the stream's task starts with it.
#[derive(Debug)]
pub(crate) struct HeldWatchStream {
    add: mpsc::UnboundedSender<HeldWatch>,
}

impl HeldWatchStream {
    /// Starts the stream's task for `session`; it ends with the session.
    pub fn start(client: Arc<Client>, session: Arc<Session>, timeout: Duration) -> Self {
        let (add, added) = mpsc::unbounded_channel();
        let task = StreamTask {
            client,
            session,
            timeout,
            add: add.clone(),
            watching: HashMap::new(),
            unopened: Vec::new(),
            next_id: 1,
        };
        tokio::spawn(task.run(added));
        HeldWatchStream { add }
    }

    /// Watches `watch`'s key on the session's stream.
    pub fn watch(&self, watch: HeldWatch) {
        // The task is gone only once the session ended, and every grant on it is lost then.
        let _ = self.add.send(watch);
    }
}

/// What woke the stream's task.
enum Woke {
    Added(HeldWatch),
    Message(Result<Option<WatchResponse>, etcd_client::Error>),
    Timer,
}

/// The stream: its two halves, once open.
type Open = (WatchRequestSender, WatchResponseStream);

struct StreamTask {
    client: Arc<Client>,
    session: Arc<Session>,
    timeout: Duration,
    /// For the reads that fall back from a cancelled watch, to hand their key back.
    add: mpsc::UnboundedSender<HeldWatch>,
    /// The watches open on the stream, by the id we gave each.
    watching: HashMap<i64, HeldWatch>,
    /// The watches to open (new, or from a stream that broke).
    unopened: Vec<HeldWatch>,
    next_id: i64,
}

impl StreamTask {
    async fn run(mut self, mut added: mpsc::UnboundedReceiver<HeldWatch>) {
        let mut liveness = self.session.subscribe();
        let mut stream: Option<Open> = None;
        let mut pause = Backoff::new(Duration::from_millis(20), Duration::from_secs(1));
        let mut reopen_at = Instant::now();
        // Watches whose grant was released or lost are cancelled now and then, not one by one
        // (a release's deletion usually cancels its watch first).
        let sweep_every = (self.session.ttl() / 3).max(Duration::from_millis(100));
        let mut sweep_at = saturating_add(Instant::now(), sweep_every);
        loop {
            if stream.is_none() && !self.unopened.is_empty() && Instant::now() >= reopen_at {
                stream = self.open().await;
                if stream.is_none() {
                    reopen_at = saturating_add(Instant::now(), pause.next_delay());
                }
            }
            if let Some((sender, _)) = stream.as_mut() {
                if !self.create_unopened(sender).await {
                    stream = self.broken(stream.take());
                    reopen_at = saturating_add(Instant::now(), pause.next_delay());
                    continue;
                }
            }
            let retry_at = (stream.is_none() && !self.unopened.is_empty()).then_some(reopen_at);
            let wake_at = retry_at.map_or(sweep_at, |at| at.min(sweep_at));
            let woke = tokio::select! {
                biased;
                // The session's end fires every grant's loss signal.
                _ = liveness.wait_for(|l| l.ended) => return,
                watch = added.recv() => match watch {
                    Some(watch) => Woke::Added(watch),
                    None => return,
                },
                message = next(&mut stream) => Woke::Message(message),
                _ = tokio::time::sleep_until(wake_at) => Woke::Timer,
            };
            match woke {
                Woke::Added(watch) => self.unopened.push(watch),
                Woke::Message(Ok(Some(response))) => {
                    pause.reset();
                    self.answered(response, &mut stream).await;
                }
                Woke::Message(Ok(None) | Err(_)) => {
                    stream = self.broken(stream.take());
                    reopen_at = saturating_add(Instant::now(), pause.next_delay());
                }
                Woke::Timer => {
                    if Instant::now() >= sweep_at {
                        self.sweep(&mut stream).await;
                        sweep_at = saturating_add(Instant::now(), sweep_every);
                    }
                }
            }
        }
    }

    /// Opens the stream with the first unopened watch; `None` when etcd did not answer.
    async fn open(&mut self) -> Option<Open> {
        self.unopened.retain(|w| w.wanted(&self.session));
        let first = self.unopened.pop()?;
        let id = self.next_id;
        let options = options(&first, id);
        let opened = errors::call("watch held keys", self.timeout, || {
            let (mut watch, key, options) = (
                self.client.watch_client(),
                first.held.name.clone(),
                options.clone(),
            );
            async move { watch.watch(key, Some(options)).await }
        })
        .await;
        match opened {
            Ok(stream) => {
                self.next_id = id.saturating_add(1);
                self.watching.insert(id, first);
                Some(stream.split())
            }
            Err(error) => {
                tracing::debug!(%error, "opening the held keys' watch stream failed; will retry");
                self.unopened.push(first);
                None
            }
        }
    }

    /// Sends a create request for each unopened watch still wanted; false when the stream
    /// would not take one in time (it is broken).
    async fn create_unopened(&mut self, sender: &mut WatchRequestSender) -> bool {
        while let Some(watch) = self.unopened.pop() {
            if !watch.wanted(&self.session) {
                continue;
            }
            let id = self.next_id;
            self.next_id = id.saturating_add(1);
            let create = sender.watch(watch.held.name.clone(), Some(options(&watch, id)));
            let sent = matches!(tokio::time::timeout(self.timeout, create).await, Ok(Ok(())));
            if !sent {
                self.unopened.push(watch);
                return false;
            }
            self.watching.insert(id, watch);
        }
        true
    }

    /// The stream broke: every watch on it is opened again on the next stream, from where it
    /// started, so a deletion meanwhile is replayed.
    fn broken(&mut self, _stream: Option<Open>) -> Option<Open> {
        self.unopened.extend(self.watching.drain().map(|(_, w)| w));
        None
    }

    async fn answered(&mut self, response: WatchResponse, stream: &mut Option<Open>) {
        let id = response.watch_id();
        let deleted = response
            .events()
            .iter()
            .any(|e| e.event_type() == EventType::Delete);
        if deleted {
            if let Some(watch) = self.watching.remove(&id) {
                cancel(stream, id).await;
                if watch.wanted(&self.session) {
                    tokio::spawn(lost_behind_our_back(
                        self.client.clone(),
                        self.session.clone(),
                        watch,
                        self.timeout,
                    ));
                }
            }
        } else if response.canceled() {
            // Its start revision was compacted away (or etcd refused it): read the key.
            if let Some(watch) = self.watching.remove(&id) {
                if watch.wanted(&self.session) {
                    tokio::spawn(read_instead(
                        self.client.clone(),
                        self.session.clone(),
                        watch,
                        self.timeout,
                        self.add.clone(),
                    ));
                }
            }
        }
    }

    /// Cancels the watches no longer wanted.
    async fn sweep(&mut self, stream: &mut Option<Open>) {
        let session = &self.session;
        let unwanted: Vec<i64> = self
            .watching
            .iter()
            .filter(|(_, w)| !w.wanted(session))
            .map(|(id, _)| *id)
            .collect();
        for id in unwanted {
            self.watching.remove(&id);
            cancel(stream, id).await;
        }
        self.unopened.retain(|w| w.wanted(session));
    }
}

/// The next message of the stream; never, while it is not open.
async fn next(stream: &mut Option<Open>) -> Result<Option<WatchResponse>, etcd_client::Error> {
    match stream {
        Some((_, responses)) => responses.message().await,
        None => std::future::pending().await,
    }
}

/// Cancels watch `id` on the server, best effort: a stream that does not take the request
/// promptly is broken, and a broken stream's watches end with it.
async fn cancel(stream: &mut Option<Open>, id: i64) {
    if let Some((sender, _)) = stream.as_mut() {
        let _ = tokio::time::timeout(Duration::from_millis(100), sender.cancel(id)).await;
    }
}

/// The create request of `watch` with the id `id`: deletions only, from its start revision.
fn options(watch: &HeldWatch, id: i64) -> WatchOptions {
    WatchOptions::new()
        .with_start_revision(watch.from)
        .with_filters([WatchFilterType::NoPut])
        .with_watch_id(id)
}

/// A held key was deleted while the session still books it as held: deleted behind our back.
/// If the session's lease is gone, the whole session ended (every grant on it is lost);
/// otherwise this grant alone was taken away (`etcdctl del`, a revoke).
async fn lost_behind_our_back(
    client: Arc<Client>,
    session: Arc<Session>,
    watch: HeldWatch,
    timeout: Duration,
) {
    if lease_gone(&client, session.lease(), timeout).await {
        // Fires every held key's signal, this one's included.
        session.end();
    } else {
        watch.loss.fire(LostReason::Refused);
    }
    session
        .contenders
        .forget(&watch.held.name, watch.held.owner);
}

/// Reads a held key whose watch etcd cancelled: gone (or created again by someone else) is a
/// loss; there is watched again from the read's revision on.
async fn read_instead(
    client: Arc<Client>,
    session: Arc<Session>,
    mut watch: HeldWatch,
    timeout: Duration,
    add: mpsc::UnboundedSender<HeldWatch>,
) {
    let read = errors::read_with_retry("look at a held key", timeout, || {
        let (mut kv, name) = (client.kv_client(), watch.held.name.clone());
        async move { kv.get(name, None).await }
    })
    .await;
    let Ok(found) = read else {
        // Unanswered: watch again from where it started; the renewals go on meanwhile.
        let _ = add.send(watch);
        return;
    };
    let revision = watch.revision();
    let gone = found
        .kvs()
        .first()
        .is_none_or(|kv| kv.create_revision() != revision);
    if !gone {
        watch.from = found
            .header()
            .map_or(watch.from, |h| h.revision().saturating_add(1));
        let _ = add.send(watch);
    } else if watch.wanted(&session) {
        lost_behind_our_back(client, session, watch, timeout).await;
    }
}
