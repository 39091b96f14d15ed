//! PostgreSQL's edges, each against a real server started by the harness: huge
//! durations, the listening connection (its own, watched, replaced), isolation levels set as a
//! database default, secrets in the URL's query string, what fences promise on the connected
//! server, cancelled and timed-out acquisitions, and a read-only (demoted) primary.
//!
//! Timing bounds are fractions of the TTL each test picks, never absolute guesses.

use std::sync::Arc;
use std::time::Duration;

use leasehold_conformance::scenarios::cut_short;
use leasehold_core::{
    Authority, Error, FenceSafety, Instant, Lease, LeaseOptions, LockKey, Released,
};
use leasehold_postgres::PostgresAuthority;
use leasehold_servers::PostgresServer;

mod common;

use common::{start, url};

async fn connect(url: &str) -> PostgresAuthority {
    PostgresAuthority::connect(url)
        .await
        .unwrap_or_else(|e| panic!("connect {url}: {e:?}"))
}

fn key(name: &str) -> LockKey {
    LockKey::new(name).unwrap()
}

async fn exec(a: &PostgresAuthority, sql: &str) {
    sqlx::query(sqlx::AssertSqlSafe(sql.to_string()))
        .execute(a.pool())
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// Leases of `key` that are live by the database's clock.
async fn live_rows(a: &PostgresAuthority, key: &LockKey) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM leasehold_leases WHERE lock_key = $1 AND expires_at > statement_timestamp()",
    )
    .bind(key.as_str())
    .fetch_one(a.pool())
    .await
    .unwrap()
}

// ---------------------------------------------------------------------------------------------
// `Duration::MAX` and huge durations in the URL.

/// `acquire(.., Duration::MAX)` means "wait as long as it takes", not a panic, and huge
/// `timeout_ms` / `listen_check_ms` are "no limit", not an overflow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duration_max_waits_forever_instead_of_panicking() {
    let server = start().await;
    let admin = connect(&url(&server)).await;
    admin.migrate().await.unwrap();
    let ttl = Duration::from_secs(4);
    let k = key("forever");
    for waiter_url in [
        url(&server),
        format!("{}?timeout_ms={}", server.url(), u64::MAX),
        format!(
            "{}?listen_check_ms={}&timeout_ms=1000",
            server.url(),
            u64::MAX
        ),
        // A margin as large as the TTL: grants end at once locally, but nothing overflows.
        format!(
            "{}?safety_margin_ms={}&timeout_ms=1000",
            server.url(),
            u64::MAX
        ),
    ] {
        let holder = admin.try_acquire(&k, ttl).await.unwrap().unwrap();
        let waiter = connect(&waiter_url).await;
        let wait = {
            let (waiter, k) = (waiter.clone(), k.clone());
            tokio::spawn(async move { waiter.acquire(&k, ttl, Duration::MAX).await })
        };
        tokio::time::sleep(ttl / 8).await;
        assert!(
            !wait.is_finished(),
            "{waiter_url}: returned while the key was held"
        );
        let released_at = Instant::now();
        assert_eq!(admin.release(&holder).await.unwrap(), Released::Released);
        let got = tokio::time::timeout(ttl / 2, wait)
            .await
            .unwrap_or_else(|_| panic!("{waiter_url}: no hand-off within TTL/2 of the release"))
            .unwrap()
            .unwrap_or_else(|e| panic!("{waiter_url}: {e:?}"));
        assert!(got.fence() > holder.fence());
        assert!(released_at.elapsed() < ttl / 2);
        // The other entry points with the huge timeout too.
        let again = waiter.try_acquire(&k, ttl).await.unwrap();
        assert!(again.is_none(), "{waiter_url}: the key is held by `got`");
        waiter.renew(&got, ttl).await.unwrap();
        assert_eq!(waiter.release(&got).await.unwrap(), Released::Released);
    }
}

// ---------------------------------------------------------------------------------------------
// The listening connection is not one of the pool's.

