//! An account kept in a Redis hash behind the Redis gate, with its leases from the same Redis: a
//! holder pauses past its lease, the next holder claims the hash, and the paused holder's late
//! write is refused by the gate's script, which compares the hash's fence and writes in one step.
//!
//! ```text
//! docker compose up -d --wait redis     # docker-compose.yml at the repository's root
//! cargo run -p leasehold-redis --example fenced_hash
//! ```
//!
//! It connects to `LEASEHOLD_REDIS_URL`, by default docker-compose.yml's
//! `redis://127.0.0.1:6379`. The gate works the same with leases from any authority: it sees only
//! their fences.
//!
//! Exits non-zero unless the late write was refused and the hash holds the new holder's write.

use std::fmt::Display;
use std::time::{Duration, Instant};

use leasehold_core::{Authority, Guarded, LockKey, OwnerToken};
use leasehold_redis::gate::RedisGate;
use leasehold_redis::RedisAuthority;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The lease's time to live: the first holder's lease runs out while it is paused.
const TTL: Duration = Duration::from_millis(300);

/// What happened, for a caller to check.
#[derive(Debug)]
pub struct Outcome {
    /// The fence of the holder that paused.
    pub stale_fence: u64,
    /// The fence of the holder that took over.
    pub fence: u64,
    /// The newest fence the hash named when it refused the late write.
    pub refused_by: u64,
    /// The hash's `balance` field at the end.
    pub balance: String,
}

fn say(start: Instant, who: &str, what: impl Display) {
    println!("[{:>6.0?}] {who:<8} {what}", start.elapsed());
}

/// The story on `gate`, with leases from `authority`: holder-1 takes the lease and pauses past
/// it; holder-2 takes over and claims the account's hash; holder-1's late write is refused;
/// holder-2 writes. An error unless the hash refused the late write and holds holder-2's.
pub async fn run(authority: &dyn Authority, gate: &RedisGate) -> Result<Outcome, BoxError> {
    let account = format!("account:{}", OwnerToken::generate()?.to_hex());
    let key = LockKey::new(format!("lock:{account}"))?;
    let start = Instant::now();

    let first = authority
        .try_acquire(&key, TTL)
        .await?
        .ok_or("the account's lease is held by someone else")?;
    say(
        start,
        "holder-1",
        format!(
            "holds the lease with fence {}, and pauses before writing",
            first.fence()
        ),
    );

    // holder-1 is paused (a GC pause, a stopped VM): its lease runs out, and holder-2 gets it.
    let second = authority.acquire(&key, TTL, Duration::from_secs(5)).await?;
    say(
        start,
        "holder-2",
        format!(
            "holds the lease with fence {} (holder-1's ran out)",
            second.fence()
        ),
    );
    match gate.claim(&account, second.fence()).await? {
        Guarded::Accepted => say(
            start,
            "holder-2",
            "claimed the hash: from now on it refuses every older fence",
        ),
        other => return Err(format!("holder-2's claim was refused: {other:?}").into()),
    }

    // holder-1 wakes up and writes, believing it still holds the lease.
    let late = gate
        .hset(
            &account,
            first.fence(),
            &[("balance", "0"), ("written_by", "holder-1")],
        )
        .await?;
    let refused_by = match late {
        Guarded::Stale { newest } => {
            say(
                start,
                "holder-1",
                format!(
                    "write REFUSED: the hash has seen fence {newest} > {}",
                    first.fence()
                ),
            );
            newest
        }
        Guarded::Accepted => {
            return Err(format!(
                "holder-1's late write with fence {} was accepted",
                first.fence()
            )
            .into())
        }
    };

    match gate
        .hset(
            &account,
            second.fence(),
            &[("balance", "120"), ("written_by", "holder-2")],
        )
        .await?
    {
        Guarded::Accepted => say(start, "holder-2", "wrote the balance"),
        other => return Err(format!("holder-2's write was refused: {other:?}").into()),
    }
    let _ = authority.release(&second).await?;

    let balance = gate.hget(&account, "balance").await?.unwrap_or_default();
    let written_by = gate.hget(&account, "written_by").await?.unwrap_or_default();
    println!("\n{account}: balance {balance}, written by {written_by}");
    if balance != "120" || written_by != "holder-2" {
        return Err(format!(
            "the hash should hold holder-2's balance 120, not {balance:?} by {written_by:?}"
        )
        .into());
    }
    println!("written once, by the holder that claimed it.");
    Ok(Outcome {
        stale_fence: first.fence().value(),
        fence: second.fence().value(),
        refused_by,
        balance,
    })
}

#[allow(dead_code)]
#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), BoxError> {
    let url = std::env::var("LEASEHOLD_REDIS_URL")
        .ok()
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| "redis://127.0.0.1:6379".to_string());
    let authority = RedisAuthority::connect(&url).await?;
    let gate = RedisGate::connect(&url).await?;
    run(&authority, &gate).await?;
    Ok(())
}
