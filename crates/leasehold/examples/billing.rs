//! Three worker **processes** race to charge invoice `inv_72`, with no server anywhere: the lock
//! lives in an embedded SQLite file, and so does the invoice.
//!
//! ```text
//! cargo run -p leasehold --features sqlite --example billing
//! ```
//!
//! The example starts itself three more times (`billing worker worker-N <dir>`), one process per
//! worker, on two files in a fresh temporary directory:
//!
//! * `locks.db`, the authority, opened with `connect("sqlite://<dir>/locks.db")`. Every process
//!   on this machine that opens the same file shares the same leases and the same fence counter.
//! * `invoices.db`, the protected resource: an ordinary table whose row keeps `last_fence`, the
//!   greatest fence it has seen. Every write is an `UPDATE ... WHERE last_fence <= ?`, so a write
//!   carrying an older fence than one already seen changes nothing, and the writer learns that
//!   it was refused.
//!
//! What happens:
//!
//! 1. All three call `try_acquire` at the same moment. One wins the lock (fence 1), the other two
//!    wait for it.
//! 2. The winner checks that its lease is valid and that the invoice is open, and then freezes
//!    before its write. Its only thread blocks, so its lease renewal stops too, as it would in a
//!    long GC pause, a `SIGSTOP` or a suspended VM. The lease runs out in the file.
//! 3. The next worker gets the lock with fence 2, *claims* the invoice (raises its `last_fence`
//!    to 2) before anything else, sees it open and charges it. The third gets fence 3, claims,
//!    sees the invoice already charged and does nothing.
//! 4. The frozen worker is let go (by the parent, once the others are done). It still believes the
//!    check it made before the pause and sends its charge with fence 1. The invoice has seen
//!    fence 3, so the charge is refused: the customer pays once.
//!
//! The lease alone could not have prevented the double charge: the frozen worker's check passed,
//! and nothing keeps a process from pausing between a check and the write after it. Only the
//! resource, which sees the write itself, can refuse it. (Real code would also make the charge conditional on `status = 'open'`; here the
//! fence alone does the refusing, so that you can see it work.)
//!
//! The example exits non-zero unless the invoice is charged exactly once, by a worker that held
//! the lock when it charged.

use std::error::Error;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, ExitCode, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use leasehold::{connect, Fence, Lease, LeaseOptions, LockKey, Released};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode};
use sqlx::{Connection, SqliteConnection};

type BoxError = Box<dyn Error + Send + Sync>;

/// Long enough that three processes starting together all try before it runs out, short enough
/// that the example takes about a second.
const TTL: Duration = Duration::from_secs(1);
/// How long a loser waits for the lock before giving up.
const MAX_WAIT: Duration = Duration::from_secs(20);
/// How long the whole race may take before the parent stops the workers and fails.
const DEADLINE: Duration = Duration::from_secs(60);
const WORKERS: usize = 3;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let outcome = match args.as_slice() {
        [] => race(),
        [role, name, dir] if role == "worker" => runtime()
            .and_then(|rt| rt.block_on(worker(name, Path::new(dir))))
            .map_err(|e| format!("{name}: {}", chain(&*e)).into()),
        _ => Err("usage: billing (the workers are started by the example itself)".into()),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("billing: {}", chain(&*e));
            ExitCode::FAILURE
        }
    }
}

/// An error and its sources on one line, each text once.
fn chain(e: &(dyn Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let more = cause.to_string();
        if !text.contains(&more) {
            text = format!("{text}: {more}");
        }
        source = cause.source();
    }
    text
}