/// With `pool_size=1`, a waiter on the same authority must not starve the lease it holds: the
/// listening connection is its own, and a short wait ends at `max_wait` with `Timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_size_one_keeps_leases_while_waiting() {
    let server = start().await;
    let b = connect(&url(&server)).await;
    b.migrate().await.unwrap();
    let a = Arc::new(connect(&format!("{}&pool_size=1", url(&server))).await);
    let ttl = Duration::from_millis(1500);
    let (contended, mine) = (key("contended"), key("mine"));
    let held = b.try_acquire(&contended, ttl * 20).await.unwrap().unwrap();
    let lease = Lease::try_acquire(a.clone(), &mine, ttl, LeaseOptions::default())
        .await
        .unwrap()
        .unwrap();

    // A short wait on a held key: `Timeout` after max_wait, not a pool timeout much later.
    let max_wait = Duration::from_millis(100);
    let started = Instant::now();
    let err = a.acquire(&contended, ttl, max_wait).await.unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }), "{err:?}");
    assert!(
        started.elapsed() < max_wait + ttl / 2,
        "a {max_wait:?} wait took {:?}",
        started.elapsed()
    );

    // A long wait on the same authority while the lease renews through the one pooled connection.
    let waiter = {
        let (a, k) = (a.clone(), contended.clone());
        tokio::spawn(async move { a.acquire(&k, ttl, ttl * 10).await })
    };
    tokio::time::sleep(ttl * 3).await;
    assert!(
        !lease.is_lost(),
        "the lease was lost while a waiter listened"
    );
    lease.ensure_valid().unwrap();
    assert!(!waiter.is_finished());
    let released_at = Instant::now();
    assert_eq!(b.release(&held).await.unwrap(), Released::Released);
    let got = tokio::time::timeout(ttl / 2, waiter)
        .await
        .expect("no hand-off within TTL/2 of the release")
        .unwrap()
        .unwrap();
    assert!(released_at.elapsed() < ttl / 2);
    assert!(!lease.is_lost());
    assert_eq!(a.release(&got).await.unwrap(), Released::Released);
    let _ = lease.release().await.unwrap();
}

// ---------------------------------------------------------------------------------------------
// A listening connection that dies is noticed and replaced.

/// The pid of the backend serving a listening connection (other than `not`), once it listens.
async fn listener_pid(admin: &PostgresAuthority, within: Duration) -> i32 {
    listener_pid_except(admin, 0, within).await
}

