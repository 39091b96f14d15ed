//! One server process: spawned with its output in a log file in its own temp dir, faulted with
//! signals, restarted with the same command line, and killed and cleaned up on drop.
//!
//! Children must never outlive the test process. Each child gets `PR_SET_PDEATHSIG(SIGKILL)`,
//! which fires when the *thread* that forked it exits, and test threads end while a server held
//! in a `static` must live on. So every child is forked by one long-lived spawner thread.

use std::ffi::OsString;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Mutex, MutexGuard, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::error::{HarnessError, Result};

/// How long a start or restart waits for a server to serve before it reports an error.
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// How long [`ManagedProcess::stop`] waits after the polite signal before it kills.
pub const STOP_GRACE: Duration = Duration::from_secs(10);

/// How many lines of a server's log an error or a panicking drop shows.
const TAIL_LINES: usize = 60;

/// How often readiness is polled.
const POLL: Duration = Duration::from_millis(25);

/// The directory under which every server gets its temp dir: `$TMPDIR/leasehold-harness`.
///
/// The first call removes dirs left behind by test processes that no longer exist (a dir's name
/// starts with its owner's pid), e.g. after a `static` server that is never dropped.
pub fn harness_root() -> Result<&'static Path> {
    static ROOT: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();
    let root = ROOT.get_or_init(|| {
        let root = std::env::temp_dir().join("leasehold-harness");
        fs::create_dir_all(&root).map_err(|e| format!("creating {}: {e}", root.display()))?;
        // Sticky and world-writable like /tmp, so a server running as another user (PostgreSQL
        // runs as `postgres` when the tests run as root) can reach its dir, and other users'
        // test runs can share the root.
        let _ = fs::set_permissions(&root, fs::Permissions::from_mode(0o1777));
        remove_stale_dirs(&root);
        Ok(root)
    });
    match root {
        Ok(root) => Ok(root.as_path()),
        Err(message) => Err(HarnessError::io(
            "creating the harness root dir",
            io::Error::other(message.clone()),
        )),
    }
}

/// Removes `<pid>-...` dirs whose process no longer exists.
fn remove_stale_dirs(root: &Path) {
    let Ok(entries) = fs::read_dir(root) else {
        return;
    };
    let own = std::process::id();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != own && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

/// Creates a fresh temp dir `<root>/<pid>-<label>-XXXXXX` for one server.
pub fn server_dir(label: &str) -> Result<TempDir> {
    let root = harness_root()?;
    tempfile::Builder::new()
        .prefix(&format!("{}-{label}-", std::process::id()))
        .tempdir_in(root)
        .map_err(|e| HarnessError::io(format!("creating a temp dir under {}", root.display()), e))
}

/// A [`server_dir`] handed to `user` (a server that runs as another user must write to it).
pub(crate) fn owned_server_dir(name: &str, user: Option<(u32, u32)>) -> Result<TempDir> {
    let dir = server_dir(name)?;
    if let Some((uid, gid)) = user {
        std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).map_err(|e| {
            HarnessError::io(format!("handing {} to uid {uid}", dir.path().display()), e)
        })?;
    }
    Ok(dir)
}

/// `Some((uid, gid))` of the system user `name` when running as root, else `None` (run as we
/// are): servers that refuse root run as their package's user. `why` explains the need when
/// the user does not exist.
pub(crate) fn run_as_when_root(name: &str, why: &str) -> Result<Option<(u32, u32)>> {
    if effective_uid() != Some(0) {
        return Ok(None);
    }
    let passwd = fs::read_to_string("/etc/passwd")
        .map_err(|e| HarnessError::io("reading /etc/passwd", e))?;
    passwd
        .lines()
        .find_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            if fields.len() > 3 && fields[0] == name {
                Some((fields[2].parse().ok()?, fields[3].parse().ok()?))
            } else {
                None
            }
        })
        .map(Some)
        .ok_or_else(|| HarnessError::missing(name, format!("the `{name}` user ({why})")))
}

