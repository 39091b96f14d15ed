//! PostgreSQL from Debian's `postgresql` package: `initdb` into a temp dir, then the `postgres`
//! binary itself as the child (not `pg_ctl`, which daemonizes), so the harness can SIGKILL and
//! SIGSTOP the postmaster and its backends.
//!
//! `initdb` and the server refuse to run as root: when the tests run as root, both run as the
//! `postgres` user (the temp dir is handed to it); otherwise as the current user.

use std::fs::{self, File};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use tempfile::TempDir;

use crate::error::{HarnessError, Result};
use crate::ports::free_ports;
use crate::process::{
    delegate_faults, restart_and_wait, retry_on_port_clash, run_to_completion, tail_of_file,
    CommandSpec, ManagedProcess, READY_TIMEOUT,
};

/// The database user the harness creates (the superuser of the cluster).
pub const PG_USER: &str = "leasehold";

/// The database the URLs name (it always exists).
pub const PG_DATABASE: &str = "postgres";

/// The directory with `postgres` and `initdb`: the highest version under `/usr/lib/postgresql`.
pub fn postgres_bin_dir() -> Result<PathBuf> {
    let versions = fs::read_dir("/usr/lib/postgresql")
        .map_err(|_| HarnessError::missing("postgres", "/usr/lib/postgresql/*/bin/postgres"))?;
    versions
        .flatten()
        .filter_map(|entry| {
            let version: u32 = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            (bin.join("postgres").is_file() && bin.join("initdb").is_file())
                .then_some((version, bin))
        })
        .max_by_key(|(version, _)| *version)
        .map(|(_, bin)| bin)
        .ok_or_else(|| HarnessError::missing("postgres", "/usr/lib/postgresql/*/bin/postgres"))
}

/// One PostgreSQL server (a postmaster and its backends) with its own cluster in a temp dir.
#[derive(Debug)]
pub struct PostgresServer {
    port: u16,
    password: Option<String>,
    data_dir: PathBuf,
    process: ManagedProcess,
}

delegate_faults!(PostgresServer);

impl PostgresServer {
    /// Creates a cluster (`initdb`, user [`PG_USER`], trust auth, no fsync) and starts it on a
    /// free loopback port; waits until it accepts connections.
    pub fn start() -> Result<Self> {
        Self::start_inner(None)
    }

    /// Like [`PostgresServer::start`], but TCP connections must authenticate with `password`
    /// (SCRAM-SHA-256), for wrong-password tests.
    pub fn start_with_password(password: &str) -> Result<Self> {
        Self::start_inner(Some(password.to_string()))
    }

    fn start_inner(password: Option<String>) -> Result<Self> {
        let bin = postgres_bin_dir()?;
        let user = run_as()?;
        // A port clash is rare: the retry simply creates a new cluster (initdb takes < 1 s).
        retry_on_port_clash(5, || {
            let dir = owned_server_dir("postgres", user)?;
            let data_dir = dir.path().join("data");
            initdb(&bin, dir.path(), &data_dir, password.as_deref(), user)?;
            Self::serve(&bin, "postgres", dir, data_dir, user, password.clone())
        })
    }

    /// An asynchronous streaming standby of `primary` (`pg_basebackup -R`, so it follows the
    /// primary until promoted), on its own free port: the failover fault of tests that need
    /// PostgreSQL's replication. Waits until it accepts connections.
    pub fn start_standby_of(primary: &PostgresServer) -> Result<Self> {
        let bin = postgres_bin_dir()?;
        let user = run_as()?;
        retry_on_port_clash(5, || {
            let dir = owned_server_dir("postgres-standby", user)?;
            let data_dir = dir.path().join("data");
            let mut command = Command::new(bin.join("pg_basebackup"));
            command
                .args(["-h", "127.0.0.1", "-p", &primary.port.to_string()])
                .args(["-U", PG_USER, "-R", "-X", "stream", "--no-sync"])
                .arg("-D")
                .arg(&data_dir)
                .env("HOME", dir.path());
            if let Some(password) = &primary.password {
                command.env("PGPASSWORD", password);
            }
            run_logged(command, "pg_basebackup", dir.path(), user)?;
            let password = primary.password.clone();
            Self::serve(&bin, "postgres-standby", dir, data_dir, user, password)
        })
    }

