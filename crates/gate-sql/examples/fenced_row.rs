//! An invoice row behind the SQL gate, on PostgreSQL, MariaDB (or MySQL) or SQLite: a holder
//! pauses past its lease, the next holder claims the row, and the paused holder's late charge is
//! refused by the database, atomically with the write it would have made.
//!
//! ```text
//! docker compose up -d --wait postgres mariadb     # docker-compose.yml at the repository's root
//! cargo run -p leasehold-gate-sql --features postgres,mysql,sqlite --example fenced_row -- postgres
//! cargo run -p leasehold-gate-sql --features postgres,mysql,sqlite --example fenced_row -- mysql
//! cargo run -p leasehold-gate-sql --features postgres,mysql,sqlite --example fenced_row -- sqlite
//! ```
//!
//! `postgres` connects to `LEASEHOLD_POSTGRES_URL`, by default docker-compose.yml's
//! `postgres://leasehold@127.0.0.1:5432/postgres`; `mysql` to `LEASEHOLD_MARIADB_URL`, by default
//! `mysql://leasehold:leasehold@127.0.0.1:3306/leasehold`; `sqlite` needs no server (a file in a
//! temporary directory). The leases come from the in-memory authority: the gate sees only their
//! fences, so any authority (etcd, ZooKeeper, PostgreSQL, Redis, SQLite) works the same.
//!
//! Exits non-zero unless the late charge was refused and the invoice was paid once, by the
//! holder that claimed it.

use std::fmt::Display;
use std::path::Path;
use std::time::{Duration, Instant};

use leasehold_core::backend::redact_url;
use leasehold_core::{Authority, Fence, LockKey, OwnerToken};
use leasehold_gate_sql::{Claimed, SqlGate};
use leasehold_memory::MemoryAuthority;
use sqlx::mysql::{MySqlPool, MySqlPoolOptions};
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The lease's time to live: the first holder's lease runs out while it is paused.
const TTL: Duration = Duration::from_millis(300);

/// The table of the example's invoices (one fresh row per run).
const TABLE: &str = "gate_example_invoices";

/// The database the invoices live in.
#[derive(Debug)]
pub enum Db {
    /// PostgreSQL.
    Postgres(PgPool),
    /// MariaDB or MySQL.
    MySql(MySqlPool),
    /// A SQLite file.
    Sqlite(SqlitePool),
}

/// What happened, for a caller to check.
#[derive(Debug)]
pub struct Outcome {
    /// The fence of the holder that paused.
    pub stale_fence: u64,
    /// The fence of the holder that took over.
    pub fence: u64,
    /// The newest fence the row named when it refused the late charge.
    pub refused_by: u64,
    /// Who the invoice is paid by at the end.
    pub paid_by: String,
}

/// Opens (creating) a SQLite file the way the gate wants it: WAL, and a busy timeout so that a
/// transaction waits for the file's write lock instead of failing at once.
pub async fn open_sqlite(path: &Path) -> Result<SqlitePool, BoxError> {
    let options = SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(5));
    Ok(SqlitePoolOptions::new().connect_with(options).await?)
}

impl Db {
    /// Creates the table if it is missing, and an open invoice `id`.
    async fn open_invoice(&self, id: &str) -> Result<(), BoxError> {
        match self {
            Db::Postgres(pool) => {
                sqlx::query(
                    "CREATE TABLE IF NOT EXISTS gate_example_invoices (id text PRIMARY KEY, \
                     state text NOT NULL, paid_by text, last_fence bigint NOT NULL DEFAULT 0)",
                )
                .execute(pool)
                .await?;
                sqlx::query("INSERT INTO gate_example_invoices (id, state) VALUES ($1, 'open')")
                    .bind(id)
                    .execute(pool)
                    .await?;
            }
            Db::MySql(pool) => {
                sqlx::query(
                    "CREATE TABLE IF NOT EXISTS gate_example_invoices (id varchar(64) PRIMARY KEY, \
                     state text NOT NULL, paid_by text, last_fence bigint NOT NULL DEFAULT 0)",
                )
                .execute(pool)
                .await?;
                sqlx::query("INSERT INTO gate_example_invoices (id, state) VALUES (?, 'open')")
                    .bind(id)
                    .execute(pool)
                    .await?;
            }
            Db::Sqlite(pool) => {
                sqlx::query(
                    "CREATE TABLE IF NOT EXISTS gate_example_invoices (id text PRIMARY KEY, \
                     state text NOT NULL, paid_by text, last_fence integer NOT NULL DEFAULT 0)",
                )
                .execute(pool)
                .await?;
                sqlx::query("INSERT INTO gate_example_invoices (id, state) VALUES (?1, 'open')")
                    .bind(id)
                    .execute(pool)
                    .await?;
            }
        }
        Ok(())
    }