/// The effective uid, from `/proc/self/status` (no `unsafe` libc call needed).
fn effective_uid() -> Option<u32> {
    let status = fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

/// Finds a program on `PATH` (and in the sbin dirs, which a test's `PATH` may lack).
pub fn find_program(name: &str) -> Option<PathBuf> {
    if name.contains('/') {
        let path = PathBuf::from(name);
        return path.is_file().then_some(path);
    }
    let path_var = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path_var)
        .chain(["/usr/local/bin", "/usr/bin", "/bin", "/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// Finds a program or returns [`HarnessError::MissingProgram`] naming the server that needs it.
pub(crate) fn require_program(server: &str, name: &str) -> Result<PathBuf> {
    find_program(name).ok_or_else(|| HarnessError::missing(server, name))
}

/// A command line, kept so that a restart runs exactly the same one.
#[derive(Debug, Clone)]
pub struct CommandSpec {
    /// The program, an absolute path.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// Extra environment variables.
    pub envs: Vec<(OsString, OsString)>,
    /// The working directory (the server's temp dir when `None`).
    pub cwd: Option<PathBuf>,
    /// Run as this `(uid, gid)` (PostgreSQL refuses to run as root).
    pub user: Option<(u32, u32)>,
    /// The signal [`ManagedProcess::stop`] sends first, e.g. `TERM` (PostgreSQL: `INT`, its
    /// "fast" shutdown; `TERM` would wait for clients to disconnect).
    pub stop_signal: &'static str,
}

impl CommandSpec {
    /// A command line with no extra environment, run as the current user, stopped with SIGTERM.
    pub fn new<I, S>(program: impl Into<PathBuf>, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        CommandSpec {
            program: program.into(),
            args: args.into_iter().map(Into::into).collect(),
            envs: Vec::new(),
            cwd: None,
            user: None,
            stop_signal: "TERM",
        }
    }
}

/// The mutable part of a [`ManagedProcess`].
#[derive(Debug)]
struct State {
    child: Option<Child>,
    paused: bool,
    /// Where the current run's output starts in the log (the log is appended to on restart).
    log_offset: u64,
}

/// A server process owned by the harness (see the module docs).
///
/// All methods take `&self`, so a server can live in a `static` shared by the tests of one
/// binary. Dropping it kills the process (and its children) and deletes its temp dir; when the
/// drop happens during a panic it first prints the tail of the log to stderr.
pub struct ManagedProcess {
    name: String,
    spec: CommandSpec,
    log_path: PathBuf,
    state: Mutex<State>,
    // Declared last: dropped after `Drop::drop` has killed the process.
    dir: TempDir,
}

impl fmt::Debug for ManagedProcess {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ManagedProcess")
            .field("name", &self.name)
            .field("pid", &self.pid())
            .field("dir", &self.dir.path())
            .finish()
    }
}

impl ManagedProcess {
    /// Spawns `spec` with stdout and stderr appended to `<dir>/<name>.log`; does not wait for
    /// readiness (see [`ManagedProcess::wait_ready`]). The process owns `dir`.
    pub fn spawn(name: impl Into<String>, dir: TempDir, spec: CommandSpec) -> Result<Self> {
        let name = name.into();
        let log_path = dir.path().join(format!("{name}.log"));
        let process = ManagedProcess {
            name,
            spec,
            log_path,
            state: Mutex::new(State {
                child: None,
                paused: false,
                log_offset: 0,
            }),
            dir,
        };
        process.respawn()?;
        Ok(process)
    }

    /// The server's name in errors and logs, e.g. `etcd-1`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The server's temp dir (data, config, log).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The log file with the server's stdout and stderr, across restarts.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The command line, as given to [`ManagedProcess::spawn`].
    pub fn spec(&self) -> &CommandSpec {
        &self.spec
    }

    /// The pid of the current run, or `None` when it was killed or stopped (or exited).
    pub fn pid(&self) -> Option<u32> {
        let mut state = self.lock();
        running_child(&mut state).map(|child| child.id())
    }

    /// How the current run ended ("exit code 1", "killed by signal 9"), or `None` while it runs
    /// or when it was never started.
    pub fn exit_status(&self) -> Option<String> {
        let mut state = self.lock();
        let child = state.child.as_mut()?;
        match child.try_wait() {
            Ok(Some(status)) => Some(describe_status(status)),
            Ok(None) => None,
            Err(e) => Some(format!("unknown ({e})")),
        }
    }

    /// Whether the process is running (a paused process is running).
    pub fn is_running(&self) -> bool {
        self.pid().is_some()
    }

    /// Whether the process is running and not paused (SIGSTOP): whether it can answer.
    pub fn is_serving(&self) -> bool {
        let paused = self.lock().paused;
        !paused && self.is_running()
    }

    /// The last lines of the log (up to 200).
    pub fn logs(&self) -> String {
        self.log_tail(200)
    }

    /// The last `lines` lines of the log.
    pub fn log_tail(&self, lines: usize) -> String {
        tail_of_file(&self.log_path, lines)
    }

    /// A log tail with a header naming the file, for error messages.
    pub(crate) fn log_excerpt(&self) -> String {
        format!(
            "--- last {TAIL_LINES} lines of {} ---\n{}",
            self.log_path.display(),
            self.log_tail(TAIL_LINES)
        )
    }

    /// Crashes the process: SIGKILL to it and to its child processes (PostgreSQL's backends),
    /// then reaps it. Does nothing if it is not running.
    pub fn kill(&self) -> Result<()> {
        let mut state = self.lock();
        kill_locked(&mut state)
    }

    /// Freezes the process and its children with SIGSTOP: it keeps its sockets but answers
    /// nothing, which is what a partition looks like from a client.
    pub fn pause(&self) -> Result<()> {
        let mut state = self.lock();
        let pid = self.running_pid(&mut state, "pause")?;
        send_signal(&[pid], "STOP")?;
        let children = descendants(pid);
        if !children.is_empty() {
            let _ = send_signal(&children, "STOP");
        }
        state.paused = true;
        // The signal is delivered when the kernel next schedules the process: until then it may
        // still answer, so the fault has landed only once /proc shows it stopped.
        wait_until_stopped(pid, STOP_LANDS_WITHIN)
    }

    /// Undoes [`ManagedProcess::pause`] with SIGCONT.
    pub fn resume(&self) -> Result<()> {
        let mut state = self.lock();
        let pid = self.running_pid(&mut state, "resume")?;
        let children = descendants(pid);
        if !children.is_empty() {
            let _ = send_signal(&children, "CONT");
        }
        send_signal(&[pid], "CONT")?;
        state.paused = false;
        Ok(())
    }

    /// Shuts the process down cleanly: its stop signal (SIGTERM for most servers), then SIGKILL
    /// if it has not exited after [`STOP_GRACE`]. Does nothing if it is not running.
    pub fn stop(&self) -> Result<()> {
        let mut state = self.lock();
        let Some(child) = running_child(&mut state) else {
            return Ok(());
        };
        let pid = child.id();
        send_signal(&[pid], self.spec.stop_signal)?;
        if state.paused {
            // A stopped process only handles the signal once it runs again.
            let children = descendants(pid);
            if !children.is_empty() {
                let _ = send_signal(&children, "CONT");
            }
            send_signal(&[pid], "CONT")?;
            state.paused = false;
        }
        let deadline = Instant::now() + STOP_GRACE;
        while Instant::now() < deadline {
            if running_child(&mut state).is_none() {
                return Ok(());
            }
            thread::sleep(POLL);
        }
        kill_locked(&mut state)
    }

    /// Starts the same command line again (same data dir and ports), killing the current run
    /// first if it is still running. Does not wait for readiness: the server types' `restart`
    /// methods call this and then wait until the server serves.
    pub fn respawn(&self) -> Result<()> {
        let mut state = self.lock();
        kill_locked(&mut state)?;
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .map_err(|e| HarnessError::io(format!("opening {}", self.log_path.display()), e))?;
        let offset = log
            .seek(SeekFrom::End(0))
            .map_err(|e| HarnessError::io("seeking the log", e))?;
        if offset > 0 {
            let _ = writeln!(
                log,
                "\n==== leasehold harness: restarting {} ====",
                self.name
            );
        }
        let offset = log.stream_position().unwrap_or(offset);
        let stdout = log
            .try_clone()
            .map_err(|e| HarnessError::io("duplicating the log file handle", e))?;

        let mut command = Command::new(&self.spec.program);
        command
            .args(&self.spec.args)
            .envs(self.spec.envs.iter().map(|(k, v)| (k, v)))
            .current_dir(self.spec.cwd.as_deref().unwrap_or(self.dir.path()))
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(log);
        if let Some((uid, gid)) = self.spec.user {
            command.uid(uid).gid(gid);
        }
        set_parent_death_signal(&mut command);
        let child = spawn_on_spawner_thread(command).map_err(|e| {
            if e.kind() == io::ErrorKind::NotFound {
                HarnessError::missing(&self.name, self.spec.program.display().to_string())
            } else {
                HarnessError::io(format!("spawning {}", self.spec.program.display()), e)
            }
        })?;
        state.child = Some(child);
        state.paused = false;
        state.log_offset = offset;
        Ok(())
    }

    /// Polls `check` until it succeeds, failing early when the process exits or reports that a
    /// port is taken ([`HarnessError::PortInUse`], after killing it), and after `timeout` with
    /// [`HarnessError::NotReady`]. Errors carry the log tail.
    pub fn wait_ready(
        &self,
        timeout: Duration,
        mut check: impl FnMut() -> std::result::Result<(), String>,
    ) -> Result<()> {
        let start = Instant::now();
        loop {
            let last_check = match check() {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            let exited = {
                let mut state = self.lock();
                match state.child.as_mut() {
                    None => Some("it was not running".to_string()),
                    Some(child) => child
                        .try_wait()
                        .map_err(|e| HarnessError::io("checking the server process", e))?
                        .map(describe_status),
                }
            };
            if self.port_in_use() {
                self.kill()?;
                return Err(HarnessError::PortInUse {
                    server: self.name.clone(),
                    log_tail: self.log_excerpt(),
                });
            }
            if let Some(status) = exited {
                return Err(HarnessError::Exited {
                    server: self.name.clone(),
                    status,
                    log_tail: self.log_excerpt(),
                });
            }
            if start.elapsed() >= timeout {
                return Err(HarnessError::NotReady {
                    server: self.name.clone(),
                    waited: timeout,
                    last_check,
                    log_tail: self.log_excerpt(),
                });
            }
            thread::sleep(POLL);
        }
    }

    /// The log output of the current run (since the last spawn).
    pub fn current_log(&self) -> String {
        let offset = self.lock().log_offset;
        let Ok(mut file) = File::open(&self.log_path) else {
            return String::new();
        };
        if file.seek(SeekFrom::Start(offset)).is_err() {
            return String::new();
        }
        let mut bytes = Vec::new();
        let _ = file.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Whether the current run logged a failed bind.
    fn port_in_use(&self) -> bool {
        self.current_log()
            .to_ascii_lowercase()
            .contains("address already in use")
    }

    fn running_pid(&self, state: &mut State, action: &str) -> Result<u32> {
        running_child(state).map(|c| c.id()).ok_or_else(|| {
            HarnessError::server(&self.name, format!("cannot {action}: it is not running"))
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for ManagedProcess {
    fn drop(&mut self) {
        if thread::panicking() {
            eprintln!(
                "--- leasehold harness: {} (dir {}), last {TAIL_LINES} lines of its log ---\n{}\n--- end of {} log ---",
                self.name,
                self.dir.path().display(),
                self.log_tail(TAIL_LINES),
                self.name
            );
        }
        let state = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        let _ = kill_locked(state);
    }
}

/// The child if it is still running (reaping it if it exited).
fn running_child(state: &mut State) -> Option<&mut Child> {
    let child = state.child.as_mut()?;
    match child.try_wait() {
        Ok(None) => Some(child),
        _ => None,
    }
}

/// SIGKILL the process and its descendants, reap it, and wait (bounded) until the descendants
/// are gone, so that a restart does not race with them (PostgreSQL refuses to start while old
/// backends still hold its shared memory).
fn kill_locked(state: &mut State) -> Result<()> {
    let Some(child) = state.child.as_mut() else {
        return Ok(());
    };
    let mut orphans = Vec::new();
    if child.try_wait().ok().flatten().is_none() {
        let pid = child.id();
        if !descendants(pid).is_empty() {
            // Freeze the parent so it forks nothing new, then kill the children it has.
            let _ = send_signal(&[pid], "STOP");
            orphans = descendants(pid);
            let _ = send_signal(&orphans, "KILL");
        }
        let _ = child.kill();
    }
    child
        .wait()
        .map_err(|e| HarnessError::io("reaping a killed server", e))?;
    state.child = None;
    state.paused = false;
    let deadline = Instant::now() + Duration::from_secs(5);
    while orphans.iter().any(|&pid| is_alive(pid)) && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

fn describe_status(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        _ => status.to_string(),
    }
}

/// Sends a signal by name (`STOP`, `CONT`, `TERM`, `INT`, `KILL`) through `/bin/sh`'s `kill`
/// built-in, which keeps this module free of `unsafe`.
pub(crate) fn send_signal(pids: &[u32], signal: &str) -> Result<()> {
    let output = Command::new("/bin/sh")
        .arg("-c")
        .arg("kill -s \"$0\" \"$@\"")
        .arg(signal)
        .args(pids.iter().map(u32::to_string))
        .stdin(Stdio::null())
        .output()
        .map_err(|e| HarnessError::io("running /bin/sh to send a signal", e))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(HarnessError::io(
            format!("sending SIG{signal} to {pids:?}"),
            io::Error::other(String::from_utf8_lossy(&output.stderr).trim().to_string()),
        ))
    }
}

/// Whether a process exists and is not a zombie.
pub fn is_alive(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat_fields(&stat).is_some_and(|(state, _)| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// How long a SIGSTOP may take to show in `/proc` before [`ManagedProcess::pause`] reports that
/// it did not land: generous, because a process in uninterruptible sleep (an fsync) stops only
/// when that ends.
const STOP_LANDS_WITHIN: Duration = Duration::from_secs(5);

/// Waits until `pid` is stopped (`T`, or `t` under a tracer), or has exited.
fn wait_until_stopped(pid: u32, within: Duration) -> Result<()> {
    let deadline = Instant::now() + within;
    loop {
        let state = fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|stat| stat_fields(&stat).map(|(state, _)| state.to_string()));
        match state.as_deref() {
            None | Some("T" | "t" | "Z" | "X") => return Ok(()),
            Some(other) if Instant::now() >= deadline => {
                return Err(HarnessError::io(
                    format!("pausing process {pid}"),
                    io::Error::other(format!("still in state {other} {within:?} after SIGSTOP")),
                ));
            }
            Some(_) => thread::sleep(Duration::from_millis(2)),
        }
    }
}

/// `(state, ppid)` from a `/proc/PID/stat` line; the command name may contain spaces and parens.
fn stat_fields(stat: &str) -> Option<(&str, u32)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((state, ppid))
}

/// The parent of `pid`, from `/proc`; `None` once it is gone.
pub fn parent_of(pid: u32) -> Option<u32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat_fields(&stat).map(|(_, ppid)| ppid)
}

/// All live descendants of `root` (zombies left out), found by walking `/proc`.
pub fn descendants(root: u32) -> Vec<u32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let parents: Vec<(u32, u32)> = entries
        .flatten()
        .filter_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let (state, ppid) = stat_fields(&stat)?;
            (state != "Z").then_some((pid, ppid))
        })
        .collect();
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        found.extend(
            parents
                .iter()
                .filter(|(_, pp)| *pp == parent)
                .map(|(p, _)| *p),
        );
        i += 1;
    }
    found.remove(0);
    found
}

/// The last `lines` lines of a file (reading at most its last 256 KiB).
pub(crate) fn tail_of_file(path: &Path, lines: usize) -> String {
    const MAX: u64 = 256 * 1024;
    let Ok(mut file) = File::open(path) else {
        return format!("(no log at {})", path.display());
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = file.seek(SeekFrom::Start(len.saturating_sub(MAX)));
    let mut bytes = Vec::new();
    let _ = file.read_to_end(&mut bytes);
    let text = String::from_utf8_lossy(&bytes);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Runs a short-lived helper (e.g. `initdb`) to completion, forked like the servers so that it
/// dies with the test process too.
pub(crate) fn run_to_completion(mut command: Command) -> io::Result<ExitStatus> {
    set_parent_death_signal(&mut command);
    spawn_on_spawner_thread(command)?.wait()
}

/// A request to the spawner thread.
struct SpawnJob {
    command: Command,
    reply: mpsc::Sender<io::Result<Child>>,
}

/// Forks `command` on the long-lived spawner thread (see the module docs).
fn spawn_on_spawner_thread(command: Command) -> io::Result<Child> {
    static SPAWNER: OnceLock<mpsc::Sender<SpawnJob>> = OnceLock::new();
    static SPAWNER_FAILED: OnceLock<String> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (jobs, inbox) = mpsc::channel::<SpawnJob>();
        let started = thread::Builder::new()
            .name("leasehold-harness-spawner".into())
            .spawn(move || {
                for mut job in inbox {
                    let _ = job.reply.send(job.command.spawn());
                }
            });
        if let Err(e) = started {
            // The inbox is dropped with the closure, so every send below fails and says why.
            let _ = SPAWNER_FAILED.set(e.to_string());
        }
        jobs
    });
    let gone = || {
        io::Error::other(match SPAWNER_FAILED.get() {
            Some(why) => format!("the harness could not start its spawner thread: {why}"),
            None => "the harness spawner thread is gone".to_string(),
        })
    };
    let (reply, answer) = mpsc::channel();
    spawner
        .send(SpawnJob { command, reply })
        .map_err(|_| gone())?;
    answer.recv().map_err(|_| gone())?
}

/// Makes the kernel SIGKILL the child when the thread that forked it (the spawner thread, which
/// lives as long as the test process) exits, so no server outlives a crashed or killed test run.
#[allow(unsafe_code)]
fn set_parent_death_signal(command: &mut Command) {
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs in the forked child before exec and only calls the
    // async-signal-safe `prctl` and `getppid`, allocating nothing.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0 as libc::c_ulong,
                0 as libc::c_ulong,
                0 as libc::c_ulong,
            ) != 0
            {
                return Err(io::Error::last_os_error());
            }
            // The parent may have died between fork and prctl: then nobody would kill us.
            if libc::getppid() != parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

/// Gives a server type the fault methods of its [`ManagedProcess`] (field `process`).
macro_rules! delegate_faults {
    ($ty:ident) => {
        impl $ty {
            /// Crashes the server: SIGKILL to it (and its child processes), then reap it.
            pub fn kill(&self) -> $crate::Result<()> {
                self.process.kill()
            }

            /// Freezes the server with SIGSTOP: it keeps its sockets but answers nothing, which
            /// is what a partition looks like from a client.
            pub fn pause(&self) -> $crate::Result<()> {
                self.process.pause()
            }

            /// Undoes [`Self::pause`] with SIGCONT.
            pub fn resume(&self) -> $crate::Result<()> {
                self.process.resume()
            }

            /// Shuts the server down cleanly (SIGKILL if it takes longer than
            /// [`STOP_GRACE`](crate::STOP_GRACE)).
            pub fn stop(&self) -> $crate::Result<()> {
                self.process.stop()
            }

            /// The server's pid, `None` while it is killed or stopped.
            pub fn pid(&self) -> Option<u32> {
                self.process.pid()
            }

            /// The last lines of the server's log, to explain a failure.
            pub fn logs(&self) -> String {
                self.process.logs()
            }

            /// The underlying process, for its dir, log path and lower-level control.
            pub fn process(&self) -> &$crate::ManagedProcess {
                &self.process
            }
        }
    };
}
pub(crate) use delegate_faults;

/// Runs `attempt` until it succeeds or fails with something other than a taken port, at most
/// `tries` times. Starts pass a closure that picks fresh ports each time.
pub(crate) fn retry_on_port_clash<T>(
    tries: usize,
    mut attempt: impl FnMut() -> Result<T>,
) -> Result<T> {
    // At least one try, so the last result is always a real one.
    for _ in 1..tries.max(1) {
        match attempt() {
            Err(e) if e.is_port_in_use() => {}
            other => return other,
        }
    }
    attempt()
}

/// Respawns and waits for readiness, retrying a few times when the (same) port is still taken.
pub(crate) fn restart_and_wait(
    process: &ManagedProcess,
    check: impl Fn() -> std::result::Result<(), String>,
) -> Result<()> {
    let mut tries = 0;
    loop {
        process.respawn()?;
        match process.wait_ready(READY_TIMEOUT, &check) {
            Err(e) if e.is_port_in_use() && tries < 10 => {
                tries += 1;
                thread::sleep(Duration::from_millis(500));
            }
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type TestResult<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

    #[test]
    fn stat_line_with_odd_command_name() {
        let stat = "123 (a (b) c) S 45 123 123 0 -1";
        assert_eq!(stat_fields(stat), Some(("S", 45)));
    }

    #[test]
    fn kill_pause_resume_and_restart_a_plain_process() -> TestResult {
        let dir = server_dir("sleep").map_err(|e| format!("a server directory: {e}"))?;
        let spec = CommandSpec::new("/bin/sh", ["-c", "echo started; exec sleep 1000"]);
        let process = ManagedProcess::spawn("sleep", dir, spec)
            .map_err(|e| format!("spawning sleep: {e}"))?;
        let pid = process.pid().ok_or("the pid of sleep")?;
        process
            .wait_ready(READY_TIMEOUT, || {
                if process.current_log().contains("started") {
                    Ok(())
                } else {
                    Err("no output yet".into())
                }
            })
            .map_err(|e| format!("waiting for sleep to run: {e}"))?;
        process.pause().map_err(|e| format!("pausing sleep: {e}"))?;
        let stat = fs::read_to_string(format!("/proc/{pid}/stat"))
            .map_err(|e| format!("reading the paused process's stat: {e}"))?;
        assert_eq!(
            stat_fields(&stat).ok_or("the fields of the stat line")?.0,
            "T"
        );
        process
            .resume()
            .map_err(|e| format!("resuming sleep: {e}"))?;
        process
            .respawn()
            .map_err(|e| format!("respawning sleep: {e}"))?;
        let new_pid = process.pid().ok_or("the pid of the respawned sleep")?;
        assert_ne!(pid, new_pid);
        assert!(!is_alive(pid));
        process.stop().map_err(|e| format!("stopping sleep: {e}"))?;
        assert_eq!(process.pid(), None);
        let dir = process.dir().to_path_buf();
        drop(process);
        assert!(!dir.exists());
        Ok(())
    }
}
