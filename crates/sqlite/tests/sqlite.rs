//! The SQLite authority against the real thing, a file in a temporary directory: the whole
//! conformance suite with faults, holder processes killed with SIGKILL, processes excluding each
//! other, fences across restarts, leases of an earlier boot, and dropped acquisitions.
//!
//! Other processes are this test binary run again with `child_process_role` selected and the
//! role in the environment (see [`child_process_role`]).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use leasehold_conformance::scenarios::run_all;
use leasehold_conformance::{harness_error, Connector, Context, Faults, Residue, Verdict};
use leasehold_core::{Authority, Error, Instant, Lease, LeaseOptions, LockKey};
use leasehold_sqlite::SqliteAuthority;
use rand::Rng;
use sqlx::{Connection, SqliteConnection};
use tokio::io::{AsyncBufReadExt, BufReader};

fn url(path: &Path) -> String {
    format!("sqlite://{}?timeout_ms=1000", path.display())
}

/// Now on the machine's monotonic clock, as the authority reads it (tests run outside any time
/// namespace).
fn now_ns() -> i64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec * 1_000_000_000 + t.tv_nsec
}

/// Makes clients, each with its own pool (as a separate process would have), and remembers them
/// so that a restart can close them all.
struct Clients {
    url: String,
    made: Mutex<Vec<SqliteAuthority>>,
}

#[async_trait]
impl Connector for Clients {
    async fn connect(&self) -> leasehold_core::Result<Arc<dyn Authority>> {
        let a = SqliteAuthority::connect(&self.url).await?;
        self.made
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(a.clone());
        Ok(Arc::new(a))
    }
}

/// Faults of an embedded authority:
/// * restart: every connection of every client is closed (the file alone remains, as after all
///   processes exited), and later clients open the same file again;
/// * pause: another connection takes the database's write lock and keeps it (a hung writer:
///   every request waits for it, as for a frozen server), resume rolls it back;
/// * revoke: an operator expires the row (the fence counter stays).
struct SqliteFaults {
    clients: Arc<Clients>,
    path: PathBuf,
    pauser: tokio::sync::Mutex<Option<SqliteConnection>>,
}

impl SqliteFaults {
    async fn admin(&self) -> leasehold_core::Result<SqliteConnection> {
        SqliteConnection::connect(&format!("sqlite://{}", self.path.display()))
            .await
            .map_err(harness_error)
    }
}

#[async_trait]
impl Faults for SqliteFaults {
    async fn restart(&self) -> leasehold_core::Result<()> {
        let made: Vec<_> =
            std::mem::take(&mut *self.clients.made.lock().unwrap_or_else(|e| e.into_inner()));
        for client in made {
            client.close().await;
        }
        Ok(())
    }

    async fn pause(&self) -> leasehold_core::Result<()> {
        let mut conn = self.admin().await?;
        sqlx::query("BEGIN IMMEDIATE")
            .execute(&mut conn)
            .await
            .map_err(harness_error)?;
        *self.pauser.lock().await = Some(conn);
        Ok(())
    }

    /// Another connection holding the write lock leaves the file answering, busy.
    fn pause_is_contention(&self) -> bool {
        true
    }

    async fn resume(&self) -> leasehold_core::Result<()> {
        if let Some(mut conn) = self.pauser.lock().await.take() {
            sqlx::query("ROLLBACK")
                .execute(&mut conn)
                .await
                .map_err(harness_error)?;
            conn.close().await.map_err(harness_error)?;
        }
        Ok(())
    }

    async fn revoke(&self, key: &LockKey) -> leasehold_core::Result<()> {
        let mut conn = self.admin().await?;
        sqlx::query("UPDATE leasehold_leases SET expires_ns = 0 WHERE lock_key = ?1")
            .bind(key.as_str())
            .execute(&mut conn)
            .await
            .map_err(harness_error)?;
        Ok(())
    }
}

/// What is left for a key: a live lease row (the row itself, with its fence counter, stays on
/// purpose).
struct LiveRows(PathBuf);

