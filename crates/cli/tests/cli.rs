//! The `leasehold` command against a real Redis started by the harness: the fence in the
//! command's environment and its exit status, a held lock, a lost lease, bad input and authorities
//! that do not answer, what waiting and errors print, logging, and `--if-unavailable`. Signals,
//! the other authorities and the per-user default have test files of their own.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use leasehold::{Authority, LockKey};
use leasehold_redis::{KeyLayout, RedisAuthority};

mod common;

use common::{code, leasehold, redis, stderr, text, url, OrFail, Result};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_gets_the_fence_and_the_lease_is_released_after_it() -> Result {
    let server = redis()?;
    let url = url(&server);
    let script =
        r#"echo "$LEASEHOLD_KEY $LEASEHOLD_FENCE $LEASEHOLD_FENCE_SAFETY $LEASEHOLD_BACKEND""#;
    let first = leasehold(&[
        "run", "--url", &url, "--key", "job:1", "--", "sh", "-c", script,
    ])?;
    assert_eq!(code(&first), 0, "{}", text(&first));
    let line = String::from_utf8_lossy(&first.stdout).trim().to_string();
    let fields: Vec<&str> = line.split(' ').collect();
    assert_eq!(fields[0], "job:1", "{line}");
    let fence: u64 = fields[1].parse().or_fail(format!("the fence in {line}"))?;
    assert_eq!(&fields[2..], ["failover-unsafe", "redis"], "{line}");
    // Released when the command ended: the next run gets the key at once, with a greater fence.
    let second = leasehold(&[
        "run", "--url", &url, "--key", "job:1", "--", "sh", "-c", script,
    ])?;
    assert_eq!(code(&second), 0, "{}", text(&second));
    let next: u64 = String::from_utf8_lossy(&second.stdout)
        .split(' ')
        .nth(1)
        .or_fail(format!("a fence in {}", text(&second)))?
        .parse()
        .or_fail(format!("the fence in {}", text(&second)))?;
    assert!(next > fence);
    // The command's exit status is leasehold's.
    let failing = leasehold(&[
        "run", "--url", &url, "--key", "job:1", "--", "sh", "-c", "exit 7",
    ])?;
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
    ])?;
    assert_eq!(code(&killed), 128 + 9, "{}", text(&killed));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_lock_is_exit_75_and_the_command_does_not_run() -> Result {
    let server = redis()?;
    let url = url(&server);
    let holder = RedisAuthority::connect(&url)
        .await
        .or_fail("connect the holder")?;
    let key = LockKey::new("job:held").or_fail("the key")?;
    let grant = holder
        .try_acquire(&key, Duration::from_secs(30))
        .await
        .or_fail("the holder acquires")?
        .or_fail("the holder acquires: a fresh key was held")?;
    let marker = std::env::temp_dir().join(format!("leasehold-cli-{}", std::process::id()));
    let touch = format!("touch {}", marker.display());
    let started = Instant::now();
    let out = leasehold(&[
        "run", "--url", &url, "--key", "job:held", "--wait", "300ms", "--", "sh", "-c", &touch,
    ])?;
    assert_eq!(code(&out), 75, "{}", text(&out));
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert!(!marker.exists(), "the command ran without the lock");
    let now = leasehold(&["run", "--url", &url, "--key", "job:held", "--", "true"])?;
    assert_eq!(code(&now), 75, "{}", text(&now));
    let _ = holder
        .release(&grant)
        .await
        .or_fail("the holder releases")?;
    Ok(())
}

/// The lease is deleted behind the command's back: at the next renewal (a third of the TTL)
/// leasehold stops the command's whole process group and exits 76.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lease_stops_the_command() -> Result {
    let server = redis()?;
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
        .or_fail("start the run")?;
    let key = LockKey::new("job:lost").or_fail("the key")?;
    let lock_key = KeyLayout::default().lock_key(&key);
    // Wait until the run holds the lock (looking, not competing), then delete it as an operator
    // would.
    while server
        .command(&["EXISTS", &lock_key])
        .or_fail("EXISTS")?
        .trim()
        != "1"
    {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the run never took the lock"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let deleted = Instant::now();
    server
        .command(&["DEL", &KeyLayout::default().lock_key(&key)])
        .or_fail("DEL")?;
    let out = tokio::task::spawn_blocking(move || run.wait_with_output())
        .await
        .or_fail("the task waiting for the run")?
        .or_fail("wait for the run")?;
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
    Ok(())
}

