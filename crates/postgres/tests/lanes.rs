//! The lanes of the PostgreSQL authority (its connections for lease statements) when the
//! server behind one goes silent, frozen with SIGSTOP: what a primary moved behind a virtual IP
//! without a reset, or a flow a NAT dropped, looks like from the client. Against a real server
//! started by the harness.

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{Authority, Grant, Instant, LockKey, Released};
use leasehold_postgres::PostgresAuthority;
use leasehold_servers::PostgresServer;

mod common;

use common::{start, url};

type Result<T = (), E = String> = std::result::Result<T, E>;

fn key(name: &str) -> Result<LockKey> {
    LockKey::new(name).map_err(|e| format!("key {name}: {e}"))
}

/// Leases of `key` that are live by the database's clock.
async fn live_rows(admin: &PostgresAuthority, key: &LockKey) -> Result<i64> {
    sqlx::query_scalar(
        "SELECT count(*) FROM leasehold_leases WHERE lock_key = $1 AND expires_at > statement_timestamp()",
    )
    .bind(key.as_str())
    .fetch_one(admin.pool())
    .await
    .map_err(|e| format!("counting live leases of {key}: {e}"))
}

/// Continues (SIGCONT) a stopped backend when dropped, so a failing test leaves a usable server.
struct Stopped(i32);

impl Stopped {
    fn new(pid: i32) -> Result<Self> {
        signal(pid, "STOP")?;
        Ok(Stopped(pid))
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = signal(self.0, "CONT");
    }
}

