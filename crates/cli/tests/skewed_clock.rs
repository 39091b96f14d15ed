//! A holder whose wall clock is wrong by minutes, on an object store (S3 through moto's server
//! mode), where expiry is judged by the store's clock alone: processes run under libfaketime
//! (Debian's `libfaketime`, preloaded), which moves the wall clock that libc's `clock_gettime`
//! and `gettimeofday` report (and so Rust's `SystemTime`, and the store client's signing
//! dates), and leaves the monotonic clock alone. A clock ten minutes ahead must not make a held
//! key look expired, nor its own lease; a clock ten minutes behind must not keep a dead
//! holder's key from the next process beyond the TTL.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

mod common;

use common::{code, hold_script, read_fence, text, wait_for_file, OrFail, Result};

/// Where Debian's libfaketime puts its preload library.
const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// The lease's TTL: short, so a dead holder's key comes free within the test.
const TTL: Duration = Duration::from_secs(4);

/// How far the skewed processes' wall clocks are off.
const SKEW: &str = "10m";

fn libfaketime() -> Result<PathBuf> {
    let path = PathBuf::from(LIBFAKETIME);
    if path.exists() {
        Ok(path)
    } else {
        Err(format!(
            "{LIBFAKETIME} is missing: apt-get install libfaketime (`./scripts/test` installs it)"
        )
        .into())
    }
}

/// `leasehold run` on `url` for `key`, its wall clock moved by `skew` (`+10m`, `-10m`) if given.
fn run(url: &str, skew: Option<&str>, args: &[&str]) -> Result<Command> {
    let mut command = Command::new(env!("CARGO_BIN_EXE_leasehold"));
    command
        .args(["run", "--url", url, "--key", "job:skew", "--ttl"])
        .arg(format!("{}s", TTL.as_secs()))
        .args(args)
        .env_remove("LEASEHOLD_URL")
        .envs(common::S3_CREDENTIALS);
    if let Some(skew) = skew {
        command
            .env("LD_PRELOAD", libfaketime()?)
            .env("FAKETIME", skew)
            .env("DONT_FAKE_MONOTONIC", "1");
    }
    Ok(command)
}

/// The wall clock a process under `skew` reads, against this one's, in seconds.
fn offset_under(skew: &str) -> Result<i64> {
    let out = Command::new("date")
        .arg("+%s")
        .env("LD_PRELOAD", libfaketime()?)
        .env("FAKETIME", skew)
        .output()
        .or_fail("run date under libfaketime")?;
    let theirs: i64 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .or_fail(format!("the time in {}", text(&out)))?;
    let ours = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .or_fail("the wall clock")?
        .as_secs() as i64;
    Ok(theirs - ours)
}

#[test]
fn wall_clocks_wrong_by_minutes_change_nothing_the_store_decides() -> Result {
    // The preload works here: a process under it reads a clock ten minutes off.
    let ahead = offset_under(&format!("+{SKEW}"))?;
    assert!(
        (590..=610).contains(&ahead),
        "the clock under +{SKEW} is {ahead} s off"
    );

    let moto = leasehold_servers::MotoServer::start().or_fail("moto must start")?;
    let url = common::s3_url(&moto, "skew");
    let dir = leasehold_servers::process::server_dir("cli-skew").or_fail("a scratch directory")?;
    let (fence_file, done) = (dir.path().join("fence"), dir.path().join("done"));

    // A holder ten minutes ahead takes the key and keeps it across several TTLs: its renewals
    // are judged by the store's clock, not by its own.
    let mut ahead_holder = run(
        &url,
        Some(&format!("+{SKEW}")),
        &["--", "sh", "-c", &hold_script(&fence_file, &done)],
    )?
    .spawn()
    .or_fail("start the holder whose clock is ahead")?;
    wait_for_file(&fence_file, &mut ahead_holder)?;
    let first = read_fence(&fence_file)?;
    std::thread::sleep(TTL * 2);
    for skew in [None, Some(format!("+{SKEW}")), Some(format!("-{SKEW}"))] {
        let out = run(&url, skew.as_deref(), &["--", "true"])?
            .output()
            .or_fail("a contender runs")?;
        assert_eq!(
            code(&out),
            75,
            "a contender with its clock {skew:?} must find the key held: {}",
            text(&out)
        );
    }
    assert!(
        ahead_holder
            .try_wait()
            .or_fail("look at the holder")?
            .is_none(),
        "the holder whose clock is ahead gave its lease up"
    );

    // The holder dies without releasing. A process ten minutes behind waits for the key: it
    // gets it when the TTL has run out by the store's clock, not ten minutes later.
    let killed = Instant::now();
    ahead_holder.kill().or_fail("kill the holder")?;
    ahead_holder.wait().or_fail("reap the holder")?;
    let next = run(
        &url,
        Some(&format!("-{SKEW}")),
        &["--wait", "60s", "--", "sh", "-c", "echo $LEASEHOLD_FENCE"],
    )?
    .output()
    .or_fail("a process whose clock is behind waits")?;
    let waited = killed.elapsed();
    assert_eq!(code(&next), 0, "{}", text(&next));
    let fence: u64 = String::from_utf8_lossy(&next.stdout)
        .trim()
        .parse()
        .or_fail(format!("the fence in {}", text(&next)))?;
    assert!(fence > first, "the next fence {fence} must exceed {first}");
    // The TTL, the store's one-second clock, and the waiter's polling; far from ten minutes.
    assert!(
        waited < TTL * 5,
        "the key of a dead holder came free after {waited:?} (TTL {TTL:?})"
    );
    // The killed holder's command, if its watcher has not ended it yet.
    std::fs::write(&done, b"done").or_fail("end the holder's command")?;
    Ok(())
}
