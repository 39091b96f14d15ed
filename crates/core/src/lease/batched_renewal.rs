//! Batched renewal: the leases held through one authority renew together, one request per
//! renewal tick instead of one per lease, where the backend can renew a batch in one request
//! ([`Capabilities::batch_renewal`](crate::Capabilities)).
//!
//! Each lease still decides for itself when it must renew and what a refusal or a silence
//! means (see `lease.rs`); only the request is shared. When a lease's renewal falls due it
//! opens a batch, which is sent a moment later ([`LINGER`]); every other lease whose renewal
//! falls due within its own *window* (half its renewal interval) joins it early. Renewing early
//! is always safe (the deadline only moves later), and leases that renewed together fall due
//! together: after a tick or two, leases acquired over a spread of time renew as one batch.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use futures_util::FutureExt;
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use crate::contract::authority::Authority;
use crate::contract::error::{Error, Result};
use crate::contract::grant::Grant;
use crate::time::saturating_add;

/// How long an opened batch waits for others to join before it is sent: short against any
/// TTL, long against the wake-ups of the leases that join it.
pub(crate) const LINGER: Duration = Duration::from_millis(2);

/// The most grants one request carries.
pub(crate) const MAX_BATCH: usize = 10_000;

struct Pending {
    grant: Grant,
    reply: oneshot::Sender<Result<Instant>>,
}

#[derive(Default)]
struct Queue {
    pending: Vec<Pending>,
    /// A batch is open (its sender task runs).
    open: bool,
}

/// The batcher of one authority.
pub(crate) struct Renewals {
    authority: Arc<dyn Authority>,
    queue: Mutex<Queue>,
    /// When the open batch will be sent (`None`: no batch open). Leases waiting for their own
    /// renewal time watch it to join early.
    sending_at: watch::Sender<Option<Instant>>,
}

impl std::fmt::Debug for Renewals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Renewals").finish_non_exhaustive()
    }
}