fn signal(pid: i32, sig: &str) -> Result {
    let status = std::process::Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .map_err(|e| format!("kill -{sig} {pid}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("kill -{sig} {pid}: {status}"))
    }
}

/// The backend serving the one lane of the authority connected as `application_name`: the
/// client backend whose last statement was a lease statement (its pool's connection last ran
/// the settings query at connect).
async fn lane_backend(admin: &PostgresAuthority, application_name: &str) -> Result<i32, String> {
    sqlx::query_scalar(
        "SELECT pid FROM pg_stat_activity WHERE application_name = $1 \
           AND query LIKE '%leasehold_leases%' ORDER BY backend_start DESC LIMIT 1",
    )
    .bind(application_name)
    .fetch_optional(admin.pool())
    .await
    .map_err(|e| format!("reading pg_stat_activity: {e}"))?
    .ok_or_else(|| format!("no backend of {application_name} ran a lease statement"))
}

/// An authority with one lane (`pool_size=1`) and the request timeout `timeout`, holding one
/// lease of `ttl` on `held`, whose lane's backend is then frozen.
struct FrozenLane {
    _server: Arc<PostgresServer>,
    admin: PostgresAuthority,
    authority: PostgresAuthority,
    app: &'static str,
    held: Grant,
    pid: i32,
    frozen: std::sync::Mutex<Option<Stopped>>,
}

impl FrozenLane {
    async fn start(
        app: &'static str,
        timeout: Duration,
        ttl: Duration,
        held: &str,
    ) -> Result<Self> {
        let server = start().await;
        let admin = PostgresAuthority::connect(&url(&server))
            .await
            .map_err(|e| format!("connect the admin: {e}"))?;
        admin.migrate().await.map_err(|e| format!("migrate: {e}"))?;
        let authority = PostgresAuthority::connect(&format!(
            "{}?pool_size=1&timeout_ms={}&application_name={app}",
            server.url(),
            timeout.as_millis()
        ))
        .await
        .map_err(|e| format!("connect: {e}"))?;
        let held = authority
            .try_acquire(&key(held)?, ttl)
            .await
            .map_err(|e| format!("the first acquisition: {e}"))?
            .ok_or("the first key was held")?;
        let pid = lane_backend(&admin, app).await?;
        let frozen = std::sync::Mutex::new(Some(Stopped::new(pid)?));
        Ok(FrozenLane {
            _server: server,
            admin,
            authority,
            app,
            held,
            pid,
            frozen,
        })
    }

    /// Continues the frozen backend.
    fn wake(&self) {
        if let Ok(mut frozen) = self.frozen.lock() {
            frozen.take();
        }
    }

    /// Releases the first lease; `want` is what the release must find.
    async fn release_held(&self, want: Released) -> Result {
        let released = self
            .authority
            .release(&self.held)
            .await
            .map_err(|e| format!("releasing the first lease: {e}"))?;
        if released != want {
            return Err(format!("the first lease: {released:?}, not {want:?}"));
        }
        Ok(())
    }
}

/// One lane whose backend goes silent (frozen with SIGSTOP: what a primary moved behind a
/// virtual IP without a reset looks like from here) must not stall the authority: the
/// statement sent on it gets no answer within the request timeout, and every later statement
/// reaches a fresh connection, instead of queueing behind the lost reply until TCP gives up.
/// With `pool_size=1` this also shows that the abandoned acquisition (its caller timed out,
/// its statement may still take the key) does not keep the only lane while it waits for its
/// answer; and when the backend wakes, the lease that statement took for nobody is given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_lane_is_given_up_and_later_statements_connect_afresh() -> Result {
    let timeout = Duration::from_millis(300);
    let ttl = Duration::from_secs(10);
    let lane = FrozenLane::start("silent-lane", timeout, ttl, "silent/held").await?;
    let (a, admin) = (&lane.authority, &lane.admin);
    let mut failed = Vec::new();
    for i in 0..5 {
        let k = key(&format!("silent/other{i}"))?;
        let started = Instant::now();
        let outcome = a.try_acquire(&k, ttl).await;
        let took = started.elapsed();
        println!(
            "try {i}: {:?} after {took:?}",
            outcome.as_ref().map(Option::is_some)
        );
        // Every answer, a grant or an error, comes within the request timeout (plus the
        // time a fresh connection takes, which is part of the same bound's slack of one
        // more timeout).
        if took > timeout * 2 {
            return Err(format!(
                "try {i} took {took:?}, more than twice the timeout"
            ));
        }
        match outcome {
            Ok(Some(_)) => {}
            Ok(None) => return Err(format!("try {i}: {k} was held by nobody yet")),
            Err(e) if e.is_retryable() => failed.push(format!("try {i}: {e}")),
            Err(e) => return Err(format!("try {i}: a permanent error: {e}")),
        }
    }
    // Only the statement already sent on the silent connection can go unanswered: nothing
    // tells a frozen backend from a slow one before the timeout.
    if failed.len() > 1 {
        return Err(format!(
            "{} of 5 tries failed behind the silent lane: {failed:?}",
            failed.len()
        ));
    }
    if lane_backend(admin, lane.app).await? == lane.pid {
        return Err("the lane still uses the silent backend".into());
    }
    lane.wake();
    // The first try's statement lands now that its backend runs again, taking its key for
    // nobody; it is given back, not kept for the TTL.
    if !failed.is_empty() {
        let k = key("silent/other0")?;
        let started = Instant::now();
        while live_rows(admin, &k).await? > 0 {
            if started.elapsed() > ttl / 4 {
                return Err("the abandoned acquisition's lease was not given back".into());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    lane.release_held(Released::Released).await
}

/// An acquisition whose caller gave up waits for its statement's answer on its own connection
/// (to give back a lease it may have taken) only until the TTL, counted from the caller's
/// deadline, has passed: then that connection is closed. Seen from the server: a backend
/// frozen for longer finds its client gone when it wakes, and exits; the lease its statement
/// took for nobody ends at its TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_acquisition_closes_its_connection_after_the_ttl() -> Result {
    let timeout = Duration::from_millis(300);
    let ttl = Duration::from_secs(1);
    let lane = FrozenLane::start("abandoned-acquisition", timeout, ttl, "abandoned/first").await?;
    let (a, admin, pid) = (&lane.authority, &lane.admin, lane.pid);
    let k = key("abandoned/late")?;
    let sent = Instant::now();
    match a.try_acquire(&k, ttl).await {
        Err(e) if e.is_retryable() => {}
        other => return Err(format!("an acquisition on a frozen backend: {other:?}")),
    }
    // Past the bound (the caller's deadline plus the TTL) with the backend still frozen.
    let bound = timeout + ttl.max(timeout);
    tokio::time::sleep_until(sent + bound + timeout).await;
    lane.wake();
    let woke = Instant::now();
    loop {
        let alive: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)")
                .bind(pid)
                .fetch_one(admin.pool())
                .await
                .map_err(|e| format!("reading pg_stat_activity: {e}"))?;
        if !alive {
            break;
        }
        if woke.elapsed() > ttl {
            return Err(format!(
                "the frozen backend still has its client {:?} after it woke",
                woke.elapsed()
            ));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Its connection was closed at the bound, so nobody read the late statement's answer and
    // nothing gave its lease back: the row is still live. (A connection still open would have
    // read the grant and given it back at once.)
    if live_rows(admin, &k).await? == 0 {
        return Err(
            "the late statement's lease was given back: its answer was read, so its connection \
             was still open past the bound"
                .into(),
        );
    }
    // Whatever the late statement took ends at its TTL.
    while live_rows(admin, &k).await? > 0 {
        if woke.elapsed() > ttl * 2 {
            return Err("the late statement's lease outlived its TTL".into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The first lease ran out meanwhile (nothing renewed it): its release finds it gone.
    lane.release_held(Released::AlreadyGone).await
}

/// A lane idle for a second is pinged before its next statement. When its backend went silent
/// meanwhile, the ping gives up within half the caller's time and the statement goes to a
/// fresh connection: with the lane idle, all five `try_acquire` after the freeze hold their
/// keys, each within the request timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_silent_lane_is_replaced_before_its_statement() -> Result {
    // The ping gets half of it; a fresh connection (a forked backend, authenticated) and the
    // statement must fit in the other half on a loaded machine.
    let timeout = Duration::from_millis(1000);
    let ttl = Duration::from_secs(10);
    let lane = FrozenLane::start("idle-silent-lane", timeout, ttl, "idle-silent/held").await?;
    let a = &lane.authority;
    // The lane is pinged before use once idle for a second (docs/postgres.md, "Lanes").
    tokio::time::sleep(Duration::from_secs(1)).await;
    for i in 0..5 {
        let k = key(&format!("idle-silent/other{i}"))?;
        let started = Instant::now();
        let outcome = a.try_acquire(&k, ttl).await;
        let took = started.elapsed();
        match outcome {
            Ok(Some(_)) if took <= timeout => {}
            other => return Err(format!("try {i} after {took:?}: {other:?}")),
        }
    }
    if lane_backend(&lane.admin, lane.app).await? == lane.pid {
        return Err("the lane still uses the silent backend".into());
    }
    lane.wake();
    lane.release_held(Released::Released).await
}
