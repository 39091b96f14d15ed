//! Waiting for the lock: watch only the key just ahead, then look again.

use std::time::Duration;

use etcd_client::{
    Client, EventType, GetOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse,
    WatchFilterType, WatchOptions,
};
use leasehold_core::{Backoff, Result};
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
/// lease is gone must not keep waiting for a turn it can no longer take (etcd #19597).
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
    loop {
        if Instant::now() >= give_up {
            return Ok(Turn::TimedOut);
        }
        let checked = Instant::now();
        let ahead = GetOptions::new()
            .with_prefix()
            .with_max_create_revision(revision - 1)
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_limit(1);
        let read = Txn::new().and_then([TxnOp::get(name, None), TxnOp::get(prefix, Some(ahead))]);
        let mut kv = client.kv_client();
        let response = errors::bounded("look for the key ahead", timeout, kv.txn(read)).await?;
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
    let mut watch = client.watch_client();
    let mut stream = errors::bounded(
        "watch the key ahead",
        timeout,
        watch.watch(key, Some(options)),
    )
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
