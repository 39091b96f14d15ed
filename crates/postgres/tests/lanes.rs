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

use common::{connect, key, start_server, url, Failure, OrFail, Result};

/// Leases of `key` that are live by the database's clock.
async fn live_rows(admin: &PostgresAuthority, key: &LockKey) -> Result<i64> {
    sqlx::query_scalar(
        "SELECT count(*) FROM leasehold_leases WHERE lock_key = $1 AND expires_at > statement_timestamp()",
    )
    .bind(key.as_str())
    .fetch_one(admin.pool())
    .await
    .or_fail(format!("counting live leases of {key}"))
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
        .or_fail(format!("kill -{sig} {pid}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(Failure::from(format!("kill -{sig} {pid}: {status}")))
    }
}

/// The backend serving the one lane of the authority connected as `application_name`: the
/// client backend whose last statement was a lease statement (its pool's connection last ran
/// the settings query at connect).
async fn lane_backend(admin: &PostgresAuthority, application_name: &str) -> Result<i32> {
    sqlx::query_scalar(
        "SELECT pid FROM pg_stat_activity WHERE application_name = $1 \
           AND query LIKE '%leasehold_leases%' ORDER BY backend_start DESC LIMIT 1",
    )
    .bind(application_name)
    .fetch_optional(admin.pool())
    .await
    .or_fail("reading pg_stat_activity")?
    .or_fail(format!(
        "a backend of {application_name} that ran a lease statement"
    ))
}

/// Whether the server still has the backend `pid`.
async fn lane_backend_alive(admin: &PostgresAuthority, pid: i32) -> Result<bool> {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)")
        .bind(pid)
        .fetch_one(admin.pool())
        .await
        .or_fail("reading pg_stat_activity")
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
        let server = start_server().await?;
        let admin = connect(&url(&server)).await?;
        admin.migrate().await.or_fail("migrate")?;
        let authority = connect(&format!(
            "{}?pool_size=1&timeout_ms={}&application_name={app}",
            server.url(),
            timeout.as_millis()
        ))
        .await?;
        let held = authority
            .try_acquire(&key(held)?, ttl)
            .await
            .or_fail("the first acquisition")?
            .or_fail("the first key free")?;
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
            .or_fail("releasing the first lease")?;
        if released != want {
            return Err(Failure::from(format!(
                "the first lease: {released:?}, not {want:?}"
            )));
        }
        Ok(())
    }
}