/// Another connection of `admin`'s pool whose last statement was this very query (sqlx gives a
/// connection back in a task of its own, so on a busy machine the next query may open a second
/// one) names the listener's check in its text: it is not a listener, and freezing it froze the
/// test's own pool.
async fn listener_pid_except(admin: &PostgresAuthority, not: i32, within: Duration) -> i32 {
    let started = Instant::now();
    loop {
        let pid: Option<i32> = sqlx::query_scalar(
            "SELECT pid FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND pid <> $1 \
             AND (query LIKE 'LISTEN %' OR query LIKE '%leasehold listener%') \
             AND query NOT LIKE '%pg_stat_activity%' \
             ORDER BY backend_start DESC LIMIT 1",
        )
        .bind(not)
        .fetch_optional(admin.pool())
        .await
        .unwrap();
        if let Some(pid) = pid {
            return pid;
        }
        assert!(started.elapsed() < within, "no listening backend");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A waiter on a key held with `ttl`, with its listening connection up.
async fn waiting(
    server: &PostgresServer,
    admin: &PostgresAuthority,
    k: &LockKey,
    ttl: Duration,
) -> (
    tokio::task::JoinHandle<leasehold_core::Result<leasehold_core::Grant>>,
    i32,
    PostgresAuthority,
) {
    waiting_at(&url(server), admin, k, ttl).await
}

/// [`waiting`] for a client of `url`.
async fn waiting_at(
    url: &str,
    admin: &PostgresAuthority,
    k: &LockKey,
    ttl: Duration,
) -> (
    tokio::task::JoinHandle<leasehold_core::Result<leasehold_core::Grant>>,
    i32,
    PostgresAuthority,
) {
    let waiter = connect(url).await;
    // The caller keeps a clone of the client: its listener lives as long as the client, and a
    // waiter done waiting must not take the listener the test still looks for with it.
    let client = waiter.clone();
    let task = {
        let k = k.clone();
        tokio::spawn(async move { waiter.acquire(&k, ttl, ttl * 2).await })
    };
    let pid = listener_pid(admin, ttl / 4).await;
    // Let the waiter make its first attempt and settle into waiting (a precondition, not a
    // bound: the assertions below do not depend on it).
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !task.is_finished(),
        "the waiter returned while the key was held"
    );
    (task, pid, client)
}

/// `pg_terminate_backend` on the listener: the next release still reaches the waiter long before
/// the holder's TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_listener_is_replaced() {
    let server = start().await;
    let admin = connect(&url(&server)).await;
    admin.migrate().await.unwrap();
    let ttl = Duration::from_secs(20);
    let k = key("terminated-listener");
    let held = admin.try_acquire(&k, ttl).await.unwrap().unwrap();
    let (waiter, pid, _client) = waiting(&server, &admin, &k, ttl).await;
    let ended: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .fetch_one(admin.pool())
        .await
        .unwrap();
    assert!(ended);
    // A new listening backend appears.
    listener_pid_except(&admin, pid, ttl / 4).await;
    let released_at = Instant::now();
    let _ = admin.release(&held).await.unwrap();
    let got = tokio::time::timeout(ttl / 4, waiter)
        .await
        .expect("the release did not reach the waiter within TTL/4")
        .unwrap()
        .unwrap();
    assert!(released_at.elapsed() < ttl / 4);
    let _ = admin.release(&got).await;
}

/// While the listening connection is down and cannot come back (the database refuses new
/// connections), a waiter re-tries by timer: a release reaches it long before the holder's TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_retries_by_timer_while_its_listener_is_down() {
    let server = start().await;
    let admin = connect(&url(&server)).await;
    exec(&admin, "CREATE DATABASE waitdb").await;
    let waitdb = format!(
        "postgres://leasehold@127.0.0.1:{}/waitdb?timeout_ms=1000",
        server.port()
    );
    let holder = connect(&waitdb).await;
    holder.migrate().await.unwrap();
    let ttl = Duration::from_secs(20);
    let k = key("listener-down");
    let held = holder.try_acquire(&k, ttl).await.unwrap().unwrap();
    let (waiter, pid, _client) = waiting_at(&waitdb, &admin, &k, ttl).await;
    // Connections already open keep working; the listener cannot open a new one.
    exec(&admin, "ALTER DATABASE waitdb ALLOW_CONNECTIONS false").await;
    let ended: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .fetch_one(admin.pool())
        .await
        .unwrap();
    assert!(ended);
    // Long after the loss was noticed (which wakes waiters once), the release.
    tokio::time::sleep(ttl / 20).await;
    let released_at = Instant::now();
    let _ = holder.release(&held).await.unwrap();
    let got = tokio::time::timeout(ttl / 8, waiter)
        .await
        .expect("the release did not reach the waiter within TTL/8")
        .unwrap()
        .unwrap();
    println!("hand-off {:?} after the release", released_at.elapsed());
    exec(&admin, "ALTER DATABASE waitdb ALLOW_CONNECTIONS true").await;
    let _ = holder.release(&got).await;
}

/// Stops (SIGCONT) a stopped backend when dropped, so a failing test leaves a usable server.
struct Stopped(i32);

impl Stopped {
    fn new(pid: i32) -> Self {
        signal(pid, "STOP");
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        signal(self.0, "CONT");
    }
}

fn signal(pid: i32, sig: &str) {
    let status = std::process::Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .unwrap();
    assert!(status.success(), "kill -{sig} {pid}");
}

