//! MariaDB from Debian's `mariadb-server` package: `mariadb-install-db` into a temp dir, then
//! `mariadbd` itself as the child (not `mysqld_safe`, which restarts it, nor the package's
//! service), so the harness can SIGKILL and SIGSTOP the server. Debian 12 ships MariaDB 10.11;
//! MySQL itself is not in Debian.
//!
//! `mariadbd` refuses to run as root: when the tests run as root, it and `mariadb-install-db`
//! run as the `mysql` user (the temp dir is handed to it); otherwise as the current user.
//!
//! Every server writes a binary log with GTIDs and has a server id of its own (its port), so any
//! server can be the primary of [`MariaDbServer::start_replica_of`]. Durability is traded for
//! speed the way a process crash cannot notice: the redo log and the binary log are written to
//! the OS at each commit but not fsynced, so a SIGKILL loses nothing that was committed, and a
//! machine crash could (the harness's servers never outlive the machine's uptime anyway).
//!
//! Semi-synchronous replication is built into the server since MariaDB 10.3 (no plugin to
//! load): [`MariaDbServer::start_replica_of`] sets up plain asynchronous replication,
//! [`MariaDbServer::start_semi_sync_replica_of`] a semi-synchronous one.
//!
//! The harness talks to the server through Debian's `mariadb` client binary
//! ([`MariaDbServer::command`]); no MySQL protocol client is linked in.

use std::fs;
use std::io::Read;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use crate::error::{HarnessError, Result};
use crate::ports::free_ports;
use crate::process::{
    delegate_faults, find_program, owned_server_dir, require_program, restart_and_wait,
    retry_on_port_clash, run_as_when_root, run_to_completion, tail_of_file, CommandSpec,
    ManagedProcess, READY_TIMEOUT,
};
use crate::redis::url_encode;

/// The database user the harness creates, reachable over TCP from 127.0.0.1 with every privilege
/// except `READ_ONLY ADMIN` (so `read_only` binds it, as it binds an application's user).
pub const MARIADB_USER: &str = "leasehold";

/// The database the URLs name (the harness creates it).
pub const MARIADB_DATABASE: &str = "leasehold";

/// How long [`MariaDbServer::command`] waits for the client before it gives up.
pub const MARIADB_COMMAND_TIMEOUT: Duration = Duration::from_secs(30);

/// How often replication state is polled.
const POLL: Duration = Duration::from_millis(25);

/// The `mariadbd` binary (Debian also installs it as `mysqld`).
pub fn mariadbd_path() -> Result<PathBuf> {
    find_program("mariadbd")
        .or_else(|| find_program("mysqld"))
        .ok_or_else(|| HarnessError::missing("mariadb", "mariadbd"))
}

/// The `mariadb` client binary (Debian also installs it as `mysql`).
pub fn mariadb_client_path() -> Result<PathBuf> {
    find_program("mariadb")
        .or_else(|| find_program("mysql"))
        .ok_or_else(|| HarnessError::missing("mariadb", "mariadb"))
}

/// One MariaDB server with its own data dir in a temp dir.
#[derive(Debug)]
pub struct MariaDbServer {
    port: u16,
    password: Option<String>,
    socket: PathBuf,
    data_dir: PathBuf,
    /// Its place in replication. Set at runtime and also written to the role file the server
    /// reads at start, so a restart comes back in the same role: runtime settings alone would
    /// leave a restarted replica writable until someone set `read_only` again.
    role: Mutex<Role>,
    process: ManagedProcess,
}

delegate_faults!(MariaDbServer);

impl MariaDbServer {
    /// Creates a data dir (`mariadb-install-db`), starts `mariadbd` on a free loopback port, and
    /// creates the database [`MARIADB_DATABASE`] and the user [`MARIADB_USER`] (no password).
    /// Returns once the user can connect over TCP.
    pub fn start() -> Result<Self> {
        Self::start_inner("mariadb", None)
    }

    /// Like [`MariaDbServer::start`], but [`MARIADB_USER`] must authenticate with `password`,
    /// for wrong-password tests.
    pub fn start_with_password(password: &str) -> Result<Self> {
        Self::start_inner("mariadb", Some(password.to_string()))
    }

