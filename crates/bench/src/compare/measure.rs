//! The four measurements on one backend, each of leasehold and of the peer recipe, against
//! the same server started for this backend.

use std::sync::Arc;
use std::time::Duration;

use rand::seq::SliceRandom;
use rand::SeedableRng;

use super::exclusion;
use super::locker::{self, Locker, Setting, Side};
use super::report::{Measure, Row};
use super::worker::{self, Mode, Worker, WorkerArgs};
use super::{sides, CompareOptions};
use crate::stats::Samples;
use crate::{harness, BoxError, Instant, ORDER_SEED};

/// A side with its two connections: the pair and the hand-off's holder use the first, the
/// hand-off's waiter the second.
type Connected = (Side, Arc<dyn Locker>, Arc<dyn Locker>);

/// The short TTL both sides get in the matched loss-detection run.
pub const LOSS_TTL: Duration = Duration::from_secs(2);

/// Every measurement on `backend`, on a server started for it.
pub async fn backend(backend: &str, o: &CompareOptions) -> Result<Vec<Row>, BoxError> {
    let started = harness::start(backend)?;
    let url = started.url.clone();
    println!("started a {backend} server for this run: {url}");
    if backend == "postgres" {
        leasehold::postgres::PostgresAuthority::connect(&url)
            .await?
            .migrate()
            .await?;
    }
    let run = format!("cmp-{}", std::process::id());
    let mut rows = Vec::new();
    let work = Setting { ttl: None };
    // Two connections (sessions, clients) per side: the pair and the hand-off's holder use
    // the first, the hand-off's waiter the second.
    let mut lockers = Vec::new();
    for side in [Side::Leasehold, Side::Peer] {
        lockers.push((
            side,
            locker::connect(backend, side, &url, work).await?,
            locker::connect(backend, side, &url, work).await?,
        ));
    }
    let iterations = if o.quick { 300 } else { 2000 };
    rows.extend(pairs(backend, &lockers, &run, iterations).await?);
    for (side, holder, waiter) in &lockers {
        let (rounds, budget) = if o.quick {
            (60, Duration::from_secs(4))
        } else {
            (300, Duration::from_secs(15))
        };
        let key = format!("{run}/handoff-{}", side.as_str());
        let samples = handoff(holder.clone(), waiter.clone(), &key, rounds, budget, o.park).await?;
        let mut row = Row::new(
            backend,
            Measure::Handoff,
            side.as_str(),
            locker::side_name(backend, *side),
        );
        row.setting = format!(
            "holder and waiter on two connections of one process, waiter parked {:?}",
            o.park
        );
        row.p50_us = Some(micros(samples.p50()));
        row.p99_us = Some(micros(samples.p99()));
        row.samples = samples.len() as u64;
        println!(
            "hand-off {:<36} p50 {:>9.1?} p99 {:>9.1?} ({} rounds)",
            row.contestant,
            samples.p50(),
            samples.p99(),
            row.samples
        );
        rows.push(row);
    }
    drop(lockers);
    let grid = o.grid();
    let mut round = 0;
    for &keys in &grid.keys {
        for &workers in &grid.workers {
            for side in sides(round) {
                let prefix = format!("{run}/tp-{}-{workers}-{keys}", side.as_str());
                let row =
                    throughput(backend, side, &url, workers, keys, grid.window, &prefix).await?;
                println!(
                    "throughput {:<34} {workers:>2} procs x {keys:>3} keys: {:>8.0}/s proven \
                     (busiest worker {:.0} %, {} holds, {} overlaps, {} fences out of order, {} errors{})",
                    row.contestant,
                    row.per_second.unwrap_or(0.0),
                    row.busiest_share.unwrap_or(f64::NAN),
                    row.samples,
                    row.overlaps,
                    row.fence_disorder,
                    row.errors,
                    if row.note.is_empty() {
                        String::new()
                    } else {
                        format!(": {}", row.note)
                    }
                );
                rows.push(row);
            }
            round += 1;
        }
    }
    let reps = if o.quick { 1 } else { 3 };
    for (side, setting, label) in loss_settings(backend) {
        let prefix = format!("{run}/loss-{}-{}", side.as_str(), rows.len());
        let samples = loss(backend, side, &url, setting, &prefix, reps).await?;
        let mut row = Row::new(
            backend,
            Measure::Loss,
            side.as_str(),
            locker::side_name(backend, side),
        );
        row.setting = label;
        row.p50_us = Some(micros(samples.p50()));
        row.p99_us = Some(micros(samples.percentile(1.0)));
        row.samples = samples.len() as u64;
        println!(
            "loss detection {:<30} {:<40} median {:>9.1?} max {:>9.1?}",
            row.contestant,
            row.setting,
            samples.p50(),
            samples.percentile(1.0)
        );
        rows.push(row);
    }
    drop(started);
    Ok(rows)
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Each side's settings for the loss-detection run, with the label the table shows: leasehold
/// with the short TTL, the peer at the same TTL where it has one, and at its own default.
fn loss_settings(backend: &str) -> Vec<(Side, Setting, String)> {
    let matched = Setting {
        ttl: Some(LOSS_TTL),
    };
    let ttl_label = format!("TTL {} s", LOSS_TTL.as_secs());
    let mut settings = vec![(Side::Leasehold, matched, ttl_label.clone())];
    match backend {
        "redis" => settings.push((Side::Peer, matched, ttl_label)),
        "zookeeper" => {
            settings.push((Side::Peer, matched, ttl_label));
            settings.push((
                Side::Peer,
                Setting { ttl: None },
                "peer default (zookeeper-client's 6 s session)".into(),
            ));
        }
        "etcd" => {
            settings.push((Side::Peer, matched, ttl_label));
            settings.push((
                Side::Peer,
                Setting { ttl: None },
                "peer default (etcdctl lock's 10 s lease)".into(),
            ));
        }
        // Advisory locks have no TTL: they end with the holder's connection, which the
        // kernel closes when the process dies.
        _ => settings.push((Side::Peer, Setting { ttl: None }, ttl_label)),
    }
    settings
}

/// The uncontended pair of both sides in a shuffled order per round, each timed pair right
/// after an untimed one of the same side, as the bench's `pair` measurement times them.
async fn pairs(
    backend: &str,
    lockers: &[Connected],
    run: &str,
    iterations: usize,
) -> Result<Vec<Row>, BoxError> {
    let warmup = iterations / 10 + 1;
    let mut samples: Vec<Samples> = lockers.iter().map(|_| Samples::default()).collect();
    let mut order: Vec<usize> = (0..lockers.len()).collect();
    let mut shuffle = rand::rngs::StdRng::seed_from_u64(ORDER_SEED);
    let keys: Vec<String> = lockers
        .iter()
        .map(|(side, _, _)| format!("{run}/pair-{}", side.as_str()))
        .collect();
    for i in 0..warmup + iterations {
        order.shuffle(&mut shuffle);
        for &which in &order {
            let (_, locker, _) = &lockers[which];
            locker.pair(&keys[which]).await?;
            let t = Instant::now();
            locker.pair(&keys[which]).await?;
            if i >= warmup {
                samples[which].push(t.elapsed());
            }
        }
    }
    let mut rows = Vec::new();
    for ((side, _, _), samples) in lockers.iter().zip(samples) {
        let mut row = Row::new(
            backend,
            Measure::Pair,
            side.as_str(),
            locker::side_name(backend, *side),
        );
        row.setting = "one connection, warm, shuffled order".into();
        row.p50_us = Some(micros(samples.p50()));
        row.p99_us = Some(micros(samples.p99()));
        row.samples = samples.len() as u64;
        println!(
            "pair {:<44} p50 {:>9.1?} p99 {:>9.1?}",
            row.contestant,
            samples.p50(),
            samples.p99()
        );
        rows.push(row);
    }
    Ok(rows)
}

/// Release -> the waiter holds: the holder and the waiter on two connections (sessions,
/// clients) of this process, the waiter parked in its side's own way of waiting for `park`
/// before the release. Stops after `rounds` or `budget`, whichever comes first (a side that
/// waits by polling takes its poll interval per round).
async fn handoff(
    holder: Arc<dyn Locker>,
    waiter: Arc<dyn Locker>,
    key: &str,
    rounds: usize,
    budget: Duration,
    park: Duration,
) -> Result<Samples, BoxError> {
    let mut samples = Samples::default();
    let until = Instant::now() + budget;
    for _ in 0..rounds {
        if Instant::now() >= until && samples.len() >= 10 {
            break;
        }
        let held = holder.acquire(key, Duration::from_secs(5)).await?;
        let task = {
            let (waiter, key) = (waiter.clone(), key.to_string());
            tokio::spawn(async move {
                let held = waiter.acquire(&key, Duration::from_secs(30)).await;
                (held, Instant::now())
            })
        };
        tokio::time::sleep(park).await;
        let released_at = Instant::now();
        holder.release(held).await?;
        let (got, got_at) = task.await?;
        samples.push(got_at - released_at);
        waiter.release(got?).await?;
    }
    Ok(samples)
}

/// `workers` worker processes churn over `keys` keys for `window`; the acquisitions the
/// exclusion check proves, per second.
async fn throughput(
    backend: &str,
    side: Side,
    url: &str,
    workers: u32,
    keys: u32,
    window: Duration,
    prefix: &str,
) -> Result<Row, BoxError> {
    let args = WorkerArgs {
        mode: Mode::Churn,
        backend: backend.to_string(),
        side,
        url: url.to_string(),
        ttl: None,
        keys,
        prefix: prefix.to_string(),
    };
    let mut started = Vec::new();
    for _ in 0..workers {
        started.push(Worker::spawn(&args)?);
    }
    for w in &mut started {
        w.await_line("ready", Duration::from_secs(120)).await?;
    }
    // Every worker has connected: the window opens for all at once, a moment from now.
    let start = worker::monotonic_ns().saturating_add(200_000_000);
    let end = start.saturating_add(u64::try_from(window.as_nanos()).unwrap_or(u64::MAX));
    for w in &mut started {
        w.go(start, end).await?;
    }
    let reports: Vec<_> = started
        .into_iter()
        .map(|w| tokio::spawn(w.report()))
        .collect();
    let (mut holds, mut errors, mut first_error) = (Vec::new(), 0, String::new());
    let mut busiest = 0;
    for r in reports {
        let (h, e, first) = r.await??;
        let in_window = h
            .iter()
            .filter(|h| (start..end).contains(&h.acquired))
            .count();
        busiest = busiest.max(in_window);
        holds.extend(h);
        errors += e;
        if first_error.is_empty() {
            first_error = first;
        }
    }
    let total = holds.len() as u64;
    let in_window = holds
        .iter()
        .filter(|h| (start..end).contains(&h.acquired))
        .count();
    let verdict = exclusion::check(&mut holds, start, end);
    let mut row = Row::new(
        backend,
        Measure::Throughput,
        side.as_str(),
        locker::side_name(backend, side),
    );
    row.setting = format!(
        "{workers} worker processes, {keys} keys, {} s window",
        window.as_secs()
    );
    row.workers = Some(workers);
    row.keys = Some(keys);
    row.per_second = Some(verdict.proven as f64 / window.as_secs_f64());
    row.busiest_share = (in_window > 0).then(|| 100.0 * busiest as f64 / in_window as f64);
    row.samples = total;
    row.overlaps = verdict.overlaps;
    row.fence_disorder = verdict.fence_disorder;
    row.errors = errors;
    row.note = first_error;
    Ok(row)
}

/// A worker process holds a key with `setting`; this process waits for the key; the worker is
/// killed (SIGKILL); measured from the kill until the waiter holds, `reps` times.
async fn loss(
    backend: &str,
    side: Side,
    url: &str,
    setting: Setting,
    prefix: &str,
    reps: usize,
) -> Result<Samples, BoxError> {
    let waiter = locker::connect(backend, side, url, setting).await?;
    let mut samples = Samples::default();
    for rep in 0..reps {
        let args = WorkerArgs {
            mode: Mode::Hold,
            backend: backend.to_string(),
            side,
            url: url.to_string(),
            ttl: setting.ttl,
            keys: 1,
            prefix: format!("{prefix}-{rep}"),
        };
        let mut holder = Worker::spawn(&args)?;
        holder.await_line("held", Duration::from_secs(120)).await?;
        let task = {
            let (waiter, key) = (waiter.clone(), args.key(0));
            tokio::spawn(async move {
                let held = waiter.acquire(&key, Duration::from_secs(120)).await;
                (held, Instant::now())
            })
        };
        // The waiter has reached its wait (a held key found, a watch set, a request parked).
        tokio::time::sleep(Duration::from_millis(300)).await;
        let killed_at = Instant::now();
        holder.child.start_kill()?;
        let (got, got_at) = task.await?;
        samples.push(got_at - killed_at);
        waiter.release(got?).await?;
        holder.child.wait().await?;
    }
    Ok(samples)
}