fn runtime() -> Result<tokio::runtime::Runtime, BoxError> {
    // One thread: when a worker blocks it, everything in that process stops, renewals included.
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

fn authority_url(dir: &Path) -> String {
    format!("sqlite://{}", dir.join("locks.db").display())
}

// --- The protected resource: the invoice row in its own SQLite file --------------------------

/// What the invoice row says.
struct Invoice {
    status: String,
    charges: i64,
    charged_by: Option<String>,
    charged_fence: Option<i64>,
    last_fence: i64,
}

async fn open_invoices(dir: &Path, create: bool) -> Result<SqliteConnection, BoxError> {
    let options = SqliteConnectOptions::new()
        .filename(dir.join("invoices.db"))
        .create_if_missing(create)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(5));
    Ok(SqliteConnection::connect_with(&options).await?)
}

async fn create_invoice(conn: &mut SqliteConnection) -> Result<(), BoxError> {
    sqlx::query(
        "CREATE TABLE invoices (id TEXT PRIMARY KEY, amount_cents INTEGER NOT NULL, \
         status TEXT NOT NULL, charges INTEGER NOT NULL DEFAULT 0, charged_by TEXT, \
         charged_fence INTEGER, last_fence INTEGER NOT NULL DEFAULT 0)",
    )
    .execute(&mut *conn)
    .await?;
    sqlx::query("INSERT INTO invoices (id, amount_cents, status) VALUES ('inv_72', 12000, 'open')")
        .execute(&mut *conn)
        .await?;
    Ok(())
}

async fn read_invoice(conn: &mut SqliteConnection) -> Result<Invoice, BoxError> {
    let (status, charges, charged_by, charged_fence, last_fence) =
        sqlx::query_as::<_, (String, i64, Option<String>, Option<i64>, i64)>(
            "SELECT status, charges, charged_by, charged_fence, last_fence \
             FROM invoices WHERE id = 'inv_72'",
        )
        .fetch_one(&mut *conn)
        .await?;
    Ok(Invoice {
        status,
        charges,
        charged_by,
        charged_fence,
        last_fence,
    })
}

/// Raises the invoice's `last_fence` to `fence`: from now on, writes with older fences are
/// refused. `Err(newest)` if it has already seen a newer fence.
async fn claim(conn: &mut SqliteConnection, fence: Fence) -> Result<Result<(), i64>, BoxError> {
    let changed =
        sqlx::query("UPDATE invoices SET last_fence = ? WHERE id = 'inv_72' AND last_fence <= ?")
            .bind(fence.as_i64())
            .bind(fence.as_i64())
            .execute(&mut *conn)
            .await?
            .rows_affected();
    refused_unless(conn, changed).await
}

/// The side effect: charges the invoice, guarded by the fence alone. `Err(newest)` if refused.
async fn charge(
    conn: &mut SqliteConnection,
    name: &str,
    fence: Fence,
) -> Result<Result<(), i64>, BoxError> {
    let changed = sqlx::query(
        "UPDATE invoices SET status = 'charged', charges = charges + 1, charged_by = ?, \
         charged_fence = ?, last_fence = ? WHERE id = 'inv_72' AND last_fence <= ?",
    )
    .bind(name)
    .bind(fence.as_i64())
    .bind(fence.as_i64())
    .bind(fence.as_i64())
    .execute(&mut *conn)
    .await?
    .rows_affected();
    refused_unless(conn, changed).await
}

async fn refused_unless(
    conn: &mut SqliteConnection,
    changed: u64,
) -> Result<Result<(), i64>, BoxError> {
    if changed == 1 {
        Ok(Ok(()))
    } else {
        Ok(Err(read_invoice(conn).await?.last_fence))
    }
}

// --- A worker process -------------------------------------------------------------------------

/// What a worker tells the parent, on lines of their own; everything else it prints is the story.
const READY: &str = "@ready";
const FROZEN: &str = "@frozen";

fn say(what: impl std::fmt::Display) {
    println!("{what}");
}

/// Blocks the whole process until the parent writes a line.
fn wait_for_parent() -> Result<(), BoxError> {
    let mut line = String::new();
    if std::io::stdin().read_line(&mut line)? == 0 {
        return Err("the parent went away".into());
    }
    Ok(())
}