    /// An asynchronous GTID replica of `primary` on its own free port (`CHANGE MASTER TO ...
    /// MASTER_USE_GTID=slave_pos`, `START SLAVE`), read-only for [`MARIADB_USER`] until
    /// [`MariaDbServer::promote`]. It replays the primary's binary log from its start, so it
    /// receives everything written before it was created. Returns once both replication
    /// threads run. The user's password is the primary's.
    pub fn start_replica_of(primary: &MariaDbServer) -> Result<Self> {
        let replica = Self::start_inner("mariadb-replica", primary.password.clone())?;
        replica.follow(primary.port)?;
        Ok(replica)
    }

    /// Like [`MariaDbServer::start_replica_of`], but semi-synchronous (built into MariaDB since
    /// 10.3): the primary's commits return only once this replica acknowledged receiving them
    /// (`rpl_semi_sync_master_wait_point = AFTER_SYNC`, so no other client sees a commit the
    /// replica lacks), or after `ack_timeout`, when the primary falls back to asynchronous
    /// replication until the replica catches up ([`MariaDbServer::semi_sync_active`] tells). An
    /// acknowledged commit survives a failover to this replica; one that timed out may not.
    /// Returns once the primary counts this replica as a semi-synchronous client.
    pub fn start_semi_sync_replica_of(
        primary: &MariaDbServer,
        ack_timeout: Duration,
    ) -> Result<Self> {
        primary.set_role(|role| role.semi_sync_ack_timeout = Some(ack_timeout))?;
        primary.command(&semi_sync_primary_sql(ack_timeout))?;
        let replica = Self::start_inner("mariadb-replica", primary.password.clone())?;
        replica.set_role(|role| role.semi_sync_replica = true)?;
        replica.command("SET GLOBAL rpl_semi_sync_slave_enabled = ON")?;
        replica.follow(primary.port)?;
        let started = Instant::now();
        while !primary.semi_sync_active()? {
            if started.elapsed() >= READY_TIMEOUT {
                return Err(HarnessError::server(
                    primary.process.name(),
                    format!("no semi-synchronous replica within {READY_TIMEOUT:?}"),
                ));
            }
            thread::sleep(POLL);
        }
        Ok(replica)
    }

    /// Whether this primary replicates semi-synchronously now: semi-sync is on, at least one
    /// semi-synchronous replica is connected, and it has not fallen back to asynchronous after
    /// an acknowledgement timed out (`Rpl_semi_sync_master_status`).
    pub fn semi_sync_active(&self) -> Result<bool> {
        let status = self.command(
            "SELECT VARIABLE_NAME, VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS \
             WHERE VARIABLE_NAME IN ('RPL_SEMI_SYNC_MASTER_STATUS', \
             'RPL_SEMI_SYNC_MASTER_CLIENTS')",
        )?;
        let value = |name: &str| {
            status
                .lines()
                .filter_map(|line| line.split_once('\t'))
                .find(|(key, _)| key.eq_ignore_ascii_case(name))
                .map(|(_, value)| value.to_string())
                .unwrap_or_default()
        };
        let clients: u32 = value("RPL_SEMI_SYNC_MASTER_CLIENTS").parse().unwrap_or(0);
        Ok(value("RPL_SEMI_SYNC_MASTER_STATUS").eq_ignore_ascii_case("ON") && clients > 0)
    }

    fn start_inner(name: &str, password: Option<String>) -> Result<Self> {
        let server = mariadbd_path()?;
        let install_db = require_program("mariadb", "mariadb-install-db")?;
        let user = run_as_when_root("mysql", "mariadbd refuses to run as root")?;
        // A port clash is rare: the retry simply creates a new data dir (install-db takes < 1 s).
        retry_on_port_clash(5, || {
            let dir = owned_server_dir(name, user)?;
            let data_dir = dir.path().join("data");
            make_private_tmp(dir.path(), user)?;
            install_db_into(&install_db, dir.path(), &data_dir, user)?;
            let port = free_ports(1)?[0];
            let socket = dir.path().join("mariadbd.sock");
            write_role_file(dir.path(), &Role::default())?;
            let mut spec = CommandSpec::new(&server, server_args(dir.path(), port));
            spec.user = user;
            let process = ManagedProcess::spawn(name, dir, spec)?;
            let server = MariaDbServer {
                port,
                password: password.clone(),
                socket,
                data_dir,
                role: Mutex::new(Role::default()),
                process,
            };
            server
                .process
                .wait_ready(READY_TIMEOUT, || handshake_probe(server.port))?;
            server.create_user_and_database()?;
            Ok(server)
        })
    }

