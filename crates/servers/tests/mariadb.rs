//! The MariaDB harness against a real `mariadbd`: it serves the URL's user over TCP, keeps a
//! committed row across a SIGKILL and restart, stops answering while paused, refuses a wrong
//! password, and an asynchronous replica follows its primary and takes writes once promoted.

use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use leasehold_servers::mariadb::{MARIADB_DATABASE, MARIADB_USER};
use leasehold_servers::MariaDbServer;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// One server for the tests that fault it, taken in turn (a kill must not meet another test's
/// query).
fn shared() -> Result<MutexGuard<'static, MariaDbServer>, String> {
    static SERVER: OnceLock<Result<Mutex<MariaDbServer>, String>> = OnceLock::new();
    let server = SERVER.get_or_init(|| {
        MariaDbServer::start()
            .map(Mutex::new)
            .map_err(|e| format!("MariaDB must start for these tests: {e}"))
    });
    match server {
        Ok(server) => Ok(server.lock().unwrap_or_else(|e| e.into_inner())),
        Err(e) => Err(e.clone()),
    }
}

#[test]
fn starts_and_answers_select_version_as_the_url_user_over_tcp() -> TestResult {
    let server = shared()?;
    let version = server.user_command(None, "SELECT VERSION()")?;
    assert!(
        version.contains("MariaDB"),
        "SELECT VERSION() over TCP answered {version:?}"
    );
    assert_eq!(server.version()?, version, "root and the URL user disagree");
    let whoami = server.user_command(None, "SELECT CURRENT_USER(), DATABASE()")?;
    assert_eq!(
        whoami,
        format!("{MARIADB_USER}@127.0.0.1\t{MARIADB_DATABASE}"),
        "the URL's user and database"
    );
    assert_eq!(
        server.url(),
        format!(
            "mysql://{MARIADB_USER}@127.0.0.1:{}/{MARIADB_DATABASE}",
            server.port()
        )
    );
    Ok(())
}

#[test]
fn a_committed_row_survives_kill_and_restart() -> TestResult {
    let server = shared()?;
    server.user_command(
        None,
        "CREATE TABLE IF NOT EXISTS durable (id INT PRIMARY KEY, note TEXT) ENGINE=InnoDB; \
         REPLACE INTO durable VALUES (1, 'before the crash');",
    )?;
    let pid = server
        .pid()
        .ok_or("the server has no pid before the kill")?;
    server.kill()?;
    assert_eq!(server.pid(), None, "the killed server still has a pid");
    assert!(
        server.user_command(None, "SELECT 1").is_err(),
        "a killed server answered"
    );
    server.restart()?;
    assert_ne!(server.pid(), Some(pid), "the restart kept the old process");
    let note = server.user_command(None, "SELECT note FROM durable WHERE id = 1")?;
    assert_eq!(note, "before the crash", "the row after crash recovery");
    Ok(())
}

#[test]
fn a_paused_server_times_a_client_out_and_serves_again_on_resume() -> TestResult {
    let server = shared()?;
    server.pause()?;
    let started = Instant::now();
    let paused = server.command_with_timeout("SELECT 1", Duration::from_millis(700));
    let waited = started.elapsed();
    server.resume()?;
    let error = match paused {
        Ok(answer) => return Err(format!("a paused server answered {answer:?}").into()),
        Err(e) => e.to_string(),
    };
    assert!(error.contains("no answer within"), "{error}");
    assert!(
        waited >= Duration::from_millis(700),
        "gave up after {waited:?}"
    );
    assert_eq!(server.command("SELECT 41 + 1")?, "42", "after resume");
    Ok(())
}

#[test]
fn a_wrong_password_is_refused_and_the_right_one_accepted() -> TestResult {
    let server = MariaDbServer::start_with_password("s3cret 'quoted'")?;
    let refused = server.user_command(Some("wrong"), "SELECT 1");
    let error = match refused {
        Ok(answer) => return Err(format!("a wrong password was accepted: {answer:?}").into()),
        Err(e) => e.to_string(),
    };
    assert!(
        error.contains("1045"),
        "not an access-denied error: {error}"
    );
    assert!(
        server.user_command(None, "SELECT 1").is_err(),
        "no password was accepted"
    );
    assert_eq!(
        server.user_command(Some("s3cret 'quoted'"), "SELECT 1")?,
        "1"
    );
    assert!(
        server.url().contains(":s3cret%20%27quoted%27@127.0.0.1:"),
        "the URL carries the encoded password: {}",
        server.url()
    );
    Ok(())
}