    /// One transaction under `fence`: the gate's claim first; then, if the claim held and
    /// `payer` is given, the charge (`state = 'paid'`, only if the invoice is still open). A
    /// claim that did not hold rolls back having changed nothing.
    async fn act(
        &self,
        gate: &SqlGate,
        id: &str,
        fence: Fence,
        payer: Option<&str>,
    ) -> Result<Claimed, BoxError> {
        match self {
            Db::Postgres(pool) => {
                let mut tx = pool.begin().await?;
                let claimed = gate.claim(&mut tx, id, fence).await?;
                if claimed != Claimed::Claimed {
                    tx.rollback().await?;
                    return Ok(claimed);
                }
                if let Some(payer) = payer {
                    sqlx::query(
                        "UPDATE gate_example_invoices SET state = 'paid', paid_by = $1 \
                         WHERE id = $2 AND state = 'open'",
                    )
                    .bind(payer)
                    .bind(id)
                    .execute(&mut *tx)
                    .await?;
                }
                tx.commit().await?;
                Ok(claimed)
            }
            Db::MySql(pool) => {
                let mut tx = pool.begin().await?;
                let claimed = gate.claim(&mut tx, id, fence).await?;
                if claimed != Claimed::Claimed {
                    tx.rollback().await?;
                    return Ok(claimed);
                }
                if let Some(payer) = payer {
                    sqlx::query(
                        "UPDATE gate_example_invoices SET state = 'paid', paid_by = ? \
                         WHERE id = ? AND state = 'open'",
                    )
                    .bind(payer)
                    .bind(id)
                    .execute(&mut *tx)
                    .await?;
                }
                tx.commit().await?;
                Ok(claimed)
            }
            Db::Sqlite(pool) => {
                // The file's write lock at once: a transaction that read first could not take
                // it later once another connection had committed.
                let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
                let claimed = gate.claim(&mut tx, id, fence).await?;
                if claimed != Claimed::Claimed {
                    tx.rollback().await?;
                    return Ok(claimed);
                }
                if let Some(payer) = payer {
                    sqlx::query(
                        "UPDATE gate_example_invoices SET state = 'paid', paid_by = ?1 \
                         WHERE id = ?2 AND state = 'open'",
                    )
                    .bind(payer)
                    .bind(id)
                    .execute(&mut *tx)
                    .await?;
                }
                tx.commit().await?;
                Ok(claimed)
            }
        }
    }

    /// The invoice's state and payer, and then the row removed (a server's table outlives the
    /// run).
    async fn close_invoice(&self, id: &str) -> Result<(String, Option<String>), BoxError> {
        let row: (String, Option<String>) = match self {
            Db::Postgres(pool) => {
                let row = sqlx::query_as(
                    "SELECT state, paid_by FROM gate_example_invoices WHERE id = $1",
                )
                .bind(id)
                .fetch_one(pool)
                .await?;
                sqlx::query("DELETE FROM gate_example_invoices WHERE id = $1")
                    .bind(id)
                    .execute(pool)
                    .await?;
                row
            }
            Db::MySql(pool) => {
                let row =
                    sqlx::query_as("SELECT state, paid_by FROM gate_example_invoices WHERE id = ?")
                        .bind(id)
                        .fetch_one(pool)
                        .await?;
                sqlx::query("DELETE FROM gate_example_invoices WHERE id = ?")
                    .bind(id)
                    .execute(pool)
                    .await?;
                row
            }
            Db::Sqlite(pool) => {
                let row = sqlx::query_as(
                    "SELECT state, paid_by FROM gate_example_invoices WHERE id = ?1",
                )
                .bind(id)
                .fetch_one(pool)
                .await?;
                sqlx::query("DELETE FROM gate_example_invoices WHERE id = ?1")
                    .bind(id)
                    .execute(pool)
                    .await?;
                row
            }
        };
        Ok(row)
    }
}

fn say(start: Instant, who: &str, what: impl Display) {
    println!("[{:>6.0?}] {who:<8} {what}", start.elapsed());
}