    /// Creates the database and the user. Kept out of the binary log: every server creates its
    /// own, so a replica replaying its primary's log from the start does not collide with them.
    fn create_user_and_database(&self) -> Result<()> {
        let account = format!("'{MARIADB_USER}'@'127.0.0.1'");
        let password = sql_string(self.password.as_deref().unwrap_or(""));
        self.command(&format!(
            "SET sql_log_bin = 0; \
             CREATE DATABASE {MARIADB_DATABASE}; \
             CREATE USER {account} IDENTIFIED BY {password}; \
             GRANT ALL PRIVILEGES ON *.* TO {account} WITH GRANT OPTION; \
             REVOKE READ_ONLY ADMIN ON *.* FROM {account};"
        ))?;
        // The user is what the URL promises: prove it connects over TCP.
        self.user_command(self.password.as_deref(), "SELECT 1")
            .map(|_| ())
    }

    /// Makes this server replicate `primary_port` and waits until both replication threads run.
    fn follow(&self, primary_port: u16) -> Result<()> {
        let password = sql_string(self.password.as_deref().unwrap_or(""));
        // A short retry, so a restarted primary is followed again within a second or two.
        self.set_role(|role| role.primary_port = Some(primary_port))?;
        self.command(&format!(
            "SET GLOBAL read_only = ON; \
             CHANGE MASTER TO MASTER_HOST = '127.0.0.1', MASTER_PORT = {primary_port}, \
             MASTER_USER = '{MARIADB_USER}', MASTER_PASSWORD = {password}, \
             MASTER_CONNECT_RETRY = 1, MASTER_USE_GTID = slave_pos; \
             START SLAVE;"
        ))?;
        self.wait_replicating(READY_TIMEOUT)
    }

    /// Waits until `Slave_IO_Running` and `Slave_SQL_Running` are both `Yes`.
    fn wait_replicating(&self, timeout: Duration) -> Result<()> {
        let started = Instant::now();
        loop {
            let status = self.replication_status()?;
            let field = |name: &str| {
                status
                    .iter()
                    .find(|(key, _)| key == name)
                    .map(|(_, value)| value.as_str())
                    .unwrap_or("")
            };
            if field("Slave_IO_Running") == "Yes" && field("Slave_SQL_Running") == "Yes" {
                return Ok(());
            }
            if started.elapsed() >= timeout {
                return Err(HarnessError::server(
                    self.process.name(),
                    format!(
                        "replication did not run within {timeout:?}: IO thread {:?}, SQL thread \
                         {:?}, last IO error {:?}, last SQL error {:?}",
                        field("Slave_IO_Running"),
                        field("Slave_SQL_Running"),
                        field("Last_IO_Error"),
                        field("Last_SQL_Error"),
                    ),
                ));
            }
            thread::sleep(POLL);
        }
    }

    /// `mysql://leasehold@127.0.0.1:PORT/leasehold`, with the password when there is one.
    pub fn url(&self) -> String {
        match &self.password {
            Some(password) => self.url_with_password(password),
            None => format!(
                "mysql://{MARIADB_USER}@127.0.0.1:{}/{MARIADB_DATABASE}",
                self.port
            ),
        }
    }

    /// The URL with a given (e.g. wrong) password, for bad-credential tests.
    pub fn url_with_password(&self, password: &str) -> String {
        format!(
            "mysql://{MARIADB_USER}:{}@127.0.0.1:{}/{MARIADB_DATABASE}",
            url_encode(password),
            self.port
        )
    }

    /// The TCP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The password of [`MARIADB_USER`], if any.
    pub fn password(&self) -> Option<&str> {
        self.password.as_deref()
    }

    /// The Unix socket (in the temp dir), where the harness connects as `root`.
    pub fn socket_path(&self) -> &Path {
        &self.socket
    }

    /// The data directory.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The port of the primary this server replicates, `None` for a primary (also after
    /// [`MariaDbServer::promote`]).
    pub fn primary_port(&self) -> Option<u16> {
        self.lock_role().primary_port
    }

    /// Runs `sql` (one or more `;`-separated statements) with the `mariadb` client in batch
    /// mode as `root` over the Unix socket, and returns its output: one line per row, columns
    /// separated by tabs, no header. Bounded by [`MARIADB_COMMAND_TIMEOUT`]; an SQL error is an
    /// error carrying the client's message.
    pub fn command(&self, sql: &str) -> Result<String> {
        self.command_with_timeout(sql, MARIADB_COMMAND_TIMEOUT)
    }

