//! `leasehold status --watch`: the keys under a prefix looked at live, as JSON lines a script
//! reads: each key at the start, then each key taken, handed off, freed early or expired, as
//! real `leasehold run` holders take and lose keys; on SQLite in detail, and on every other
//! backend the key a holder takes and frees. Interrupted, it exits 0.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

mod common;

use rustix::process::{Pid, Signal};

use common::{hold_script, read_fence, wait_for_file, OrFail, Result};

/// How long a watch may take to report what it should see: many looks at 100 ms, with room
/// for a loaded machine.
const WITHIN: Duration = Duration::from_secs(15);

/// A running `leasehold status --watch --json`, its lines arriving on a channel.
struct Watch {
    child: Child,
    lines: Receiver<String>,
    seen: Vec<String>,
}

impl Watch {
    fn start(url: &str, prefix: &str, env: &[(&str, &str)]) -> Result<Watch> {
        let mut command = Command::new(env!("CARGO_BIN_EXE_leasehold"));
        command
            .args(["status", "--url", url, "--prefix", prefix])
            .args(["--watch", "--json", "--interval", "100ms"])
            .env_remove("LEASEHOLD_URL")
            .stdout(Stdio::piped());
        for (k, v) in env {
            command.env(k, v);
        }
        let mut child = command.spawn().or_fail("start status --watch")?;
        let stdout = child.stdout.take().or_fail("the watch's stdout")?;
        let (send, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(|l| l.ok()) {
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Watch {
            child,
            lines,
            seen: Vec::new(),
        })
    }

    /// The next line that has every one of `parts`, within [`WITHIN`].
    fn expect(&mut self, parts: &[&str]) -> Result<String> {
        let deadline = Instant::now() + WITHIN;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self.lines.recv_timeout(left).map_err(|_| {
                format!(
                    "no line with {parts:?} within {WITHIN:?}; the watch said:\n{}",
                    self.seen.join("\n")
                )
            })?;
            self.seen.push(line.clone());
            if parts.iter().all(|p| line.contains(p)) {
                return Ok(line);
            }
        }
    }