#[async_trait]
impl Residue for LiveRows {
    async fn leftovers(&self, key: &LockKey) -> leasehold_core::Result<Vec<String>> {
        live_rows(&self.0, key.as_str()).await
    }
}

async fn live_rows(path: &Path, key: &str) -> leasehold_core::Result<Vec<String>> {
    let admin = SqliteAuthority::connect(&url(path)).await?;
    let live: Vec<(i64, String)> = sqlx::query_as(
        "SELECT fence, owner FROM leasehold_leases \
         WHERE lock_key = ?1 AND boot_id = ?2 AND expires_ns > ?3",
    )
    .bind(key)
    .bind(admin.boot_id())
    .bind(now_ns())
    .fetch_all(admin.pool())
    .await
    .map_err(harness_error)?;
    admin.close().await;
    Ok(live
        .into_iter()
        .map(|(fence, owner)| format!("a live lease row: fence {fence}, owner {owner}"))
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_the_conformance_suite_with_faults() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("locks.db");
    let clients = Arc::new(Clients {
        url: url(&path),
        made: Mutex::new(Vec::new()),
    });
    let ctx = Context::new(clients.clone())
        .await
        .unwrap()
        .with_residue(Arc::new(LiveRows(path.clone())))
        .with_faults(Arc::new(SqliteFaults {
            clients,
            path,
            pauser: tokio::sync::Mutex::new(None),
        }));
    let report = run_all("sqlite", &ctx).await;
    println!("{report}");
    report.assert_passed();
    for line in &report.lines {
        // One file on one machine has no standby to fail over to.
        if line.scenario != "fences_survive_failover" {
            assert_eq!(
                line.outcome,
                Ok(Verdict::Passed),
                "{}:\n{report}",
                line.scenario
            );
        }
    }
}

// ---- other processes -------------------------------------------------------------------------

const ROLE: &str = "LEASEHOLD_SQLITE_CHILD_ROLE";
const CHILD_URL: &str = "LEASEHOLD_SQLITE_CHILD_URL";
const CHILD_KEY: &str = "LEASEHOLD_SQLITE_CHILD_KEY";
const CHILD_LOG: &str = "LEASEHOLD_SQLITE_CHILD_LOG";
const RACE_ROUNDS: usize = 15;
const HOLD_TTL: Duration = Duration::from_millis(1500);

/// Not a test of its own: the body of the child processes the tests below start. Without the
/// role in the environment it does nothing.
///
/// * `hold`: takes the key with a renewing lease, prints `HOLDING <fence>`, and keeps it until
///   killed.
/// * `race`: [`RACE_ROUNDS`] times, waits for the key, appends `start <pid> <fence>` to the log,
///   sleeps a little, appends `end <pid> <fence>`, releases.
#[test]
fn child_process_role() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let url = std::env::var(CHILD_URL).unwrap();
    let key = LockKey::new(std::env::var(CHILD_KEY).unwrap()).unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let authority = Arc::new(SqliteAuthority::connect(&url).await.unwrap());
        match role.as_str() {
            "hold" => {
                let lease = Lease::acquire(
                    authority,
                    &key,
                    HOLD_TTL,
                    Duration::from_secs(30),
                    LeaseOptions::default(),
                )
                .await
                .unwrap();
                println!("HOLDING {}", lease.fence().value());
                tokio::time::sleep(Duration::from_secs(120)).await;
                drop(lease);
            }
            "race" => {
                use std::io::Write;
                let log = std::env::var(CHILD_LOG).unwrap();
                let pid = std::process::id();
                let append = |line: String| {
                    let mut f = std::fs::OpenOptions::new()
                        .append(true)
                        .create(true)
                        .open(&log)
                        .unwrap();
                    f.write_all(line.as_bytes()).unwrap();
                };
                for _ in 0..RACE_ROUNDS {
                    let grant = authority
                        .acquire(&key, Duration::from_secs(10), Duration::from_secs(60))
                        .await
                        .unwrap();
                    let fence = grant.fence().value();
                    append(format!("start {pid} {fence}\n"));
                    tokio::time::sleep(Duration::from_millis(3)).await;
                    append(format!("end {pid} {fence}\n"));
                    let _ = authority.release(&grant).await.unwrap();
                }
                println!("DONE");
            }
            other => panic!("unknown role {other}"),
        }
    });
}

