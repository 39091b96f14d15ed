//! `leasehold revoke`: an operator ends a `leasehold run`'s lease on Redis and PostgreSQL; the
//! run hears of it, stops its command and exits with the lost status, and the next holder's
//! fence is greater. A second revoke finds the key free. An operator the backend does not let
//! revoke (a Redis ACL user without `DEL`) gets the no-permission status, and the run keeps its
//! lease.

use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

mod common;

use common::{code, hold_script, leasehold, read_fence, redis, text, url, wait_for_file};
use common::{OrFail, Result};

/// A `leasehold run` holding `key` with a 3 s TTL until it is killed or loses the lease, and
/// the fence it was given (its command writes it to a file under `dir`).
fn hold(key: &str, url: &str, dir: &Path) -> Result<(Child, u64)> {
    let (fence_file, done) = (dir.join("fence"), dir.join("done"));
    let mut holder = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(["run", "--key", key, "--ttl", "3s", "--url", url])
        .env_remove("LEASEHOLD_URL")
        .args(["--", "sh", "-c", &hold_script(&fence_file, &done)])
        .spawn()
        .or_fail("start the holder")?;
    wait_for_file(&fence_file, &mut holder)?;
    let fence = read_fence(&fence_file)?;
    Ok((holder, fence))
}

/// Waits for `child` to exit, for at most `within`.
fn exit_within(child: &mut Child, within: Duration) -> Result<std::process::ExitStatus> {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().or_fail("look at the holder")? {
            return Ok(status);
        }
        if started.elapsed() > within {
            let _ = child.kill();
            return Err(format!("the revoked run did not exit within {within:?}").into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A run holds `key` with a 3 s TTL; `leasehold revoke` ends its lease and prints its fence;
/// the run exits 76 (lost) within a renewal period and a margin; a second revoke says the key
/// was free (exit 1); the next run's fence is greater than the revoked one's.
fn revoke_ends_a_run(url: &str, name: &str) -> Result {
    let dir = leasehold_servers::process::server_dir(name).or_fail("a scratch directory")?;
    let key = "job:revoke";
    let out = leasehold(&["revoke", "--key", key, "--url", url])?;
    assert_eq!(code(&out), 1, "a free key: {}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("was free"),
        "{}",
        text(&out)
    );

    let (mut holder, fence) = hold(key, url, dir.path())?;

    let out = leasehold(&["revoke", "--key", key, "--url", url])?;
    assert_eq!(code(&out), 0, "{}", text(&out));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains(&format!("revoked the lease with fence {fence} ")),
        "the holder's fence is {fence}: {}",
        text(&out)
    );
    let status = exit_within(&mut holder, Duration::from_secs(6))?;
    assert_eq!(
        status.code(),
        Some(76),
        "the revoked run must exit as lost: {status}"
    );

    let out = leasehold(&["revoke", "--key", key, "--url", url])?;
    assert_eq!(code(&out), 1, "revoked already: {}", text(&out));

    let next = dir.path().join("next");
    let out = leasehold(&[
        "run",
        "--key",
        key,
        "--url",
        url,
        "--",
        "sh",
        "-c",
        &format!("echo $LEASEHOLD_FENCE > {}", next.display()),
    ])?;
    assert_eq!(code(&out), 0, "{}", text(&out));
    let after = read_fence(&next)?;
    assert!(after > fence, "the next fence {after} is not above {fence}");
    Ok(())
}

#[test]
fn revoke_ends_a_run_on_redis() -> Result {
    let server = redis()?;
    revoke_ends_a_run(&url(&server), "cli-revoke-redis")
}

#[test]
fn revoke_ends_a_run_on_postgres() -> Result {
    let server = leasehold_servers::PostgresServer::start().or_fail("PostgreSQL must start")?;
    let url = format!("{}?timeout_ms=1000", server.url());
    let out = leasehold(&["migrate", "--url", &url])?;
    assert_eq!(code(&out), 0, "{}", text(&out));
    revoke_ends_a_run(&url, "cli-revoke-postgres")
}

/// On Redis, an operator whose ACL user may not `DEL` runs `leasehold revoke` on a key a run
/// holds: it exits 77 (no permission) without showing its password, and the run keeps its
/// lease through more than a TTL (so through its renewals), with the same fence. Granted `DEL`,
/// the same operator revokes it and the run exits as lost: the refusal was the permission's.
#[test]
fn revoke_without_the_grant_exits_77_and_the_run_keeps_its_lease_on_redis() -> Result {
    let server = redis()?;
    server
        .command(&[
            "ACL", "SETUSER", "ops", "on", ">ops-pw", "~*", "&*", "+@all", "-del",
        ])
        .or_fail("create the ACL user ops without DEL")?;
    let url = url(&server);
    let ops = format!(
        "redis://ops:ops-pw@127.0.0.1:{}?timeout_ms=1000",
        server.port()
    );
    let dir = leasehold_servers::process::server_dir("cli-revoke-noperm")
        .or_fail("a scratch directory")?;
    let key = "job:revoke-denied";
    let (mut holder, fence) = hold(key, &url, dir.path())?;

    let out = leasehold(&["revoke", "--key", key, "--url", &ops])?;
    assert_eq!(code(&out), 77, "a user without DEL: {}", text(&out));
    assert!(
        !text(&out).contains("ops-pw"),
        "the refusal shows the password: {}",
        text(&out)
    );

    // Longer than the TTL: had the lease ended, a renewal in this time would have failed.
    std::thread::sleep(Duration::from_secs(4));
    if let Some(status) = holder.try_wait().or_fail("look at the holder")? {
        return Err(format!("the holder exited ({status}) after a refused revoke").into());
    }
    let out = leasehold(&["status", "--key", key, "--url", &url])?;
    assert_eq!(code(&out), 1, "held: {}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&format!("fence {fence},")),
        "still the holder's fence {fence}: {}",
        text(&out)
    );

    server
        .command(&["ACL", "SETUSER", "ops", "+del"])
        .or_fail("grant ops DEL")?;
    let out = leasehold(&["revoke", "--key", key, "--url", &ops])?;
    assert_eq!(code(&out), 0, "granted DEL: {}", text(&out));
    let status = exit_within(&mut holder, Duration::from_secs(6))?;
    assert_eq!(
        status.code(),
        Some(76),
        "the revoked run must exit as lost: {status}"
    );
    Ok(())
}

#[test]
fn revoke_needs_a_key() -> Result {
    let out = leasehold(&["revoke"])?;
    assert_eq!(code(&out), 64, "{}", text(&out));
    Ok(())
}
