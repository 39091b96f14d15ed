//! Three workers race to charge invoice `inv_72`. One wins; one of them pauses past its TTL (a
//! long GC pause, a stopped VM) and wakes up believing it still holds the lock: its late write is
//! refused by the fenced resource, so the customer is charged exactly once.
//!
//! ```text
//! cargo run -p leasehold --example billing                 # in-memory authority
//! cargo run -p leasehold --example billing -- <url>        # any backend built in
//! ```
//! It exits non-zero if the invoice is not charged exactly once.

use std::sync::Arc;
use std::time::Duration;

use leasehold::{
    connect, Authority, FencedRegister, FencedResource, Guarded, Instant, Lease, LeaseOptions,
    LockKey,
};

/// The protected resource: the invoice row, with the greatest fence it has accepted.
struct Invoices {
    row: FencedRegister,
}

fn log(start: Instant, who: &str, what: impl std::fmt::Display) {
    println!("[{:>6.0?}] {who:<9} {what}", start.elapsed());
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "memory://billing".into());
    let authority = connect(&url).await?;
    let key = LockKey::new("invoice:inv_72")?;
    let ttl = authority
        .capabilities()
        .ttl
        .at_least(Duration::from_millis(500));
    let invoices = Arc::new(Invoices {
        row: FencedRegister::new(),
    });
    let start = Instant::now();
    println!(
        "authority: {} (fences {}), TTL {ttl:?}\n",
        authority.capabilities().backend,
        authority.capabilities().fence_safety
    );

    // All three race for the lock at once; exactly one gets it.
    let mut racers = Vec::new();
    for name in ["worker-1", "worker-2", "worker-3"] {
        let (authority, key) = (authority.clone(), key.clone());
        racers.push(tokio::spawn(async move {
            let got = authority.try_acquire(&key, ttl).await;
            (name, got)
        }));
    }
    let mut winner = None;
    let mut losers = Vec::new();
    for racer in racers {
        let (name, got) = racer.await?;
        match got? {
            Some(grant) => {
                log(
                    start,
                    name,
                    format!("won the lock, fence {}", grant.fence()),
                );
                winner = Some((name, grant));
            }
            None => {
                log(start, name, "lost the race: someone else holds the lock");
                losers.push(name);
            }
        }
    }
    let (paused_name, paused_grant) = winner.ok_or("nobody won the race")?;
    if losers.len() != 2 {
        return Err(format!("{} workers won the race", 3 - losers.len()).into());
    }

    // The winner checks its lease, then pauses before writing: the classic unsafe gap.
    log(
        start,
        paused_name,
        "lease valid; about to charge... (pauses: stop-the-world GC)",
    );
    let pause = ttl + ttl / 2;

    // Meanwhile the others wait for the lock; the first to get it charges the invoice.
    let mut successors = Vec::new();
    for name in losers {
        let (authority, key, invoices) = (authority.clone(), key.clone(), invoices.clone());
        successors.push(tokio::spawn(async move {
            work_as_successor(start, name, authority, key, ttl, invoices).await
        }));
    }

    tokio::time::sleep(pause).await;
    log(
        start,
        paused_name,
        format!(
            "wakes up after {pause:?}; its TTL was {ttl:?}; writes with fence {}",
            paused_grant.fence()
        ),
    );
    match invoices
        .row
        .write(paused_grant.fence(), paused_name)
        .await?
    {
        Guarded::Accepted => log(
            start,
            paused_name,
            "charge ACCEPTED (this would be a double charge)",
        ),
        Guarded::Stale { newest } => log(
            start,
            paused_name,
            format!("charge REFUSED: the invoice already saw fence {newest}; abandoning"),
        ),
    }
    let _ = authority.release(&paused_grant).await?;

    let mut charges = 0;
    for s in successors {
        charges += s.await??;
    }
    let (charged_by, newest) = invoices.row.read();
    println!(
        "\ninvoice inv_72: charged by {}, newest fence {newest}",
        charged_by.as_deref().unwrap_or("nobody")
    );
    if charges == 1 && charged_by.as_deref() != Some(paused_name) {
        println!("charged exactly once.");
        Ok(())
    } else {
        Err(format!("charged {charges} times by successors, last by {charged_by:?}").into())
    }
}

/// Waits for the lock, claims the invoice with the new fence, charges it unless already charged.
/// Returns how many charges it made (0 or 1).
async fn work_as_successor(
    start: Instant,
    name: &'static str,
    authority: Arc<dyn Authority>,
    key: LockKey,
    ttl: Duration,
    invoices: Arc<Invoices>,
) -> Result<u32, Box<dyn std::error::Error + Send + Sync>> {
    let lease = Lease::acquire(authority, &key, ttl, ttl * 10, LeaseOptions::default()).await?;
    log(
        start,
        name,
        format!("acquired the lock, fence {}", lease.fence()),
    );
    // Claim first: from now on any write with an older fence is refused.
    if let Guarded::Stale { newest } = invoices.row.claim(lease.fence()).await? {
        log(
            start,
            name,
            format!("claim refused (newer fence {newest}); abandoning"),
        );
        return Ok(0);
    }
    let charged = invoices.row.read().0.is_some();
    let made = if charged {
        log(start, name, "invoice already charged; nothing to do");
        0
    } else {
        lease.ensure_valid()?;
        match invoices.row.write(lease.fence(), name).await? {
            Guarded::Accepted => {
                log(start, name, "charged the invoice");
                1
            }
            Guarded::Stale { newest } => {
                log(
                    start,
                    name,
                    format!("charge refused (newer fence {newest})"),
                );
                0
            }
        }
    };
    let _ = lease.release().await?;
    Ok(made)
}
