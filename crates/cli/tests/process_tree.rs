//! Nothing the command started outlives its lease: `leasehold run` against a SQLite file (an
//! embedded authority, no server), with real process trees: grandchildren that ignore SIGTERM,
//! descendants that left the command's process group, a `leasehold` stopped by SIGSTOP or Ctrl-Z,
//! and a command that reads the terminal.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

type Result<T = (), E = String> = std::result::Result<T, E>;

/// How often the writer appends a line.
const WRITE_EVERY: Duration = Duration::from_millis(50);

/// A temporary directory with a SQLite lock file and the writer's files.
struct Scratch {
    dir: tempfile::TempDir,
}

impl Scratch {
    fn new(name: &str) -> Result<Scratch> {
        let dir =
            leasehold_servers::process::server_dir(name).map_err(|e| format!("temp dir: {e}"))?;
        let scratch = Scratch { dir };
        std::fs::write(scratch.path("writer.sh"), WRITER)
            .map_err(|e| format!("write writer.sh: {e}"))?;
        Ok(scratch)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A local file authority with a short request timeout, so short TTLs are allowed.
    fn url(&self) -> String {
        format!(
            "sqlite://{}?timeout_ms=500",
            self.path("locks.db").display()
        )
    }

    /// `/bin/sh writer.sh OUT PIDS [ignore-term]`: the command line of one writer.
    fn writer(&self, out: &str, ignore_term: bool) -> String {
        format!(
            "/bin/sh {} {} {}{}",
            self.path("writer.sh").display(),
            self.path(out).display(),
            self.path("pids").display(),
            if ignore_term { " ignore-term" } else { "" }
        )
    }

    fn size(&self, out: &str) -> u64 {
        std::fs::metadata(self.path(out)).map_or(0, |m| m.len())
    }

    /// Waits until `out` has grown twice (the writer runs), failing if `run` exits first.
    fn wait_for_writes(&self, out: &str, run: &mut Child) -> Result {
        let started = Instant::now();
        let mut seen = Vec::new();
        while seen.len() < 3 {
            let n = self.size(out);
            if seen.last() != Some(&n) {
                seen.push(n);
            }
            if let Ok(Some(status)) = run.try_wait() {
                return Err(format!(
                    "leasehold exited ({status}) before its command wrote"
                ));
            }
            if started.elapsed() > Duration::from_secs(30) {
                return Err(format!("the writer did not write within 30 s ({seen:?})"));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }

    /// Whether `out` grows within ten write intervals.
    fn grows(&self, out: &str) -> bool {
        self.grows_within(out, WRITE_EVERY * 10)
    }

    /// Whether `out` grows within `limit`: a writer that should resume is given seconds on a
    /// loaded machine, not ten write intervals.
    fn grows_within(&self, out: &str, limit: Duration) -> bool {
        let before = self.size(out);
        let until = Instant::now() + limit;
        while Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
            if self.size(out) != before {
                return true;
            }
        }
        false
    }

    /// The writers that recorded their pid and are still alive (a zombie is dead): a writer
    /// that merely stands still (starved, stopped) is not gone.
    fn live_writers(&self) -> Vec<String> {
        let pids = std::fs::read_to_string(self.path("pids")).unwrap_or_default();
        pids.split_whitespace()
            .filter(|pid| {
                pid.parse::<u32>()
                    .ok()
                    .and_then(state_of)
                    .is_some_and(|state| state != 'Z' && state != 'X')
            })
            .map(str::to_string)
            .collect()
    }

    /// Kills every writer that recorded its pid, so a failed test leaves nothing running.
    fn kill_writers(&self) {
        if let Ok(pids) = std::fs::read_to_string(self.path("pids")) {
            for pid in pids.split_whitespace() {
                let _ = Command::new("/bin/kill").args(["-KILL", pid]).status();
            }
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        self.kill_writers();
    }
}

/// Appends a line to $1 every 50 ms, after recording its pid in $2; with $3 = ignore-term it
/// ignores SIGTERM, as a careless background job does. Absolute paths only, so it runs with an
/// empty PATH.
const WRITER: &str = r#"
[ "$3" = ignore-term ] && trap '' TERM
echo $$ >> "$2"
while :; do echo x >> "$1"; /bin/sleep 0.05; done
"#;

fn leasehold() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_leasehold"));
    command.env_remove("LEASEHOLD_URL").stdin(Stdio::null());
    command
}

fn signal(pid: u32, signal: &str) -> Result {
    let status = Command::new("/bin/kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()
        .map_err(|e| format!("kill -{signal} {pid}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("kill -{signal} {pid}: {status}"))
    }
}

/// Waits for `run` to exit, at most `limit`; its exit code (or an error naming what happened).
fn exit_within(run: &mut Child, limit: Duration, what: &str) -> Result<i32> {
    let started = Instant::now();
    loop {
        match run.try_wait() {
            Ok(Some(status)) => return status.code().ok_or(format!("{what}: {status}")),
            Ok(None) if started.elapsed() > limit => {
                let _ = run.kill();
                return Err(format!("{what}: leasehold did not exit within {limit:?}"));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => return Err(format!("{what}: {e}")),
        }
    }
}

/// Waits for `run` to exit once a test's checks (`result`) are done, whatever they found:
/// their failure first, else an exit status other than `want`.
fn settled(result: Result, run: &mut Child, what: &str, want: i32) -> Result {
    let code = exit_within(run, Duration::from_secs(15), what);
    result?;
    match code? {
        code if code == want => Ok(()),
        other => Err(format!("{what}: exited {other}, not {want}")),
    }
}

/// The process state letter from /proc/PID/stat (`T` stopped, `S` sleeping...).
fn state_of(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = stat.rsplit_once(')')?.1;
    after_name.trim_start().chars().next()
}

/// The process group of `pid` and the foreground group of its terminal (`/proc/PID/stat`'s
/// fifth and eighth fields).
fn groups_of(pid: u32) -> Option<(i64, i64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    Some((fields.get(2)?.parse().ok()?, fields.get(5)?.parse().ok()?))
}

fn wait_for_state(pid: u32, want: char, limit: Duration) -> Result {
    let started = Instant::now();
    while state_of(pid) != Some(want) {
        if started.elapsed() > limit {
            return Err(format!(
                "process {pid} is in state {:?}, not {want}, after {limit:?}",
                state_of(pid)
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

/// SIGTERM to `leasehold` running `script`: once it has exited, nothing the command started
/// may still write, and the key must be free for the next run.
fn terminated_run_leaves_nothing(
    scratch: &Scratch,
    script: &str,
    path_env: Option<&str>,
) -> Result {
    let url = scratch.url();
    let mut command = leasehold();
    command.args([
        "run", "--url", &url, "--key", "gc", "--ttl", "6s", "--grace", "1s", "--", "/bin/sh", "-c",
        script,
    ]);
    if let Some(path) = path_env {
        command.env("PATH", path);
    }
    let mut run = command
        .spawn()
        .map_err(|e| format!("spawn leasehold: {e}"))?;
    scratch.wait_for_writes("out", &mut run)?;
    signal(run.id(), "TERM")?;
    let code = exit_within(&mut run, Duration::from_secs(15), "after SIGTERM")?;
    if code != 128 + 15 {
        return Err(format!("leasehold exited {code}, not 143, after SIGTERM"));
    }
    if scratch.grows("out") {
        return Err(format!(
            "something `{script}` started still writes after leasehold exited"
        ));
    }
    let alive = scratch.live_writers();
    if !alive.is_empty() {
        return Err(format!(
            "writers {alive:?} that `{script}` started are alive after leasehold exited"
        ));
    }
    let next = leasehold()
        .args(["run", "--url", &url, "--key", "gc", "--", "/bin/true"])
        .output()
        .map_err(|e| format!("second run: {e}"))?;
    if next.status.code() != Some(0) {
        return Err(format!(
            "the key was not free after the first run: {}",
            String::from_utf8_lossy(&next.stderr)
        ));
    }
    Ok(())
}

/// A background job that ignores SIGTERM: the group is killed after --grace even though the
/// group's leader (the shell) obeyed SIGTERM at once.
#[test]
fn a_grandchild_that_ignores_sigterm_is_killed_after_the_grace() -> Result {
    let scratch = Scratch::new("cli-tree-ignore-term")?;
    terminated_run_leaves_nothing(
        &scratch,
        &format!("{} & wait", scratch.writer("out", true)),
        None,
    )
}

/// As above, with nothing on PATH (a distroless image has no `kill` program): the signals must
/// still reach the group.
#[test]
fn the_group_is_killed_without_a_kill_program_on_path() -> Result {
    let scratch = Scratch::new("cli-tree-no-path")?;
    let script = format!("{} & wait", scratch.writer("out", true));
    terminated_run_leaves_nothing(&scratch, &script, Some(""))
}

/// A descendant that left the command's process group (`setsid`) is found and killed too.
#[test]
fn a_descendant_in_a_session_of_its_own_is_killed_too() -> Result {
    let scratch = Scratch::new("cli-tree-setsid")?;
    let script = format!("/usr/bin/setsid {} & wait", scratch.writer("out", false));
    terminated_run_leaves_nothing(&scratch, &script, None)
}

/// A daemon (double fork into a session of its own, its parent gone at once, so it was
/// reparented) is found and killed too.
#[test]
fn a_daemonized_descendant_is_killed_too() -> Result {
    let scratch = Scratch::new("cli-tree-daemon")?;
    let script = format!(
        "( /usr/bin/setsid {} & ) ; /bin/sleep 60",
        scratch.writer("out", true)
    );
    terminated_run_leaves_nothing(&scratch, &script, None)
}

/// A command that exits while something it started in the background goes on: that is ended
/// before the lease is released, and leasehold exits with the command's status.
#[test]
fn what_a_finished_command_left_running_is_ended_before_the_release() -> Result {
    let scratch = Scratch::new("cli-tree-left-behind")?;
    let url = scratch.url();
    let script = format!(
        "{} & while [ ! -s {out} ]; do /bin/sleep 0.01; done; exit 3",
        scratch.writer("out", false),
        out = scratch.path("out").display()
    );
    // Not `output()`: the writer holds leasehold's stdout open for as long as it lives.
    let mut run = leasehold()
        .args([
            "run", "--url", &url, "--key", "left", "--ttl", "6s", "--grace", "1s", "--",
        ])
        .args(["/bin/sh", "-c", &script])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("run: {e}"))?;
    let code = exit_within(&mut run, Duration::from_secs(15), "a finished command")?;
    if code != 3 {
        return Err(format!("leasehold exited {code}, not the command's 3"));
    }
    if scratch.grows("out") || !scratch.live_writers().is_empty() {
        return Err("the command's background writer outlived the run".into());
    }
    Ok(())
}

/// `kill -STOP` of leasehold (it cannot catch it): the watcher process knows the lease's
/// deadline and kills the command when it passes unconfirmed, before a second run can take the
/// key. Resumed, leasehold finds the lease lost and exits with --lost-exit-code.
#[test]
fn a_stopped_leasehold_cannot_keep_its_command_running_past_the_lease() -> Result {
    let scratch = Scratch::new("cli-tree-sigstop")?;
    let url = scratch.url();
    let mut first = leasehold()
        .args([
            "run",
            "--url",
            &url,
            "--key",
            "stop",
            "--ttl",
            "6s",
            "--lost-exit-code",
            "90",
        ])
        .args(["--", "/bin/sh", "-c", &scratch.writer("out", false)])
        .spawn()
        .map_err(|e| format!("spawn the first run: {e}"))?;
    scratch.wait_for_writes("out", &mut first)?;
    signal(first.id(), "STOP")?;
    // The second run records the writer's output size as its command starts: from then on,
    // with fence 2 out, fence 1's command must not write.
    let seen = scratch.path("seen");
    let second = leasehold()
        .args([
            "run", "--url", &url, "--key", "stop", "--ttl", "6s", "--wait", "20s", "--",
        ])
        .args([
            "/bin/sh",
            "-c",
            &format!(
                "/usr/bin/wc -c < {} > {}; echo $LEASEHOLD_FENCE > {}",
                scratch.path("out").display(),
                seen.display(),
                scratch.path("fence").display()
            ),
        ])
        .output()
        .map_err(|e| format!("second run: {e}"))?;
    let result: Result = (|| {
        if second.status.code() != Some(0) {
            return Err(format!(
                "the second run failed: {}",
                String::from_utf8_lossy(&second.stderr)
            ));
        }
        let at_grant: u64 = std::fs::read_to_string(&seen)
            .map_err(|e| format!("read seen: {e}"))?
            .trim()
            .parse()
            .map_err(|e| format!("seen: {e}"))?;
        let fence = std::fs::read_to_string(scratch.path("fence")).unwrap_or_default();
        let _ = scratch.grows("out");
        let now = scratch.size("out");
        if now != at_grant {
            return Err(format!(
                "fence 1's command went on writing after fence {} was granted: {at_grant} \
                 bytes then, {now} now",
                fence.trim()
            ));
        }
        Ok(())
    })();
    let _ = signal(first.id(), "CONT");
    settled(result, &mut first, "the resumed run (--lost-exit-code)", 90)
}

/// SIGTSTP (Ctrl-Z, or `kill -TSTP`) stops the command first, then leasehold; SIGCONT resumes
/// both while the lease lasts.
#[test]
fn sigtstp_stops_the_command_first_and_sigcont_resumes_it() -> Result {
    let scratch = Scratch::new("cli-tree-tstp")?;
    let url = scratch.url();
    let mut run = leasehold()
        .args([
            "run", "--url", &url, "--key", "tstp", "--ttl", "30s", "--grace", "1s",
        ])
        .args(["--", "/bin/sh", "-c", &scratch.writer("out", false)])
        .spawn()
        .map_err(|e| format!("spawn: {e}"))?;
    scratch.wait_for_writes("out", &mut run)?;
    let result: Result = (|| {
        signal(run.id(), "TSTP")?;
        wait_for_state(run.id(), 'T', Duration::from_secs(10))?;
        if scratch.grows("out") {
            return Err("the command goes on writing while leasehold is stopped".into());
        }
        signal(run.id(), "CONT")?;
        if !scratch.grows_within("out", Duration::from_secs(5)) {
            return Err("the command did not resume with leasehold".into());
        }
        Ok(())
    })();
    let _ = signal(run.id(), "CONT");
    let _ = signal(run.id(), "TERM");
    settled(result, &mut run, "after SIGTERM", 143)
}

/// Runs the shell command line `inner` in a terminal of its own (a pty from script(1)), whose
/// keyboard is the returned child's stdin.
fn in_a_terminal(inner: &str) -> Result<Child> {
    Command::new("/usr/bin/script")
        .args(["-qec", inner, "/dev/null"])
        .env_remove("LEASEHOLD_URL")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| format!("script: {e}"))
}

/// In a terminal, the command is the terminal's foreground group: it can read it (instead of
/// being stopped by SIGTTIN while leasehold renews forever), and Ctrl-C reaches it.
#[test]
fn a_command_in_a_terminal_can_read_it() -> Result {
    let scratch = Scratch::new("cli-tree-tty")?;
    let got = scratch.path("got");
    let inner = format!(
        "{} run --url '{}' --key tty --ttl 6s -- /bin/sh -c 'read line; echo \"$line\" > {}'",
        env!("CARGO_BIN_EXE_leasehold"),
        scratch.url(),
        got.display()
    );
    let mut session = in_a_terminal(&inner)?;
    let result: Result = (|| {
        use std::io::Write;
        let stdin = session.stdin.as_mut().ok_or("no stdin")?;
        stdin
            .write_all(b"hello\n")
            .map_err(|e| format!("type into the terminal: {e}"))?;
        let started = Instant::now();
        while std::fs::read_to_string(&got).map_or(true, |s| s.trim() != "hello") {
            if started.elapsed() > Duration::from_secs(10) {
                return Err("the command never read the line typed into its terminal".into());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    })();
    drop(session.stdin.take());
    settled(result, &mut session, "the terminal session", 0)
}

/// The watcher kills only at a deadline nobody confirmed: a command that runs for two TTLs
/// under a lease renewed all along is left alone.
#[test]
fn a_renewed_lease_keeps_the_watcher_quiet() -> Result {
    let scratch = Scratch::new("cli-tree-quiet")?;
    let url = scratch.url();
    let ttl = Duration::from_secs(2);
    let started = Instant::now();
    let out = leasehold()
        .args(["run", "--url", &url, "--key", "quiet", "--ttl", "2s", "--"])
        .args(["/bin/sh", "-c", "/bin/sleep 4.5; exit 7"])
        .output()
        .map_err(|e| format!("run: {e}"))?;
    let took = started.elapsed();
    if out.status.code() != Some(7) {
        return Err(format!(
            "exited {:?} after {took:?}, not the command's 7: {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    if took < ttl * 2 {
        return Err(format!(
            "the command ended after {took:?}, before its 4.5 s sleep"
        ));
    }
    Ok(())
}

/// Ctrl-Z at the terminal reaches the command (the foreground group); leasehold sees it stop
/// and stops too, as a shell's job; continued, leasehold continues the command.
#[test]
fn ctrl_z_at_the_terminal_stops_the_command_and_leasehold() -> Result {
    let scratch = Scratch::new("cli-tree-ctrl-z")?;
    let leasehold_pid = scratch.path("leasehold.pid");
    let inner = format!(
        "{} run --url '{}' --key ctrlz --ttl 30s --grace 1s -- /bin/sh -c 'echo $PPID > {}; exec {}'",
        env!("CARGO_BIN_EXE_leasehold"),
        scratch.url(),
        leasehold_pid.display(),
        scratch.writer("out", false),
    );
    let mut session = in_a_terminal(&inner)?;
    let mut pid = None;
    let result: Result = (|| {
        use std::io::Write;
        scratch.wait_for_writes("out", &mut session)?;
        let leasehold: u32 = std::fs::read_to_string(&leasehold_pid)
            .map_err(|e| format!("leasehold's pid: {e}"))?
            .trim()
            .parse()
            .map_err(|e| format!("leasehold's pid: {e}"))?;
        pid = Some(leasehold);
        let stdin = session.stdin.as_mut().ok_or("no stdin")?;
        stdin
            .write_all(b"\x1a")
            .and_then(|()| stdin.flush())
            .map_err(|e| format!("type Ctrl-Z: {e}"))?;
        wait_for_state(leasehold, 'T', Duration::from_secs(10))?;
        if scratch.grows("out") {
            return Err("the command goes on writing after Ctrl-Z".into());
        }
        // Stopped, leasehold took the terminal back: its own group is the foreground one.
        let (group, foreground) = groups_of(leasehold).ok_or("leasehold's stat")?;
        if group != foreground {
            return Err(format!(
                "stopped, leasehold (group {group}) left the terminal to group {foreground}"
            ));
        }
        // `script` stops itself when its child (leasehold) stops, as a job's process does;
        // `fg` would continue both.
        signal(session.id(), "CONT")?;
        signal(leasehold, "CONT")?;
        if !scratch.grows_within("out", Duration::from_secs(5)) {
            return Err("the command did not resume with leasehold".into());
        }
        // Continued in the foreground, leasehold gave the terminal back to the command.
        let (group, foreground) = groups_of(leasehold).ok_or("leasehold's stat")?;
        if group == foreground {
            return Err("continued, leasehold kept the terminal from its command".into());
        }
        Ok(())
    })();
    let _ = signal(session.id(), "CONT");
    if let Some(pid) = pid {
        let _ = signal(pid, "CONT");
        let _ = signal(pid, "TERM");
    }
    drop(session.stdin.take());
    settled(result, &mut session, "leasehold after SIGTERM", 143)
}
