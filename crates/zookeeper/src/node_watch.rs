//! The watch a holder keeps on its own node, so that a deletion by anyone else (a revoke, an
//! operator's `delete`) is a loss the moment the server tells this client, not at the next
//! renewal a third of a TTL later.
//!
//! Each grant gets its own [`LossSignal`]: a deleted node ends that grant alone, while the end
//! of its session (expired, closed) ends every grant on it, so the grant's signal also follows
//! the session's. One task per held lease waits on a one-shot `exists` watch of the node and on
//! the session's signal. A deletion that this side made or decided (a release, a tenure run out)
//! ends the tenure before the node is deleted, so the watch finds the tenure over and reports
//! nothing. A disconnection changes nothing: the client sets the watch again when it reconnects,
//! and the server then reports a deletion it missed.

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{LossSignal, LostReason};
use zookeeper_client::{Error as ZkError, EventType};

use crate::errors::is_session_end;
use crate::held::Held;
use crate::session::{self, Session};

/// The first pause before setting the watch again after a failed request; it doubles up to
/// [`LONGEST_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(50);
const LONGEST_PAUSE: Duration = Duration::from_secs(1);

/// The longest a grant waits before its watch is set.
const LONGEST_DELAY: Duration = Duration::from_millis(250);

/// A loss signal for the grant of `held`, fired when its node is deleted by anyone but this
/// side, or when `session` ends.
///
/// The watch is set a twentieth of the grant's `ttl` after the grant (at most 250 ms): most
/// grants on a hot path are released sooner, and then send no request for it. Nothing is
/// missed meanwhile: a node deleted before the watch is set is found missing when it is.
pub(crate) fn watch(held: Arc<Held>, session: &Arc<Session>, ttl: Duration) -> LossSignal {
    let loss = LossSignal::new();
    if session.loss.fired().is_some() {
        loss.fire(LostReason::SessionEnded);
        return loss;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        // No runtime to watch on: the session's signal still ends the grant at once.
        return session.loss.clone();
    };
    let delay = (ttl / 20).min(LONGEST_DELAY);
    runtime.spawn(keep(held, session.loss.clone(), loss.clone(), delay));
    loss
}

/// What one round of watching found.
enum Outcome {
    /// The node is gone and this side did not end the tenure: lost.
    Deleted,
    /// The session ended.
    SessionEnded,
    /// Released or run out here, or the authority is gone: nothing to report.
    Over,
    /// Something else changed (a proclaim wrote the data): watch again.
    Again,
    /// The request failed without an answer: watch again after a pause.
    Failed,
}

async fn keep(held: Arc<Held>, session_loss: LossSignal, loss: LossSignal, delay: Duration) {
    tokio::select! {
        biased;
        _ = session_loss.wait() => {
            loss.fire(LostReason::SessionEnded);
            return;
        }
        () = tokio::time::sleep(delay) => {}
    }
    let mut pause = FIRST_PAUSE;
    loop {
        let outcome = tokio::select! {
            biased;
            _ = session_loss.wait() => Outcome::SessionEnded,
            outcome = once(&held) => outcome,
        };
        match outcome {
            Outcome::Deleted => {
                // Ended here first, so a renewal in flight cannot extend it any more.
                if held.end() {
                    tracing::debug!(path = %held.path, "the holder's node was deleted by someone else");
                    loss.fire(LostReason::Refused);
                }
                return;
            }
            Outcome::SessionEnded => {
                loss.fire(LostReason::SessionEnded);
                return;
            }
            Outcome::Over => return,
            Outcome::Again => pause = FIRST_PAUSE,
            Outcome::Failed => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(LONGEST_PAUSE);
            }
        }
    }
}

/// Sets the watch and waits for its event. The session is held only while the request is in
/// flight, so a grant's watch never keeps its session (and its nodes) alive once the authority
/// is gone: closing the session wakes the watch.
async fn once(held: &Held) -> Outcome {
    if held.has_ended() {
        return Outcome::Over;
    }
    let watcher = {
        let Some(session) = held.session.upgrade() else {
            return Outcome::Over;
        };
        let client = &session.client;
        let set = session::read(&held.config, "watch the held node", || {
            client.check_and_watch_stat(&held.path)
        })
        .await;
        match set {
            Ok(Ok((Some(stat), watcher))) if stat.czxid == held.czxid.get() => watcher,
            Ok(Ok(_)) => return gone(held),
            Ok(Err(e)) if is_session_end(&e) => return Outcome::SessionEnded,
            Ok(Err(ZkError::NoNode)) => return gone(held),
            Ok(Err(e)) => {
                tracing::debug!(path = %held.path, error = %e, "could not watch the held node");
                return Outcome::Failed;
            }
            Err(e) => {
                tracing::debug!(path = %held.path, error = %e, "could not watch the held node");
                return Outcome::Failed;
            }
        }
    };
    let event = watcher.changed().await;
    match event.event_type {
        EventType::NodeDeleted => gone(held),
        EventType::Session if event.session_state.is_terminated() => Outcome::SessionEnded,
        _ => Outcome::Again,
    }
}

/// The node is missing: a loss, unless this side ended the tenure before deleting it.
fn gone(held: &Held) -> Outcome {
    if held.has_ended() {
        Outcome::Over
    } else {
        Outcome::Deleted
    }
}