/// A listening connection that goes silent (its backend frozen: what a NAT or load balancer
/// that dropped the flow looks like) is noticed by its health check, and the release reaches the
/// waiter long before the holder's TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_listener_is_noticed_and_replaced() {
    let server = start().await;
    let admin = connect(&url(&server)).await;
    admin.migrate().await.unwrap();
    let ttl = Duration::from_secs(20);
    let k = key("silent-listener");
    let held = admin.try_acquire(&k, ttl).await.unwrap().unwrap();
    let (waiter, pid, _client) = waiting(&server, &admin, &k, ttl).await;
    let frozen = Stopped::new(pid);
    let released_at = Instant::now();
    let _ = admin.release(&held).await.unwrap();
    let got = tokio::time::timeout(ttl / 4, waiter)
        .await
        .expect("the release did not reach the waiter within TTL/4")
        .unwrap()
        .unwrap();
    println!("hand-off {:?} after the release", released_at.elapsed());
    assert!(released_at.elapsed() < ttl / 4);
    // The waiter's listener moved to a new backend.
    listener_pid_except(&admin, pid, ttl / 4).await;
    drop(frozen);
    let _ = admin.release(&got).await;
}

// ---------------------------------------------------------------------------------------------
// Repeatable read / serializable as the database's default.

async fn contend(url: &str, k: &LockKey, workers: usize, rounds: usize) -> Vec<u64> {
    let ttl = Duration::from_secs(2);
    let mut tasks = Vec::new();
    for _ in 0..workers {
        let a = connect(url).await;
        let k = k.clone();
        tasks.push(tokio::spawn(async move {
            let mut fences = Vec::new();
            for _ in 0..rounds {
                // Bursts of try_acquire between the waiting acquisitions, to race on the row.
                for _ in 0..3 {
                    if let Some(g) = a.try_acquire(&k, ttl).await? {
                        fences.push(g.fence().value());
                        let _ = a.release(&g).await?;
                    }
                }
                let g = a.acquire(&k, ttl, ttl * 10).await?;
                fences.push(g.fence().value());
                a.renew(&g, ttl).await?;
                let _ = a.release(&g).await?;
            }
            Ok::<_, Error>(fences)
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap().unwrap_or_else(|e| panic!("{e:?}")));
    }
    all
}

/// Under `repeatable read` and `serializable` set with `ALTER DATABASE`, contended acquisitions
/// neither fail with SQLSTATE 40001 nor hand out a fence twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contention_under_repeatable_read_and_serializable_defaults() {
    let server = start().await;
    let admin = connect(&url(&server)).await;
    admin.migrate().await.unwrap();
    for level in ["repeatable read", "serializable"] {
        exec(
            &admin,
            &format!("ALTER DATABASE postgres SET default_transaction_isolation = '{level}'"),
        )
        .await;
        let probe = connect(&url(&server)).await;
        let shown: String = sqlx::query_scalar("SHOW default_transaction_isolation")
            .fetch_one(probe.pool())
            .await
            .unwrap();
        assert_eq!(shown, level);
        let k = key(&format!("isolation-{}", level.replace(' ', "-")));
        let (workers, rounds) = (6, 6);
        let mut fences = contend(&url(&server), &k, workers, rounds).await;
        let n = fences.len();
        assert!(n >= workers * rounds, "{level}: {n} grants");
        fences.sort_unstable();
        fences.dedup();
        assert_eq!(fences.len(), n, "{level}: a fence was handed out twice");
    }
}

// ---------------------------------------------------------------------------------------------
// `?password=` is the password, and no secret parameter is ever printed.

/// Display and Debug of an error and of every error in its source chain.
fn everything_printed(err: &Error) -> String {
    let mut shown = format!("{err}\n{err:?}\n");
    let mut source = std::error::Error::source(err);
    while let Some(s) = source {
        shown.push_str(&format!("{s}\n{s:?}\n"));
        source = s.source();
    }
    shown
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_in_the_query_string_is_used_and_never_printed() {
    let server = tokio::task::spawn_blocking(|| PostgresServer::start_with_password("s3cret pw&x"))
        .await
        .unwrap()
        .unwrap();
    let base = format!("postgres://leasehold@127.0.0.1:{}/postgres", server.port());
    // The right password, percent-encoded in the query string, connects.
    let good = format!("{base}?password=s3cret%20pw%26x&timeout_ms=2000");
    let a = connect(&good).await;
    a.migrate().await.unwrap();
    let shown = format!("{a:?}");
    assert!(!shown.contains("s3cret"), "{shown}");

    // A wrong one is Unauthorized, and no part of the error shows it.
    let wrong = format!("{base}?timeout_ms=2000&password=hunter2");
    let err = PostgresAuthority::connect(&wrong).await.unwrap_err();
    assert!(matches!(err, Error::Unauthorized { .. }), "{err:?}");
    let shown = everything_printed(&err);
    assert!(!shown.contains("hunter2"), "{shown}");

    // Every way a URL with a secret parameter can be refused keeps the secret out.
    for bad in [
        format!("{base}?password=hunter2&tabel=x"),
        format!("{base}?password=hunter2&pool_size=0"),
        format!("{base}?password=hunter2&epoch=x"),
        format!("{base}?password=hunter2&timeout_ms=0"),
        format!("{base}?password=hunter2&sslmode=sometimes"),
        format!("{base}?password=hunter2&password=hunter2"),
        format!("{base}?sslpassword=hunter2"),
        "postgres://leasehold:hunter2@127.0.0.1:1/postgres?password=hunter2".to_string(),
        "postgres://leasehold:hunter2@127.0.0.1:1/postgres?bogus=1".to_string(),
        "postgres://leasehold@127.0.0.1:1/postgres?password=hunter%zz2".to_string(),
    ] {
        let err = PostgresAuthority::connect(&bad).await.unwrap_err();
        assert!(
            matches!(err, Error::InvalidUrl { .. } | Error::InvalidConfig { .. }),
            "{bad}: {err:?}"
        );
        let shown = everything_printed(&err);
        assert!(
            !shown.contains("hunter2") && !shown.contains("hunter%32"),
            "{shown}"
        );
    }
    // The configuration's Debug hides it too.
    let config = leasehold_postgres::PostgresConfig::from_url(&wrong).unwrap();
    let shown = format!("{config:?}");
    assert!(!shown.contains("hunter2"), "{shown}");
    // An unreachable server with the password in the query: Unavailable, nothing printed.
    let port = leasehold_servers::free_port().unwrap();
    let err = PostgresAuthority::connect(&format!(
        "postgres://leasehold@127.0.0.1:{port}/postgres?password=hunter%32&timeout_ms=500"
    ))
    .await
    .unwrap_err();
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    let shown = everything_printed(&err);
    assert!(
        !shown.contains("hunter2") && !shown.contains("hunter%32"),
        "{shown}"
    );
}

// ---------------------------------------------------------------------------------------------
// Fences declare what the connected server promises.

/// Sets `synchronous_standby_names` (empty: none) and waits until the server uses it. Reads and
/// `ALTER SYSTEM` need no commit, so this works while commits would wait for a standby.
async fn standbys(admin: &PostgresAuthority, names: &str) {
    if names.is_empty() {
        exec(admin, "ALTER SYSTEM RESET synchronous_standby_names").await;
    } else {
        exec(
            admin,
            &format!("ALTER SYSTEM SET synchronous_standby_names = '{names}'"),
        )
        .await;
    }
    exec(admin, "SELECT pg_reload_conf()").await;
    let started = Instant::now();
    loop {
        let now: String = sqlx::query_scalar("SELECT current_setting('synchronous_standby_names')")
            .fetch_one(admin.pool())
            .await
            .unwrap();
        if now == names {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the reload did not apply"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn declared(url: &str) -> (FenceSafety, bool, FenceSafety) {
    let a = connect(url).await;
    let c = a.capabilities().clone();
    let k = key("declared");
    let g = a
        .try_acquire(&k, Duration::from_secs(1))
        .await
        .unwrap()
        .unwrap();
    let _ = a.release(&g).await.unwrap();
    (c.fence_safety, c.durable_fences, g.fence().safety())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_declare_what_the_server_promises() {
    let server = start().await;
    let base = url(&server);
    let admin = connect(&base).await;
    admin.migrate().await.unwrap();

    // No synchronous standby: a failover may lose the last acquisitions.
    let (safety, durable, fence) = declared(&base).await;
    assert_eq!(safety, FenceSafety::FailoverUnsafe);
    assert!(durable);
    assert_eq!(
        fence, safety,
        "a fence must carry what the backend declares"
    );

    // The operator vouches for synchronous replication the server cannot show (a managed
    // service replicating storage): linearizable.
    let vouched = format!("{base}&fence_safety=linearizable");
    let (safety, durable, fence) = declared(&vouched).await;
    assert_eq!(
        (safety, durable, fence),
        (FenceSafety::Linearizable, true, FenceSafety::Linearizable)
    );
    let forced = format!("{base}&fence_safety=failover-unsafe");
    assert_eq!(declared(&forced).await.0, FenceSafety::FailoverUnsafe);
    let err = PostgresAuthority::connect(&format!("{base}&fence_safety=maybe"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidUrl { .. }), "{err:?}");

    // A synchronous standby named, and commits wait for it: linearizable. (No standby runs, so
    // nothing may commit meanwhile: only connect and read the declaration.)
    standbys(&admin, "standby1").await;
    let c = connect(&base).await.capabilities().clone();
    assert_eq!(c.fence_safety, FenceSafety::Linearizable);
    assert!(c.durable_fences);
    standbys(&admin, "").await;
    // ... but not where the role's commits do not wait for it, unless the operator vouches.
    exec(
        &admin,
        "ALTER ROLE leasehold SET synchronous_commit = local",
    )
    .await;
    standbys(&admin, "standby1").await;
    let c = connect(&base).await.capabilities().clone();
    assert_eq!(c.fence_safety, FenceSafety::FailoverUnsafe);
    assert!(c.durable_fences);
    let c = connect(&vouched).await.capabilities().clone();
    assert_eq!(
        c.fence_safety,
        FenceSafety::Linearizable,
        "vouched for: storage replication"
    );
    standbys(&admin, "").await;

    // `synchronous_commit = off`: even a crash of this one server can lose the last commits.
    exec(&admin, "ALTER ROLE leasehold SET synchronous_commit = off").await;
    for url in [&base, &vouched] {
        let (safety, durable, fence) = declared(url).await;
        assert_eq!(safety, FenceSafety::FailoverUnsafe, "{url}");
        assert!(!durable, "{url}");
        assert_eq!(fence, safety);
    }
    exec(&admin, "ALTER ROLE leasehold RESET synchronous_commit").await;
}

// ---------------------------------------------------------------------------------------------
// Cancelled and timed-out acquisitions give their lease back; a read-only server is
// an outage, not a permanent error.

/// Acquisitions cut off at random points around one round trip (an acquire that waits: within
/// its wait), hundreds of times: afterwards nothing of ours is left live and another client
/// gets the key at once, not after the TTL. The
/// cuts are the conformance suite's (a timer, or a random number of polls: tokio's timers tick
/// in whole milliseconds, longer than an acquisition on loopback).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_acquisitions_leave_no_lease_behind() {
    let server = start().await;
    let admin = connect(&url(&server)).await;
    admin.migrate().await.unwrap();
    let a = connect(&url(&server)).await;
    let ttl = Duration::from_secs(20);
    let k = key("cancelled");
    // One round trip, measured: the median of a few acquire+release pairs, halved.
    let mut trips = Vec::new();
    for _ in 0..21 {
        let t = Instant::now();
        let g = a.try_acquire(&k, ttl).await.unwrap().unwrap();
        trips.push(t.elapsed());
        let _ = a.release(&g).await.unwrap();
    }
    trips.sort();
    let trip = trips[trips.len() / 2];
    let (mut won, mut cut, mut busy) = (0, 0, 0);
    for i in 0..400 {
        // The acquire rounds find the key held for a moment by another client (its lease ends
        // by the database's clock 5 ms on): the acquire waits, and the attempt that wins is the
        // waiter's form (which marks the key), cut at random moments too.
        let span = if i % 2 == 0 {
            trip * 2
        } else {
            // (Held already when an earlier cut-off's statement is still landing: its lease is
            // given back at once, and the acquire waits for that instead.)
            let _ = admin
                .try_acquire(&k, Duration::from_millis(5))
                .await
                .unwrap();
            Duration::from_millis(30)
        };
        let attempt = async {
            if i % 2 == 0 {
                a.try_acquire(&k, ttl).await
            } else {
                a.acquire(&k, ttl, ttl).await.map(Some)
            }
        };
        match cut_short(attempt, span).await {
            Some(Ok(Some(g))) => {
                won += 1;
                assert_eq!(a.release(&g).await.unwrap(), Released::Released);
            }
            // The statement of an earlier cut-off may still be landing (its lease is given back
            // as soon as it does, which the wait below checks).
            Some(Ok(None)) => busy += 1,
            Some(Err(e)) => panic!("{e:?}"),
            None => cut += 1,
        }
        // A lease left by a cut-off must be gone before the next attempt can be refused
        // for it: wait until the key is free again (bounded well below the TTL).
        let started = Instant::now();
        while live_rows(&admin, &k).await > 0 {
            assert!(
                started.elapsed() < ttl / 4,
                "a lease left by a cut-off acquisition stayed live ({won} won, {cut} cut)"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    println!("round trip {trip:?}: {won} won, {cut} cut off, {busy} found it taken");
    assert!(
        cut > 0 && won > 0,
        "{won} won, {cut} cut: the cut-offs missed the window"
    );
    let b = connect(&url(&server)).await;
    let g = b.acquire(&k, ttl, ttl / 4).await.unwrap();
    let _ = b.release(&g).await.unwrap();
}

/// An acquisition that times out while its statement waits at the server (here on a row lock
/// an administrator holds), and lands later, is given back at once instead of holding the key
/// for its TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_acquisition_is_given_back_when_it_lands() {
    let server = start().await;
    let admin = connect(&url(&server)).await;
    admin.migrate().await.unwrap();
    let a = connect(&url(&server)).await;
    let ttl = Duration::from_secs(20);
    let k = key("timed-out");
    let held = admin.try_acquire(&k, ttl).await.unwrap().unwrap();
    let mut tx = admin.pool().begin().await.unwrap();
    sqlx::query("SELECT 1 FROM leasehold_leases WHERE lock_key = $1 FOR UPDATE")
        .bind(k.as_str())
        .execute(&mut *tx)
        .await
        .unwrap();
    let err = a.try_acquire(&k, ttl).await.unwrap_err();
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    // The holder's lease ends (as if long expired) and the lock is let go: the waiting
    // statement now takes the key, for nobody.
    sqlx::query(
        "UPDATE leasehold_leases SET expires_at = statement_timestamp() - interval '1 hour' \
         WHERE lock_key = $1",
    )
    .bind(k.as_str())
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let b = connect(&url(&server)).await;
    let started = Instant::now();
    let g = b
        .acquire(&k, ttl, ttl / 4)
        .await
        .unwrap_or_else(|e| panic!("the timed-out acquisition kept the key: {e:?}"));
    assert!(started.elapsed() < ttl / 4);
    assert!(
        g.fence().value() > held.fence().value() + 1,
        "the late acquisition did take a fence"
    );
    let _ = b.release(&g).await.unwrap();
}

/// A server that refuses writes (a demoted primary: SQLSTATE 25006) is `Unavailable` and
/// retryable, like Redis's READONLY; when it takes writes again, the same client works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_server_is_unavailable_and_retryable() {
    let server = start().await;
    let admin = connect(&url(&server)).await;
    admin.migrate().await.unwrap();
    let a = connect(&url(&server)).await;
    let ttl = Duration::from_secs(5);
    let (k, other) = (key("read-only"), key("read-only-2"));
    let held = a.try_acquire(&k, ttl).await.unwrap().unwrap();
    exec(
        &admin,
        "ALTER DATABASE postgres SET default_transaction_read_only = on",
    )
    .await;
    // Existing sessions keep their setting; a new client sees the read-only server.
    let ro = connect(&url(&server)).await;
    let err = ro.try_acquire(&other, ttl).await.unwrap_err();
    assert!(
        matches!(err, Error::Unavailable { .. }) && err.is_retryable(),
        "{err:?}"
    );
    let err = ro.acquire(&other, ttl, ttl).await.unwrap_err();
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    let err = ro.renew(&held, ttl).await.unwrap_err();
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    let err = ro.release(&held).await.unwrap_err();
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    exec(
        &admin,
        "ALTER DATABASE postgres RESET default_transaction_read_only",
    )
    .await;
    // The writable server is back (as a new primary would be): the connections that met the
    // read-only one were closed, so the same client reaches it again.
    let started = Instant::now();
    let g = loop {
        match ro.try_acquire(&other, ttl).await {
            Ok(g) => break g.expect("nobody else holds it"),
            Err(e @ Error::Unavailable { .. }) => {
                assert!(
                    started.elapsed() < ttl,
                    "still read-only after {:?}: {e}",
                    started.elapsed()
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("{e:?}"),
        }
    };
    assert_eq!(ro.release(&g).await.unwrap(), Released::Released);
    assert_eq!(a.release(&held).await.unwrap(), Released::Released);
}

/// Lease statements run on lanes (kept connections) instead of sqlx's pool, which
/// pinged every connection it took back. What the ping protected against still holds: with every
/// lane's server process terminated (an operator, a failover), a lane used within the last second
/// fails its next statement with a retryable error and connects afresh, so the call after it
/// succeeds; a lane idle for longer is pinged first and replaced before the statement, so the
/// call succeeds at once. Nothing is left held by mistake either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lanes_recover_from_terminated_connections() {
    let server = start().await;
    let url = url(&server);
    let a = connect(&format!("{url}&pool_size=2")).await;
    a.migrate().await.unwrap();
    let admin = connect(&url).await;
    let ttl = Duration::from_secs(5);
    let terminate = || async {
        let killed: i64 = sqlx::query_scalar(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid() \
               AND backend_type = 'client backend' AND query NOT ILIKE '%LISTEN%'",
        )
        .fetch_one(admin.pool())
        .await
        .unwrap();
        killed
    };
    // A lane in use a moment ago.
    let g = a.try_acquire(&key("lane/hot"), ttl).await.unwrap().unwrap();
    assert!(terminate().await >= 1);
    let mut failed = 0;
    let released = loop {
        match a.release(&g).await {
            Ok(r) => break r,
            Err(e) => {
                assert!(e.is_retryable(), "{e}");
                failed += 1;
                assert!(failed <= 2, "the lane did not reconnect: {e}");
            }
        }
    };
    assert_eq!(released, Released::Released);
    assert_eq!(live_rows(&admin, &key("lane/hot")).await, 0);
    // Lanes idle past the ping threshold are replaced before use.
    let g = a
        .try_acquire(&key("lane/idle"), ttl)
        .await
        .unwrap()
        .unwrap();
    assert!(terminate().await >= 1);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(a.release(&g).await.unwrap(), Released::Released);
    let again = a.try_acquire(&key("lane/idle"), ttl).await.unwrap();
    assert!(again.is_some(), "the key was left held");
}
