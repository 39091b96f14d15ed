//! PostgreSQL's listening connection, against a real server started by the harness: it is not
//! one of the pool's, and one that is terminated, cut off from the database or gone silent is
//! noticed and replaced (or, while it cannot be, made up for by a timer), so a release still
//! reaches the waiter long before the holder's TTL.
//!
//! Timing bounds are fractions of the TTL each test picks, never absolute guesses.

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{Authority, Error, Instant, Lease, LeaseOptions, LockKey, Released};
use leasehold_postgres::PostgresAuthority;
use leasehold_servers::PostgresServer;

mod common;

use common::{connect, exec, key, start_server, url, OrFail, Result};

// ---------------------------------------------------------------------------------------------
// The listening connection is not one of the pool's.

/// With `pool_size=1`, a waiter on the same authority must not starve the lease it holds: the
/// listening connection is its own, and a short wait ends at `max_wait` with `Timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_size_one_keeps_leases_while_waiting() -> Result {
    let server = start_server().await?;
    let b = connect(&url(&server)).await?;
    b.migrate().await.or_fail("migrate")?;
    let a = Arc::new(connect(&format!("{}&pool_size=1", url(&server))).await?);
    let ttl = Duration::from_millis(1500);
    let (contended, mine) = (key("contended")?, key("mine")?);
    let held = b
        .try_acquire(&contended, ttl * 20)
        .await
        .or_fail("B holds the contended key")?
        .or_fail("B holds the contended key: a fresh key was held")?;
    let lease = Lease::try_acquire(a.clone(), &mine, ttl, LeaseOptions::default())
        .await
        .or_fail("A's lease")?
        .or_fail("A's lease: a fresh key was held")?;

    // A short wait on a held key: `Timeout` after max_wait, not a pool timeout much later.
    let max_wait = Duration::from_millis(100);
    let started = Instant::now();
    let err = match a.acquire(&contended, ttl, max_wait).await {
        Ok(g) => return Err(format!("a short wait on a held key got it: {g:?}").into()),
        Err(e) => e,
    };
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
    lease
        .ensure_valid()
        .or_fail("the lease while a waiter listens")?;
    assert!(!waiter.is_finished());
    let released_at = Instant::now();
    assert_eq!(
        b.release(&held).await.or_fail("B releases")?,
        Released::Released
    );
    let got = tokio::time::timeout(ttl / 2, waiter)
        .await
        .or_fail("no hand-off within TTL/2 of the release")?
        .or_fail("the waiter's task")?
        .or_fail("the waiter")?;
    assert!(released_at.elapsed() < ttl / 2);
    assert!(!lease.is_lost());
    assert_eq!(
        a.release(&got).await.or_fail("the waiter releases")?,
        Released::Released
    );
    let _ = lease.release().await.or_fail("A's lease released")?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// A listening connection that dies is noticed and replaced.

/// The pid of the backend serving a listening connection (other than `not`), once it listens.
async fn listener_pid(admin: &PostgresAuthority, within: Duration) -> Result<i32> {
    listener_pid_except(admin, 0, within).await
}

/// Another connection of `admin`'s pool whose last statement was this very query (sqlx gives a
/// connection back in a task of its own, so on a busy machine the next query may open a second
/// one) names the listener's check in its text: it is not a listener, and freezing it froze the
/// test's own pool.
async fn listener_pid_except(admin: &PostgresAuthority, not: i32, within: Duration) -> Result<i32> {
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
        .or_fail("look for a listening backend")?;
        if let Some(pid) = pid {
            return Ok(pid);
        }
        assert!(started.elapsed() < within, "no listening backend");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A waiter's acquisition, running in a task of its own.
type Waiter = tokio::task::JoinHandle<leasehold_core::Result<leasehold_core::Grant>>;

/// A waiter on a key held with `ttl`, with its listening connection up.
async fn waiting(
    server: &PostgresServer,
    admin: &PostgresAuthority,
    k: &LockKey,
    ttl: Duration,
) -> Result<(Waiter, i32, PostgresAuthority)> {
    waiting_at(&url(server), admin, k, ttl).await
}

/// [`waiting`] for a client of `url`.
async fn waiting_at(
    url: &str,
    admin: &PostgresAuthority,
    k: &LockKey,
    ttl: Duration,
) -> Result<(Waiter, i32, PostgresAuthority)> {
    let waiter = connect(url).await?;
    // The caller keeps a clone of the client: its listener lives as long as the client, and a
    // waiter done waiting must not take the listener the test still looks for with it.
    let client = waiter.clone();
    let task = {
        let k = k.clone();
        tokio::spawn(async move { waiter.acquire(&k, ttl, ttl * 2).await })
    };
    let pid = listener_pid(admin, ttl / 4).await?;
    // Let the waiter make its first attempt and settle into waiting (a precondition, not a
    // bound: the assertions below do not depend on it).
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !task.is_finished(),
        "the waiter returned while the key was held"
    );
    Ok((task, pid, client))
}

/// Ends the backend `pid` with `pg_terminate_backend`, through `admin`.
async fn terminate(admin: &PostgresAuthority, pid: i32) -> Result<bool> {
    sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .fetch_one(admin.pool())
        .await
        .or_fail(format!("terminate backend {pid}"))
}