#[test]
fn a_replica_follows_its_primary_and_takes_writes_once_promoted() -> TestResult {
    let primary = MariaDbServer::start()?;
    primary.user_command(
        None,
        "CREATE TABLE fences (name VARCHAR(64) PRIMARY KEY, fence BIGINT NOT NULL); \
         INSERT INTO fences VALUES ('before-replica', 1);",
    )?;
    let replica = MariaDbServer::start_replica_of(&primary)?;
    assert_eq!(replica.primary_port(), Some(primary.port()));
    primary.user_command(None, "INSERT INTO fences VALUES ('after-replica', 2)")?;
    replica.wait_caught_up(Duration::from_secs(10))?;
    let rows = replica.user_command(None, "SELECT name, fence FROM fences ORDER BY fence")?;
    assert_eq!(
        rows, "before-replica\t1\nafter-replica\t2",
        "the replica's rows"
    );
    // A crashed replica comes back replicating and read-only.
    replica.kill()?;
    primary.user_command(None, "INSERT INTO fences VALUES ('while-replica-down', 2)")?;
    replica.restart()?;
    replica.wait_caught_up(Duration::from_secs(10))?;
    let rows = replica.user_command(None, "SELECT COUNT(*) FROM fences")?;
    assert_eq!(rows, "3", "the restarted replica's row count");
    let refused = replica.user_command(None, "INSERT INTO fences VALUES ('on-replica', 3)");
    assert!(
        refused
            .as_ref()
            .is_err_and(|e| e.to_string().contains("1290")),
        "a replica took a write from the URL user: {refused:?}"
    );

    primary.kill()?;
    replica.promote()?;
    assert_eq!(replica.primary_port(), None);
    assert!(
        replica.replication_status()?.is_empty(),
        "the promoted server still replicates"
    );
    replica.user_command(None, "INSERT INTO fences VALUES ('after-failover', 3)")?;
    let fences = replica.user_command(None, "SELECT COUNT(*), MAX(fence) FROM fences")?;
    assert_eq!(fences, "4\t3", "the promoted replica's rows");
    Ok(())
}

#[test]
fn a_replica_promoted_while_its_primary_is_paused_takes_writes() -> TestResult {
    let primary = MariaDbServer::start()?;
    primary.user_command(
        None,
        "CREATE TABLE counter (n INT); INSERT INTO counter VALUES (1);",
    )?;
    let replica = MariaDbServer::start_replica_of(&primary)?;
    replica.wait_caught_up(Duration::from_secs(10))?;
    // The replica's connection to the primary hangs rather than breaks: promoting must not wait
    // for it.
    primary.pause()?;
    let started = Instant::now();
    let promoted = replica.promote();
    let took = started.elapsed();
    primary.resume()?;
    promoted?;
    assert!(took < Duration::from_secs(10), "promote took {took:?}");
    replica.user_command(None, "UPDATE counter SET n = n + 1")?;
    assert_eq!(replica.user_command(None, "SELECT n FROM counter")?, "2");
    Ok(())
}

#[test]
fn a_semi_sync_primary_waits_for_its_replica_and_falls_back_when_it_hangs() -> TestResult {
    let primary = MariaDbServer::start()?;
    let ack_timeout = Duration::from_millis(600);
    let replica = MariaDbServer::start_semi_sync_replica_of(&primary, ack_timeout)?;
    assert!(primary.semi_sync_active()?, "semi-sync is not active");
    primary.user_command(
        None,
        "CREATE TABLE acked (n INT); INSERT INTO acked VALUES (1);",
    )?;
    // An acknowledged commit is on the replica (received; applied soon after).
    replica.wait_caught_up(Duration::from_secs(10))?;
    assert_eq!(replica.user_command(None, "SELECT n FROM acked")?, "1");

    replica.pause()?;
    let started = Instant::now();
    let write = primary.user_command(None, "INSERT INTO acked VALUES (2)");
    let took = started.elapsed();
    let active = primary.semi_sync_active();
    replica.resume()?;
    write?;
    assert!(
        took >= ack_timeout,
        "a commit returned after {took:?} without the hung replica's acknowledgement"
    );
    assert!(
        !active?,
        "the primary still claims semi-sync after a timed-out acknowledgement"
    );

    // A crashed primary comes back semi-synchronous once its replica reconnects.
    primary.kill()?;
    primary.restart()?;
    let deadline = Instant::now() + Duration::from_secs(15);
    while !primary.semi_sync_active()? {
        if Instant::now() >= deadline {
            return Err("the restarted primary is not semi-synchronous again".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}