async fn worker(name: &str, dir: &Path) -> Result<(), BoxError> {
    let authority = connect(&authority_url(dir)).await?;
    let mut invoices = open_invoices(dir, false).await?;
    let key = LockKey::new("invoice:inv_72")?;
    say(READY);
    wait_for_parent()?; // the start line: all three try at once

    let Some(lease) =
        Lease::try_acquire(authority.clone(), &key, TTL, LeaseOptions::default()).await?
    else {
        say("lost the race; waits for the lock");
        let lease = Lease::acquire(authority, &key, TTL, MAX_WAIT, LeaseOptions::default()).await?;
        return successor(name, lease, &mut invoices).await;
    };

    let fence = lease.fence();
    say(format!("won the lock, fence {fence}"));
    let invoice = read_invoice(&mut invoices).await?;
    lease.ensure_valid()?;
    say(format!(
        "lease valid, invoice {}: about to charge it when the whole process freezes (its \
         lease renewal too)",
        invoice.status
    ));
    say(FROZEN);
    let frozen = Instant::now();
    wait_for_parent()?; // frozen: no task of this process runs, so no renewal either
    say(format!(
        "resumes after {:.1?} (its TTL was {TTL:?}) and sends the charge with fence {fence}",
        frozen.elapsed()
    ));
    match charge(&mut invoices, name, fence).await? {
        Ok(()) => say("charge ACCEPTED: the customer has been charged twice"),
        Err(newest) => say(format!(
            "charge REFUSED as stale: the invoice has already seen fence {newest}"
        )),
    }
    if lease.release().await? == Released::AlreadyGone {
        say("its lease had long been someone else's: gives up");
    }
    Ok(())
}

/// Got the lock after waiting: claim the invoice, then charge it unless it is already charged.
async fn successor(
    name: &str,
    lease: Lease,
    invoices: &mut SqliteConnection,
) -> Result<(), BoxError> {
    let fence = lease.fence();
    if let Err(newest) = claim(invoices, fence).await? {
        say(format!(
            "got the lock, fence {fence}, but the invoice has seen fence {newest}: gives up"
        ));
        let _ = lease.release().await?;
        return Ok(());
    }
    say(format!(
        "got the lock, fence {fence}, and claimed the invoice with it"
    ));
    let invoice = read_invoice(invoices).await?;
    if invoice.status == "charged" {
        say(format!(
            "invoice already charged by {}: nothing to do",
            invoice.charged_by.as_deref().unwrap_or("?")
        ));
    } else {
        lease.ensure_valid()?;
        match charge(invoices, name, fence).await? {
            Ok(()) => say("charged the invoice: EUR 120.00"),
            Err(newest) => say(format!(
                "charge refused: the invoice has seen fence {newest}"
            )),
        }
    }
    if lease.release().await? == Released::AlreadyGone {
        say("its lease had run out before it released it");
    }
    Ok(())
}

// --- The parent: starts the workers, relays what they say, checks the outcome -----------------

enum Event {
    Line(usize, String),
    Exited(usize),
}

/// The worker processes, stopped (by their own pids) if the parent leaves early.
struct Workers(Vec<Child>);