#[test]
fn bad_input_and_unreachable_authorities_have_their_exit_codes() -> Result {
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
        let out = leasehold(args)?;
        assert_eq!(code(&out), want, "{args:?}: {}", text(&out));
    }
    let help = leasehold(&["--help"])?;
    assert_eq!(code(&help), 0);
    assert!(String::from_utf8_lossy(&help.stdout).contains("LEASEHOLD_FENCE"));
    Ok(())
}

/// `leasehold --help | head` and friends: a reader that went away is not a panic. The pipe's
/// read end is closed before `leasehold` starts, so every write to stdout fails with EPIPE.
#[test]
fn help_and_version_survive_a_closed_pipe() -> Result {
    for flag in ["--help", "--version", "-V"] {
        let (reader, writer) = std::io::pipe().or_fail("a pipe")?;
        drop(reader);
        let out = Command::new(env!("CARGO_BIN_EXE_leasehold"))
            .arg(flag)
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .output()
            .or_fail(format!("run leasehold {flag}"))?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{flag}: {stderr}");
        assert_ne!(code(&out), 101, "{flag}: {stderr}");
    }
    Ok(())
}

#[test]
fn version_prints_the_package_version() -> Result {
    for flag in ["--version", "-V"] {
        let out = leasehold(&[flag])?;
        assert_eq!(code(&out), 0, "{flag}: {}", text(&out));
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            format!("leasehold {}", env!("CARGO_PKG_VERSION")),
            "{flag}"
        );
    }
    Ok(())
}

/// Runs `leasehold` with extra environment variables.
fn leasehold_env(args: &[&str], env: &[(&str, &str)]) -> Result<Output> {
    Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(args)
        .env_remove("LEASEHOLD_URL")
        .env_remove("LEASEHOLD_LOG")
        .env_remove("RUST_LOG")
        .envs(env.iter().copied())
        .output()
        .or_fail(format!("run leasehold {args:?}"))
}

/// Two `leasehold run --url memory://x` processes both ran with fence 1, each with an
/// in-process authority of its own. The CLI refuses `memory://` and names what to use instead.
#[test]
fn memory_urls_are_refused_and_point_to_sqlite() -> Result {
    let dir =
        leasehold_servers::process::server_dir("cli-memory").or_fail("a scratch directory")?;
    let marker = dir.path().join("ran");
    let touch = format!("touch {}", marker.display());
    for url in ["memory://", "memory://x"] {
        let out = leasehold(&["run", "--url", url, "--key", "k", "--", "sh", "-c", &touch])?;
        assert_eq!(code(&out), 64, "{url}: {}", text(&out));
        assert!(!marker.exists(), "{url}: the command ran");
        let err = stderr(&out);
        assert!(err.contains("sqlite://"), "{url}: {err}");
        assert!(err.contains("in-process"), "{url}: {err}");
    }
    Ok(())
}

/// `--ttl 1ms` ran the command. A TTL below the floor (the request timeout plus the
/// safety margin) is refused before connecting: exit 64 even for an unreachable authority.
#[test]
fn a_ttl_below_the_floor_is_refused_before_connecting() -> Result {
    let server = redis()?;
    let dir = leasehold_servers::process::server_dir("cli-ttl").or_fail("a scratch directory")?;
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
        ])?;
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
    ])?;
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert!(marker.exists());
    Ok(())
}

/// `--busy-exit-code` (flock's -E) replaces 75, so a command's own 75 can be told from "busy";
/// a wait longer than a second is said once on stderr (not with --quiet), and giving up is said.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_exit_code_and_what_a_wait_says() -> Result {
    let server = redis()?;
    let url = url(&server);
    let holder = RedisAuthority::connect(&url)
        .await
        .or_fail("connect the holder")?;
    let key = LockKey::new("job:busy").or_fail("the key")?;
    let grant = holder
        .try_acquire(&key, Duration::from_secs(30))
        .await
        .or_fail("the holder acquires")?
        .or_fail("the holder acquires: a fresh key was held")?;
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
    ])?;
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
    ])?;
    assert_eq!(code(&waited), 75, "{}", text(&waited));
    let err = stderr(&waited);
    assert_eq!(err.matches("waiting").count(), 1, "{err}");
    assert!(err.contains("until"), "{err}");
    assert!(err.contains("gave up"), "{err}");
    assert!(err.contains("1.6s"), "{err}");
    assert_eq!(err.matches(&holder_id).count(), 2, "{err}");

    let quiet = leasehold(&[
        "run", "--url", &url, "--key", "job:busy", "--wait", "1.2s", "--quiet", "--", "true",
    ])?;
    assert_eq!(code(&quiet), 75, "{}", text(&quiet));
    assert!(!stderr(&quiet).contains("waiting"), "{}", text(&quiet));
    let _ = holder
        .release(&grant)
        .await
        .or_fail("the holder releases")?;

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
    ])?;
    assert_eq!(code(&own), 75, "{}", text(&own));
    Ok(())
}

