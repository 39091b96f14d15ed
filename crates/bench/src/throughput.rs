//! Many keys, many tasks: acquire + release throughput through leasehold against the raw fenced
//! pair driven the same way (the same tasks, keys and runtime).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use leasehold::{Authority, Instant, LockKey};

use crate::{BoxError, RawPair, Subject, TTL};

/// What one side did in the window.
#[derive(Debug, Default)]
struct Tally {
    done: AtomicU64,
    busy: AtomicU64,
    errors: AtomicU64,
}

impl Tally {
    fn per_second(&self, window: Duration) -> f64 {
        self.done.load(Ordering::Relaxed) as f64 / window.as_secs_f64()
    }
}

/// Task `t` walks the keys `t, t + tasks, t + 2 tasks, ...`, so tasks rarely meet on a key (a
/// meeting is counted as busy, not as work).
fn key_index(task: usize, round: usize, tasks: usize, keys: usize) -> usize {
    (task + round * tasks) % keys
}

/// How one pair ended.
enum Ended {
    Done,
    Busy,
    Failed,
}

/// `tasks` tasks run `one` on their keys until `window` has passed, counting how each pair
/// ended: the same driver for leasehold and for the raw pair.
async fn drive<K, F, Fut>(
    keys: Arc<Vec<K>>,
    tasks: usize,
    window: Duration,
    one: F,
) -> Result<Tally, BoxError>
where
    K: Send + Sync + 'static,
    F: Fn(Arc<Vec<K>>, usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Ended> + Send,
{
    let tally = Arc::new(Tally::default());
    let until = Instant::now() + window;
    let mut handles = Vec::new();
    for task in 0..tasks {
        let (keys, tally, one) = (keys.clone(), tally.clone(), one.clone());
        handles.push(tokio::spawn(async move {
            let mut round = 0;
            while Instant::now() < until {
                let at = key_index(task, round, tasks, keys.len());
                round += 1;
                let counter = match one(keys.clone(), at).await {
                    Ended::Done => &tally.done,
                    Ended::Busy => &tally.busy,
                    Ended::Failed => &tally.errors,
                };
                counter.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for h in handles {
        h.await?;
    }
    Ok(Arc::try_unwrap(tally).unwrap_or_default())
}

async fn ours(
    authority: Arc<dyn Authority>,
    keys: Arc<Vec<LockKey>>,
    tasks: usize,
    window: Duration,
) -> Result<Tally, BoxError> {
    drive(keys, tasks, window, move |keys, at| {
        let authority = authority.clone();
        async move {
            match authority.try_acquire(&keys[at], TTL).await {
                Ok(Some(grant)) => match authority.release(&grant).await {
                    Ok(_) => Ended::Done,
                    Err(_) => Ended::Failed,
                },
                Ok(None) => Ended::Busy,
                Err(_) => Ended::Failed,
            }
        }
    })
    .await
}

async fn raw(
    pair: Arc<dyn RawPair>,
    keys: Arc<Vec<String>>,
    tasks: usize,
    window: Duration,
) -> Result<Tally, BoxError> {
    drive(keys, tasks, window, move |keys, at| {
        let pair = pair.clone();
        async move {
            match pair.pair(&keys[at]).await {
                Ok(()) => Ended::Done,
                Err(e) if e.to_string().contains("held") => Ended::Busy,
                Err(_) => Ended::Failed,
            }
        }
    })
    .await
}

/// Runs both sides one after the other, twice in alternating order, and prints the better of
/// each side's two windows.
pub async fn run(
    subject: &Subject,
    keys: usize,
    tasks: usize,
    window: Duration,
) -> Result<(), BoxError> {
    let pid = std::process::id();
    let ours_keys: Arc<Vec<LockKey>> = Arc::new(
        (0..keys)
            .map(|k| LockKey::new(format!("bench-tp/{pid}/{k}")))
            .collect::<Result<_, _>>()?,
    );
    let raw_keys: Arc<Vec<String>> = Arc::new(
        (0..keys)
            .map(|k| format!("bench-tp-raw/{pid}/{k}"))
            .collect(),
    );
    let mut best_ours: Option<Tally> = None;
    let mut best_raw: Option<Tally> = None;
    for round in 0..2 {
        let ours_first = round == 0;
        for side in 0..2 {
            if (side == 0) == ours_first {
                let t = ours(subject.authority.clone(), ours_keys.clone(), tasks, window).await?;
                if best_ours
                    .as_ref()
                    .is_none_or(|b| t.per_second(window) > b.per_second(window))
                {
                    best_ours = Some(t);
                }
            } else if let Some(pair) = &subject.concurrent_raw {
                let t = raw(pair.clone(), raw_keys.clone(), tasks, window).await?;
                if best_raw
                    .as_ref()
                    .is_none_or(|b| t.per_second(window) > b.per_second(window))
                {
                    best_raw = Some(t);
                }
            }
        }
    }
    let line = |name: &str, t: &Tally| {
        format!(
            "{name} {:>9.0} pairs/s (busy {}, errors {})",
            t.per_second(window),
            t.busy.load(Ordering::Relaxed),
            t.errors.load(Ordering::Relaxed)
        )
    };
    let ours = best_ours.unwrap_or_default();
    match (&best_raw, &subject.concurrent_raw) {
        (Some(raw), Some(pair)) => {
            let ratio = raw.per_second(window) / ours.per_second(window).max(f64::MIN_POSITIVE);
            println!(
                "throughput, {keys} keys x {tasks} tasks, {window:?}: {} | {} | raw/ours {ratio:.2}x",
                line("leasehold", &ours),
                line(pair.name(), raw),
            );
        }
        _ => println!(
            "throughput, {keys} keys x {tasks} tasks, {window:?}: {}",
            line("leasehold", &ours)
        ),
    }
    Ok(())
}