    /// Like [`MariaDbServer::command`] with a bound of its own: a paused server makes it fail
    /// after `timeout` (the client is killed).
    pub fn command_with_timeout(&self, sql: &str, timeout: Duration) -> Result<String> {
        let mut args = vec!["-N".to_string()];
        args.extend(self.root_args());
        self.client(args, sql, timeout)
    }

    /// Runs `sql` like [`MariaDbServer::command`], but over TCP as [`MARIADB_USER`] with
    /// `password` (`None`: none), in the database [`MARIADB_DATABASE`]: what a client with the
    /// URL gets, e.g. "access denied" for a wrong password.
    pub fn user_command(&self, password: Option<&str>, sql: &str) -> Result<String> {
        let mut args = vec![
            "-N".to_string(),
            "--protocol=TCP".to_string(),
            "--host=127.0.0.1".to_string(),
            format!("--port={}", self.port),
            format!("--user={MARIADB_USER}"),
            format!("--database={MARIADB_DATABASE}"),
        ];
        if let Some(password) = password {
            args.push(format!("--password={password}"));
        }
        self.client(args, sql, MARIADB_COMMAND_TIMEOUT)
    }

    /// The server's version, e.g. `10.11.19-MariaDB-0+deb12u1-log`.
    pub fn version(&self) -> Result<String> {
        self.command("SELECT VERSION()")
    }

    /// `SHOW SLAVE STATUS` as (field, value) pairs in the server's order; empty when the
    /// server replicates nothing.
    pub fn replication_status(&self) -> Result<Vec<(String, String)>> {
        // Vertical output (`\G`) names every field, so no column positions are assumed.
        let output = self.client(
            self.root_args(),
            "SHOW SLAVE STATUS\\G",
            MARIADB_COMMAND_TIMEOUT,
        )?;
        Ok(output
            .lines()
            .filter_map(|line| {
                let (key, value) = line.split_once(": ")?;
                Some((key.trim().to_string(), value.trim().to_string()))
            })
            .collect())
    }

    /// Waits until this replica has applied everything its primary's binary log holds now
    /// (`MASTER_GTID_WAIT` on the primary's `gtid_binlog_pos`), at most `timeout`. An error when
    /// this server is not a replica, the primary does not answer, or the bound passes.
    pub fn wait_caught_up(&self, timeout: Duration) -> Result<()> {
        let primary_port = self.primary_port().ok_or_else(|| {
            HarnessError::server(self.process.name(), "wait_caught_up: not a replica")
        })?;
        let mut args = vec![
            "-N".to_string(),
            "--protocol=TCP".to_string(),
            "--host=127.0.0.1".to_string(),
            format!("--port={primary_port}"),
            format!("--user={MARIADB_USER}"),
        ];
        if let Some(password) = &self.password {
            args.push(format!("--password={password}"));
        }
        let position = self.client(args, "SELECT @@gtid_binlog_pos", MARIADB_COMMAND_TIMEOUT)?;
        let seconds = timeout.as_secs_f64();
        let answer = self.command_with_timeout(
            &format!(
                "SELECT MASTER_GTID_WAIT({}, {seconds:.3})",
                sql_string(position.trim())
            ),
            timeout.saturating_add(MARIADB_COMMAND_TIMEOUT),
        )?;
        if answer.trim() == "0" {
            Ok(())
        } else {
            Err(HarnessError::server(
                self.process.name(),
                format!(
                    "the replica did not reach the primary's position {position:?} within \
                     {timeout:?}"
                ),
            ))
        }
    }

    /// Turns this replica into a primary: stops fetching from the primary, lets the SQL thread
    /// apply what was already received (bounded by [`READY_TIMEOUT`]), then `STOP SLAVE; RESET
    /// SLAVE ALL` and `read_only` off. Works with the old primary dead, paused or alive; writes
    /// the old primary took but never shipped are lost, as in any asynchronous failover.
    pub fn promote(&self) -> Result<()> {
        self.command("STOP SLAVE IO_THREAD")?;
        self.wait_relay_log_applied(READY_TIMEOUT)?;
        self.command("STOP SLAVE; RESET SLAVE ALL; SET GLOBAL read_only = OFF;")?;
        self.set_role(|role| {
            role.primary_port = None;
            role.semi_sync_replica = false;
        })
    }

