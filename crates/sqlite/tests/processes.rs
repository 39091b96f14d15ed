//! Processes sharing one SQLite file: a holder process killed with SIGKILL frees the key after
//! its TTL with a greater fence, and processes racing for one key exclude each other.
//!
//! Other processes are this test binary run again with `child_process_role` selected and the
//! role in the environment (see [`child_process_role`]).

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use leasehold_conformance::kit::{OrFail, TestResult};
use leasehold_conformance::Failure;
use leasehold_core::{Authority, Instant, Lease, LeaseOptions, LockKey};
use leasehold_sqlite::SqliteAuthority;
use tokio::io::{AsyncBufReadExt, BufReader};

mod common;

use common::url;

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
fn child_process_role() -> TestResult {
    let Ok(role) = std::env::var(ROLE) else {
        return Ok(());
    };
    let url = std::env::var(CHILD_URL).or_fail(CHILD_URL)?;
    let key = LockKey::new(std::env::var(CHILD_KEY).or_fail(CHILD_KEY)?).or_fail("the key")?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .or_fail("a runtime")?;
    runtime.block_on(async move {
        let authority = Arc::new(SqliteAuthority::connect(&url).await.or_fail("connect")?);
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
                .or_fail("the holder acquires")?;
                println!("HOLDING {}", lease.fence().value());
                tokio::time::sleep(Duration::from_secs(120)).await;
                drop(lease);
                Ok(())
            }
            "race" => {
                use std::io::Write;
                let log = std::env::var(CHILD_LOG).or_fail(CHILD_LOG)?;
                let pid = std::process::id();
                let append = |line: String| {
                    std::fs::OpenOptions::new()
                        .append(true)
                        .create(true)
                        .open(&log)
                        .and_then(|mut f| f.write_all(line.as_bytes()))
                        .or_fail("append to the log")
                };
                for _ in 0..RACE_ROUNDS {
                    let grant = authority
                        .acquire(&key, Duration::from_secs(10), Duration::from_secs(60))
                        .await
                        .or_fail("a racer acquires")?;
                    let fence = grant.fence().value();
                    append(format!("start {pid} {fence}\n"))?;
                    tokio::time::sleep(Duration::from_millis(3)).await;
                    append(format!("end {pid} {fence}\n"))?;
                    let _ = authority
                        .release(&grant)
                        .await
                        .or_fail("a racer releases")?;
                }
                println!("DONE");
                Ok(())
            }
            other => Err(Failure::new(format!("unknown role {other}"))),
        }
    })
}

fn child(
    role: &str,
    url: &str,
    key: &str,
    log: Option<&Path>,
) -> TestResult<tokio::process::Command> {
    let mut cmd =
        tokio::process::Command::new(std::env::current_exe().or_fail("this test binary")?);
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
    Ok(cmd)
}

/// A holder process is killed with SIGKILL while its lease renews: until then another process
/// cannot take the key (the renewals from the other process keep it); after the kill the key is
/// free once the last renewal's TTL ran out, not before, and the fence is greater.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holder_process_frees_the_key_after_its_ttl_with_a_greater_fence() -> TestResult {
    let dir = tempfile::tempdir().or_fail("a temporary directory")?;
    let url = url(&dir.path().join("locks.db"));
    let key = LockKey::new("crash/holder").or_fail("the key")?;
    let here = SqliteAuthority::connect(&url).await.or_fail("connect")?;
    let mut holder = child("hold", &url, key.as_str(), None)?
        .spawn()
        .or_fail("start the holder process")?;
    let mut lines = BufReader::new(holder.stdout.take().or_fail("the holder's stdout")?).lines();
    let fence: u64 = loop {
        let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .or_fail("the holder process said nothing for 30 s")?
            .or_fail("read the holder's output")?
            .or_fail("the holder process ended before holding")?;
        // libtest prints the test's name on the same line, before it.
        if let Some((_, f)) = line.split_once("HOLDING ") {
            break f.trim().parse().or_fail("the holder's fence")?;
        }
    };
    // Two TTLs: without the child's renewals the lease would have run out.
    let until = Instant::now() + HOLD_TTL * 2;
    while Instant::now() < until {
        assert!(
            here.try_acquire(&key, HOLD_TTL)
                .await
                .or_fail("try the held key")?
                .is_none(),
            "took the key from a live holder process"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    holder.start_kill().or_fail("kill the holder")?;
    let killed = Instant::now();
    let status = holder.wait().await.or_fail("wait for the holder")?;
    assert!(!status.success(), "{status:?}");
    let grant = loop {
        if let Some(g) = here
            .try_acquire(&key, HOLD_TTL)
            .await
            .or_fail("try the key")?
        {
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
    let _ = here.release(&grant).await.or_fail("release")?;
    Ok(())
}

/// Three processes open a fresh file together and take turns on one key: their critical
/// sections, logged to one file, never overlap, and every grant's fence is above the one before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_exclude_each_other_and_fences_only_grow() -> TestResult {
    let dir = tempfile::tempdir().or_fail("a temporary directory")?;
    let url = url(&dir.path().join("locks.db"));
    let log = dir.path().join("sections.log");
    // The file does not exist yet: the processes race to create it and switch it to WAL mode,
    // then for the key.
    let mut children = Vec::new();
    for _ in 0..3 {
        children.push(
            child("race", &url, "race/one-key", Some(&log))?
                .spawn()
                .or_fail("start a racing process")?,
        );
    }
    for mut c in children {
        let status = tokio::time::timeout(Duration::from_secs(120), c.wait())
            .await
            .or_fail("a racing process hung")?
            .or_fail("wait for a racing process")?;
        assert!(status.success(), "{status:?}");
    }
    let text = std::fs::read_to_string(&log).or_fail("read the log")?;
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
        let fence: u64 = start[2].parse().or_fail("a logged fence")?;
        assert!(
            fence > last_fence,
            "fence {fence} after {last_fence}:\n{text}"
        );
        last_fence = fence;
        pids.insert(start[1]);
    }
    assert_eq!(pids.len(), 3);
    Ok(())
}
