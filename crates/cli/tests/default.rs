//! `leasehold run` with no `--url` and no `LEASEHOLD_URL`: the per-user SQLite file under
//! `$XDG_STATE_HOME` or `$HOME`, excluding across processes, taking short TTLs, and saying why
//! when neither variable is usable.

use std::process::Command;
use std::time::Duration;

mod common;

use common::{
    code, hold_script, leasehold, read_fence, stderr, text, wait_for_file, OrFail, Result,
};

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
fn with_no_url_runs_exclude_each_other_through_a_per_user_sqlite_file() -> Result {
    use std::os::unix::fs::PermissionsExt;
    let dir =
        leasehold_servers::process::server_dir("cli-default").or_fail("a scratch directory")?;
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
    .or_fail("start the holder")?;
    wait_for_file(&fence1, &mut holder)?;
    let first = read_fence(&fence1)?;
    assert!(db_dir.join("locks.db").is_file());
    let mode = std::fs::metadata(&db_dir)
        .or_fail("the database's directory")?
        .permissions()
        .mode()
        & 0o777;
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
    .or_fail("run the second process")?;
    assert_eq!(code(&busy), 75, "{}", text(&busy));
    assert!(stderr(&busy).contains("held"), "{}", text(&busy));

    // A third waits, and gets the key once the holder lets it go, with a greater fence.
    let (fence2, done2) = (dir.path().join("fence2"), dir.path().join("done2"));
    std::fs::write(&done2, b"").or_fail("let the waiter's command end at once")?;
    let waiter = leasehold_default(
        &["run", "--key", "nightly", "--wait", "30s", "-q", "--"],
        Some(&state),
        Some(&home),
    )
    .args(["sh", "-c", &hold_script(&fence2, &done2)])
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .or_fail("start the waiter")?;
    std::thread::sleep(Duration::from_millis(300));
    assert!(!fence2.exists(), "the waiter ran while the key was held");
    std::fs::write(&done1, b"done").or_fail("let the holder finish")?;
    assert!(holder.wait().or_fail("wait for the holder")?.success());
    let out = waiter.wait_with_output().or_fail("wait for the waiter")?;
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert!(read_fence(&fence2)? > first);
    Ok(())
}

/// Without XDG_STATE_HOME (or with a relative one, which the XDG spec says to ignore), the file is
/// `$HOME/.local/state/leasehold/locks.db`; with neither usable, a clear error and 64.
/// The per-user SQLite file is a local lock, as flock is: a short TTL works with it (its request
/// timeout is a quarter of the TTL), where a network authority's 5 s request timeout would refuse
/// it. A TTL too short even for that is still refused before anything is created.
#[test]
fn the_default_authority_takes_short_ttls() -> Result {
    let dir = leasehold_servers::process::server_dir("cli-default-ttl").or_fail("temp dir")?;
    for ttl in ["2s", "1s", "500ms"] {
        let out = leasehold_default(
            &["run", "--key", "short", "--ttl", ttl, "--", "true"],
            Some(dir.path()),
            None,
        )
        .output()
        .or_fail("run")?;
        if code(&out) != 0 {
            return Err(format!("--ttl {ttl} on the default authority: {}", text(&out)).into());
        }
    }
    let state = dir.path().join("none");
    let out = leasehold_default(
        &["run", "--key", "short", "--ttl", "10ms", "--", "true"],
        Some(&state),
        None,
    )
    .output()
    .or_fail("run")?;
    if code(&out) != 64 || !stderr(&out).contains("too short") {
        return Err(format!("--ttl 10ms was not refused: {}", text(&out)).into());
    }
    if state.exists() {
        return Err("a refused TTL created the state directory".into());
    }
    Ok(())
}

#[test]
fn with_no_url_the_default_falls_back_to_home_or_says_why_not() -> Result {
    let dir = leasehold_servers::process::server_dir("cli-default-home")
        .or_fail("a scratch directory")?;
    let home = dir.path().join("home");
    std::fs::create_dir(&home).or_fail("make HOME")?;
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
        .or_fail(format!("run with XDG_STATE_HOME {xdg:?}"))?;
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
        .or_fail(format!("run with XDG_STATE_HOME {xdg:?} and HOME {home:?}"))?;
        assert_eq!(code(&out), 64, "{xdg:?} {home:?}: {}", text(&out));
        let err = stderr(&out);
        assert!(
            err.contains("XDG_STATE_HOME") && err.contains("--url"),
            "{err}"
        );
        assert!(!marker.exists());
    }
    let help = leasehold(&["--help"])?;
    let usage = String::from_utf8_lossy(&help.stdout);
    assert!(
        usage.contains("$XDG_STATE_HOME/leasehold/locks.db"),
        "{usage}"
    );
    assert!(!usage.contains("coming"), "{usage}");
    Ok(())
}