/// One lane whose backend goes silent (frozen with SIGSTOP: what a primary moved behind a
/// virtual IP without a reset looks like from here) must not stall the authority: all five
/// `try_acquire` after the freeze hold their keys, each within the request timeout. The first
/// one's statement is already on the silent connection, and nothing tells a frozen backend
/// from a slow one: after half its time it is sent again, with the same owner token, on a
/// fresh connection; later statements find the lane connected afresh. With `pool_size=1` this
/// also shows that the abandoned statement does not keep the only lane while it waits for its
/// answer; and when the backend wakes, that statement lands on a key its own retry holds and
/// changes nothing: the retry's lease renews and releases as a lease should.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_lane_is_given_up_and_later_statements_connect_afresh() -> Result {
    let timeout = Duration::from_millis(300);
    let ttl = Duration::from_secs(10);
    let lane = FrozenLane::start("silent-lane", timeout, ttl, "silent/held").await?;
    let (a, admin) = (&lane.authority, &lane.admin);
    let mut grants = Vec::new();
    for i in 0..5 {
        let k = key(&format!("silent/other{i}"))?;
        let started = Instant::now();
        let outcome = a.try_acquire(&k, ttl).await;
        let took = started.elapsed();
        // Every answer comes within the request timeout (the bound every call keeps), plus
        // scheduling slack on a loaded machine.
        if took > timeout + timeout / 2 {
            return Err(Failure::from(format!(
                "try {i} took {took:?}, past the timeout {timeout:?}"
            )));
        }
        match outcome {
            Ok(Some(grant)) => grants.push(grant),
            Ok(None) => {
                return Err(Failure::from(format!(
                    "try {i}: {k} was held by nobody yet"
                )))
            }
            Err(e) => {
                return Err(Failure::from(format!(
                    "try {i} failed behind the silent lane: {e}"
                )))
            }
        }
    }
    if lane_backend(admin, lane.app).await? == lane.pid {
        return Err("the lane still uses the silent backend".into());
    }
    lane.wake();
    // The first try's abandoned statement lands now that its backend runs again, or its
    // connection is found closed: either way it must leave the retry's lease alone.
    let k = key("silent/other0")?;
    let landed = Instant::now();
    while lane_backend_alive(admin, lane.pid).await? {
        if landed.elapsed() > ttl / 2 {
            return Err("the woken backend kept its abandoned statement's connection".into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    if live_rows(admin, &k).await? != 1 {
        return Err(Failure::from(format!(
            "{k} is not held after the abandoned statement landed"
        )));
    }
    for grant in &grants {
        a.renew(grant, ttl)
            .await
            .or_fail(format!("renewing {} after the wake", grant.key()))?;
        match a.release(grant).await {
            Ok(Released::Released) => {}
            other => {
                return Err(Failure::from(format!(
                    "releasing {}: {other:?}",
                    grant.key()
                )))
            }
        }
    }
    lane.release_held(Released::Released).await
}

/// An acquisition statement abandoned on a silent connection (its acquisition was sent again
/// on a fresh one, and took the key) waits for its answer on its own connection (to give back
/// a lease it may have taken) only until the TTL, counted from the caller's deadline, has
/// passed: then that connection is closed. Seen from the server: a backend frozen for longer
/// finds its client gone when it wakes, and exits; the lease its statement took for nobody
/// (the retry's lease has run out by then) ends at its TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_acquisition_closes_its_connection_after_the_ttl() -> Result {
    let timeout = Duration::from_millis(300);
    let ttl = Duration::from_secs(1);
    let lane = FrozenLane::start("abandoned-acquisition", timeout, ttl, "abandoned/first").await?;
    let (a, admin, pid) = (&lane.authority, &lane.admin, lane.pid);
    let k = key("abandoned/late")?;
    let sent = Instant::now();
    let retried = match a.try_acquire(&k, ttl).await {
        Ok(Some(grant)) => grant,
        other => {
            return Err(Failure::from(format!(
                "an acquisition behind a frozen backend: {other:?}"
            )))
        }
    };
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
                .or_fail("reading pg_stat_activity")?;
        if !alive {
            break;
        }
        if woke.elapsed() > ttl {
            return Err(Failure::from(format!(
                "the frozen backend still has its client {:?} after it woke",
                woke.elapsed()
            )));
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
    // The retry's lease and the first one ran out meanwhile (nothing renewed them): their
    // releases find them gone.
    match a.release(&retried).await {
        Ok(Released::AlreadyGone) => {}
        other => {
            return Err(Failure::from(format!(
                "releasing the retry's lease: {other:?}"
            )))
        }
    }
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
    // The lane is pinged before use once idle for a second (docs/design/postgres.md, "Lanes").
    tokio::time::sleep(Duration::from_secs(1)).await;
    for i in 0..5 {
        let k = key(&format!("idle-silent/other{i}"))?;
        let started = Instant::now();
        let outcome = a.try_acquire(&k, ttl).await;
        let took = started.elapsed();
        match outcome {
            Ok(Some(_)) if took <= timeout => {}
            other => return Err(Failure::from(format!("try {i} after {took:?}: {other:?}"))),
        }
    }
    if lane_backend(&lane.admin, lane.app).await? == lane.pid {
        return Err("the lane still uses the silent backend".into());
    }
    lane.wake();
    lane.release_held(Released::Released).await
}

/// An acquisition statement the server answers only after half the request timeout is sent
/// again, with the same owner token, on another connection, and the two race; here the first
/// statement takes the key before the second runs (a trigger makes its commit slow), so the
/// second finds the key held by its own owner token and must report that same grant, leaving
/// it as it is. Both answers then name one grant: the one that loses the race must not be
/// given back, or the caller's lease ends under it (a second statement that raised the fence,
/// or a give-back that ignored which grant the caller got, both fail here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_acquisition_sent_again_takes_the_key_once() -> Result {
    let timeout = Duration::from_millis(1000);
    let ttl = Duration::from_secs(10);
    let server = start_server().await?;
    let admin = PostgresAuthority::connect(&url(&server))
        .await
        .or_fail("connect the admin")?;
    admin.migrate().await.or_fail("migrate")?;
    // Only the key's first grant (fence 1) is slow: 0.7 of the timeout, past the half at
    // which the acquisition is sent again, and before the timeout.
    let slow = "slow-commit/first";
    for statement in [
        "CREATE OR REPLACE FUNCTION slow_first_grant() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN PERFORM pg_sleep(0.7); RETURN NULL; END $$"
            .to_string(),
        format!(
            "CREATE TRIGGER slow_first_grant AFTER INSERT ON leasehold_leases FOR EACH ROW \
             WHEN (NEW.lock_key = '{slow}') EXECUTE FUNCTION slow_first_grant()"
        ),
    ] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
            .execute(admin.pool())
            .await
            .or_fail("making the first grant slow")?;
    }
    let authority = PostgresAuthority::connect(&format!(
        "{}?timeout_ms={}&application_name=slow-commit",
        server.url(),
        timeout.as_millis()
    ))
    .await
    .or_fail("connect")?;
    let k = key(slow)?;
    let started = Instant::now();
    let grant = match authority.try_acquire(&k, ttl).await {
        Ok(Some(grant)) => grant,
        other => {
            return Err(Failure::from(format!(
                "the slow acquisition after {:?}: {other:?}",
                started.elapsed()
            )))
        }
    };
    // The first statement's answer has come by now (its connection was never silent) and its
    // grant was given back, by a fence that is no longer the key's.
    tokio::time::sleep(timeout / 2).await;
    if live_rows(&admin, &k).await? != 1 {
        return Err("the first statement's give-back ended the caller's lease".into());
    }
    authority
        .renew(&grant, ttl)
        .await
        .or_fail("renewing the slow acquisition's lease")?;
    match authority.release(&grant).await {
        Ok(Released::Released) => Ok(()),
        other => Err(Failure::from(format!(
            "releasing the slow acquisition's lease: {other:?}"
        ))),
    }
}