    /// SIGINT, then the exit status, which must be 0.
    fn interrupt(mut self) -> Result {
        signal(&self.child, Signal::INT)?;
        let deadline = Instant::now() + WITHIN;
        loop {
            if let Some(status) = self.child.try_wait().or_fail("wait for the watch")? {
                assert_eq!(status.code(), Some(0), "the watch's exit after SIGINT");
                return Ok(());
            }
            assert!(Instant::now() < deadline, "the watch ignored SIGINT");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn signal(child: &Child, signal: Signal) -> Result {
    let pid = Pid::from_child(child);
    rustix::process::kill_process(pid, signal).or_fail(format!("send {signal:?} to {pid:?}"))
}

/// A `leasehold run` holding `key` until `done` exists; its fence is written to `fence`.
fn hold(
    url: &str,
    key: &str,
    ttl: &str,
    dir: &std::path::Path,
    name: &str,
    env: &[(&str, &str)],
) -> Result<(Child, u64, std::path::PathBuf)> {
    let (fence, done) = (
        dir.join(format!("{name}.fence")),
        dir.join(format!("{name}.done")),
    );
    let mut command = Command::new(env!("CARGO_BIN_EXE_leasehold"));
    command
        .args([
            "run", "--url", url, "--key", key, "--ttl", ttl, "--wait", "30s",
        ])
        .args(["--", "sh", "-c", &hold_script(&fence, &done)])
        .env_remove("LEASEHOLD_URL");
    for (k, v) in env {
        command.env(k, v);
    }
    let mut child = command.spawn().or_fail("start a holder")?;
    wait_for_file(&fence, &mut child)?;
    let value = read_fence(&fence)?;
    Ok((child, value, done))
}

/// Lets a [`hold`] holder's command end, and waits for the holder to exit 0.
fn finish(mut holder: Child, done: &std::path::Path) -> Result {
    std::fs::write(done, "").or_fail("tell the holder to finish")?;
    let status = holder.wait().or_fail("wait for the holder")?;
    assert_eq!(status.code(), Some(0), "the holder's exit");
    Ok(())
}

/// On SQLite: a key taken, handed off while the watch was paused (so its next look sees the
/// other holder, not the free key between), freed early by a release, and expired after its
/// holder was killed; each with the fence the holder got.
#[test]
fn sqlite_watch_names_each_change_with_its_fences() -> Result {
    let dir = tempfile::tempdir().or_fail("a scratch directory")?;
    // A short request timeout lets the TTL be short, so the expiry comes soon.
    let url = format!("sqlite://{}/locks.db?timeout_ms=200", dir.path().display());
    let mut watch = Watch::start(&url, "job:", &[])?;

    let (first, f1, done1) = hold(&url, "job:a", "1s", dir.path(), "a1", &[])?;
    watch.expect(&[
        r#""event":"taken""#,
        r#""key":"job:a""#,
        &format!(r#""fence":{f1}"#),
    ])?;

    // Paused, the watch cannot look while the first holder releases and the second takes over.
    signal(&watch.child, Signal::STOP)?;
    let waiting = std::thread::scope(|s| {
        let second = s.spawn(|| hold(&url, "job:a", "1s", dir.path(), "a2", &[]));
        std::thread::sleep(Duration::from_millis(200));
        finish(first, &done1)?;
        second.join().map_err(|_| "the second holder's thread")?
    });
    let (second, f2, _done2) = waiting?;
    signal(&watch.child, Signal::CONT)?;
    assert!(f2 > f1, "fences {f1} then {f2}");
    watch.expect(&[
        r#""event":"handed_off""#,
        &format!(r#""from_fence":{f1}"#),
        &format!(r#""fence":{f2}"#),
    ])?;

    // Killed with SIGKILL, the holder cannot release: its lease runs out on the authority's clock.
    let mut second = second;
    second.kill().or_fail("kill the second holder")?;
    second.wait().or_fail("reap the second holder")?;
    watch.expect(&[
        r#""event":"expired""#,
        r#""key":"job:a""#,
        &format!(r#""from_fence":{f2}"#),
    ])?;

    let (third, f3, done3) = hold(&url, "job:b", "5s", dir.path(), "b", &[])?;
    watch.expect(&[r#""event":"taken""#, r#""key":"job:b""#])?;
    finish(third, &done3)?;
    watch.expect(&[
        r#""event":"ended""#,
        r#""key":"job:b""#,
        &format!(r#""from_fence":{f3}"#),
    ])?;
    watch.interrupt()
}

/// A watch started while a key is held reports it first (`"event":"seen"` with its fence),
/// then its release; on a backend given by `url`.
fn sees_a_holder_then_its_release(url: &str, env: &[(&str, &str)]) -> Result {
    let dir = tempfile::tempdir().or_fail("a scratch directory")?;
    let (holder, fence, done) = hold(url, "watched:k", "10s", dir.path(), "h", env)?;
    let mut watch = Watch::start(url, "watched:", env)?;
    watch.expect(&[
        r#""event":"seen""#,
        r#""held":true"#,
        &format!(r#""fence":{fence}"#),
    ])?;
    finish(holder, &done)?;
    watch.expect(&[r#""event":"ended""#, &format!(r#""from_fence":{fence}"#)])?;
    watch.interrupt()
}

#[test]
fn postgres_watch_sees_a_holder_and_its_release() -> Result {
    let server = leasehold_servers::PostgresServer::start().or_fail("PostgreSQL must start")?;
    let url = format!("{}?timeout_ms=3000", server.url());
    let migrated = common::leasehold(&["migrate", "--url", &url])?;
    assert_eq!(common::code(&migrated), 0, "{}", common::text(&migrated));
    sees_a_holder_then_its_release(&url, &[])
}

#[test]
fn mysql_watch_sees_a_holder_and_its_release() -> Result {
    let server = leasehold_servers::MariaDbServer::start().or_fail("MariaDB must start")?;
    let url = server.url();
    let migrated = common::leasehold(&["migrate", "--url", &url])?;
    assert_eq!(common::code(&migrated), 0, "{}", common::text(&migrated));
    sees_a_holder_then_its_release(&url, &[])
}

#[test]
fn redis_watch_sees_a_holder_and_its_release() -> Result {
    let server = common::redis()?;
    sees_a_holder_then_its_release(&common::url(&server), &[])
}

#[test]
fn etcd_watch_sees_a_holder_and_its_release() -> Result {
    let server = leasehold_servers::EtcdServer::start().or_fail("etcd must start")?;
    let url = format!("etcd://{}?timeout_ms=1000", server.endpoint());
    sees_a_holder_then_its_release(&url, &[])
}

#[test]
fn zookeeper_watch_sees_a_holder_and_its_release() -> Result {
    let server = leasehold_servers::ZkServer::start().or_fail("ZooKeeper must start")?;
    let url = format!("zk://{}/leasehold?timeout_ms=3000", server.connect_string());
    sees_a_holder_then_its_release(&url, &[])
}

#[test]
fn object_store_watch_sees_a_holder_and_its_release() -> Result {
    let moto = leasehold_servers::MotoServer::start().or_fail("moto must start")?;
    let url = common::s3_url(&moto, "watch");
    sees_a_holder_then_its_release(&url, &common::S3_CREDENTIALS)
}

#[test]
fn azure_watch_sees_a_holder_and_its_release() -> Result {
    let azurite = leasehold_servers::AzuriteServer::start().or_fail("Azurite must start")?;
    let url = common::azure_url(&azurite, "watch");
    sees_a_holder_then_its_release(&url, &common::AZURE_CREDENTIALS)
}