fn child(role: &str, url: &str, key: &str, log: Option<&Path>) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "child_process_role",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(ROLE, role)
    .env(CHILD_URL, url)
    .env(CHILD_KEY, key)
    .stdout(Stdio::piped())
    .stderr(Stdio::inherit())
    .kill_on_drop(true);
    if let Some(log) = log {
        cmd.env(CHILD_LOG, log);
    }
    cmd
}

/// A holder process is killed with SIGKILL while its lease renews: until then another process
/// cannot take the key (the renewals from the other process keep it); after the kill the key is
/// free once the last renewal's TTL ran out, not before, and the fence is greater.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holder_process_frees_the_key_after_its_ttl_with_a_greater_fence() {
    let dir = tempfile::tempdir().unwrap();
    let url = url(&dir.path().join("locks.db"));
    let key = LockKey::new("crash/holder").unwrap();
    let here = SqliteAuthority::connect(&url).await.unwrap();
    let mut holder = child("hold", &url, key.as_str(), None).spawn().unwrap();
    let mut lines = BufReader::new(holder.stdout.take().unwrap()).lines();
    let fence: u64 = loop {
        let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("the holder process said nothing for 30 s")
            .unwrap()
            .expect("the holder process ended before holding");
        // libtest prints the test's name on the same line, before it.
        if let Some((_, f)) = line.split_once("HOLDING ") {
            break f.trim().parse().unwrap();
        }
    };
    // Two TTLs: without the child's renewals the lease would have run out.
    let until = Instant::now() + HOLD_TTL * 2;
    while Instant::now() < until {
        assert!(
            here.try_acquire(&key, HOLD_TTL).await.unwrap().is_none(),
            "took the key from a live holder process"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    holder.start_kill().unwrap();
    let killed = Instant::now();
    let status = holder.wait().await.unwrap();
    assert!(!status.success(), "{status:?}");
    let grant = loop {
        if let Some(g) = here.try_acquire(&key, HOLD_TTL).await.unwrap() {
            break g;
        }
        assert!(
            killed.elapsed() < HOLD_TTL + Duration::from_secs(2),
            "the key stayed held {:?} after its holder was killed",
            killed.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let after = killed.elapsed();
    // The last renewal happened about a third of the TTL before the kill (less on time).
    assert!(
        after >= HOLD_TTL / 4,
        "the key was free {after:?} after the kill, before the holder's TTL ran out"
    );
    assert!(
        grant.fence().value() > fence,
        "fence {} after the crash is not above {fence}",
        grant.fence()
    );
    let _ = here.release(&grant).await.unwrap();
}

/// Three processes open a fresh file together and take turns on one key: their critical
/// sections, logged to one file, never overlap, and every grant's fence is above the one before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_exclude_each_other_and_fences_only_grow() {
    let dir = tempfile::tempdir().unwrap();
    let url = url(&dir.path().join("locks.db"));
    let log = dir.path().join("sections.log");
    // The file does not exist yet: the processes race to create it and switch it to WAL mode,
    // then for the key.
    let mut children = Vec::new();
    for _ in 0..3 {
        children.push(
            child("race", &url, "race/one-key", Some(&log))
                .spawn()
                .unwrap(),
        );
    }
    for mut c in children {
        let status = tokio::time::timeout(Duration::from_secs(120), c.wait())
            .await
            .expect("a racing process hung")
            .unwrap();
        assert!(status.success(), "{status:?}");
    }
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<Vec<&str>> = text.lines().map(|l| l.split(' ').collect()).collect();
    assert_eq!(lines.len(), 3 * RACE_ROUNDS * 2, "{text}");
    let mut last_fence = 0u64;
    let mut pids = std::collections::HashSet::new();
    for pair in lines.chunks(2) {
        let (start, end) = (&pair[0], &pair[1]);
        assert_eq!(start[0], "start", "{text}");
        assert_eq!(end[0], "end", "two critical sections overlapped:\n{text}");
        assert_eq!(
            (start[1], start[2]),
            (end[1], end[2]),
            "two critical sections overlapped:\n{text}"
        );
        let fence: u64 = start[2].parse().unwrap();
        assert!(
            fence > last_fence,
            "fence {fence} after {last_fence}:\n{text}"
        );
        last_fence = fence;
        pids.insert(start[1]);
    }
    assert_eq!(pids.len(), 3);
}

// ---- fences, boots, cancellation ---------------------------------------------------------------

/// Fences keep growing across release, and across closing every connection and opening the
/// file again (what is left after every process exited).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_grow_across_release_and_reopening_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let url = url(&dir.path().join("locks.db"));
    let key = LockKey::new("fences/reopen").unwrap();
    let ttl = Duration::from_secs(5);
    let mut last = None;
    for _ in 0..3 {
        let a = SqliteAuthority::connect(&url).await.unwrap();
        for _ in 0..3 {
            let g = a.try_acquire(&key, ttl).await.unwrap().unwrap();
            if let Some(before) = last {
                assert!(g.fence() > before, "{} after {before}", g.fence());
            }
            last = Some(g.fence());
            assert_eq!(
                a.release(&g).await.unwrap(),
                leasehold_core::Released::Released
            );
        }
        a.close().await;
    }
    assert_eq!(last.unwrap().raw(), 9);
}

/// A lease written in another boot counts as expired, however far ahead its expiry reads; one
/// of this boot still holds the key. The fence goes on from the old row's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_from_an_earlier_boot_is_expired() {
    let dir = tempfile::tempdir().unwrap();
    let a = SqliteAuthority::connect(&url(&dir.path().join("locks.db")))
        .await
        .unwrap();
    let ttl = Duration::from_secs(5);
    let insert = "INSERT INTO leasehold_leases (lock_key, owner, fence, boot_id, expires_ns) \
                  VALUES (?1, 'someone-else', 41, ?2, ?3)";
    sqlx::query(insert)
        .bind("boot/earlier")
        .bind("00000000-0000-0000-0000-000000000000")
        .bind(i64::MAX)
        .execute(a.pool())
        .await
        .unwrap();
    sqlx::query(insert)
        .bind("boot/this")
        .bind(a.boot_id())
        .bind(now_ns() + 3_600_000_000_000)
        .execute(a.pool())
        .await
        .unwrap();
    let g = a
        .try_acquire(&LockKey::new("boot/earlier").unwrap(), ttl)
        .await
        .unwrap()
        .expect("a lease of an earlier boot kept the key");
    assert_eq!(g.fence().raw(), 42);
    assert!(a
        .try_acquire(&LockKey::new("boot/this").unwrap(), ttl)
        .await
        .unwrap()
        .is_none());
    // The earlier boot's lease cannot be renewed or released by its old owner either: the row
    // is ours now.
    let _ = a.release(&g).await.unwrap();
}