/// As shells do: 127 for a command that is not found, 126 for one that is not executable; the
/// lease is released either way (the next run gets the key at once).
#[test]
fn a_command_that_cannot_run_is_126_or_127() -> Result {
    let server = redis()?;
    let url = url(&server);
    let dir = leasehold_servers::process::server_dir("cli-exec").or_fail("a scratch directory")?;
    let plain = dir.path().join("not-executable");
    std::fs::write(&plain, "#!/bin/sh\necho hi\n").or_fail("write the script")?;
    let plain = plain.display().to_string();
    for (program, want) in [("/nonexistent/program", 127), (plain.as_str(), 126)] {
        let out = leasehold(&["run", "--url", &url, "--key", "job:exec", "--", program])?;
        assert_eq!(code(&out), want, "{program}: {}", text(&out));
        let next = leasehold(&["run", "--url", &url, "--key", "job:exec", "--", "true"])?;
        assert_eq!(code(&next), 0, "{program}: {}", text(&next));
    }
    Ok(())
}

/// `rediss://` against a server without TLS gets no answer; the error says TLS may be why.
#[test]
fn a_tls_url_against_a_plain_server_says_tls_may_be_why() -> Result {
    let server = redis()?;
    let plain = url(&server);
    let tls = plain.replacen("redis://", "rediss://", 1);
    let out = leasehold(&["run", "--url", &tls, "--key", "k", "--", "true"])?;
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
    ])?;
    assert!(!stderr(&out).contains("TLS"), "{}", text(&out));
    Ok(())
}

/// `LEASEHOLD_LOG=info` (or `RUST_LOG`) shows the acquire, renew and release spans, without
/// colour codes when stderr is not a terminal (here a pipe).
#[test]
fn logging_shows_acquire_renew_and_release_without_colour() -> Result {
    let server = redis()?;
    let url = url(&server);
    for var in ["LEASEHOLD_LOG", "RUST_LOG"] {
        let out = leasehold_env(
            &[
                "run", "--url", &url, "--key", "job:log", "--ttl", "1.2s", "--", "sleep", "1",
            ],
            &[(var, "info")],
        )?;
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
    )?;
    assert_eq!(code(&quiet), 0, "{}", text(&quiet));
    assert_eq!(stderr(&quiet), "");
    Ok(())
}

/// An error prints its source chain once: no text repeated, no Rust Debug dump.
#[test]
fn errors_print_their_chain_once_without_debug_dumps() -> Result {
    for url in [
        "redis://127.0.0.1:1?timeout_ms=500",
        "etcd://127.0.0.1:1?timeout_ms=500",
        "postgres://leasehold@127.0.0.1:1/x?timeout_ms=500",
    ] {
        let out = leasehold(&["run", "--url", url, "--key", "k", "--", "true"])?;
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
    Ok(())
}

/// `--if-unavailable` against an authority that does not answer (nothing listens on
/// the port): `fail` (the default) exits 69 and never runs the command; `skip` exits 0 and never
/// runs it; `run` runs it without a lock, told so by `LEASEHOLD_LOCK=unlocked` and with no
/// fence in its environment, even one inherited from an outer run, and exits with its status.
#[test]
fn if_unavailable_fails_skips_or_runs_unlocked_as_told() -> Result {
    let dir = leasehold_servers::process::server_dir("cli-if-unavailable")
        .or_fail("a scratch directory")?;
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
            .or_fail(format!("run leasehold with --if-unavailable {policy:?}"))
    };
    for policy in [None, Some("fail")] {
        let out = run(policy)?;
        assert_eq!(code(&out), 69, "{policy:?}: {}", text(&out));
        assert!(!seen.exists(), "{policy:?} ran the command");
    }
    let out = run(Some("skip"))?;
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert!(
        text(&out).contains("not running the command"),
        "{}",
        text(&out)
    );
    assert!(!seen.exists(), "skip ran the command");
    let out = run(Some("run"))?;
    assert_eq!(code(&out), 3, "{}", text(&out));
    assert!(text(&out).contains("WITHOUT a lock"), "{}", text(&out));
    assert_eq!(
        std::fs::read_to_string(&seen)
            .or_fail("what the command saw")?
            .trim(),
        "lock=unlocked fence=unset"
    );
    Ok(())
}