impl Drop for Workers {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn tell(stdin: &mut Option<ChildStdin>, line: &str) -> Result<(), BoxError> {
    if let Some(stdin) = stdin {
        stdin.write_all(format!("{line}\n").as_bytes())?;
        stdin.flush()?;
    }
    Ok(())
}

fn race() -> Result<(), BoxError> {
    let dir = tempfile::tempdir()?;
    let url = authority_url(dir.path());
    let rt = runtime()?;
    let authority = rt.block_on(async {
        let mut invoices = open_invoices(dir.path(), true).await?;
        create_invoice(&mut invoices).await?;
        Ok::<_, BoxError>(connect(&url).await?)
    })?;
    let caps = authority.capabilities();
    println!("lock authority: {url}");
    println!(
        "  ({}, fences {}, TTL {TTL:?}; a file on this machine, no server)",
        caps.backend, caps.fence_safety
    );
    println!(
        "invoice inv_72: EUR 120.00, open, in {}",
        dir.path().join("invoices.db").display()
    );
    drop(authority);

    let exe = std::env::current_exe()?;
    let mut workers = Workers(Vec::new());
    let mut stdins = Vec::new();
    let (tx, rx) = mpsc::channel();
    for i in 0..WORKERS {
        let mut child = Command::new(&exe)
            .args(["worker", &format!("worker-{}", i + 1)])
            .arg(dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        stdins.push(child.stdin.take());
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(Event::Line(i, line));
            }
            let _ = tx.send(Event::Exited(i));
        });
        workers.0.push(child);
    }
    let pids: Vec<String> = workers
        .0
        .iter()
        .enumerate()
        .map(|(i, c)| format!("worker-{} (pid {})", i + 1, c.id()))
        .collect();
    println!("three worker processes race for it: {}\n", pids.join(", "));

    let deadline = Instant::now() + DEADLINE;
    let mut started = None::<Instant>;
    let (mut ready, mut exited, mut frozen) = (0, vec![false; WORKERS], vec![false; WORKERS]);
    let mut resumed = false;
    while exited.contains(&false) {
        let left = deadline.saturating_duration_since(Instant::now());
        let event = rx
            .recv_timeout(left)
            .map_err(|_| format!("the workers did not finish within {DEADLINE:?}"))?;
        match event {
            Event::Line(_, line) if line == READY => {
                ready += 1;
                if ready == WORKERS {
                    started = Some(Instant::now());
                    for stdin in &mut stdins {
                        tell(stdin, "go")?;
                    }
                }
            }
            Event::Line(i, line) if line == FROZEN => frozen[i] = true,
            Event::Line(i, line) => {
                let at = started.map_or(0, |s| s.elapsed().as_millis());
                println!("[{at:>5} ms] worker-{}  {line}", i + 1);
            }
            Event::Exited(i) => {
                if started.is_none() {
                    return Err(format!("worker-{} stopped before the race", i + 1).into());
                }
                exited[i] = true;
            }
        }
        // Let the frozen worker go once every other worker is done with the invoice.
        let others_done = (0..WORKERS).all(|i| frozen[i] || exited[i]);
        if !resumed && frozen.contains(&true) && others_done {
            resumed = true;
            for i in (0..WORKERS).filter(|&i| frozen[i]) {
                tell(&mut stdins[i], "resume")?;
            }
        }
    }
    for (i, child) in workers.0.iter_mut().enumerate() {
        let status = child.wait()?;
        if !status.success() {
            return Err(format!("worker-{} failed ({status})", i + 1).into());
        }
    }

    let invoice = rt.block_on(async {
        let mut invoices = open_invoices(dir.path(), false).await?;
        read_invoice(&mut invoices).await
    })?;
    let by = invoice.charged_by.as_deref().unwrap_or("nobody");
    let paused: Vec<String> = (0..WORKERS)
        .filter(|&i| frozen[i])
        .map(|i| format!("worker-{}", i + 1))
        .collect();
    println!(
        "\ninvoice inv_72: {} {} time(s), last by {by} with fence {}; newest fence seen: {}",
        invoice.status,
        invoice.charges,
        invoice.charged_fence.unwrap_or(0),
        invoice.last_fence
    );
    if paused.is_empty() {
        return Err("no worker won the race and froze: the race did not happen as intended".into());
    }
    if invoice.charges != 1 || paused.iter().any(|p| p == by) {
        return Err(format!(
            "the invoice must be charged once, by a worker that held the lock; it was charged \
             {} time(s), last by {by}",
            invoice.charges
        )
        .into());
    }
    println!("charged exactly once.");
    Ok(())
}
