//! The `leasehold` command against a real Redis started by the harness.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use leasehold::{Authority, LockKey};
use leasehold_redis::{KeyLayout, RedisAuthority};
use leasehold_servers::RedisServer;

fn leasehold(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(args)
        .env_remove("LEASEHOLD_URL")
        .output()
        .unwrap()
}

fn url(server: &RedisServer) -> String {
    format!("{}?timeout_ms=1000", server.url())
}

fn code(out: &Output) -> i32 {
    out.status.code().unwrap_or(-1)
}

fn text(out: &Output) -> String {
    format!(
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_gets_the_fence_and_the_lease_is_released_after_it() {
    let server = RedisServer::start().unwrap();
    let url = url(&server);
    let script =
        r#"echo "$LEASEHOLD_KEY $LEASEHOLD_FENCE $LEASEHOLD_FENCE_SAFETY $LEASEHOLD_BACKEND""#;
    let first = leasehold(&[
        "run", "--url", &url, "--key", "job:1", "--", "sh", "-c", script,
    ]);
    assert_eq!(code(&first), 0, "{}", text(&first));
    let line = String::from_utf8_lossy(&first.stdout).trim().to_string();
    let fields: Vec<&str> = line.split(' ').collect();
    assert_eq!(fields[0], "job:1", "{line}");
    let fence: u64 = fields[1].parse().unwrap();
    assert_eq!(&fields[2..], ["failover-unsafe", "redis"], "{line}");
    // Released when the command ended: the next run gets the key at once, with a greater fence.
    let second = leasehold(&[
        "run", "--url", &url, "--key", "job:1", "--", "sh", "-c", script,
    ]);
    assert_eq!(code(&second), 0, "{}", text(&second));
    let next: u64 = String::from_utf8_lossy(&second.stdout)
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    assert!(next > fence);
    // The command's exit status is leasehold's.
    let failing = leasehold(&[
        "run", "--url", &url, "--key", "job:1", "--", "sh", "-c", "exit 7",
    ]);
    assert_eq!(code(&failing), 7, "{}", text(&failing));
    let killed = leasehold(&[
        "run",
        "--url",
        &url,
        "--key",
        "job:1",
        "--",
        "sh",
        "-c",
        "kill -9 $$",
    ]);
    assert_eq!(code(&killed), 128 + 9, "{}", text(&killed));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_lock_is_exit_75_and_the_command_does_not_run() {
    let server = RedisServer::start().unwrap();
    let url = url(&server);
    let holder = RedisAuthority::connect(&url).await.unwrap();
    let key = LockKey::new("job:held").unwrap();
    let grant = holder
        .try_acquire(&key, Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    let marker = std::env::temp_dir().join(format!("leasehold-cli-{}", std::process::id()));
    let touch = format!("touch {}", marker.display());
    let started = Instant::now();
    let out = leasehold(&[
        "run", "--url", &url, "--key", "job:held", "--wait", "300ms", "--", "sh", "-c", &touch,
    ]);
    assert_eq!(code(&out), 75, "{}", text(&out));
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert!(!marker.exists(), "the command ran without the lock");
    let now = leasehold(&["run", "--url", &url, "--key", "job:held", "--", "true"]);
    assert_eq!(code(&now), 75, "{}", text(&now));
    let _ = holder.release(&grant).await.unwrap();
}

/// The lease is deleted behind the command's back: at the next renewal (a third of the TTL)
/// leasehold stops the command's whole process group and exits 76.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lease_stops_the_command() {
    let server = RedisServer::start().unwrap();
    let url = url(&server);
    let ttl = Duration::from_secs(1);
    let bin = env!("CARGO_BIN_EXE_leasehold");
    let started = Instant::now();
    // The command starts a grandchild too: both must be stopped.
    let run = Command::new(bin)
        .args([
            "run", "--url", &url, "--key", "job:lost", "--ttl", "1s", "--grace", "500ms", "--",
        ])
        .args(["sh", "-c", "sleep 30 & sleep 30; echo survived"])
        .env_remove("LEASEHOLD_URL")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let key = LockKey::new("job:lost").unwrap();
    let lock_key = KeyLayout::default().lock_key(&key);
    // Wait until the run holds the lock (looking, not competing), then delete it as an operator
    // would.
    while server.command(&["EXISTS", &lock_key]).unwrap().trim() != "1" {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the run never took the lock"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let deleted = Instant::now();
    server
        .command(&["DEL", &KeyLayout::default().lock_key(&key)])
        .unwrap();
    let out = tokio::task::spawn_blocking(move || run.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(code(&out), 76, "{}", text(&out));
    assert!(
        deleted.elapsed() < ttl / 3 + Duration::from_millis(500) + Duration::from_secs(1),
        "took {:?} to stop the command",
        deleted.elapsed()
    );
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("survived"),
        "{}",
        text(&out)
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("lost"),
        "{}",
        text(&out)
    );
}

#[test]
fn bad_input_and_unreachable_authorities_have_their_exit_codes() {
    for (args, want) in [
        (&["run", "--key", "k", "--", "true"][..], 64),
        (
            &[
                "run",
                "--url",
                "memory://",
                "--key",
                "has space",
                "--",
                "true",
            ],
            64,
        ),
        (&["run", "--url", "ftp://x", "--key", "k", "--", "true"], 64),
        (
            &[
                "run",
                "--url",
                "memory://",
                "--key",
                "k",
                "--ttl",
                "0s",
                "--",
                "true",
            ],
            64,
        ),
        (&["run", "--url", "memory://", "--key", "k"], 64),
        (
            &[
                "run",
                "--url",
                "redis://127.0.0.1:1?timeout_ms=300",
                "--key",
                "k",
                "--",
                "true",
            ],
            69,
        ),
        (
            &[
                "run",
                "--url",
                "memory://",
                "--key",
                "k",
                "--",
                "/nonexistent/program",
            ],
            127,
        ),
    ] {
        let out = leasehold(args);
        assert_eq!(code(&out), want, "{args:?}: {}", text(&out));
    }
    let help = leasehold(&["--help"]);
    assert_eq!(code(&help), 0);
    assert!(String::from_utf8_lossy(&help.stdout).contains("LEASEHOLD_FENCE"));
}

/// `leasehold --help | head` and friends: a reader that went away is not a panic. The pipe's
/// read end is closed before `leasehold` starts, so every write to stdout fails with EPIPE.
#[test]
fn help_and_version_survive_a_closed_pipe() {
    for flag in ["--help", "--version", "-V"] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = Command::new(env!("CARGO_BIN_EXE_leasehold"))
            .arg(flag)
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{flag}: {stderr}");
        assert_ne!(code(&out), 101, "{flag}: {stderr}");
    }
}

#[test]
fn version_prints_the_package_version() {
    for flag in ["--version", "-V"] {
        let out = leasehold(&[flag]);
        assert_eq!(code(&out), 0, "{flag}: {}", text(&out));
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            format!("leasehold {}", env!("CARGO_PKG_VERSION")),
            "{flag}"
        );
    }
}

/// The etcd leases on the server, by `etcdctl lease list`.
fn etcd_leases(server: &leasehold_servers::EtcdServer) -> Vec<String> {
    let out = server
        .etcdctl()
        .unwrap()
        .args(["lease", "list"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // "found N leases" and then one id per line.
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .skip(1)
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect()
}

/// Issue 10 #8: with etcd, `leasehold run` leaves no session lease behind when it exits: not
/// after the command ran, nor after the lock was found held. (It used to exit with the session
/// lease still granted, to live out its TTL.)
#[test]
fn etcd_runs_leave_no_lease_behind() {
    let server = leasehold_servers::EtcdServer::start().unwrap();
    let url = format!("etcd://{}?timeout_ms=1000", server.endpoint());
    let ran = leasehold(&[
        "run",
        "--url",
        &url,
        "--key",
        "job:etcd",
        "--ttl",
        "30s",
        "--",
        "sh",
        "-c",
        "echo $LEASEHOLD_FENCE",
    ]);
    assert_eq!(code(&ran), 0, "{}", text(&ran));
    assert_eq!(etcd_leases(&server), Vec::<String>::new(), "after a run");

    // While one run holds the key, a second finds it held (75); neither leaves a lease.
    let dir = leasehold_servers::process::server_dir("cli-etcd").unwrap();
    let (holding, done) = (dir.path().join("holding"), dir.path().join("done"));
    let wait = format!(
        "touch {}; while [ ! -e {} ]; do sleep 0.05; done",
        holding.display(),
        done.display()
    );
    let mut holder = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args([
            "run", "--url", &url, "--key", "job:etcd", "--ttl", "30s", "--",
        ])
        .args(["sh", "-c", &wait])
        .env_remove("LEASEHOLD_URL")
        .spawn()
        .unwrap();
    let started = Instant::now();
    // Only once the holder's command runs (so it holds the key) does the second run try.
    while !holding.exists() {
        if let Some(status) = holder.try_wait().unwrap() {
            panic!("the holder exited ({status}) before its command ran");
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the holder's command did not run within 30 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let held = loop {
        let out = leasehold(&["run", "--url", &url, "--key", "job:etcd", "--", "true"]);
        if code(&out) == 75 {
            break out;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{}",
            text(&out)
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(code(&held), 75);
    std::fs::write(&done, b"done").unwrap();
    assert!(holder.wait().unwrap().success());
    assert_eq!(etcd_leases(&server), Vec::<String>::new(), "after the runs");
}