/// Hundreds of try_acquire and acquire futures dropped at random moments (before, during and
/// after the step that takes the key), with and without a holder: with a TTL of a minute,
/// the key is free again at once afterwards, and no live row is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_acquisitions_leave_nothing_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("locks.db");
    let a = SqliteAuthority::connect(&url(&path)).await.unwrap();
    let holder = SqliteAuthority::connect(&url(&path)).await.unwrap();
    let key = LockKey::new("cancel/dropped").unwrap();
    let ttl = Duration::from_secs(60);
    let mut cut_short = 0;
    // Until enough futures were cut short: how many a random cut of 0-3 ms catches depends on
    // how fast the machine answers, so the count, not the rounds, is what is fixed.
    let mut round = 0;
    while cut_short < 100 && round < 4000 {
        round += 1;
        let held = if round % 3 == 0 {
            holder.try_acquire(&key, ttl).await.unwrap()
        } else {
            None
        };
        let cut = Duration::from_micros(rand::rng().random_range(0..=3000));
        let done = if round % 2 == 0 {
            tokio::time::timeout(cut, a.try_acquire(&key, ttl))
                .await
                .map(|r| r.unwrap())
        } else {
            tokio::time::timeout(cut, a.acquire(&key, ttl, Duration::from_millis(2)))
                .await
                .map(|r| match r {
                    Ok(g) => Some(g),
                    Err(Error::Timeout { .. }) => None,
                    Err(e) => panic!("{e}"),
                })
        };
        match done {
            Ok(Some(g)) => {
                let _ = a.release(&g).await.unwrap();
            }
            Ok(None) => {}
            Err(_) => cut_short += 1,
        }
        if let Some(g) = held {
            let _ = holder.release(&g).await.unwrap();
        }
    }
    assert!(cut_short > 50, "only {cut_short} futures were cut short");
    // Give-backs run in the background: the key must be free within a moment, far below the TTL.
    let other = SqliteAuthority::connect(&url(&path)).await.unwrap();
    let start = Instant::now();
    let g = loop {
        if let Some(g) = other.try_acquire(&key, ttl).await.unwrap() {
            break g;
        }
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "a dropped acquisition left the key held"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let _ = other.release(&g).await.unwrap();
    let left = live_rows(&path, key.as_str()).await.unwrap();
    assert!(left.is_empty(), "{left:?}");
}