    /// Waits until the SQL thread has executed everything the IO thread wrote to the relay log.
    fn wait_relay_log_applied(&self, timeout: Duration) -> Result<()> {
        let started = Instant::now();
        loop {
            let status = self.replication_status()?;
            let field = |name: &str| {
                status
                    .iter()
                    .find(|(key, _)| key == name)
                    .map(|(_, value)| value.clone())
                    .unwrap_or_default()
            };
            let sql_stopped = field("Slave_SQL_Running") != "Yes";
            let sql_error = field("Last_SQL_Errno");
            if sql_stopped && !sql_error.is_empty() && sql_error != "0" {
                // Promoting a replica whose replication broke would make a primary that lacks
                // data without saying so.
                return Err(HarnessError::server(
                    self.process.name(),
                    format!(
                        "replication stopped on error {sql_error}: {}",
                        field("Last_SQL_Error")
                    ),
                ));
            }
            let applied = field("Master_Log_File") == field("Relay_Master_Log_File")
                && field("Read_Master_Log_Pos") == field("Exec_Master_Log_Pos");
            if status.is_empty() || applied || sql_stopped {
                return Ok(());
            }
            if started.elapsed() >= timeout {
                return Err(HarnessError::server(
                    self.process.name(),
                    format!(
                        "the relay log was not applied within {timeout:?} (read {} {}, executed \
                         {} {})",
                        field("Master_Log_File"),
                        field("Read_Master_Log_Pos"),
                        field("Relay_Master_Log_File"),
                        field("Exec_Master_Log_Pos"),
                    ),
                ));
            }
            thread::sleep(POLL);
        }
    }

    /// Starts the server again on the same data dir and port (killing it first if it runs) and
    /// waits until it accepts connections; after a kill InnoDB runs crash recovery first. A
    /// replica resumes replicating (its position is kept in the data dir) and is read-only
    /// from its first connection on; semi-sync settings hold again (the role file).
    pub fn restart(&self) -> Result<()> {
        self.process.kill()?;
        restart_and_wait(&self.process, || handshake_probe(self.port))
    }

    /// The client's arguments to connect as `root` over the Unix socket.
    fn root_args(&self) -> Vec<String> {
        vec![
            "--user=root".to_string(),
            format!("--socket={}", self.socket.display()),
        ]
    }

    /// Runs the `mariadb` client with `args`, `sql` and a bound.
    fn client(&self, args: Vec<String>, sql: &str, timeout: Duration) -> Result<String> {
        let program = mariadb_client_path()?;
        let connect_timeout = timeout.as_secs().clamp(1, 30);
        let mut command = Command::new(program);
        command
            // No option files: the package's /etc/mysql config must not change what we run.
            .arg("--no-defaults")
            .arg("--batch")
            .arg(format!("--connect-timeout={connect_timeout}"))
            .args(&args)
            .arg("--execute")
            .arg(sql)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        run_bounded(command, timeout).map_err(|message| {
            HarnessError::server(
                self.process.name(),
                format!("the mariadb client failed on {sql:?}: {message}"),
            )
        })
    }

    /// Changes the role and writes it to the role file for the next start (the caller applies
    /// it to the running server).
    fn set_role(&self, change: impl FnOnce(&mut Role)) -> Result<()> {
        let mut role = self.lock_role();
        change(&mut role);
        write_role_file(self.process.dir(), &role)
    }

