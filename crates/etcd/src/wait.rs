//! Waiting for the lock: watch only the key just ahead, then look again. And waiting for any
//! change of a lock ([`changed`]), for observers of an election and waiters of a semaphore.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use etcd_client::{
    Client, EventType, GetOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse,
    WatchFilterType, WatchOptions,
};
use leasehold_core::backend::Backoff;
use leasehold_core::Result;
use tokio::time::Instant;

use crate::authority::{delete_orphan, is_orphan};
use crate::errors;
use crate::session::Session;

/// How a wait ended.
#[derive(Debug)]
pub(crate) enum Turn {
    /// No key is ahead of ours: we hold the lock, as read by the request sent at `checked`.
    Mine { checked: Instant },
    /// Our own key is gone (the session ended, or an operator deleted it).
    Lost,
    /// `give_up` came first.
    TimedOut,
}

/// Waits until contender `name`, created at `revision` under `prefix`, is the oldest key there.
///
/// Each round is one read transaction: our own key (still there, same revision?) and the key
/// just ahead of ours (the highest create revision below ours). Then only that key's deletion is
/// watched, from the revision of the read on, so nothing in between is missed and a release
/// wakes exactly one waiter (no herd). The session's end wakes the wait too: a waiter whose
/// lease is gone must not keep waiting for a turn it can no longer take (etcd #19597). A read
/// the cluster does not answer (an election under way) is sent again until `give_up`, as long
/// as the session lives: the waiter keeps its place in the queue. If the last look before
/// `give_up` failed, its error is returned, not [`Turn::TimedOut`].
pub(crate) async fn for_turn(
    client: &Client,
    session: &Session,
    prefix: &str,
    name: &str,
    revision: i64,
    give_up: Instant,
    timeout: Duration,
) -> Result<Turn> {
    let mut liveness = session.subscribe();
    let mut pause = Backoff::new(Duration::from_millis(5), Duration::from_millis(200));
    // Why the last look failed, while it did: a wait that ends without a successful look says
    // nobody knows who holds the key (`Unavailable`), not that someone does (`Timeout`).
    let mut unanswered = None;
    loop {
        if Instant::now() >= give_up {
            return unanswered.map_or(Ok(Turn::TimedOut), Err);
        }
        let checked = Instant::now();
        let ahead = GetOptions::new()
            .with_prefix()
            .with_max_create_revision(revision - 1)
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_limit(1);
        let read = Txn::new().and_then([TxnOp::get(name, None), TxnOp::get(prefix, Some(ahead))]);
        // A read changes nothing, so it is sent again while the cluster is unavailable: a
        // release wakes us just as the leader may die ("leader changed", a reset connection),
        // and our key keeps its place in the queue on the session's kept-alive lease, so
        // giving up here would lose that place for nothing (etcd's Go Mutex retries too).
        let response = match errors::read_with_retry("look for the key ahead", timeout, || {
            let (mut kv, read) = (client.kv_client(), read.clone());
            async move { kv.txn(read).await }
        })
        .await
        {
            Ok(response) => {
                unanswered = None;
                response
            }
            Err(error) if error.is_retryable() => {
                tracing::debug!(%error, "looking for the key ahead failed; looking again");
                unanswered = Some(error);
                tokio::select! {
                    biased;
                    _ = liveness.wait_for(|l| l.ended) => return Ok(Turn::Lost),
                    () = tokio::time::sleep(
                        pause
                            .next_delay()
                            .min(give_up.saturating_duration_since(Instant::now())),
                    ) => {}
                }
                continue;
            }
            Err(error) => return Err(error),
        };
        let read_at = response.header().map_or(0, |h| h.revision());
        let mut own_there = false;
        let mut predecessor = None;
        for (i, op) in response.op_responses().into_iter().enumerate() {
            if let TxnOpResponse::Get(get) = op {
                let first = get.kvs().first();
                if i == 0 {
                    own_there = first.is_some_and(|kv| kv.create_revision() == revision);
                } else {
                    predecessor = first.cloned();
                }
            }
        }
        if !own_there {
            return Ok(Turn::Lost);
        }
        let Some(ahead) = predecessor else {
            return Ok(Turn::Mine { checked });
        };
        // A key of our own lease that the session does not know is an orphan of an earlier
        // request that got no answer: nobody will ever delete it but us.
        if is_orphan(session, &ahead) {
            delete_orphan(client, &ahead, timeout).await?;
            continue;
        }
        let ahead_key = ahead.key().to_vec();
        let deleted = tokio::select! {
            biased;
            _ = liveness.wait_for(|l| l.ended) => return Ok(Turn::Lost),
            _ = tokio::time::sleep_until(give_up) => return Ok(Turn::TimedOut),
            d = deleted(client, ahead_key, read_at + 1, timeout) => d,
        };
        match deleted {
            Ok(true) => pause.reset(),
            // The watch ended without the delete (a broken stream, a compaction, a server
            // restart): look again after a short, growing pause so a broken watch cannot spin.
            Ok(false) => {
                tokio::time::sleep(
                    pause
                        .next_delay()
                        .min(give_up.saturating_duration_since(Instant::now())),
                )
                .await
            }
            Err(error) => {
                tracing::debug!(%error, "watching the key ahead failed; looking again");
                tokio::time::sleep(
                    pause
                        .next_delay()
                        .min(give_up.saturating_duration_since(Instant::now())),
                )
                .await;
            }
        }
    }
}