/// Typed errors before anything is opened: a missing directory is not created, a bad URL says
/// what is wrong.
#[tokio::test]
async fn bad_paths_and_urls_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no/such/dir/locks.db");
    let err = SqliteAuthority::connect(&url(&missing)).await.unwrap_err();
    assert!(matches!(err, Error::InvalidConfig { .. }), "{err}");
    assert!(!missing.parent().unwrap().exists());
    let err = SqliteAuthority::connect("sqlite://:memory:")
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidUrl { .. }), "{err}");
    // A file that is not a database: a permanent backend error, not "unavailable".
    let junk = dir.path().join("junk.db");
    std::fs::write(&junk, vec![b'x'; 4096]).unwrap();
    let err = SqliteAuthority::connect(&url(&junk)).await.unwrap_err();
    assert!(!err.is_retryable(), "{err}");
}

/// Clients that open a fresh file at the same moment (each switching it to WAL mode, which
/// takes an exclusive lock the busy timeout does not wait for) all connect, and share one table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_opening_a_fresh_file_together_all_connect() {
    for _ in 0..5 {
        let dir = tempfile::tempdir().unwrap();
        let url = url(&dir.path().join("fresh.db"));
        let opening: Vec<_> = (0..8)
            .map(|_| {
                let url = url.clone();
                tokio::spawn(async move { SqliteAuthority::connect(&url).await })
            })
            .collect();
        let key = LockKey::new("fresh/one").unwrap();
        let mut granted = 0;
        for o in opening {
            let a = o.await.unwrap().unwrap();
            if a.try_acquire(&key, Duration::from_secs(30))
                .await
                .unwrap()
                .is_some()
            {
                granted += 1;
            }
        }
        assert_eq!(granted, 1);
    }
}

/// With one connection in the pool, a lease keeps renewing while another task of the same
/// client waits for its key: a waiter never keeps the connection that renewals need.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_size_one_keeps_leases_while_waiting() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!(
        "sqlite://{}?pool_size=1&timeout_ms=1000",
        dir.path().join("locks.db").display()
    );
    let a = Arc::new(SqliteAuthority::connect(&url).await.unwrap());
    let key = LockKey::new("pool/one").unwrap();
    let ttl = Duration::from_millis(600);
    let lease = Lease::try_acquire(a.clone(), &key, ttl, LeaseOptions::default())
        .await
        .unwrap()
        .unwrap();
    let waiting = a.acquire(&key, ttl, ttl * 4).await;
    assert!(matches!(waiting, Err(Error::Timeout { .. })), "{waiting:?}");
    lease.ensure_valid().unwrap();
    let fence = lease.fence();
    let _ = lease.release().await.unwrap();
    let g = a.acquire(&key, ttl, ttl).await.unwrap();
    assert!(g.fence() > fence);
    let _ = a.release(&g).await.unwrap();
}

