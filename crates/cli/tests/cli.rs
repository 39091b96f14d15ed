//! The `leasehold` command against a real Redis started by the harness.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use leasehold::{Authority, LockKey};
use leasehold_redis::{KeyLayout, RedisAuthority};
use leasehold_servers::RedisServer;

mod common;

use common::{code, hold_script, leasehold, read_fence, text, url, wait_for_file};

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
    let ttl = Duration::from_secs(2);
    let bin = env!("CARGO_BIN_EXE_leasehold");
    let started = Instant::now();
    // The command starts a grandchild too: both must be stopped.
    let run = Command::new(bin)
        .args([
            "run", "--url", &url, "--key", "job:lost", "--ttl", "2s", "--grace", "500ms", "--",
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
        (&["run", "--url", "u", "--", "true"][..], 64),
        (
            &[
                "run",
                "--url",
                "redis://127.0.0.1:1?timeout_ms=300",
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
                "redis://127.0.0.1:1?timeout_ms=300",
                "--key",
                "k",
                "--ttl",
                "0s",
                "--",
                "true",
            ],
            64,
        ),
        (&["run", "--url", "redis://127.0.0.1:1", "--key", "k"], 64),
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

/// With etcd, `leasehold run` leaves no session lease behind when it exits: not
/// after the command ran, nor after the lock was found held. (Exiting without closing the
/// authority would leave the session lease granted, to live out its TTL.)
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
    wait_for_file(&holding, &mut holder);
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

/// Runs `leasehold` with extra environment variables.
fn leasehold_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(args)
        .env_remove("LEASEHOLD_URL")
        .env_remove("LEASEHOLD_LOG")
        .env_remove("RUST_LOG")
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Two `leasehold run --url memory://x` processes both ran with fence 1, each with an
/// in-process authority of its own. The CLI refuses `memory://` and names what to use instead.
#[test]
fn memory_urls_are_refused_and_point_to_sqlite() {
    let dir = leasehold_servers::process::server_dir("cli-memory").unwrap();
    let marker = dir.path().join("ran");
    let touch = format!("touch {}", marker.display());
    for url in ["memory://", "memory://x"] {
        let out = leasehold(&["run", "--url", url, "--key", "k", "--", "sh", "-c", &touch]);
        assert_eq!(code(&out), 64, "{url}: {}", text(&out));
        assert!(!marker.exists(), "{url}: the command ran");
        let err = stderr(&out);
        assert!(err.contains("sqlite://"), "{url}: {err}");
        assert!(err.contains("in-process"), "{url}: {err}");
    }
}

/// `--ttl 1ms` ran the command. A TTL below the floor (the request timeout plus the
/// safety margin) is refused before connecting: exit 64 even for an unreachable authority.
#[test]
fn a_ttl_below_the_floor_is_refused_before_connecting() {
    let server = RedisServer::start().unwrap();
    let dir = leasehold_servers::process::server_dir("cli-ttl").unwrap();
    let marker = dir.path().join("ran");
    let touch = format!("touch {}", marker.display());
    let url = url(&server);
    for (url, ttl) in [
        (url.as_str(), "1ms"),
        (url.as_str(), "1s"),
        ("redis://127.0.0.1:1?timeout_ms=1000", "1ms"),
        ("redis://127.0.0.1:1", "5s"),
    ] {
        let out = leasehold(&[
            "run", "--url", url, "--key", "job:ttl", "--ttl", ttl, "--", "sh", "-c", &touch,
        ]);
        assert_eq!(code(&out), 64, "{url} {ttl}: {}", text(&out));
        assert!(!marker.exists(), "{url} {ttl}: the command ran");
        assert!(
            stderr(&out).contains("too short"),
            "{url} {ttl}: {}",
            text(&out)
        );
    }
    // Just above the floor (1 s request timeout + 5 ms + 1 %), it runs.
    let out = leasehold(&[
        "run", "--url", &url, "--key", "job:ttl", "--ttl", "1.1s", "--", "sh", "-c", &touch,
    ]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert!(marker.exists());
}

/// `--busy-exit-code` (flock's -E) replaces 75, so a command's own 75 can be told from "busy";
/// a wait longer than a second is said once on stderr (not with --quiet), and giving up is said.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_exit_code_and_what_a_wait_says() {
    let server = RedisServer::start().unwrap();
    let url = url(&server);
    let holder = RedisAuthority::connect(&url).await.unwrap();
    let key = LockKey::new("job:busy").unwrap();
    let grant = holder
        .try_acquire(&key, Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    let busy = leasehold(&[
        "run",
        "--url",
        &url,
        "--key",
        "job:busy",
        "--busy-exit-code",
        "3",
        "--",
        "true",
    ]);
    assert_eq!(code(&busy), 3, "{}", text(&busy));
    assert!(stderr(&busy).contains("held"), "{}", text(&busy));
    // Whom it is held by, and for how long, as the authority tells (Authority::inspect).
    let holder_id = leasehold::OwnerId::of(&grant.owner()).to_string();
    let holder_fence = format!("fence {}", grant.fence().value());
    for part in [&holder_id, &holder_fence, &"left".to_string()] {
        assert!(
            stderr(&busy).contains(part.as_str()),
            "{part}: {}",
            text(&busy)
        );
    }

    let waited = leasehold(&[
        "run", "--url", &url, "--key", "job:busy", "--wait", "1.6s", "--", "true",
    ]);
    assert_eq!(code(&waited), 75, "{}", text(&waited));
    let err = stderr(&waited);
    assert_eq!(err.matches("waiting").count(), 1, "{err}");
    assert!(err.contains("until"), "{err}");
    assert!(err.contains("gave up"), "{err}");
    assert!(err.contains("1.6s"), "{err}");
    assert_eq!(err.matches(&holder_id).count(), 2, "{err}");

    let quiet = leasehold(&[
        "run", "--url", &url, "--key", "job:busy", "--wait", "1.2s", "--quiet", "--", "true",
    ]);
    assert_eq!(code(&quiet), 75, "{}", text(&quiet));
    assert!(!stderr(&quiet).contains("waiting"), "{}", text(&quiet));
    let _ = holder.release(&grant).await.unwrap();

    // A command's own 75 is its own; with --busy-exit-code it cannot be taken for "busy".
    let own = leasehold(&[
        "run",
        "--url",
        &url,
        "--key",
        "job:busy",
        "--busy-exit-code",
        "3",
        "--",
        "sh",
        "-c",
        "exit 75",
    ]);
    assert_eq!(code(&own), 75, "{}", text(&own));
}

/// As shells do: 127 for a command that is not found, 126 for one that is not executable; the
/// lease is released either way (the next run gets the key at once).
#[test]
fn a_command_that_cannot_run_is_126_or_127() {
    let server = RedisServer::start().unwrap();
    let url = url(&server);
    let dir = leasehold_servers::process::server_dir("cli-exec").unwrap();
    let plain = dir.path().join("not-executable");
    std::fs::write(&plain, "#!/bin/sh\necho hi\n").unwrap();
    let plain = plain.display().to_string();
    for (program, want) in [("/nonexistent/program", 127), (plain.as_str(), 126)] {
        let out = leasehold(&["run", "--url", &url, "--key", "job:exec", "--", program]);
        assert_eq!(code(&out), want, "{program}: {}", text(&out));
        let next = leasehold(&["run", "--url", &url, "--key", "job:exec", "--", "true"]);
        assert_eq!(code(&next), 0, "{program}: {}", text(&next));
    }
}

/// `leasehold migrate` creates the lease table on a fresh database (twice is fine); before it,
/// `run` says which command creates the table.
#[test]
fn migrate_creates_the_table_and_run_names_it_when_it_is_missing() {
    let server = leasehold_servers::PostgresServer::start().unwrap();
    let url = format!("{}?timeout_ms=3000", server.url());
    let before = leasehold(&["run", "--url", &url, "--key", "job:pg", "--", "true"]);
    assert_ne!(code(&before), 0, "{}", text(&before));
    assert!(
        stderr(&before).contains("leasehold migrate"),
        "{}",
        text(&before)
    );
    // The error once, and the hint.
    assert_eq!(stderr(&before).lines().count(), 2, "{}", text(&before));
    for _ in 0..2 {
        let out = leasehold(&["migrate", "--url", &url]);
        assert_eq!(code(&out), 0, "{}", text(&out));
    }
    let after = leasehold(&[
        "run",
        "--url",
        &url,
        "--key",
        "job:pg",
        "--",
        "sh",
        "-c",
        "echo $LEASEHOLD_FENCE",
    ]);
    assert_eq!(code(&after), 0, "{}", text(&after));
    assert!(
        String::from_utf8_lossy(&after.stdout)
            .trim()
            .parse::<u64>()
            .unwrap()
            > 0
    );
    // Only PostgreSQL has a schema to create.
    let redis = leasehold(&["migrate", "--url", "redis://127.0.0.1:1"]);
    assert_eq!(code(&redis), 64, "{}", text(&redis));
}

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
fn wait_for_growth(file: &std::path::Path, run: &mut std::process::Child) {
    let started = Instant::now();
    let first = loop {
        let n = size(file);
        if n > 0 {
            break n;
        }
        if let Some(status) = run.try_wait().unwrap() {
            panic!("leasehold exited ({status}) before its command wrote");
        }
        assert!(started.elapsed() < Duration::from_secs(20), "no writes");
        std::thread::sleep(Duration::from_millis(20));
    };
    while size(file) == first {
        assert!(started.elapsed() < Duration::from_secs(20), "no growth");
        std::thread::sleep(Duration::from_millis(20));
    }
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
fn sigkill_of_leasehold_stops_the_command() {
    let server = RedisServer::start().unwrap();
    let url = url(&server);
    let dir = leasehold_servers::process::server_dir("cli-pdeath").unwrap();
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
        .unwrap();
    wait_for_growth(&file, &mut run);
    run.kill().unwrap();
    let killed = Instant::now();
    let _ = run.wait();
    let grew = last_growth_after(&file, killed, ttl);
    kill_pid_file(&pid);
    assert!(
        grew < ttl / 2,
        "the command kept writing {grew:?} after leasehold was killed (TTL {ttl:?})"
    );
}

/// SIGHUP (a closed terminal, a dropped ssh session) is handled as SIGTERM: the command is
/// stopped, the lease released, and `leasehold` exits 128+1.
#[test]
fn sighup_of_leasehold_stops_the_command_and_releases_the_lease() {
    let server = RedisServer::start().unwrap();
    let url = url(&server);
    let dir = leasehold_servers::process::server_dir("cli-hup").unwrap();
    let (file, pid) = (dir.path().join("out"), dir.path().join("pid"));
    let ttl = Duration::from_secs(30);
    let mut run = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args([
            "run", "--url", &url, "--key", "job:hup", "--ttl", "30s", "--grace", "1s", "--",
        ])
        .args(["sh", "-c", &writer_script(&file, &pid)])
        .env_remove("LEASEHOLD_URL")
        .spawn()
        .unwrap();
    wait_for_growth(&file, &mut run);
    let status = Command::new("kill")
        .args(["-HUP", &run.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let hung_up = Instant::now();
    let exit = run.wait().unwrap();
    let grew = last_growth_after(&file, hung_up, ttl);
    kill_pid_file(&pid);
    assert_eq!(exit.code(), Some(128 + 1), "{exit}");
    assert!(grew < Duration::from_secs(2), "kept writing for {grew:?}");
    // Released: the next run gets the key at once (no 30 s wait for the TTL).
    let next = leasehold(&["run", "--url", &url, "--key", "job:hup", "--", "true"]);
    assert_eq!(code(&next), 0, "{}", text(&next));
}

/// `LEASEHOLD_LOG=info` (or `RUST_LOG`) shows the acquire, renew and release spans, without
/// colour codes when stderr is not a terminal (here a pipe).
#[test]
fn logging_shows_acquire_renew_and_release_without_colour() {
    let server = RedisServer::start().unwrap();
    let url = url(&server);
    for var in ["LEASEHOLD_LOG", "RUST_LOG"] {
        let out = leasehold_env(
            &[
                "run", "--url", &url, "--key", "job:log", "--ttl", "1.2s", "--", "sleep", "1",
            ],
            &[(var, "info")],
        );
        assert_eq!(code(&out), 0, "{var}: {}", text(&out));
        let err = stderr(&out);
        for span in ["leasehold.acquire", "leasehold.renew", "leasehold.release"] {
            assert!(err.contains(span), "{var}: no {span} in {err}");
        }
        assert!(!err.contains('\u{1b}'), "{var}: colour codes in {err:?}");
        // The renew span, not the DEBUG events inside it (the backend's own).
        assert!(
            !err.lines()
                .any(|l| l.contains("DEBUG") && !l.contains("close time.busy")),
            "{var}: debug events at info: {err}"
        );
    }
    // Without either, nothing but what the command prints.
    let quiet = leasehold_env(
        &["run", "--url", &url, "--key", "job:log", "--", "true"],
        &[],
    );
    assert_eq!(code(&quiet), 0, "{}", text(&quiet));
    assert_eq!(stderr(&quiet), "");
}

/// An error prints its source chain once: no text repeated, no Rust Debug dump.
#[test]
fn errors_print_their_chain_once_without_debug_dumps() {
    for url in [
        "redis://127.0.0.1:1?timeout_ms=500",
        "etcd://127.0.0.1:1?timeout_ms=500",
        "postgres://leasehold@127.0.0.1:1/x?timeout_ms=500",
    ] {
        let out = leasehold(&["run", "--url", url, "--key", "k", "--", "true"]);
        assert_eq!(code(&out), 69, "{url}: {}", text(&out));
        let err = stderr(&out);
        assert_eq!(err.lines().count(), 1, "{url}: {err}");
        for debug in ["Os {", "kind:", "Error(", "Some(", "source:"] {
            assert!(!err.contains(debug), "{url}: a Debug dump in {err}");
        }
        let parts: Vec<&str> = err.trim().split(": ").collect();
        for (i, part) in parts.iter().enumerate() {
            let repeated = parts[i + 1..]
                .iter()
                .any(|p| p == part || (part.len() >= 12 && p.contains(part)));
            assert!(!repeated, "{url}: `{part}` repeated in {err}");
        }
    }
}

/// The psql recipe in docs/cli.md, run as written: under `leasehold`, its guarded UPDATE lands
/// with the fence; a row already written under a newer fence refuses it and the script says so.
#[test]
fn the_psql_recipe_in_the_docs_guards_with_the_fence() {
    let docs =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/cli.md")).unwrap();
    let script = docs
        .split("The script (`charge.sh`):\n\n```sh\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("the recipe's script in docs/cli.md");
    let redis = RedisServer::start().unwrap();
    let postgres = leasehold_servers::PostgresServer::start().unwrap();
    let database = postgres.url();
    let psql = |sql: &str| {
        let out = Command::new("psql")
            .args([
                &database,
                "--no-psqlrc",
                "-qtA",
                "-v",
                "ON_ERROR_STOP=1",
                "-c",
                sql,
            ])
            .output()
            .unwrap();
        assert!(out.status.success(), "{sql}: {}", text(&out));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    psql("CREATE TABLE invoices (id text PRIMARY KEY, status text NOT NULL)");
    psql("INSERT INTO invoices VALUES ('inv_72', 'open')");
    psql(
        docs.split("```sql\n")
            .nth(1)
            .and_then(|rest| rest.split("```").next())
            .unwrap(),
    );
    let dir = leasehold_servers::process::server_dir("cli-recipe").unwrap();
    let path = dir.path().join("charge.sh");
    std::fs::write(&path, script).unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let url = url(&redis);
    let charge = || {
        Command::new(env!("CARGO_BIN_EXE_leasehold"))
            .args([
                "run",
                "--url",
                &url,
                "--key",
                "invoice:inv_72",
                "--ttl",
                "30s",
                "--",
            ])
            .arg(&path)
            .arg("inv_72")
            .env_remove("LEASEHOLD_URL")
            .env("DATABASE_URL", &database)
            .output()
            .unwrap()
    };
    let first = charge();
    assert_eq!(code(&first), 0, "{}", text(&first));
    let row = psql("SELECT status || ' ' || last_fence FROM invoices WHERE id = 'inv_72'");
    let fence: u64 = row.strip_prefix("charged ").unwrap().parse().unwrap();
    assert!(fence > 0, "{row}");
    // A newer holder wrote the row; this run's fence is older now.
    psql("UPDATE invoices SET status = 'refunded', last_fence = 281474976710655");
    let stale = charge();
    assert_eq!(code(&stale), 3, "{}", text(&stale));
    assert!(stderr(&stale).contains("stale"), "{}", text(&stale));
    assert_eq!(
        psql("SELECT status FROM invoices WHERE id = 'inv_72'"),
        "refunded"
    );
}

/// What the memory:// refusal points to works: two `leasehold` processes on one SQLite file
/// exclude each other, and fences grow from run to run.
#[test]
fn sqlite_urls_exclude_across_processes() {
    let dir = leasehold_servers::process::server_dir("cli-sqlite").unwrap();
    let url = format!("sqlite://{}", dir.path().join("locks.db").display());
    let fence_of = |out: &Output| -> u64 {
        let line = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert!(line.ends_with(" sqlite"), "{line}");
        line.split(' ').next().unwrap().parse().unwrap()
    };
    let echo = "echo $LEASEHOLD_FENCE $LEASEHOLD_BACKEND";
    let first = leasehold(&[
        "run", "--url", &url, "--key", "job:sq", "--", "sh", "-c", echo,
    ]);
    assert_eq!(code(&first), 0, "{}", text(&first));
    let (holding, done) = (dir.path().join("holding"), dir.path().join("done"));
    let wait = format!(
        "touch {}; while [ ! -e {} ]; do sleep 0.05; done",
        holding.display(),
        done.display()
    );
    let mut holder = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(["run", "--url", &url, "--key", "job:sq", "--"])
        .args(["sh", "-c", &wait])
        .env_remove("LEASEHOLD_URL")
        .spawn()
        .unwrap();
    let started = Instant::now();
    while !holding.exists() {
        if let Some(status) = holder.try_wait().unwrap() {
            panic!("the holder exited ({status}) before its command ran");
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the holder never ran"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let held = leasehold(&["run", "--url", &url, "--key", "job:sq", "--", "true"]);
    std::fs::write(&done, b"done").unwrap();
    assert!(holder.wait().unwrap().success());
    assert_eq!(code(&held), 75, "{}", text(&held));
    let last = leasehold(&[
        "run", "--url", &url, "--key", "job:sq", "--", "sh", "-c", echo,
    ]);
    assert_eq!(code(&last), 0, "{}", text(&last));
    assert!(fence_of(&last) > fence_of(&first));
}

/// `rediss://` against a server without TLS gets no answer; the error says TLS may be why.
#[test]
fn a_tls_url_against_a_plain_server_says_tls_may_be_why() {
    let server = RedisServer::start().unwrap();
    let plain = url(&server);
    let tls = plain.replacen("redis://", "rediss://", 1);
    let out = leasehold(&["run", "--url", &tls, "--key", "k", "--", "true"]);
    assert_eq!(code(&out), 69, "{}", text(&out));
    assert!(stderr(&out).contains("TLS"), "{}", text(&out));
    assert!(stderr(&out).contains("redis://"), "{}", text(&out));
    // Not said for a plain URL that gets no answer.
    let out = leasehold(&[
        "run",
        "--url",
        "redis://127.0.0.1:1?timeout_ms=300",
        "--key",
        "k",
        "--",
        "true",
    ]);
    assert!(!stderr(&out).contains("TLS"), "{}", text(&out));
}

/// The parent-death signal reaches only the command itself; what the command started in the
/// background must stop too when `leasehold` is killed with -9: the whole process group goes.
#[test]
fn sigkill_of_leasehold_stops_the_commands_background_processes_too() {
    let server = RedisServer::start().unwrap();
    let url = url(&server);
    let dir = leasehold_servers::process::server_dir("cli-pdeath-group").unwrap();
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
        .unwrap();
    wait_for_growth(&file, &mut run);
    run.kill().unwrap();
    let killed = Instant::now();
    let _ = run.wait();
    let grew = last_growth_after(&file, killed, ttl);
    kill_pid_file(&pid);
    assert!(
        grew < ttl / 2,
        "the background writer kept writing {grew:?} after leasehold was killed (TTL {ttl:?})"
    );
}

/// `leasehold` with no `--url` and no `LEASEHOLD_URL`, with `XDG_STATE_HOME` and `HOME` as given
/// (`None`: unset).
fn leasehold_default(
    args: &[&str],
    xdg: Option<&std::path::Path>,
    home: Option<&std::path::Path>,
) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_leasehold"));
    command
        .args(args)
        .env_remove("LEASEHOLD_URL")
        .env_remove("XDG_STATE_HOME")
        .env_remove("HOME");
    if let Some(xdg) = xdg {
        command.env("XDG_STATE_HOME", xdg);
    }
    if let Some(home) = home {
        command.env("HOME", home);
    }
    command
}

/// With no `--url` and no `LEASEHOLD_URL`, `leasehold run` uses a per-user SQLite file,
/// `$XDG_STATE_HOME/leasehold/locks.db`, creating its directory (mode 0700): two processes on one
/// key exclude each other (the second is busy, or waits), and fences grow.
#[test]
fn with_no_url_runs_exclude_each_other_through_a_per_user_sqlite_file() {
    use std::os::unix::fs::PermissionsExt;
    let dir = leasehold_servers::process::server_dir("cli-default").unwrap();
    let state = dir.path().join("state");
    let home = dir.path().join("home-unused");
    let db_dir = state.join("leasehold");
    assert!(!db_dir.exists());
    let (fence1, done1) = (dir.path().join("fence1"), dir.path().join("done1"));
    let mut holder = leasehold_default(
        &["run", "--key", "nightly", "--ttl", "30s", "--"],
        Some(&state),
        Some(&home),
    )
    .args(["sh", "-c", &hold_script(&fence1, &done1)])
    .spawn()
    .unwrap();
    wait_for_file(&fence1, &mut holder);
    let first = read_fence(&fence1);
    assert!(db_dir.join("locks.db").is_file());
    let mode = std::fs::metadata(&db_dir).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "{mode:o}");
    assert!(
        !home.exists(),
        "HOME was used although XDG_STATE_HOME is set"
    );

    // The second process finds the key held: busy at once with --wait 0s.
    let busy = leasehold_default(
        &["run", "--key", "nightly", "--", "true"],
        Some(&state),
        Some(&home),
    )
    .output()
    .unwrap();
    assert_eq!(code(&busy), 75, "{}", text(&busy));
    assert!(stderr(&busy).contains("held"), "{}", text(&busy));

    // A third waits, and gets the key once the holder lets it go, with a greater fence.
    let (fence2, done2) = (dir.path().join("fence2"), dir.path().join("done2"));
    std::fs::write(&done2, b"").unwrap();
    let waiter = leasehold_default(
        &["run", "--key", "nightly", "--wait", "30s", "-q", "--"],
        Some(&state),
        Some(&home),
    )
    .args(["sh", "-c", &hold_script(&fence2, &done2)])
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(!fence2.exists(), "the waiter ran while the key was held");
    std::fs::write(&done1, b"done").unwrap();
    assert!(holder.wait().unwrap().success());
    let out = waiter.wait_with_output().unwrap();
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert!(read_fence(&fence2) > first);
}

/// Without XDG_STATE_HOME (or with a relative one, which the XDG spec says to ignore), the file is
/// `$HOME/.local/state/leasehold/locks.db`; with neither usable, a clear error and 64.
/// The per-user SQLite file is a local lock, as flock is: a short TTL works with it (its request
/// timeout is a quarter of the TTL), where a network authority's 5 s request timeout would refuse
/// it. A TTL too short even for that is still refused before anything is created.
#[test]
fn the_default_authority_takes_short_ttls() -> Result<(), String> {
    let dir = leasehold_servers::process::server_dir("cli-default-ttl")
        .map_err(|e| format!("temp dir: {e}"))?;
    for ttl in ["2s", "1s", "500ms"] {
        let out = leasehold_default(
            &["run", "--key", "short", "--ttl", ttl, "--", "true"],
            Some(dir.path()),
            None,
        )
        .output()
        .map_err(|e| format!("run: {e}"))?;
        if code(&out) != 0 {
            return Err(format!(
                "--ttl {ttl} on the default authority: {}",
                text(&out)
            ));
        }
    }
    let state = dir.path().join("none");
    let out = leasehold_default(
        &["run", "--key", "short", "--ttl", "10ms", "--", "true"],
        Some(&state),
        None,
    )
    .output()
    .map_err(|e| format!("run: {e}"))?;
    if code(&out) != 64 || !stderr(&out).contains("too short") {
        return Err(format!("--ttl 10ms was not refused: {}", text(&out)));
    }
    if state.exists() {
        return Err("a refused TTL created the state directory".into());
    }
    Ok(())
}

#[test]
fn with_no_url_the_default_falls_back_to_home_or_says_why_not() {
    let dir = leasehold_servers::process::server_dir("cli-default-home").unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir(&home).unwrap();
    let echo = "echo $LEASEHOLD_BACKEND";
    for xdg in [
        None,
        Some(std::path::Path::new("relative/state")),
        Some(std::path::Path::new("")),
    ] {
        let out = leasehold_default(
            &["run", "--key", "k", "--", "sh", "-c", echo],
            xdg,
            Some(&home),
        )
        .output()
        .unwrap();
        assert_eq!(code(&out), 0, "{xdg:?}: {}", text(&out));
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "sqlite");
        assert!(home.join(".local/state/leasehold/locks.db").is_file());
    }
    let marker = dir.path().join("ran");
    let touch = format!("touch {}", marker.display());
    for (xdg, home) in [(None, None), (None, Some("")), (Some("rel"), Some("rel"))] {
        let out = leasehold_default(
            &["run", "--key", "k", "--", "sh", "-c", &touch],
            xdg.map(std::path::Path::new),
            home.map(std::path::Path::new),
        )
        .output()
        .unwrap();
        assert_eq!(code(&out), 64, "{xdg:?} {home:?}: {}", text(&out));
        let err = stderr(&out);
        assert!(
            err.contains("XDG_STATE_HOME") && err.contains("--url"),
            "{err}"
        );
        assert!(!marker.exists());
    }
    let help = leasehold(&["--help"]);
    let usage = String::from_utf8_lossy(&help.stdout);
    assert!(
        usage.contains("$XDG_STATE_HOME/leasehold/locks.db"),
        "{usage}"
    );
    assert!(!usage.contains("coming"), "{usage}");
}

/// The Prometheus text a server at `port` serves at `/metrics`.
fn scrape(port: u16) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let mut body = String::new();
    stream.read_to_string(&mut body).unwrap();
    body
}

/// The value of the series `name` whose labels include `labels`, if served.
fn series(body: &str, name: &str, labels: &[&str]) -> Option<f64> {
    body.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .find(|l| labels.iter().all(|label| l.contains(label)))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// `leasehold run --metrics-addr` serves the run's metrics while the command runs:
/// the lease held (1), the acquire that got it, labelled with the backend and the key; an
/// address already in use is refused before anything is acquired (69).
#[test]
fn run_serves_prometheus_metrics_while_the_command_runs() {
    let dir = leasehold_servers::process::server_dir("cli-metrics").unwrap();
    let url = format!("sqlite://{}", dir.path().join("locks.db").display());
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = {
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        free.local_addr().unwrap().port()
    };
    let (fence_file, done) = (dir.path().join("fence"), dir.path().join("done"));
    let mut holder = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(["run", "--url", &url, "--key", "metrics:job", "--ttl", "30s"])
        .args(["--metrics-addr", &format!("127.0.0.1:{port}"), "--"])
        .args(["sh", "-c", &hold_script(&fence_file, &done)])
        .env_remove("LEASEHOLD_URL")
        .spawn()
        .unwrap();
    wait_for_file(&fence_file, &mut holder);
    let body = scrape(port);
    let ours = ["backend=\"sqlite\"", "key=\"metrics:job\""];
    assert_eq!(
        series(&body, "leasehold_leases_held", &ours),
        Some(1.0),
        "{body}"
    );
    let acquired = [ours[0], ours[1], "outcome=\"acquired\""];
    assert_eq!(
        series(&body, "leasehold_acquire_total", &acquired),
        Some(1.0),
        "{body}"
    );
    assert!(body.contains("# HELP leasehold_acquire_total"), "{body}");
    std::fs::write(&done, b"done").unwrap();
    assert!(holder.wait().unwrap().success());

    let in_use = taken.local_addr().unwrap().to_string();
    let out = leasehold(&[
        "run",
        "--url",
        &url,
        "--key",
        "metrics:job",
        "--metrics-addr",
        &in_use,
        "--",
        "true",
    ]);
    assert_eq!(code(&out), 69, "{}", text(&out));
    assert!(
        text(&out).contains("cannot serve metrics"),
        "{}",
        text(&out)
    );
}

/// `--if-unavailable` against an authority that does not answer (nothing listens on
/// the port): `fail` (the default) exits 69 and never runs the command; `skip` exits 0 and never
/// runs it; `run` runs it without a lock, told so by `LEASEHOLD_LOCK=unlocked` and with no
/// fence in its environment, even one inherited from an outer run, and exits with its status.
#[test]
fn if_unavailable_fails_skips_or_runs_unlocked_as_told() {
    let dir = leasehold_servers::process::server_dir("cli-if-unavailable").unwrap();
    let seen = dir.path().join("seen");
    let script = format!(
        "echo \"lock=$LEASEHOLD_LOCK fence=${{LEASEHOLD_FENCE-unset}}\" > {}; exit 3",
        seen.display()
    );
    let down = "redis://127.0.0.1:1?timeout_ms=300";
    let run = |policy: Option<&str>| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_leasehold"));
        command.args(["run", "--url", down, "--key", "nightly"]);
        if let Some(p) = policy {
            command.args(["--if-unavailable", p]);
        }
        command
            .args(["--", "sh", "-c", &script])
            .env_remove("LEASEHOLD_URL")
            .env("LEASEHOLD_FENCE", "41")
            .output()
            .unwrap()
    };
    for policy in [None, Some("fail")] {
        let out = run(policy);
        assert_eq!(code(&out), 69, "{policy:?}: {}", text(&out));
        assert!(!seen.exists(), "{policy:?} ran the command");
    }
    let out = run(Some("skip"));
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert!(
        text(&out).contains("not running the command"),
        "{}",
        text(&out)
    );
    assert!(!seen.exists(), "skip ran the command");
    let out = run(Some("run"));
    assert_eq!(code(&out), 3, "{}", text(&out));
    assert!(text(&out).contains("WITHOUT a lock"), "{}", text(&out));
    assert_eq!(
        std::fs::read_to_string(&seen).unwrap().trim(),
        "lock=unlocked fence=unset"
    );
}