fn registry() -> &'static Mutex<HashMap<usize, Weak<Renewals>>> {
    static REGISTRY: OnceLock<Mutex<HashMap<usize, Weak<Renewals>>>> = OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Every update under these locks completes before anything can panic.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Renewals {
    /// The batcher shared by every lease on `authority` (this very client), or `None` when the
    /// backend renews one grant per request anyway.
    pub(crate) fn of(authority: &Arc<dyn Authority>) -> Option<Arc<Renewals>> {
        if !authority.capabilities().batch_renewal {
            return None;
        }
        // Keyed by the client's address: a batcher holds its client, so the address cannot be
        // reused by another client while the batcher lives.
        let id = Arc::as_ptr(authority) as *const () as usize;
        let mut map = lock(registry());
        if let Some(found) = map.get(&id).and_then(Weak::upgrade) {
            return Some(found);
        }
        map.retain(|_, w| w.strong_count() > 0);
        let (sending_at, _) = watch::channel(None);
        let renewals = Arc::new(Renewals {
            authority: authority.clone(),
            queue: Mutex::new(Queue::default()),
            sending_at,
        });
        map.insert(id, Arc::downgrade(&renewals));
        Some(renewals)
    }

    /// Sleeps until `due`, or until a batch is sent no earlier than `window` before `due`
    /// (then the caller renews now and joins it).
    pub(crate) async fn sleep_until(&self, due: Instant, window: Duration) {
        let mut sending = self.sending_at.subscribe();
        loop {
            let joins = sending
                .borrow_and_update()
                .is_some_and(|at| due.saturating_duration_since(at) <= window);
            if joins {
                return;
            }
            tokio::select! {
                () = tokio::time::sleep_until(due) => return,
                changed = sending.changed() => {
                    if changed.is_err() {
                        tokio::time::sleep_until(due).await;
                        return;
                    }
                }
            }
        }
    }

    /// Renews `grant` in the next batch.
    pub(crate) async fn renew(self: &Arc<Self>, grant: &Grant) -> Result<Instant> {
        let (reply, answer) = oneshot::channel();
        let opened = {
            let mut queue = lock(&self.queue);
            queue.pending.push(Pending {
                grant: grant.clone(),
                reply,
            });
            if queue.open {
                None
            } else {
                queue.open = true;
                let at = saturating_add(Instant::now(), LINGER);
                // Published under the queue's lock, as the closing batch publishes `None`: the
                // two cannot overtake each other, so leases waiting to join see this batch.
                self.sending_at.send_replace(Some(at));
                Some((at, Closed::new(self.clone())))
            }
        };
        if let Some((at, closed)) = opened {
            tokio::spawn(self.clone().send_at(at, closed));
        }
        answer.await.unwrap_or_else(|_| {
            Err(Error::Backend {
                backend: self.authority.capabilities().backend,
                message: "the renewal batch ended without an answer".into(),
                retryable: true,
                source: None,
            })
        })
    }

    /// The batch's task: waits [`LINGER`] for others to join, then sends everything queued, in
    /// requests of at most [`MAX_BATCH`] grants, until nothing is left.
    ///
    /// `closed` reopens the queue however the task ends, even if it is dropped unpolled (a
    /// runtime shutting down), so the next renewal can open a batch again.
    async fn send_at(self: Arc<Self>, at: Instant, mut closed: Closed) {
        tokio::time::sleep_until(at).await;
        loop {
            let batch: Vec<Pending> = {
                let mut queue = lock(&self.queue);
                // A lease that stopped waiting (lost, released, dropped) renews nothing.
                queue.pending.retain(|p| !p.reply.is_closed());
                let take = queue.pending.len().min(MAX_BATCH);
                if take == 0 {
                    // Closed under the lock a renewal queues under: a renewal queued after
                    // this finds no batch open and opens one, none queued before is left.
                    closed.close(&mut queue);
                    return;
                }
                queue.pending.drain(..take).collect()
            };
            let grants: Vec<Grant> = batch.iter().map(|p| p.grant.clone()).collect();
            // A backend that panics renews nothing: every lease of the batch hears so at once
            // and is lost, as a lease whose own renewal task died would be.
            let answered = AssertUnwindSafe(self.authority.renew_many(&grants))
                .catch_unwind()
                .await;
            let mut results = match answered {
                Ok(results) => results.into_iter(),
                Err(_) => {
                    let panicked = Error::Backend {
                        backend: self.authority.capabilities().backend,
                        message: "the backend panicked while renewing".into(),
                        retryable: false,
                        source: None,
                    };
                    vec![Err(panicked); grants.len()].into_iter()
                }
            };
            for pending in batch {
                let result = results.next().unwrap_or_else(|| {
                    Err(Error::Backend {
                        backend: self.authority.capabilities().backend,
                        message: "renew_many answered fewer grants than it was given".into(),
                        retryable: false,
                        source: None,
                    })
                });
                // A lease that stopped waiting (released, dropped) no longer needs its answer.
                let _ = pending.reply.send(result);
            }
        }
    }
}

/// Closes the batch when its task ends, however it ends.
struct Closed {
    renewals: Arc<Renewals>,
    done: bool,
}

impl Closed {
    fn new(renewals: Arc<Renewals>) -> Self {
        Closed {
            renewals,
            done: false,
        }
    }

    /// Marks the queue closed; the caller holds its lock.
    fn close(&mut self, queue: &mut Queue) {
        queue.open = false;
        self.renewals.sending_at.send_replace(None);
        self.done = true;
    }
}

impl Drop for Closed {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        // The task ended without sending what is queued (a panic, a runtime shutting down):
        // those leases hear at once that their renewal has no answer, and retry.
        let renewals = self.renewals.clone();
        let mut queue = lock(&renewals.queue);
        queue.pending.clear();
        self.close(&mut queue);
    }
}