/// The story on `db`, with leases from `authority`: holder-1 takes the lease and pauses past
/// it; holder-2 takes over and claims the invoice's row; holder-1's late charge is refused;
/// holder-2 charges. An error unless the row refused the late charge and holder-2 paid.
pub async fn run(authority: &dyn Authority, db: &Db) -> Result<Outcome, BoxError> {
    let id = format!("inv_{}", OwnerToken::generate()?.to_hex());
    db.open_invoice(&id).await?;
    let gate = SqlGate::new(TABLE, "id")?;
    let key = LockKey::new(format!("invoice:{id}"))?;
    let start = Instant::now();

    let first = authority
        .try_acquire(&key, TTL)
        .await?
        .ok_or("the invoice's lease is held by someone else")?;
    say(
        start,
        "holder-1",
        format!(
            "holds the lease with fence {}, and pauses before charging",
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
    match db.act(&gate, &id, second.fence(), None).await? {
        Claimed::Claimed => say(
            start,
            "holder-2",
            "claimed the row: from now on it refuses every older fence",
        ),
        other => return Err(format!("holder-2's claim did not hold: {other:?}").into()),
    }

    // holder-1 wakes up and charges, believing it still holds the lease.
    let refused_by = match db.act(&gate, &id, first.fence(), Some("holder-1")).await? {
        Claimed::Stale { newest } => {
            say(
                start,
                "holder-1",
                format!(
                    "charge REFUSED: the row has seen fence {newest} > {}",
                    first.fence()
                ),
            );
            newest
        }
        other => {
            return Err(format!(
                "holder-1's late charge with fence {} was not refused: {other:?}",
                first.fence()
            )
            .into())
        }
    };

    match db.act(&gate, &id, second.fence(), Some("holder-2")).await? {
        Claimed::Claimed => say(start, "holder-2", "charged the invoice"),
        other => return Err(format!("holder-2's charge did not hold: {other:?}").into()),
    }
    let _ = authority.release(&second).await?;

    let (state, paid_by) = db.close_invoice(&id).await?;
    let paid_by = paid_by.unwrap_or_default();
    println!("\n{id}: {state}, paid by {paid_by}");
    if state != "paid" || paid_by != "holder-2" {
        return Err(
            format!("the invoice should be paid by holder-2, not {state} by {paid_by:?}").into(),
        );
    }
    println!("charged exactly once.");
    Ok(Outcome {
        stale_fence: first.fence().value(),
        fence: second.fence().value(),
        refused_by,
        paid_by,
    })
}

/// `name`'s value, or `default` when it is unset or empty.
fn env_or(name: &str, default: &str) -> String {
    std::env::var(name)
        .ok()
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| default.to_string())
}

/// A connection failure that says where, and what would start the server.
fn unreachable(url: &str, service: &str, error: sqlx::Error) -> BoxError {
    format!(
        "cannot connect to {} ({error}); is it running (docker compose up -d --wait {service})?",
        redact_url(url)
    )
    .into()
}

#[allow(dead_code)]
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), BoxError> {
    let which = std::env::args().nth(1).unwrap_or_else(|| "sqlite".into());
    let wait = Duration::from_secs(5);
    let dir = tempfile::tempdir()?;
    let db = match which.as_str() {
        "postgres" => {
            let url = env_or(
                "LEASEHOLD_POSTGRES_URL",
                "postgres://leasehold@127.0.0.1:5432/postgres",
            );
            let pool = PgPoolOptions::new().acquire_timeout(wait).connect(&url);
            Db::Postgres(pool.await.map_err(|e| unreachable(&url, "postgres", e))?)
        }
        "mysql" | "mariadb" => {
            let url = env_or(
                "LEASEHOLD_MARIADB_URL",
                "mysql://leasehold:leasehold@127.0.0.1:3306/leasehold",
            );
            let pool = MySqlPoolOptions::new().acquire_timeout(wait).connect(&url);
            Db::MySql(pool.await.map_err(|e| unreachable(&url, "mariadb", e))?)
        }
        "sqlite" => Db::Sqlite(open_sqlite(&dir.path().join("invoices.db")).await?),
        other => {
            return Err(format!("usage: fenced_row [postgres|mysql|sqlite], not {other:?}").into())
        }
    };
    run(&MemoryAuthority::standalone(), &db).await?;
    Ok(())
}
