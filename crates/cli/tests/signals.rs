//! `leasehold run` killed or hung up on, against a real Redis started by the harness: the
//! command, and what it started in the background, never outlive their lease holder, and a
//! hang-up releases the lease.

use std::process::Command;
use std::time::{Duration, Instant};

mod common;

use common::{code, leasehold, redis, text, url, OrFail, Result};

/// A child that appends a line to `file` every 50 ms, and writes its pid to `pid` first.
fn writer_script(file: &std::path::Path, pid: &std::path::Path) -> String {
    format!(
        "echo $$ > {pid}; while :; do echo x >> {file}; sleep 0.05; done",
        pid = pid.display(),
        file = file.display()
    )
}

fn size(file: &std::path::Path) -> u64 {
    std::fs::metadata(file).map(|m| m.len()).unwrap_or(0)
}

/// Waits until `file` grows, then returns.
fn wait_for_growth(file: &std::path::Path, run: &mut std::process::Child) -> Result {
    let started = Instant::now();
    let first = loop {
        let n = size(file);
        if n > 0 {
            break n;
        }
        if let Some(status) = run.try_wait().or_fail("look at leasehold")? {
            return Err(format!("leasehold exited ({status}) before its command wrote").into());
        }
        assert!(started.elapsed() < Duration::from_secs(20), "no writes");
        std::thread::sleep(Duration::from_millis(20));
    };
    while size(file) == first {
        assert!(started.elapsed() < Duration::from_secs(20), "no growth");
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// After the holder is gone, the file must stop growing before the lease could pass to someone
/// else (the TTL after the holder's last renewal): returns when it last grew, counted from
/// `since`, after watching it stand still for ten write intervals.
fn last_growth_after(file: &std::path::Path, since: Instant, ttl: Duration) -> Duration {
    let mut last = size(file);
    let mut grew = Duration::ZERO;
    let mut still = Instant::now();
    while still.elapsed() < Duration::from_millis(500) {
        std::thread::sleep(Duration::from_millis(25));
        let n = size(file);
        if n != last {
            last = n;
            grew = since.elapsed();
            still = Instant::now();
        }
        if since.elapsed() > ttl * 3 {
            break;
        }
    }
    grew
}

fn kill_pid_file(pid: &std::path::Path) {
    if let Ok(pid) = std::fs::read_to_string(pid) {
        let _ = Command::new("kill").args(["-KILL", pid.trim()]).status();
    }
}

/// The command must never outlive its lease holder. `kill -9` of `leasehold` leaves
/// nobody to renew the lease or stop the command, so the command gets the parent-death signal:
/// it stops at once, long before the lease (TTL 2 s) could pass to another holder.
#[test]
fn sigkill_of_leasehold_stops_the_command() -> Result {
    let server = redis()?;
    let url = url(&server);
    let dir =
        leasehold_servers::process::server_dir("cli-pdeath").or_fail("a scratch directory")?;
    let (file, pid) = (dir.path().join("out"), dir.path().join("pid"));
    let ttl = Duration::from_secs(2);
    let mut run = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args([
            "run",
            "--url",
            &url,
            "--key",
            "job:kill9",
            "--ttl",
            "2s",
            "--",
        ])
        .args(["sh", "-c", &writer_script(&file, &pid)])
        .env_remove("LEASEHOLD_URL")
        .spawn()
        .or_fail("start the run")?;
    wait_for_growth(&file, &mut run)?;
    run.kill().or_fail("kill leasehold")?;
    let killed = Instant::now();
    let _ = run.wait();
    let grew = last_growth_after(&file, killed, ttl);
    kill_pid_file(&pid);
    assert!(
        grew < ttl / 2,
        "the command kept writing {grew:?} after leasehold was killed (TTL {ttl:?})"
    );
    Ok(())
}

/// SIGHUP (a closed terminal, a dropped ssh session) is handled as SIGTERM: the command is
/// stopped, the lease released, and `leasehold` exits 128+1.
#[test]
fn sighup_of_leasehold_stops_the_command_and_releases_the_lease() -> Result {
    let server = redis()?;
    let url = url(&server);
    let dir = leasehold_servers::process::server_dir("cli-hup").or_fail("a scratch directory")?;
    let (file, pid) = (dir.path().join("out"), dir.path().join("pid"));
    let ttl = Duration::from_secs(30);
    let mut run = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args([
            "run", "--url", &url, "--key", "job:hup", "--ttl", "30s", "--grace", "1s", "--",
        ])
        .args(["sh", "-c", &writer_script(&file, &pid)])
        .env_remove("LEASEHOLD_URL")
        .spawn()
        .or_fail("start the run")?;
    wait_for_growth(&file, &mut run)?;
    let status = Command::new("kill")
        .args(["-HUP", &run.id().to_string()])
        .status()
        .or_fail("run kill -HUP")?;
    assert!(status.success());
    let hung_up = Instant::now();
    let exit = run.wait().or_fail("wait for leasehold")?;
    let grew = last_growth_after(&file, hung_up, ttl);
    kill_pid_file(&pid);
    assert_eq!(exit.code(), Some(128 + 1), "{exit}");
    assert!(grew < Duration::from_secs(2), "kept writing for {grew:?}");
    // Released: the next run gets the key at once (no 30 s wait for the TTL).
    let next = leasehold(&["run", "--url", &url, "--key", "job:hup", "--", "true"])?;
    assert_eq!(code(&next), 0, "{}", text(&next));
    Ok(())
}

/// The parent-death signal reaches only the command itself; what the command started in the
/// background must stop too when `leasehold` is killed with -9: the whole process group goes.
#[test]
fn sigkill_of_leasehold_stops_the_commands_background_processes_too() -> Result {
    let server = redis()?;
    let url = url(&server);
    let dir = leasehold_servers::process::server_dir("cli-pdeath-group")
        .or_fail("a scratch directory")?;
    let (file, pid) = (dir.path().join("out"), dir.path().join("pid"));
    let ttl = Duration::from_secs(2);
    // The writer is a background subshell: a grandchild of leasehold.
    let script = format!("sh -c '{}' & wait", writer_script(&file, &pid));
    let mut run = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args([
            "run",
            "--url",
            &url,
            "--key",
            "job:kill9g",
            "--ttl",
            "2s",
            "--",
        ])
        .args(["sh", "-c", &script])
        .env_remove("LEASEHOLD_URL")
        .spawn()
        .or_fail("start the run")?;
    wait_for_growth(&file, &mut run)?;
    run.kill().or_fail("kill leasehold")?;
    let killed = Instant::now();
    let _ = run.wait();
    let grew = last_growth_after(&file, killed, ttl);
    kill_pid_file(&pid);
    assert!(
        grew < ttl / 2,
        "the background writer kept writing {grew:?} after leasehold was killed (TTL {ttl:?})"
    );
    Ok(())
}