/// Tasks sharing a client hand a key on at once when it is released through that client,
/// faster than polling would notice (a waiter that has waited a while polls every 25 to 50 ms).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_waiters_of_the_same_client_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let a = Arc::new(
        SqliteAuthority::connect(&url(&dir.path().join("locks.db")))
            .await
            .unwrap(),
    );
    let key = LockKey::new("wake/same-client").unwrap();
    let ttl = Duration::from_secs(10);
    let mut handoffs = Vec::new();
    for _ in 0..5 {
        let held = a.try_acquire(&key, ttl).await.unwrap().unwrap();
        let waiter = {
            let (a, key) = (a.clone(), key.clone());
            tokio::spawn(async move {
                let g = a.acquire(&key, ttl, Duration::from_secs(10)).await;
                (g, Instant::now())
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        let released = Instant::now();
        let _ = a.release(&held).await.unwrap();
        let (g, at) = waiter.await.unwrap();
        handoffs.push(at - released);
        let _ = a.release(&g.unwrap()).await.unwrap();
    }
    handoffs.sort();
    assert!(
        handoffs[2] < Duration::from_millis(20),
        "hand-offs within one client: {handoffs:?}"
    );
}

// ---- proclaimed values ------------------------------------------------------------------------

/// The value a grant proclaims belongs to that grant: a later grant on the key starts with none,
/// a stale grant's proclaim is refused with `LeaseLost` and leaves the holder's value as it was,
/// a released key shows no value, and a value over the limit is refused before any request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proclaimed_value_belongs_to_its_grant() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("locks.db");
    let (a, b) = (
        SqliteAuthority::connect(&url(&path)).await.unwrap(),
        SqliteAuthority::connect(&url(&path)).await.unwrap(),
    );
    let key = LockKey::new("proclaim/owned").unwrap();
    let ttl = Duration::from_millis(300);
    let old = a.try_acquire(&key, ttl).await.unwrap().unwrap();
    a.proclaim(&old, b"old leader").await.unwrap();
    let seen = b.inspect(&key).await.unwrap();
    assert_eq!(seen.value.as_deref(), Some(&b"old leader"[..]), "{seen:?}");

    // The old grant runs out; the next one starts without a value.
    tokio::time::sleep(ttl + Duration::from_millis(50)).await;
    let new = b.try_acquire(&key, ttl * 100).await.unwrap().unwrap();
    assert!(new.fence() > old.fence());
    let seen = a.inspect(&key).await.unwrap();
    assert!(seen.held && seen.value.is_none(), "{seen:?}");

    // The stale grant cannot write over the new holder's value, nor set one where it has none.
    let err = a.proclaim(&old, b"stale").await.unwrap_err();
    assert!(
        matches!(
            &err,
            Error::LeaseLost {
                reason: leasehold_core::LostReason::Refused,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(a.inspect(&key).await.unwrap().value.is_none());
    b.proclaim(&new, b"new leader").await.unwrap();
    let err = a.proclaim(&old, b"stale").await.unwrap_err();
    assert!(matches!(err, Error::LeaseLost { .. }), "{err:?}");
    let seen = a.inspect(&key).await.unwrap();
    assert_eq!(seen.value.as_deref(), Some(&b"new leader"[..]), "{seen:?}");
    assert_eq!(seen.fence, Some(new.fence()));

    // Too long: refused before anything is sent; the value stays.
    let err = b
        .proclaim(&new, &vec![b'x'; leasehold_core::MAX_VALUE_LEN + 1])
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidConfig { .. }), "{err:?}");
    assert_eq!(
        a.inspect(&key).await.unwrap().value.as_deref(),
        Some(&b"new leader"[..])
    );

    // Released: free, no value; the next grant (the same client's) starts without one too.
    let _ = b.release(&new).await.unwrap();
    let seen = a.inspect(&key).await.unwrap();
    assert!(!seen.held && seen.value.is_none(), "{seen:?}");
    let again = b.try_acquire(&key, ttl * 100).await.unwrap().unwrap();
    assert!(b.inspect(&key).await.unwrap().value.is_none());
    let err = b.proclaim(&new, b"released").await.unwrap_err();
    assert!(matches!(err, Error::LeaseLost { .. }), "{err:?}");
    let _ = b.release(&again).await.unwrap();
}

/// The previous version's lease table, created by hand with its SQL, with a live lease in it.
const PREVIOUS_SCHEMA: &str = "CREATE TABLE \"leases_v0\" (
    lock_key   TEXT    NOT NULL PRIMARY KEY,
    owner      TEXT    NOT NULL,
    fence      INTEGER NOT NULL CHECK (fence > 0),
    boot_id    TEXT    NOT NULL,
    expires_ns INTEGER NOT NULL
) WITHOUT ROWID";

async fn previous_version_table(path: &Path, boot_id: &str) {
    let mut conn = SqliteConnection::connect(&format!("sqlite://{}?mode=rwc", path.display()))
        .await
        .unwrap();
    sqlx::query(PREVIOUS_SCHEMA)
        .execute(&mut conn)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO leases_v0 (lock_key, owner, fence, boot_id, expires_ns) \
         VALUES ('upgrade/held', 'an-older-process', 7, ?1, ?2)",
    )
    .bind(boot_id)
    .bind(now_ns() + 3_600_000_000_000)
    .execute(&mut conn)
    .await
    .unwrap();
    conn.close().await.unwrap();
}

