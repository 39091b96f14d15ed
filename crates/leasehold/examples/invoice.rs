//! Charging an invoice in PostgreSQL with a lease and a guarded write.
//!
//! The invoices table carries `last_fence`; every write under the lease goes through
//! `FencedTable`, so a worker that paused past its lease cannot charge the invoice a second time,
//! even though its check of the lease passed before the pause.
//!
//! ```text
//! cargo run -p leasehold --features postgres --example invoice -- postgres://user@host/db
//! ```
//! Exits non-zero unless the invoice ends up paid exactly once.

use std::time::Duration;

use leasehold::postgres::guarded::{Claimed, FencedTable, Guarded};
use leasehold::postgres::PostgresAuthority;
use leasehold::{Authority, Instant, LockKey};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn log(start: Instant, who: &str, what: impl std::fmt::Display) {
    println!("[{:>6.0?}] {who:<9} {what}", start.elapsed());
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), BoxError> {
    let url = std::env::args()
        .nth(1)
        .ok_or("usage: invoice <postgres://...>")?;
    let authority = PostgresAuthority::connect(&url).await?;
    authority.migrate().await?;
    let pool = authority.pool().clone();
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS invoices (id text PRIMARY KEY, state text NOT NULL, \
         paid_by text, last_fence bigint NOT NULL DEFAULT 0)",
    )
    .execute(&pool)
    .await?;
    let id = format!("inv_{}", std::process::id());
    sqlx::query("INSERT INTO invoices (id, state) VALUES ($1, 'open')")
        .bind(&id)
        .execute(&pool)
        .await?;
    let invoices = FencedTable::new("invoices", "id")?;
    let key = LockKey::new(format!("invoice:{id}"))?;
    let ttl = Duration::from_millis(500);
    let start = Instant::now();

    // worker-1 takes the lease, checks it, then pauses before writing.
    let stale = authority
        .try_acquire(&key, ttl)
        .await?
        .ok_or("the invoice is locked by someone else")?;
    log(
        start,
        "worker-1",
        format!(
            "holds the lease, fence {}; pauses before charging",
            stale.fence()
        ),
    );
    tokio::time::sleep(ttl + ttl / 2).await;

    // worker-2 gets the lease after it expired, claims the row, and charges.
    let fresh = authority.acquire(&key, ttl, Duration::from_secs(5)).await?;
    log(
        start,
        "worker-2",
        format!("holds the lease, fence {}", fresh.fence()),
    );
    let mut tx = pool.begin().await?;
    match invoices
        .claim::<(String,)>(&mut tx, &id, fresh.fence(), "state")
        .await?
    {
        Claimed::Claimed((state,)) => log(
            start,
            "worker-2",
            format!("claimed the invoice (state {state})"),
        ),
        other => return Err(format!("worker-2 could not claim: {other:?}").into()),
    }
    let charged = invoices
        .update(
            &mut tx,
            &id,
            fresh.fence(),
            "state = 'paid', paid_by = $3",
            "state = 'open'",
            |q| q.bind("worker-2"),
        )
        .await?;
    tx.commit().await?;
    log(start, "worker-2", format!("charge: {charged:?}"));
    let _ = authority.release(&fresh).await?;

    // worker-1 wakes up and tries to charge with its old fence.
    let mut tx = pool.begin().await?;
    let late = invoices
        .update(
            &mut tx,
            &id,
            stale.fence(),
            "state = 'paid', paid_by = $3",
            "state = 'open'",
            |q| q.bind("worker-1"),
        )
        .await?;
    tx.commit().await?;
    match late {
        Guarded::Stale { newest } => log(
            start,
            "worker-1",
            format!(
                "charge REFUSED: the invoice saw fence {newest} > {}; abandoning",
                stale.fence()
            ),
        ),
        other => log(
            start,
            "worker-1",
            format!("charge: {other:?} (this would be a double charge)"),
        ),
    }

    let (state, paid_by): (String, Option<String>) =
        sqlx::query_as("SELECT state, paid_by FROM invoices WHERE id = $1")
            .bind(&id)
            .fetch_one(&pool)
            .await?;
    sqlx::query("DELETE FROM invoices WHERE id = $1")
        .bind(&id)
        .execute(&pool)
        .await?;
    println!(
        "\n{id}: {state}, paid by {}",
        paid_by.as_deref().unwrap_or("nobody")
    );
    if charged == Guarded::Applied
        && matches!(late, Guarded::Stale { .. })
        && paid_by.as_deref() == Some("worker-2")
    {
        println!("charged exactly once.");
        Ok(())
    } else {
        Err("the invoice was not charged exactly once".into())
    }
}
