//! `leasehold-bench <backend> [--iterations N]`: measures, in one run on the same server,
//! leasehold's uncontended acquire+release and its hand-off (release -> the next waiter holds),
//! next to the raw protocol pair done with the same client library, and prints p50, p99 and the
//! p50 ratio. Run it in release mode:
//!
//! ```text
//! cargo run --release -p leasehold-bench -- memory
//! cargo run --release -p leasehold-bench -- postgres              # starts its own server
//! cargo run --release -p leasehold-bench -- postgres --url postgres://...
//! ```
//!
//! Targets: acquire+release <= 1.10x the raw pair; hand-off <= 1.5x one raw pair.
//! The numbers are printed, never asserted: timing belongs in benchmarks, not in tests.

mod etcd;
mod harness;
mod memory;
mod postgres;
mod redis;
mod stats;
mod zookeeper;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold::{Authority, Instant, LockKey};
use stats::Samples;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The backend's raw protocol: the cheapest take-and-free pair its client library can do, with
/// none of leasehold's checks (no owner token, no fence, no deadline).
#[async_trait]
pub trait RawPair: Send + Sync + std::fmt::Debug {
    /// What the pair is, for the printed line.
    fn name(&self) -> &'static str;
    /// One take + free on `key`.
    async fn pair(&self, key: &str) -> Result<(), BoxError>;
    /// The p50 ratio leasehold must stay under against this pair: 1.10 against the raw
    /// protocol, 1.0 ("no slower") against another lock library.
    fn target(&self) -> f64 {
        1.10
    }
}

/// A backend under measurement.
#[derive(Debug)]
pub struct Subject {
    pub authority: Arc<dyn Authority>,
    pub raw: Vec<Box<dyn RawPair>>,
    /// Whether the ratio targets apply (they do for every network backend).
    pub targets: bool,
}

const TTL: Duration = Duration::from_secs(10);

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), BoxError> {
    let mut args = std::env::args().skip(1);
    let backend = args.next().unwrap_or_else(|| "memory".into());
    let mut iterations = 2000usize;
    let mut url = None;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--url" => url = Some(args.next().ok_or("--url needs a URL")?),
            "--iterations" => {
                iterations = args
                    .next()
                    .and_then(|n| n.parse().ok())
                    .ok_or("--iterations needs a number")?
            }
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    // Keeps a server the bench started alive until the end of the run.
    let mut _server: Option<Box<dyn std::any::Any>> = None;
    let subject = match backend.as_str() {
        "memory" => memory::subject().await?,
        "postgres" | "redis" | "etcd" | "zookeeper" => {
            let url = match url {
                Some(url) => url,
                None => {
                    let (server, url) = harness::start(&backend)?;
                    println!("started a {backend} server for this run: {url}");
                    _server = Some(server);
                    url
                }
            };
            match backend.as_str() {
                "postgres" => postgres::subject(&url).await?,
                "redis" => redis::subject(&url).await?,
                "etcd" => etcd::subject(&url).await?,
                _ => zookeeper::subject(&url).await?,
            }
        }
        other => {
            return Err(format!(
                "unknown backend {other}; known: memory, postgres, redis, etcd, zookeeper"
            )
            .into())
        }
    };
    println!(
        "leasehold-bench: backend {backend}, {iterations} iterations per measurement{}",
        if cfg!(debug_assertions) {
            " (DEBUG BUILD: use --release for real figures)"
        } else {
            ""
        }
    );
    if !subject.targets {
        println!(
            "(no targets: the in-memory raw pair has no round trip to amortise leasehold's work)"
        );
    }
    run(&subject, iterations).await
}