    fn lock_role(&self) -> std::sync::MutexGuard<'_, Role> {
        self.role.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A server's place in replication.
#[derive(Debug, Default, Clone, Copy)]
struct Role {
    /// The primary's port while this server is a replica (until [`MariaDbServer::promote`]).
    primary_port: Option<u16>,
    /// As a primary: wait this long for a semi-synchronous replica's acknowledgement.
    semi_sync_ack_timeout: Option<Duration>,
    /// As a replica: acknowledge what it receives (semi-synchronous).
    semi_sync_replica: bool,
}

/// Writes `<dir>/role.cnf`, the only option file the server reads (`--defaults-file`): what
/// its role needs from the start of a run.
fn write_role_file(dir: &Path, role: &Role) -> Result<()> {
    let mut text = String::from("[mariadbd]\n");
    if role.primary_port.is_some() {
        text.push_str("read_only = ON\n");
    }
    if role.semi_sync_replica {
        text.push_str("rpl_semi_sync_slave_enabled = ON\n");
    }
    if let Some(ack_timeout) = role.semi_sync_ack_timeout {
        text.push_str(&format!(
            "rpl_semi_sync_master_wait_point = AFTER_SYNC\n\
             rpl_semi_sync_master_timeout = {}\n\
             rpl_semi_sync_master_enabled = ON\n",
            ack_timeout.as_millis().max(1)
        ));
    }
    let path = dir.join("role.cnf");
    fs::write(&path, text).map_err(|e| HarnessError::io(format!("writing {}", path.display()), e))
}

/// Turns on semi-synchronous replication on a primary, lossless (`AFTER_SYNC`).
fn semi_sync_primary_sql(ack_timeout: Duration) -> String {
    let millis = ack_timeout.as_millis().max(1);
    format!(
        "SET GLOBAL rpl_semi_sync_master_wait_point = AFTER_SYNC; \
         SET GLOBAL rpl_semi_sync_master_timeout = {millis}; \
         SET GLOBAL rpl_semi_sync_master_enabled = ON;"
    )
}

/// `mariadbd`'s arguments for a server in `dir` on `port`.
fn server_args(dir: &Path, port: u16) -> Vec<String> {
    let in_dir = |name: &str| dir.join(name).display().to_string();
    vec![
        // Only the role file: /etc/mysql's config (port 3306, /run/mysqld) must not apply.
        format!("--defaults-file={}", in_dir("role.cnf")),
        format!("--datadir={}", in_dir("data")),
        format!("--port={port}"),
        "--bind-address=127.0.0.1".into(),
        format!("--socket={}", in_dir("mariadbd.sock")),
        format!("--pid-file={}", in_dir("mariadbd.pid")),
        format!("--tmpdir={}", in_dir("tmp")),
        // Without it a `'user'@'127.0.0.1'` account is matched by host name lookups first.
        "--skip-name-resolve".into(),
        // Written to the OS at each commit, never fsynced: survives a SIGKILL, starts fast.
        "--innodb-flush-log-at-trx-commit=2".into(),
        "--sync-binlog=0".into(),
        "--innodb-buffer-pool-size=32M".into(),
        // Debian's own config sets these; without option files the server would use latin1.
        "--character-set-server=utf8mb4".into(),
        "--collation-server=utf8mb4_general_ci".into(),
        // Fault tests cut and pause clients mid-handshake: the server must not block 127.0.0.1
        // for "too many connection errors" (100 by default), nor run out of connections.
        "--max-connect-errors=1000000000".into(),
        "--max-connections=1000".into(),
        "--innodb-log-file-size=16M".into(),
        // GTID replication needs a binary log and an id unique among the servers that
        // replicate; the port is unique among the servers running on this machine.
        format!("--server-id={port}"),
        format!("--log-bin={}", in_dir("data/binlog")),
        "--log-slave-updates".into(),
        "--binlog-format=ROW".into(),
        format!("--relay-log={}", in_dir("data/relay")),
        // A replica notices a dead or hung primary within seconds, not the default minute.
        "--slave-net-timeout=4".into(),
    ]
}

/// Creates `<dir>/tmp` for the server's temporary tables (handed to `user`). A shared `/tmp`
/// is not safe: temporary tables are named by the server's pid, and a server in another pid
/// namespace on the same machine can have the same one (seen: an install failing with "Error on
/// delete of '/tmp/#sql-temptable-...'").
fn make_private_tmp(dir: &Path, user: Option<(u32, u32)>) -> Result<()> {
    let tmp = dir.join("tmp");
    fs::create_dir(&tmp).map_err(|e| HarnessError::io(format!("creating {}", tmp.display()), e))?;
    if let Some((uid, gid)) = user {
        std::os::unix::fs::chown(&tmp, Some(uid), Some(gid))
            .map_err(|e| HarnessError::io(format!("handing {} to uid {uid}", tmp.display()), e))?;
    }
    Ok(())
}

/// Runs `mariadb-install-db` (as `user`) into `data_dir`, its output in `<dir>/install-db.log`.
fn install_db_into(
    install_db: &Path,
    dir: &Path,
    data_dir: &Path,
    user: Option<(u32, u32)>,
) -> Result<()> {
    let log_path = dir.join("install-db.log");
    let log = fs::File::create(&log_path)
        .map_err(|e| HarnessError::io(format!("creating {}", log_path.display()), e))?;
    let log_err = log
        .try_clone()
        .map_err(|e| HarnessError::io("duplicating the install-db log handle", e))?;
    let mut command = Command::new(install_db);
    command
        .arg("--no-defaults")
        .arg(format!("--datadir={}", data_dir.display()))
        // `root`@`localhost` with an empty password over the socket, whichever OS user the
        // harness runs as (the default, unix_socket auth, maps the OS user to the account).
        .arg("--auth-root-authentication-method=normal")
        .arg("--skip-test-db")
        .arg(format!("--tmpdir={}", dir.join("tmp").display()))
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err);
    if let Some((uid, gid)) = user {
        std::os::unix::process::CommandExt::uid(&mut command, uid);
        std::os::unix::process::CommandExt::gid(&mut command, gid);
    }
    let status = run_to_completion(command)
        .map_err(|e| HarnessError::io("running mariadb-install-db", e))?;
    if status.success() {
        Ok(())
    } else {
        Err(HarnessError::Exited {
            server: "mariadb-install-db".into(),
            status: status.to_string(),
            log_tail: format!(
                "--- {} ---\n{}",
                log_path.display(),
                tail_of_file(&log_path, 60)
            ),
        })
    }
}

