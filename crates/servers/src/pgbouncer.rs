//! PgBouncer from Debian's `pgbouncer` package in front of a [`PostgresServer`], in
//! transaction pooling mode: each transaction (or autocommit statement) of a client may run on
//! another server connection, which is what a transaction-pooling proxy does to a driver that
//! prepares named statements or listens.
//!
//! PgBouncer refuses to run as root: when the tests run as root it runs as the `postgres` user
//! (`-u postgres`, as PostgreSQL itself does here).

use std::fs;
use std::path::PathBuf;

use crate::error::{HarnessError, Result};
use crate::ports::free_ports;
use crate::postgres::{
    owned_server_dir, run_as, startup_probe, PostgresServer, PG_DATABASE, PG_USER,
};
use crate::process::{
    delegate_faults, retry_on_port_clash, CommandSpec, ManagedProcess, READY_TIMEOUT,
};

/// Where Debian's package installs the program.
const PGBOUNCER: &str = "/usr/sbin/pgbouncer";

/// One PgBouncer process pooling connections to one PostgreSQL server.
#[derive(Debug)]
pub struct PgBouncer {
    port: u16,
    process: ManagedProcess,
}

delegate_faults!(PgBouncer);

/// The setting that turns PgBouncer's tracking of prepared statements off, for versions that
/// have it (1.21 and later; from 1.22 it is on by default): the pooler then behaves as the
/// transaction poolers that do not track them, which is what the tests of an undeclared pooler
/// need to meet, whichever version Debian ships.
fn prepared_statements_off(program: &std::path::Path) -> &'static str {
    let version = std::process::Command::new(program)
        .arg("--version")
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
        .unwrap_or_default();
    let numbers: Vec<u32> = version
        .split_whitespace()
        .nth(1)
        .unwrap_or_default()
        .split('.')
        .map_while(|n| n.parse().ok())
        .collect();
    match numbers[..] {
        [1, minor, ..] if minor >= 21 => "max_prepared_statements = 0\n",
        [major, ..] if major >= 2 => "max_prepared_statements = 0\n",
        _ => "",
    }
}

impl PgBouncer {
    /// Starts PgBouncer on a free loopback port in transaction pooling mode in front of
    /// `server` (which must use trust authentication, as [`PostgresServer::start`] does), with
    /// at most `server_connections` connections to it; waits until it accepts clients.
    pub fn start_transaction_pooling(
        server: &PostgresServer,
        server_connections: u32,
    ) -> Result<Self> {
        let program = PathBuf::from(PGBOUNCER);
        if !program.is_file() {
            return Err(HarnessError::missing("pgbouncer", PGBOUNCER));
        }
        let user = run_as()?;
        retry_on_port_clash(5, || {
            let dir = owned_server_dir("pgbouncer", user)?;
            let port = free_ports(1)?[0];
            let userlist = dir.path().join("userlist.txt");
            // Trust, as the server behind it: the user must still be listed.
            fs::write(&userlist, format!("\"{PG_USER}\" \"\"\n"))
                .map_err(|e| HarnessError::io("writing PgBouncer's userlist.txt", e))?;
            let ini = dir.path().join("pgbouncer.ini");
            fs::write(
                &ini,
                format!(
                    "[databases]\n\
                     {PG_DATABASE} = host=127.0.0.1 port={server_port} dbname={PG_DATABASE}\n\
                     [pgbouncer]\n\
                     listen_addr = 127.0.0.1\n\
                     listen_port = {port}\n\
                     unix_socket_dir =\n\
                     auth_type = trust\n\
                     auth_file = {userlist}\n\
                     pool_mode = transaction\n\
                     default_pool_size = {server_connections}\n\
                     max_client_conn = 1000\n\
                     ignore_startup_parameters = extra_float_digits\n\
                     server_login_retry = 0\n\
                     {prepared}",
                    server_port = server.port(),
                    prepared = prepared_statements_off(&program),
                    userlist = userlist.display(),
                ),
            )
            .map_err(|e| HarnessError::io("writing pgbouncer.ini", e))?;
            let mut args = Vec::new();
            if user.is_some() {
                args.extend(["-u".to_string(), "postgres".to_string()]);
            }
            args.push(ini.display().to_string());
            let mut spec = CommandSpec::new(PGBOUNCER, args);
            // Started as root, it switches to `postgres` itself (-u).
            spec.user = None;
            // `server_login_retry = 0`: a server login that failed (the server restarting
            // under a fault) is tried again at the next client's login, instead of every
            // client being refused for 15 seconds, as PgBouncer does by default.
            // SIGINT is its "safe shutdown", which waits for clients; SIGTERM quits at once.
            spec.stop_signal = "TERM";
            let process = ManagedProcess::spawn("pgbouncer", dir, spec)?;
            let bouncer = PgBouncer { port, process };
            bouncer
                .process
                .wait_ready(READY_TIMEOUT, || startup_probe(bouncer.port))?;
            Ok(bouncer)
        })
    }

    /// Kills PgBouncer (every client and server connection through it ends at once) and starts
    /// it again on the same port; waits until it accepts clients.
    pub fn restart(&self) -> Result<()> {
        self.process.respawn()?;
        self.process
            .wait_ready(READY_TIMEOUT, || startup_probe(self.port))
    }

    /// Whether a client can log in through PgBouncer now: after the server behind it failed
    /// a login (a restart), PgBouncer refuses clients of a pool whose server login has been
    /// failing ("server login has been failing, try again later") until one succeeds.
    pub fn accepts_logins(&self) -> Result<()> {
        startup_probe(self.port).map_err(|why| HarnessError::server("pgbouncer", why))
    }

    /// `postgres://leasehold@127.0.0.1:PORT/postgres`, through PgBouncer.
    pub fn url(&self) -> String {
        format!("postgres://{PG_USER}@127.0.0.1:{}/{PG_DATABASE}", self.port)
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }
}
