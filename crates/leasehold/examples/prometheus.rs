//! Workers contend for a few keys while their leases are exported as Prometheus metrics.
//!
//! ```text
//! cargo run -p leasehold --example prometheus              # 5 s, then prints what it served
//! LEASEHOLD_EXAMPLE_SECONDS=600 cargo run -p leasehold --example prometheus
//! curl -s http://127.0.0.1:9464/metrics | grep leasehold_    # while it runs
//! ```
//!
//! Four workers take turns on two report keys through one authority, each holding its lease
//! for a short critical section. Now and then one of them freezes past its lease (as a GC pause
//! would), a colleague takes the key, and the frozen worker's late write is refused by the
//! resource's fence: `leasehold_fence_rejections_total` counts each stale holder caught. See
//! docs/observability.md for how to read every metric and what to alert on.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use leasehold::telemetry::{self, KeyLabels};
use leasehold::{connect, FencedRegister, FencedResource, Lease, LeaseOptions, LockKey};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr: SocketAddr = std::env::var("LEASEHOLD_METRICS_ADDR")
        .unwrap_or_else(|_| "127.0.0.1:9464".into())
        .parse()?;
    let seconds: u64 = std::env::var("LEASEHOLD_EXAMPLE_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    PrometheusBuilder::new()
        .with_http_listener(addr)
        // Histograms as Prometheus histograms (with _bucket series), so the alert rules in
        // docs/observability.md can take quantiles across instances.
        .set_buckets_for_metric(
            Matcher::Suffix("_seconds".into()),
            &[0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0],
        )?
        .set_buckets_for_metric(
            Matcher::Full(telemetry::LEASE_HELD_TTL_RATIO.into()),
            &[0.1, 0.25, 0.5, 0.8, 1.0, 2.0, 5.0],
        )?
        .install()?;
    telemetry::describe();
    // Keys are `report:<name>`: one series per family, whatever the names.
    telemetry::set_key_labels(KeyLabels::UpTo(':'));

    let authority = connect("memory://prometheus-example").await?;
    // One report per key, each checking the fences of its own key's leases.
    let reports = Arc::new([FencedRegister::new(), FencedRegister::new()]);
    let keys = [
        LockKey::new("report:daily")?,
        LockKey::new("report:weekly")?,
    ];
    let until = tokio::time::Instant::now() + Duration::from_secs(seconds);
    let mut workers = Vec::new();
    for worker in 0..4u64 {
        let (authority, reports, keys) = (authority.clone(), reports.clone(), keys.clone());
        workers.push(tokio::spawn(async move {
            let ttl = Duration::from_millis(200);
            let mut round = 0u64;
            while tokio::time::Instant::now() < until {
                round += 1;
                let which = (worker + round) as usize % keys.len();
                let (key, report) = (&keys[which], &reports[which]);
                let Ok(Some(lease)) = Lease::try_acquire(
                    authority.clone(),
                    key,
                    ttl,
                    LeaseOptions::default().with_auto_renew(false),
                )
                .await
                else {
                    tokio::time::sleep(Duration::from_millis(7)).await;
                    continue;
                };
                let fence = lease.fence();
                if report.claim(fence).await.is_ok_and(|g| g.is_accepted()) {
                    // Every 25th round, freeze past the lease before writing.
                    let work = if round.is_multiple_of(25) {
                        ttl * 2
                    } else {
                        Duration::from_millis(5)
                    };
                    tokio::time::sleep(work).await;
                    let _ = report.write(fence, &format!("worker {worker}")).await;
                }
                let _ = lease.release().await;
            }
        }));
    }
    for worker in workers {
        worker.await?;
    }

    // What a scraper would see: the leasehold_ series, read back over HTTP.
    let mut scrape = tokio::net::TcpStream::connect(addr).await?;
    scrape
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .await?;
    let mut body = String::new();
    scrape.read_to_string(&mut body).await?;
    let lines: Vec<&str> = body
        .lines()
        .filter(|l| l.starts_with("leasehold_") && !l.contains("_bucket"))
        .collect();
    for line in &lines {
        println!("{line}");
    }
    for expected in [
        "leasehold_acquire_total{",
        "leasehold_lease_held_ttl_ratio_count{",
        "leasehold_fence_rejections_total{resource=\"register\"}",
    ] {
        if !lines.iter().any(|l| l.starts_with(expected)) {
            return Err(format!("the scrape has no {expected}").into());
        }
    }
    Ok(())
}