async fn run(subject: &Subject, iterations: usize) -> Result<(), BoxError> {
    let key = LockKey::new(format!("bench/{}", std::process::id()))?;
    let warmup = iterations / 10 + 1;
    let mut ours = Samples::default();
    // The same pair with a recorder installed (this thread's, for that pair only), interleaved
    // with the rest: what recording the metrics costs on the hot path.
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let mut recorded = Samples::default();
    let mut raws: Vec<Samples> = subject.raw.iter().map(|_| Samples::default()).collect();
    // Interleave the measurements so drift on a noisy machine hits them alike.
    for i in 0..warmup + iterations {
        let took = pair(subject, &key).await?;
        {
            let _recording = metrics::set_default_local_recorder(&recorder);
            let with_recorder = pair(subject, &key).await?;
            if i >= warmup {
                recorded.push(with_recorder);
            }
        }
        for (raw, samples) in subject.raw.iter().zip(raws.iter_mut()) {
            let t = Instant::now();
            raw.pair(&format!("{key}-raw")).await?;
            if i >= warmup {
                samples.push(t.elapsed());
            }
        }
        if i >= warmup {
            ours.push(took);
        }
    }
    let first_raw = raws.first().cloned().unwrap_or_default();
    for (raw, samples) in subject.raw.iter().zip(&raws) {
        let target = subject.targets.then_some(raw.target());
        stats::report(
            "uncontended acquire+release",
            &ours,
            raw.name(),
            samples,
            target,
        );
    }
    stats::report(
        "acquire+release, metrics recorded (Prometheus recorder)",
        &recorded,
        "the same with no recorder installed",
        &ours,
        None,
    );
    let (handoff, idle_raw) = handoff(subject, &key, iterations / 4 + 1).await?;
    if let Some(raw) = subject.raw.first() {
        let target = subject.targets.then_some(1.5);
        stats::report(
            "hand-off (release -> waiter holds)",
            &handoff,
            "same raw pair, after a 2 ms idle gap",
            &idle_raw,
            target,
        );
        stats::report(
            "hand-off (release -> waiter holds)",
            &handoff,
            raw.name(),
            &first_raw,
            None,
        );
    }
    Ok(())
}

/// One uncontended try_acquire + release through leasehold, timed.
async fn pair(subject: &Subject, key: &LockKey) -> Result<Duration, BoxError> {
    let t = Instant::now();
    let grant = subject
        .authority
        .try_acquire(key, TTL)
        .await?
        .ok_or("the bench key is held by someone else")?;
    let _ = subject.authority.release(&grant).await?;
    Ok(t.elapsed())
}

/// A waiter blocks in `acquire`; the holder releases; measured from the release call until the
/// waiter's `acquire` returns. Each round starts after a 2 ms idle gap (so the waiter is parked),
/// and the same round measures one raw pair after the same kind of gap: an idle connection and a
/// sleeping runtime wake slower than a hot loop, and the ratio should compare like with like.
async fn handoff(
    subject: &Subject,
    key: &LockKey,
    rounds: usize,
) -> Result<(Samples, Samples), BoxError> {
    let mut samples = Samples::default();
    let mut idle_raw = Samples::default();
    let raw_key = format!("{key}-raw");
    let mut held = subject
        .authority
        .try_acquire(key, TTL)
        .await?
        .ok_or("the bench key is held by someone else")?;
    for _ in 0..rounds {
        if let Some(raw) = subject.raw.first() {
            tokio::time::sleep(Duration::from_millis(2)).await;
            let t = Instant::now();
            raw.pair(&raw_key).await?;
            idle_raw.push(t.elapsed());
        }
        let waiter = {
            let (authority, key) = (subject.authority.clone(), key.clone());
            tokio::spawn(async move {
                let g = authority.acquire(&key, TTL, Duration::from_secs(30)).await;
                (g, Instant::now())
            })
        };
        // Let the waiter reach its wait.
        tokio::time::sleep(Duration::from_millis(2)).await;
        let released_at = Instant::now();
        let _ = subject.authority.release(&held).await?;
        let (grant, got_at) = waiter.await?;
        held = grant?;
        samples.push(got_at - released_at);
    }
    let _ = subject.authority.release(&held).await?;
    Ok((samples, idle_raw))
}
