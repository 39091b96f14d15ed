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
use leasehold_gate_sql::{Claimed, GateDatabase, SqlGate};
use leasehold_memory::MemoryAuthority;
use sqlx::mysql::{MySqlPool, MySqlPoolOptions};
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};
use sqlx::{
    AssertSqlSafe, Database, Encode, Executor, FromRow, IntoArguments, MySql, Pool, Postgres,
    Sqlite, Type,
};

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

/// All that differs between the databases in the example's own statements (the gate's claim
/// already speaks each): how a statement names its parameters, and how a transaction that
/// writes begins.
trait Dialect: GateDatabase {
    /// The placeholders of a statement's first and second parameters.
    const PARAMS: [&'static str; 2];
    /// The statement that begins a transaction.
    const BEGIN: &'static str = "BEGIN";
}

impl Dialect for Postgres {
    const PARAMS: [&'static str; 2] = ["$1", "$2"];
}

impl Dialect for MySql {
    const PARAMS: [&'static str; 2] = ["?", "?"];
}

impl Dialect for Sqlite {
    const PARAMS: [&'static str; 2] = ["?1", "?2"];
    // The file's write lock at once: a transaction that read first could not take it later
    // once another connection had committed.
    const BEGIN: &'static str = "BEGIN IMMEDIATE";
}

/// One invoice row in `pool`'s database, behind the gate.
struct Invoice<'a, DB: Database> {
    pool: &'a Pool<DB>,
    gate: SqlGate,
    id: String,
}

/// The statement `sql` with the database's placeholders for `{p1}` and `{p2}`. The text is the
/// example's own constants and the placeholders: no input becomes SQL.
fn statement<DB: Dialect>(sql: &str) -> AssertSqlSafe<String> {
    let [p1, p2] = DB::PARAMS;
    AssertSqlSafe(sql.replace("{p1}", p1).replace("{p2}", p2))
}

// The bounds are what sqlx asks of a database to run these statements generically; PostgreSQL,
// MySQL and SQLite each meet them, so the story below is written once for all three.
impl<'a, DB> Invoice<'a, DB>
where
    DB: Dialect,
    DB::Arguments: IntoArguments<DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    (String, Option<String>): for<'r> FromRow<'r, DB::Row>,
{
    /// Creates the table if it is missing, and an open invoice with a fresh id.
    async fn open(pool: &'a Pool<DB>) -> Result<Self, BoxError> {
        let invoice = Invoice {
            pool,
            gate: SqlGate::new(TABLE, "id")?,
            id: format!("inv_{}", OwnerToken::generate()?.to_hex()),
        };
        let mut conn = pool.acquire().await?;
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS gate_example_invoices (id varchar(64) PRIMARY KEY, \
             state varchar(16) NOT NULL, paid_by varchar(64), \
             last_fence bigint NOT NULL DEFAULT 0)",
        )
        .execute(&mut *conn)
        .await?;
        sqlx::query(statement::<DB>(
            "INSERT INTO gate_example_invoices (id, state) VALUES ({p1}, 'open')",
        ))
        .bind(invoice.id.as_str())
        .execute(&mut *conn)
        .await?;
        Ok(invoice)
    }

    /// One transaction under `fence`: the gate's claim first; then, if the claim held and
    /// `payer` is given, the charge (`state = 'paid'`, only if the invoice is still open). A
    /// claim that did not hold rolls back having changed nothing.
    async fn act(&self, fence: Fence, payer: Option<&str>) -> Result<Claimed, BoxError> {
        let mut tx = self.pool.begin_with(DB::BEGIN).await?;
        let claimed = self.gate.claim(&mut tx, &self.id, fence).await?;
        if claimed != Claimed::Claimed {
            tx.rollback().await?;
            return Ok(claimed);
        }
        if let Some(payer) = payer {
            sqlx::query(statement::<DB>(
                "UPDATE gate_example_invoices SET state = 'paid', paid_by = {p1} \
                 WHERE id = {p2} AND state = 'open'",
            ))
            .bind(payer)
            .bind(self.id.as_str())
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(claimed)
    }

    /// The invoice's state and payer, and then the row removed (a server's table outlives the
    /// run).
    async fn close(self) -> Result<(String, Option<String>), BoxError> {
        let mut conn = self.pool.acquire().await?;
        let row = sqlx::query_as(statement::<DB>(
            "SELECT state, paid_by FROM gate_example_invoices WHERE id = {p1}",
        ))
        .bind(self.id.as_str())
        .fetch_one(&mut *conn)
        .await?;
        sqlx::query(statement::<DB>(
            "DELETE FROM gate_example_invoices WHERE id = {p1}",
        ))
        .bind(self.id.as_str())
        .execute(&mut *conn)
        .await?;
        Ok(row)
    }

    /// The story on `pool`'s database, with leases from `authority`: holder-1 takes the lease
    /// and pauses past it; holder-2 takes over and claims the invoice's row; holder-1's late
    /// charge is refused; holder-2 charges. An error unless the row refused the late charge and
    /// holder-2 paid.
    async fn story(authority: &dyn Authority, pool: &'a Pool<DB>) -> Result<Outcome, BoxError> {
        let invoice = Invoice::open(pool).await?;
        let key = LockKey::new(format!("invoice:{}", invoice.id))?;
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
        match invoice.act(second.fence(), None).await? {
            Claimed::Claimed => say(
                start,
                "holder-2",
                "claimed the row: from now on it refuses every older fence",
            ),
            other => return Err(format!("holder-2's claim did not hold: {other:?}").into()),
        }

        // holder-1 wakes up and charges, believing it still holds the lease.
        let refused_by = match invoice.act(first.fence(), Some("holder-1")).await? {
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

        match invoice.act(second.fence(), Some("holder-2")).await? {
            Claimed::Claimed => say(start, "holder-2", "charged the invoice"),
            other => return Err(format!("holder-2's charge did not hold: {other:?}").into()),
        }
        let _ = authority.release(&second).await?;

        let id = invoice.id.clone();
        let (state, paid_by) = invoice.close().await?;
        let paid_by = paid_by.unwrap_or_default();
        println!("\n{id}: {state}, paid by {paid_by}");
        if state != "paid" || paid_by != "holder-2" {
            return Err(format!(
                "the invoice should be paid by holder-2, not {state} by {paid_by:?}"
            )
            .into());
        }
        println!("charged exactly once.");
        Ok(Outcome {
            stale_fence: first.fence().value(),
            fence: second.fence().value(),
            refused_by,
            paid_by,
        })
    }
}

fn say(start: Instant, who: &str, what: impl Display) {
    println!("[{:>6.0?}] {who:<8} {what}", start.elapsed());
}

/// The story on `db` (see [`Invoice::story`]), with leases from `authority`.
pub async fn run(authority: &dyn Authority, db: &Db) -> Result<Outcome, BoxError> {
    match db {
        Db::Postgres(pool) => Invoice::story(authority, pool).await,
        Db::MySql(pool) => Invoice::story(authority, pool).await,
        Db::Sqlite(pool) => Invoice::story(authority, pool).await,
    }
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