    /// Starts `postgres` on the cluster in `data_dir` on a free port and waits until it accepts.
    fn serve(
        bin: &Path,
        name: &str,
        dir: TempDir,
        data_dir: PathBuf,
        user: Option<(u32, u32)>,
        password: Option<String>,
    ) -> Result<Self> {
        let port = free_ports(1)?[0];
        let args: Vec<String> = vec![
            "-D".into(),
            data_dir.display().to_string(),
            "-p".into(),
            port.to_string(),
            // The Unix socket goes into the temp dir, not /var/run/postgresql.
            "-k".into(),
            dir.path().display().to_string(),
            "-c".into(),
            "listen_addresses=127.0.0.1".into(),
            "-c".into(),
            "fsync=off".into(),
        ];
        let mut spec = CommandSpec::new(bin.join("postgres"), args);
        spec.user = user;
        // SIGTERM is a "smart" shutdown that waits for every client to disconnect.
        spec.stop_signal = "INT";
        let process = ManagedProcess::spawn(name, dir, spec)?;
        let server = PostgresServer {
            port,
            password,
            data_dir,
            process,
        };
        server
            .process
            .wait_ready(READY_TIMEOUT, || server.accepting())?;
        Ok(server)
    }

    /// `postgres://leasehold@127.0.0.1:PORT/postgres`, with the password when there is one.
    pub fn url(&self) -> String {
        match &self.password {
            Some(password) => self.url_with_password(password),
            None => format!("postgres://{PG_USER}@127.0.0.1:{}/{PG_DATABASE}", self.port),
        }
    }

    /// The URL with a given (e.g. wrong) password, for bad-credential tests.
    pub fn url_with_password(&self, password: &str) -> String {
        format!(
            "postgres://{PG_USER}:{}@127.0.0.1:{}/{PG_DATABASE}",
            crate::redis::url_encode(password),
            self.port
        )
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The password TCP connections need, if any.
    pub fn password(&self) -> Option<&str> {
        self.password.as_deref()
    }

    /// The cluster's data directory.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// Starts the server again on the same data dir and port (killing it first if it runs) and
    /// waits until it accepts connections; after a kill it runs crash recovery first.
    pub fn restart(&self) -> Result<()> {
        // `kill` also waits until the old backends are gone: they hold the shared memory that a
        // new postmaster refuses to start beside.
        self.process.kill()?;
        // A stale lock file could name a pid that is in use again; the old postmaster is dead.
        let _ = fs::remove_file(self.data_dir.join("postmaster.pid"));
        let socket_lock = format!(".s.PGSQL.{}.lock", self.port);
        let _ = fs::remove_file(self.process.dir().join(socket_lock));
        restart_and_wait(&self.process, || self.accepting())
    }

    /// Promotes a standby to a primary (`pg_ctl promote`), returning once it accepts writes.
    pub fn promote(&self) -> Result<()> {
        let bin = postgres_bin_dir()?;
        let mut command = Command::new(bin.join("pg_ctl"));
        command
            .args(["promote", "-w", "-t", "30", "-D"])
            .arg(&self.data_dir);
        run_logged(command, "pg_ctl-promote", self.process.dir(), run_as()?)
    }

    /// Whether the server completes a startup handshake (answers with an authentication
    /// request rather than "the database system is starting up").
    fn accepting(&self) -> std::result::Result<(), String> {
        startup_probe(self.port)
    }
}

/// Sends a startup message and reads the first answer: `R` (an authentication request, also
/// "ok" under trust) means the server accepts connections; `E` carries the reason it does not.
pub(crate) fn startup_probe(port: u16) -> std::result::Result<(), String> {
    let timeout = Duration::from_secs(1);
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut stream = TcpStream::connect_timeout(&addr, timeout).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(timeout))
        .and_then(|_| stream.set_write_timeout(Some(timeout)))
        .map_err(|e| e.to_string())?;
    let mut body = Vec::new();
    body.extend_from_slice(&196_608u32.to_be_bytes()); // protocol 3.0
    for text in ["user", PG_USER, "database", PG_DATABASE, ""] {
        body.extend_from_slice(text.as_bytes());
        body.push(0);
    }
    let mut message = ((body.len() + 4) as u32).to_be_bytes().to_vec();
    message.extend_from_slice(&body);
    stream.write_all(&message).map_err(|e| e.to_string())?;
    let mut header = [0u8; 5];
    stream
        .read_exact(&mut header)
        .map_err(|e| format!("no answer to the startup message: {e}"))?;
    match header[0] {
        b'R' => {
            // Terminate politely; the answer does not matter.
            let _ = stream.write_all(&[b'X', 0, 0, 0, 4]);
            Ok(())
        }
        b'E' => {
            let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
            let mut fields = vec![0u8; len.saturating_sub(4).min(64 * 1024)];
            let _ = stream.read_exact(&mut fields);
            let text = fields
                .split(|&b| b == 0)
                .filter(|f| f.first() == Some(&b'M'))
                .map(|f| String::from_utf8_lossy(&f[1..]).into_owned())
                .next()
                .unwrap_or_else(|| "an error".into());
            Err(format!("the server answered: {text}"))
        }
        other => Err(format!("unexpected answer {:?}", other as char)),
    }
}