/// Watches `key` from `from_revision` until it is deleted (`true`) or the watch ends (`false`).
async fn deleted(
    client: &Client,
    key: Vec<u8>,
    from_revision: i64,
    timeout: Duration,
) -> Result<bool> {
    let options = WatchOptions::new()
        .with_start_revision(from_revision)
        .with_filters([WatchFilterType::NoPut]);
    let mut stream = errors::call("watch a contender key", timeout, || {
        let (mut watch, key, options) = (client.watch_client(), key.clone(), options.clone());
        async move { watch.watch(key, Some(options)).await }
    })
    .await?;
    loop {
        match stream.message().await {
            Ok(Some(response)) => {
                if response
                    .events()
                    .iter()
                    .any(|e| e.event_type() == EventType::Delete)
                {
                    return Ok(true);
                }
                if response.canceled() {
                    return Ok(false);
                }
            }
            Ok(None) => return Ok(false),
            Err(e) if errors::is_compacted(&e) => return Ok(false),
            Err(e) => return Err(errors::map(e, "watch the key ahead")),
        }
    }
}

/// How many lock prefixes [`Seen`] remembers before it starts afresh.
const SEEN_CAPACITY: usize = 1024;

/// The revision at which this client last read each lock prefix (an inspect, a try that found
/// the lock held) or last saw it change (a wait that woke).
///
/// [`changed`] watches from just after it, so a change that lands between a caller's read and
/// its wait is replayed instead of missed: an election observer reads the leader, then waits,
/// and a proclaim sent a moment after the leader was elected must wake it, not wait out its
/// timer. A hint, like the wait itself: with several readers of one key on one client the
/// newest read wins, which at worst misses what the contract allows (a change before the
/// call); beyond [`SEEN_CAPACITY`] prefixes the map starts afresh, and a wait then watches from
/// the current revision.
#[derive(Debug, Default)]
pub(crate) struct Seen {
    by_prefix: Mutex<HashMap<String, i64>>,
}

impl Seen {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, i64>> {
        // Every critical section leaves the map consistent, so a poisoned lock is still usable.
        self.by_prefix.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `prefix` was read (or seen to change) at `revision`.
    pub fn record(&self, prefix: &str, revision: i64) {
        if revision <= 0 {
            return;
        }
        let mut map = self.map();
        if let Some(seen) = map.get_mut(prefix) {
            *seen = (*seen).max(revision);
            return;
        }
        if map.len() >= SEEN_CAPACITY {
            map.clear();
        }
        map.insert(prefix.to_string(), revision);
    }

    /// The revision `prefix` was last seen at, if remembered.
    pub fn get(&self, prefix: &str) -> Option<i64> {
        self.map().get(prefix).copied()
    }

    /// Forgets `prefix` (its revision was compacted away: watch from now on).
    pub fn forget(&self, prefix: &str) {
        self.map().remove(prefix);
    }
}

/// How a watch for any change under a prefix ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Change {
    /// A put or a delete under the prefix, the newest at this revision.
    At(i64),
    /// The revision to start from was compacted away: something may have changed.
    Compacted,
    /// The watch ended without an event (a broken stream, a server stopping, a member that
    /// lost its leader, a watch etcd refused): something may have changed.
    Ended,
}

/// Watches every key under `prefix`, from `after + 1` (or from now), until any put or delete
/// there: a release, a grant, a waiter queueing or leaving, a proclaimed value, a lease running
/// out. One watch stream, opened within `timeout` (failing to open it is the error); dropping
/// the future drops the stream, which cancels the watch at the server.
pub(crate) async fn changed(
    client: &Client,
    prefix: &str,
    after: Option<i64>,
    timeout: Duration,
) -> Result<Change> {
    let mut options = WatchOptions::new().with_prefix();
    if let Some(seen) = after {
        options = options.with_start_revision(seen.saturating_add(1));
    }
    // Opening a watch changes nothing: safe to send again while the cluster elects a leader.
    let mut stream = errors::read_with_retry("watch a lock's keys", timeout, || {
        let (mut watch, prefix, options) =
            (client.watch_client(), prefix.to_string(), options.clone());
        async move { watch.watch(prefix, Some(options)).await }
    })
    .await?;
    loop {
        match stream.message().await {
            Ok(Some(response)) => {
                if !response.events().is_empty() {
                    let newest = response
                        .events()
                        .iter()
                        .filter_map(|e| e.kv().map(|kv| kv.mod_revision()))
                        .max();
                    return Ok(Change::At(newest.unwrap_or(0)));
                }
                if response.compact_revision() > 0 {
                    return Ok(Change::Compacted);
                }
                if response.canceled() {
                    tracing::debug!(
                        reason = response.cancel_reason(),
                        "etcd cancelled the watch on a lock's keys"
                    );
                    return Ok(Change::Ended);
                }
            }
            Ok(None) => return Ok(Change::Ended),
            Err(e) if errors::is_compacted(&e) => return Ok(Change::Compacted),
            // Opened, then broken: the caller reads again, and that read reports an outage.
            Err(error) => {
                tracing::debug!(%error, "watching a lock's keys broke off");
                return Ok(Change::Ended);
            }
        }
    }
}
