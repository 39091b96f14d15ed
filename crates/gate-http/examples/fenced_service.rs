//! A fenced HTTP service: account balances in SQLite, written only under the caller's fence.
//!
//! `PUT /accounts/{id}` with the balance as the body and the caller's fence in the
//! `leasehold-fence` header: the handler claims the account's row with that fence as the first
//! statement of its transaction (`leasehold-gate-sql`), then writes the balance in the same
//! transaction. A fence older than one the row has seen is answered `409 Conflict` with the
//! newest fence; the row is untouched.
//!
//! ```text
//! cargo run -p leasehold-gate-http --features client,server --example fenced_service -- accounts.db 8080
//! curl -X PUT -H 'leasehold-fence: 7' --data 120 http://127.0.0.1:8080/accounts/a1   # 204
//! curl -X PUT -H 'leasehold-fence: 6' --data 999 http://127.0.0.1:8080/accounts/a1   # 409
//! ```

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use axum::Router;
use leasehold_gate_http::{stale_response, RequireFence};
use leasehold_gate_sql::{Claimed, SqlGate};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx::SqlitePool;

/// The service's state: the accounts' pool and their gate.
#[derive(Clone, Debug)]
pub struct Accounts {
    pool: SqlitePool,
    gate: SqlGate,
}

/// Opens (creating if need be) the accounts file.
pub async fn open(path: &std::path::Path) -> Result<Accounts, Box<dyn std::error::Error>> {
    let options = SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(std::time::Duration::from_secs(5));
    let pool = SqlitePoolOptions::new().connect_with(options).await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS accounts (id text PRIMARY KEY, \
         last_fence integer NOT NULL DEFAULT 0, balance integer NOT NULL DEFAULT 0)",
    )
    .execute(&pool)
    .await?;
    Ok(Accounts {
        pool,
        gate: SqlGate::new("accounts", "id")?,
    })
}

/// The routes: `PUT /accounts/{id}` (fenced) and `GET /accounts/{id}`.
pub fn app(accounts: Accounts) -> Router {
    Router::new()
        .route("/accounts/{id}", put(set_balance).get(balance))
        .route("/health", get(|| async { "ok" }))
        .with_state(accounts)
}

fn internal(e: impl std::fmt::Display) -> Response {
    (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response()
}

async fn set_balance(
    State(accounts): State<Accounts>,
    Path(id): Path<String>,
    RequireFence(fence): RequireFence,
    body: String,
) -> Response {
    let Ok(balance) = body.trim().parse::<i64>() else {
        return (StatusCode::BAD_REQUEST, "the body is not a balance").into_response();
    };
    // The write lock at once (SQLite), then the claim as the first statement.
    let mut tx = match accounts.pool.begin_with("BEGIN IMMEDIATE").await {
        Ok(tx) => tx,
        Err(e) => return internal(e),
    };
    let inserted = sqlx::query("INSERT INTO accounts (id) VALUES (?1) ON CONFLICT (id) DO NOTHING")
        .bind(&id)
        .execute(&mut *tx)
        .await;
    if let Err(e) = inserted {
        return internal(e);
    }
    match accounts.gate.claim(&mut tx, &id, fence).await {
        Ok(Claimed::Claimed) => {}
        Ok(Claimed::Stale { newest }) => return stale_response(newest),
        Ok(Claimed::Missing) => return (StatusCode::NOT_FOUND, "no such account").into_response(),
        Err(e) => return internal(e),
    }
    let written = sqlx::query("UPDATE accounts SET balance = ?1 WHERE id = ?2")
        .bind(balance)
        .bind(&id)
        .execute(&mut *tx)
        .await;
    if let Err(e) = written {
        return internal(e);
    }
    match tx.commit().await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => internal(e),
    }
}

async fn balance(State(accounts): State<Accounts>, Path(id): Path<String>) -> Response {
    let found: Result<Option<(i64, i64)>, _> =
        sqlx::query_as("SELECT balance, last_fence FROM accounts WHERE id = ?1")
            .bind(&id)
            .fetch_optional(&accounts.pool)
            .await;
    match found {
        Ok(Some((balance, fence))) => format!("{balance} (fence {fence})").into_response(),
        Ok(None) => (StatusCode::NOT_FOUND, "no such account").into_response(),
        Err(e) => internal(e),
    }
}

#[allow(dead_code)]
#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args.next().unwrap_or_else(|| "accounts.db".to_string());
    let port: u16 = args.next().map_or(Ok(8080), |p| p.parse())?;
    let accounts = open(std::path::Path::new(&path)).await?;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    println!("fenced accounts on http://{}", listener.local_addr()?);
    axum::serve(listener, app(accounts)).await?;
    Ok(())
}