/// Runs `initdb` (as `user`) into `data_dir`, its output in `<dir>/initdb.log`.
fn initdb(
    bin: &Path,
    dir: &Path,
    data_dir: &Path,
    password: Option<&str>,
    user: Option<(u32, u32)>,
) -> Result<()> {
    let mut command = Command::new(bin.join("initdb"));
    command.arg("-D").arg(data_dir).args([
        "-U",
        PG_USER,
        "--no-sync",
        "--encoding=UTF8",
        "--locale=C",
    ]);
    match password {
        None => {
            command.arg("--auth=trust");
        }
        Some(password) => {
            let pwfile = dir.join("pwfile");
            fs::write(&pwfile, format!("{password}\n"))
                .and_then(|_| fs::set_permissions(&pwfile, fs::Permissions::from_mode(0o600)))
                .map_err(|e| HarnessError::io(format!("writing {}", pwfile.display()), e))?;
            if let Some((uid, gid)) = user {
                std::os::unix::fs::chown(&pwfile, Some(uid), Some(gid))
                    .map_err(|e| HarnessError::io("handing the password file to postgres", e))?;
            }
            command
                .args(["--auth-local=trust", "--auth-host=scram-sha-256"])
                .arg(format!("--pwfile={}", pwfile.display()));
        }
    }
    run_logged(command, "initdb", dir, user)
}

/// A temp dir for a server, handed to the `postgres` user when we run as root.
pub(crate) fn owned_server_dir(name: &str, user: Option<(u32, u32)>) -> Result<TempDir> {
    crate::process::owned_server_dir(name, user)
}

/// Runs one of PostgreSQL's tools (`initdb`, `pg_basebackup`) in `dir` as `user`, its output in
/// `dir/<tool>.log`; a failure carries the log's tail.
fn run_logged(
    mut command: Command,
    tool: &str,
    dir: &Path,
    user: Option<(u32, u32)>,
) -> Result<()> {
    let log_path = dir.join(format!("{tool}.log"));
    let log = File::create(&log_path)
        .map_err(|e| HarnessError::io(format!("creating {}", log_path.display()), e))?;
    let log_err = log
        .try_clone()
        .map_err(|e| HarnessError::io(format!("duplicating the {tool} log handle"), e))?;
    command
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err);
    if let Some((uid, gid)) = user {
        command.uid(uid).gid(gid);
    }
    let status =
        run_to_completion(command).map_err(|e| HarnessError::io(format!("running {tool}"), e))?;
    if status.success() {
        Ok(())
    } else {
        Err(HarnessError::Exited {
            server: format!("postgres {tool}"),
            status: status.to_string(),
            log_tail: format!(
                "--- {} ---\n{}",
                log_path.display(),
                tail_of_file(&log_path, 60)
            ),
        })
    }
}

/// `Some((uid, gid))` of the `postgres` user when running as root, else `None` (run as we are).
pub(crate) fn run_as() -> Result<Option<(u32, u32)>> {
    crate::process::run_as_when_root("postgres", "PostgreSQL refuses to run as root")
}
