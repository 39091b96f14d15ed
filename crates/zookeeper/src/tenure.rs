//! The keeper of tenures: one task per authority that deletes the node of a grant nobody renewed
//! within its TTL (see [`crate::held`]).
//!
//! One task with a heap of deadlines, rather than a task per grant: a grant is a push onto the
//! heap, which wakes the task only if the new deadline is the earliest (with one TTL per session,
//! it never is), and a release touches nothing but the grant's own flag. So the acquire and
//! release paths pay no task spawn, wake-up or cancellation.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;
use std::fmt;
use std::sync::{Arc, Mutex};

use leasehold_core::Instant;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::cleanup;
use crate::held::{Due, Held};

/// A strong reference: a grant dropped without release must still have its node deleted when
/// its tenure runs out (a released one is dropped from the heap when its time comes).
struct Entry {
    at: Instant,
    held: Arc<Held>,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.at == other.at
    }
}

impl Eq for Entry {}

impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Entry {
    fn cmp(&self, other: &Self) -> Ordering {
        self.at.cmp(&other.at)
    }
}

#[derive(Default)]
struct Shared {
    heap: Mutex<BinaryHeap<Reverse<Entry>>>,
    earlier: Notify,
}

/// The tenures of one authority's grants.
#[derive(Default)]
pub(crate) struct Tenures {
    shared: Arc<Shared>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl fmt::Debug for Tenures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pending = self.shared.heap.lock().map(|h| h.len()).unwrap_or(0);
        f.debug_struct("Tenures")
            .field("pending", &pending)
            .finish()
    }
}

impl Drop for Tenures {
    fn drop(&mut self) {
        if let Some(task) = self.task.get_mut().ok().and_then(Option::take) {
            task.abort();
        }
    }
}

impl Tenures {
    /// Watches `held`'s tenure, whose first deadline is `at`.
    pub fn watch(&self, held: &Arc<Held>, at: Instant) {
        {
            let mut task = self.task.lock().unwrap_or_else(|e| e.into_inner());
            if task.as_ref().is_none_or(|t| t.is_finished()) {
                *task = Some(tokio::spawn(keep(self.shared.clone())));
            }
        }
        let earliest = {
            let mut heap = self.shared.heap.lock().unwrap_or_else(|e| e.into_inner());
            let earliest = heap.peek().is_none_or(|Reverse(e)| at < e.at);
            heap.push(Reverse(Entry {
                at,
                held: held.clone(),
            }));
            earliest
        };
        if earliest {
            self.shared.earlier.notify_one();
        }
    }
}

/// Sleeps until the earliest tenure's deadline, then deals with every tenure that is due.
async fn keep(shared: Arc<Shared>) {
    loop {
        let next = {
            let heap = shared.heap.lock().unwrap_or_else(|e| e.into_inner());
            heap.peek().map(|Reverse(e)| e.at)
        };
        match next {
            None => shared.earlier.notified().await,
            Some(at) => {
                tokio::select! {
                    _ = tokio::time::sleep_until(at) => {}
                    _ = shared.earlier.notified() => continue,
                }
            }
        }
        let now = Instant::now();
        let due: Vec<Arc<Held>> = {
            let mut heap = shared.heap.lock().unwrap_or_else(|e| e.into_inner());
            let mut due = Vec::new();
            while heap.peek().is_some_and(|Reverse(e)| e.at <= now) {
                if let Some(Reverse(entry)) = heap.pop() {
                    due.push(entry.held);
                }
            }
            due
        };
        for held in due {
            match held.due(now) {
                Due::Ended => {}
                Due::Later(at) => {
                    let mut heap = shared.heap.lock().unwrap_or_else(|e| e.into_inner());
                    heap.push(Reverse(Entry { at, held }));
                }
                Due::Expired => {
                    tracing::debug!(path = %held.path, "lease not renewed within its TTL; deleting its node");
                    if let Some(session) = held.session.upgrade() {
                        cleanup::spawn_delete(session, held.config.clone(), held.path.clone());
                    }
                }
            }
        }
    }
}