/// `pg_terminate_backend` on the listener: the next release still reaches the waiter long before
/// the holder's TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_listener_is_replaced() -> Result {
    let server = start_server().await?;
    let admin = connect(&url(&server)).await?;
    admin.migrate().await.or_fail("migrate")?;
    let ttl = Duration::from_secs(20);
    let k = key("terminated-listener")?;
    let held = admin
        .try_acquire(&k, ttl)
        .await
        .or_fail("hold the key")?
        .or_fail("hold the key: a fresh key was held")?;
    let (waiter, pid, _client) = waiting(&server, &admin, &k, ttl).await?;
    let ended = terminate(&admin, pid).await?;
    assert!(ended);
    // A new listening backend appears.
    listener_pid_except(&admin, pid, ttl / 4).await?;
    let released_at = Instant::now();
    let _ = admin.release(&held).await.or_fail("release")?;
    let got = tokio::time::timeout(ttl / 4, waiter)
        .await
        .or_fail("the release did not reach the waiter within TTL/4")?
        .or_fail("the waiter's task")?
        .or_fail("the waiter")?;
    assert!(released_at.elapsed() < ttl / 4);
    let _ = admin.release(&got).await;
    Ok(())
}

/// While the listening connection is down and cannot come back (the database refuses new
/// connections), a waiter re-tries by timer: a release reaches it long before the holder's TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_retries_by_timer_while_its_listener_is_down() -> Result {
    let server = start_server().await?;
    let admin = connect(&url(&server)).await?;
    exec(&admin, "CREATE DATABASE waitdb").await?;
    let waitdb = format!(
        "postgres://leasehold@127.0.0.1:{}/waitdb?timeout_ms=1000",
        server.port()
    );
    let holder = connect(&waitdb).await?;
    holder.migrate().await.or_fail("migrate waitdb")?;
    let ttl = Duration::from_secs(20);
    let k = key("listener-down")?;
    let held = holder
        .try_acquire(&k, ttl)
        .await
        .or_fail("hold the key")?
        .or_fail("hold the key: a fresh key was held")?;
    let (waiter, pid, _client) = waiting_at(&waitdb, &admin, &k, ttl).await?;
    // Connections already open keep working; the listener cannot open a new one.
    exec(&admin, "ALTER DATABASE waitdb ALLOW_CONNECTIONS false").await?;
    let ended = terminate(&admin, pid).await?;
    assert!(ended);
    // Long after the loss was noticed (which wakes waiters once), the release.
    tokio::time::sleep(ttl / 20).await;
    let released_at = Instant::now();
    let _ = holder.release(&held).await.or_fail("release")?;
    let got = tokio::time::timeout(ttl / 8, waiter)
        .await
        .or_fail("the release did not reach the waiter within TTL/8")?
        .or_fail("the waiter's task")?
        .or_fail("the waiter")?;
    println!("hand-off {:?} after the release", released_at.elapsed());
    exec(&admin, "ALTER DATABASE waitdb ALLOW_CONNECTIONS true").await?;
    let _ = holder.release(&got).await;
    Ok(())
}

/// Stops (SIGCONT) a stopped backend when dropped, so a failing test leaves a usable server.
struct Stopped(i32);

impl Stopped {
    fn new(pid: i32) -> Result<Self> {
        signal(pid, "STOP")?;
        Ok(Stopped(pid))
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        if let Err(e) = signal(self.0, "CONT") {
            eprintln!("{e}");
        }
    }
}

fn signal(pid: i32, sig: &str) -> Result {
    let status = std::process::Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .or_fail(format!("run kill -{sig} {pid}"))?;
    assert!(status.success(), "kill -{sig} {pid}");
    Ok(())
}

/// A listening connection that goes silent (its backend frozen: what a NAT or load balancer
/// that dropped the flow looks like) is noticed by its health check, and the release reaches the
/// waiter long before the holder's TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_listener_is_noticed_and_replaced() -> Result {
    let server = start_server().await?;
    let admin = connect(&url(&server)).await?;
    admin.migrate().await.or_fail("migrate")?;
    let ttl = Duration::from_secs(20);
    let k = key("silent-listener")?;
    let held = admin
        .try_acquire(&k, ttl)
        .await
        .or_fail("hold the key")?
        .or_fail("hold the key: a fresh key was held")?;
    let (waiter, pid, _client) = waiting(&server, &admin, &k, ttl).await?;
    let frozen = Stopped::new(pid)?;
    let released_at = Instant::now();
    let _ = admin.release(&held).await.or_fail("release")?;
    let got = tokio::time::timeout(ttl / 4, waiter)
        .await
        .or_fail("the release did not reach the waiter within TTL/4")?
        .or_fail("the waiter's task")?
        .or_fail("the waiter")?;
    println!("hand-off {:?} after the release", released_at.elapsed());
    assert!(released_at.elapsed() < ttl / 4);
    // The waiter's listener moved to a new backend.
    listener_pid_except(&admin, pid, ttl / 4).await?;
    drop(frozen);
    let _ = admin.release(&got).await;
    Ok(())
}