/// A file whose lease table the previous version made (with a live lease in it) is upgraded when
/// clients open it, several at once: the columns are added, the rows kept (the held lease, its
/// fence, the counter), and proclaim works. A table remade the old way under an open client
/// (another program) gives a clear permanent error that says to connect again, which upgrades it.
/// (`boots.rs` migrates a file of the schema before the wall-clock columns.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_of_the_previous_version_is_upgraded_when_the_file_is_opened() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.db");
    let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    previous_version_table(&path, boot_id.trim()).await;
    let url = format!("{}&table=leases_v0", url(&path));
    let opening: Vec<_> = (0..6)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { SqliteAuthority::connect(&url).await })
        })
        .collect();
    let mut clients = Vec::new();
    for o in opening {
        clients.push(o.await.unwrap().unwrap());
    }
    let a = clients[0].clone();
    let columns: Vec<String> =
        sqlx::query_scalar("SELECT name FROM pragma_table_info('leases_v0')")
            .fetch_all(a.pool())
            .await
            .unwrap();
    assert_eq!(
        columns,
        [
            "lock_key",
            "owner",
            "fence",
            "boot_id",
            "expires_ns",
            "value",
            "value_fence",
            "written_unix_ns",
            "expires_unix_ns"
        ]
    );
    let held = LockKey::new("upgrade/held").unwrap();
    let seen = a.inspect(&held).await.unwrap();
    assert!(seen.held && seen.value.is_none(), "{seen:?}");
    assert_eq!(seen.fence.map(|f| f.raw()), Some(7));
    assert!(a
        .try_acquire(&held, Duration::from_secs(5))
        .await
        .unwrap()
        .is_none());
    let key = LockKey::new("upgrade/new").unwrap();
    let g = a
        .try_acquire(&key, Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    a.proclaim(&g, b"after the upgrade").await.unwrap();
    assert_eq!(
        clients[1].inspect(&key).await.unwrap().value.as_deref(),
        Some(&b"after the upgrade"[..])
    );

    // Another program remakes the table the old way while this client is open.
    sqlx::query("DROP TABLE leases_v0")
        .execute(a.pool())
        .await
        .unwrap();
    drop(clients);
    previous_version_table(&path, boot_id.trim()).await;
    let err = a.inspect(&held).await.unwrap_err();
    let err2 = a.proclaim(&g, b"v").await.unwrap_err();
    // Acquisitions write the wall-clock columns too, so they say the same.
    let err3 = a
        .try_acquire(&key, Duration::from_secs(30))
        .await
        .unwrap_err();
    for err in [err, err2, err3] {
        assert!(
            matches!(
                err,
                Error::Backend {
                    retryable: false,
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(err.to_string().contains("connect again"), "{err}");
    }
    // Connecting again upgrades it, and every client works on it again.
    let again = SqliteAuthority::connect(&url).await.unwrap();
    let g = again
        .try_acquire(&key, Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    let seen = again.inspect(&held).await.unwrap();
    assert!(
        seen.held && seen.fence.map(|f| f.raw()) == Some(7),
        "{seen:?}"
    );
    again.proclaim(&g, b"again").await.unwrap();
    assert_eq!(
        a.inspect(&key).await.unwrap().value.as_deref(),
        Some(&b"again"[..])
    );
}

/// Tasks sharing a client see its proclaim and release at once in `wait_for_change` (polling
/// otherwise, as declared), and `Duration::MAX` waits without panicking and can be dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_for_change_wakes_on_the_same_clients_changes() {
    let dir = tempfile::tempdir().unwrap();
    let a = Arc::new(
        SqliteAuthority::connect(&url(&dir.path().join("locks.db")))
            .await
            .unwrap(),
    );
    let key = LockKey::new("wait/same-client").unwrap();
    let g = a
        .try_acquire(&key, Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    for proclaim in [true, false] {
        let w = {
            let (a, key) = (a.clone(), key.clone());
            tokio::spawn(async move {
                a.wait_for_change(&key, Duration::from_secs(20))
                    .await
                    .unwrap();
                Instant::now()
            })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!w.is_finished());
        let sent = Instant::now();
        if proclaim {
            a.proclaim(&g, b"v").await.unwrap();
        } else {
            let _ = a.release(&g).await.unwrap();
        }
        let woken = tokio::time::timeout(Duration::from_secs(5), w)
            .await
            .unwrap()
            .unwrap();
        assert!(woken - sent < Duration::from_secs(1), "{:?}", woken - sent);
    }
    let forever = tokio::time::timeout(
        Duration::from_millis(100),
        a.wait_for_change(&key, Duration::MAX),
    )
    .await;
    assert!(forever.is_err());
}

/// One transaction renews a batch. A grant released behind its back and a stale grant
/// (its key since taken by another client) are refused, each alone; the others in the same batch
/// are renewed to their full TTL.
#[tokio::test]
async fn renew_many_renews_a_batch_and_refuses_only_what_is_not_ours() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("locks.db");
    let (a, b) = (
        SqliteAuthority::connect(&url(&path)).await.unwrap(),
        SqliteAuthority::connect(&url(&path)).await.unwrap(),
    );
    assert!(a.capabilities().batch_renewal);
    let short = Duration::from_millis(200);
    let long = Duration::from_secs(20);
    let mut grants = Vec::new();
    for i in 0..5 {
        let key = LockKey::new(format!("batch/{i}")).unwrap();
        let ttl = if i == 3 { short } else { long };
        grants.push(a.try_acquire(&key, ttl).await.unwrap().unwrap());
    }
    let _ = a.release(&grants[1]).await.unwrap();
    tokio::time::sleep(short + Duration::from_millis(100)).await;
    let taken = b
        .try_acquire(grants[3].key(), long)
        .await
        .unwrap()
        .expect("grant 3 ran out");
    let results = a.renew_many(&grants).await;
    assert_eq!(results.len(), 5);
    for (i, result) in results.iter().enumerate() {
        if i == 1 || i == 3 {
            assert!(
                matches!(result, Err(Error::LeaseLost { .. })),
                "grant {i}: {result:?}"
            );
        } else {
            let deadline = *result.as_ref().unwrap();
            assert!(deadline > Instant::now() + long / 2, "grant {i}");
            let seen = b.inspect(grants[i].key()).await.unwrap();
            assert!(
                seen.held && seen.remaining.unwrap() > long - Duration::from_secs(2),
                "grant {i}: {seen:?}"
            );
        }
    }
    let seen = a.inspect(taken.key()).await.unwrap();
    assert_eq!(seen.fence, Some(taken.fence()));
}