/// Connects and reads the server's first packet: a protocol-10 greeting means it accepts
/// connections; an error packet (`0xff`, e.g. while it starts up or shuts down) carries why not.
pub(crate) fn handshake_probe(port: u16) -> std::result::Result<(), String> {
    let timeout = Duration::from_secs(1);
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut stream = TcpStream::connect_timeout(&addr, timeout).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    let mut header = [0u8; 4];
    stream
        .read_exact(&mut header)
        .map_err(|e| format!("no greeting: {e}"))?;
    let len = u32::from_le_bytes([header[0], header[1], header[2], 0]) as usize;
    let mut payload = vec![0u8; len.min(64 * 1024)];
    stream
        .read_exact(&mut payload)
        .map_err(|e| format!("a short greeting: {e}"))?;
    match payload.first() {
        Some(10) => Ok(()),
        Some(0xff) if payload.len() >= 3 => {
            let code = u16::from_le_bytes([payload[1], payload[2]]);
            let message = String::from_utf8_lossy(&payload[3..]);
            Err(format!("the server answered error {code}: {message}"))
        }
        Some(other) => Err(format!("unexpected first packet byte {other:#04x}")),
        None => Err("an empty greeting".into()),
    }
}

/// `text` as an SQL string literal (quotes and backslashes escaped).
fn sql_string(text: &str) -> String {
    format!("'{}'", text.replace('\\', "\\\\").replace('\'', "\\'"))
}

/// Runs `command` (stdout and stderr piped) to completion within `timeout`, killing it after;
/// its stdout (without the final newline) on success, else its stderr or why it was killed.
fn run_bounded(mut command: Command, timeout: Duration) -> std::result::Result<String, String> {
    let mut child = command.spawn().map_err(|e| e.to_string())?;
    // Read both pipes on threads, so a large output cannot block the client while we wait.
    let stdout = read_pipe(child.stdout.take());
    let stderr = read_pipe(child.stderr.take());
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() >= timeout => {
                kill_and_reap(&mut child);
                return Err(format!(
                    "no answer within {timeout:?} (the client was killed)"
                ));
            }
            Ok(None) => thread::sleep(Duration::from_millis(5)),
            Err(e) => {
                kill_and_reap(&mut child);
                return Err(e.to_string());
            }
        }
    };
    let stdout = stdout.join().unwrap_or_default();
    let stderr = stderr.join().unwrap_or_default();
    if status.success() {
        Ok(stdout.strip_suffix('\n').unwrap_or(&stdout).to_string())
    } else {
        Err(format!("{status}: {}", stderr.trim()))
    }
}

fn read_pipe(pipe: Option<impl Read + Send + 'static>) -> thread::JoinHandle<String> {
    thread::spawn(move || {
        let mut text = String::new();
        if let Some(mut pipe) = pipe {
            let _ = pipe.read_to_string(&mut text);
        }
        text
    })
}

fn kill_and_reap(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sql_strings_escape_quotes_and_backslashes() {
        assert_eq!(sql_string("it's a \\ test"), "'it\\'s a \\\\ test'");
        assert_eq!(sql_string(""), "''");
    }
}
