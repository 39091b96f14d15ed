//! Redis: a primary, replicas of it, and a password-protected variant, from Debian's
//! `redis-server`. Without persistence: a restart starts empty (which is what a crash of a
//! Redis without AOF does). [`SentinelDeployment`] adds Redis Sentinel: a primary, a replica and
//! three sentinels (`redis-server <conf> --sentinel`) that fail over on their own.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use crate::error::{HarnessError, Result};
use crate::ports::free_ports;
use crate::process::{
    delegate_faults, require_program, restart_and_wait, retry_on_port_clash, server_dir,
    CommandSpec, ManagedProcess, READY_TIMEOUT,
};

/// How long [`RedisServer::command`] waits for an answer.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);

/// Sends one command over RESP to `127.0.0.1:port` (after `AUTH password` when given) and returns
/// the reply as text: simple strings and bulk strings as they are, integers in decimal, nil as
/// an empty string, arrays one element per line. An error reply is an `Err` with its text.
pub fn resp_command(
    port: u16,
    password: Option<&str>,
    args: &[&str],
    timeout: Duration,
) -> std::result::Result<String, String> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let stream = TcpStream::connect_timeout(&addr, timeout).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(timeout))
        .and_then(|_| stream.set_write_timeout(Some(timeout)))
        .map_err(|e| e.to_string())?;
    let mut reader = BufReader::new(stream);
    if let Some(password) = password {
        send(reader.get_mut(), &["AUTH", password])?;
        read_reply(&mut reader)?;
    }
    send(reader.get_mut(), args)?;
    read_reply(&mut reader)
}

fn send(stream: &mut TcpStream, args: &[&str]) -> std::result::Result<(), String> {
    let mut frame = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        frame.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        frame.extend_from_slice(arg.as_bytes());
        frame.extend_from_slice(b"\r\n");
    }
    stream.write_all(&frame).map_err(|e| e.to_string())
}

fn read_reply(reader: &mut BufReader<TcpStream>) -> std::result::Result<String, String> {
    let mut line = String::new();
    reader.read_line(&mut line).map_err(|e| e.to_string())?;
    if line.is_empty() {
        return Err("connection closed".into());
    }
    let line = line.trim_end_matches(['\r', '\n']);
    let (kind, rest) = line.split_at(1);
    match kind {
        "+" | ":" => Ok(rest.to_string()),
        "-" => Err(rest.to_string()),
        "$" => {
            let len: i64 = rest
                .parse()
                .map_err(|_| format!("bad bulk length {rest}"))?;
            if len < 0 {
                return Ok(String::new());
            }
            let mut bytes = vec![0; len as usize + 2];
            reader.read_exact(&mut bytes).map_err(|e| e.to_string())?;
            bytes.truncate(len as usize);
            Ok(String::from_utf8_lossy(&bytes).into_owned())
        }
        "*" => {
            let len: i64 = rest
                .parse()
                .map_err(|_| format!("bad array length {rest}"))?;
            let mut items = Vec::new();
            for _ in 0..len.max(0) {
                items.push(read_reply(reader)?);
            }
            Ok(items.join("\n"))
        }
        _ => Err(format!("unexpected reply {line:?}")),
    }
}

/// Percent-encodes a URL userinfo part.
pub(crate) fn url_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// One `redis-server` process: a primary or a replica.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    password: Option<String>,
    primary_port: Option<u16>,
    process: ManagedProcess,
}

delegate_faults!(RedisServer);

impl RedisServer {
    /// Starts a primary on a free loopback port (no RDB, no AOF) and waits until it answers PING.
    pub fn start() -> Result<Self> {
        Self::start_inner(None, None)
    }

    /// Starts a primary that requires `password` (`requirepass`), for bad-credential tests.
    pub fn start_with_password(password: &str) -> Result<Self> {
        Self::start_inner(Some(password.to_string()), None)
    }

    /// Starts a replica of `primary` (with the primary's password, if any) and waits until it
    /// reports `master_link_status:up`, i.e. the first sync is done.
    pub fn start_replica_of(primary: &RedisServer) -> Result<Self> {
        Self::start_inner(primary.password.clone(), Some(primary.port))
    }

    fn start_inner(password: Option<String>, primary_port: Option<u16>) -> Result<Self> {
        let name = if primary_port.is_some() {
            "redis-replica"
        } else {
            "redis"
        };
        let program = require_program(name, "redis-server")?;
        retry_on_port_clash(5, || {
            let port = free_ports(1)?[0];
            let dir = server_dir(name)?;
            let mut args: Vec<String> = vec![
                "--port".into(),
                port.to_string(),
                "--bind".into(),
                "127.0.0.1".into(),
                "--dir".into(),
                dir.path().display().to_string(),
                "--save".into(),
                String::new(),
                "--appendonly".into(),
                "no".into(),
                "--repl-diskless-sync".into(),
                "yes".into(),
                // The default 5 s delay would make every first sync take 5 s.
                "--repl-diskless-sync-delay".into(),
                "0".into(),
                "--enable-debug-command".into(),
                "local".into(),
            ];
            if let Some(password) = &password {
                args.extend(["--requirepass".into(), password.clone()]);
                args.extend(["--masterauth".into(), password.clone()]);
            }
            if let Some(primary) = primary_port {
                args.extend([
                    "--replicaof".into(),
                    "127.0.0.1".into(),
                    primary.to_string(),
                ]);
            }
            let process = ManagedProcess::spawn(name, dir, CommandSpec::new(&program, args))?;
            let server = RedisServer {
                port,
                password: password.clone(),
                primary_port,
                process,
            };
            server
                .process
                .wait_ready(READY_TIMEOUT, || server.ready_check(true))?;
            Ok(server)
        })
    }

    /// `redis://127.0.0.1:PORT`, with the password (`redis://:PASSWORD@...`) when there is one.
    pub fn url(&self) -> String {
        match &self.password {
            Some(password) => self.url_with_password(password),
            None => format!("redis://127.0.0.1:{}", self.port),
        }
    }

    /// The URL with a given (e.g. wrong) password, for bad-credential tests.
    pub fn url_with_password(&self, password: &str) -> String {
        format!("redis://:{}@127.0.0.1:{}", url_encode(password), self.port)
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The password the server requires, if any.
    pub fn password(&self) -> Option<&str> {
        self.password.as_deref()
    }

    /// The primary's port when this server was started as a replica.
    pub fn primary_port(&self) -> Option<u16> {
        self.primary_port
    }

    /// Runs one command over a fresh raw RESP connection (authenticating first when the server
    /// has a password) and returns the reply as text (see [`resp_command`]).
    pub fn command(&self, args: &[&str]) -> Result<String> {
        resp_command(self.port, self.password.as_deref(), args, COMMAND_TIMEOUT).map_err(|e| {
            HarnessError::server(
                self.process.name(),
                format!("`{}` failed: {e}", args.join(" ")),
            )
        })
    }

    /// Makes a replica a primary (`REPLICAOF NO ONE`), as a failover does.
    pub fn promote(&self) -> Result<()> {
        let answer = self.command(&["REPLICAOF", "NO", "ONE"])?;
        if answer.starts_with("OK") {
            Ok(())
        } else {
            Err(HarnessError::server(
                self.process.name(),
                format!("REPLICAOF NO ONE answered {answer:?}"),
            ))
        }
    }

    /// The server's role from `ROLE`: `master` or `slave`.
    pub fn role(&self) -> Result<String> {
        let answer = self.command(&["ROLE"])?;
        Ok(answer.lines().next().unwrap_or_default().to_string())
    }

    /// Starts the server again on the same port and command line (killing it first if it runs)
    /// and waits until it answers PING. It starts empty (no persistence). A replica, even one
    /// that was promoted since (the command line still says `--replicaof`), replicates its
    /// primary again; this does not wait for that sync, since the primary may be down.
    pub fn restart(&self) -> Result<()> {
        restart_and_wait(&self.process, || self.ready_check(false))
    }

    /// PING answers; for a replica being started, its link to the primary is up too.
    fn ready_check(&self, replica_link: bool) -> std::result::Result<(), String> {
        let timeout = Duration::from_secs(1);
        let password = self.password.as_deref();
        if replica_link && self.primary_port.is_some() {
            let info = resp_command(self.port, password, &["INFO", "replication"], timeout)?;
            if info.contains("master_link_status:up") {
                Ok(())
            } else {
                Err("the replica's link to its primary is not up yet".into())
            }
        } else {
            match resp_command(self.port, password, &["PING"], timeout)? {
                pong if pong == "PONG" => Ok(()),
                other => Err(format!("PING answered {other:?}")),
            }
        }
    }
}

/// How a [`SentinelDeployment`] is set up. The defaults: three sentinels with quorum 2, a
/// primary declared down after 1 s without an answer, failovers given 2 s, no passwords.
#[derive(Clone, Debug)]
pub struct SentinelOptions {
    /// The name the sentinels monitor the primary under (default `leasehold`).
    pub master_name: String,
    /// How many sentinels (default 3).
    pub sentinels: usize,
    /// How many sentinels must agree that the primary is down (default 2).
    pub quorum: usize,
    /// `sentinel down-after-milliseconds`: how long the primary may not answer before a
    /// sentinel considers it down (default 1 s).
    pub down_after: Duration,
    /// `sentinel failover-timeout` (default 2 s): among other things, a failover that did not
    /// start is tried again after twice this.
    pub failover_timeout: Duration,
    /// A password for the primary and the replica (`requirepass`, `masterauth`; the sentinels
    /// get it as `auth-pass`).
    pub password: Option<String>,
    /// A password for the sentinels themselves (`requirepass` in their config; they use it
    /// with each other too).
    pub sentinel_password: Option<String>,
}

impl Default for SentinelOptions {
    fn default() -> Self {
        SentinelOptions {
            master_name: "leasehold".into(),
            sentinels: 3,
            quorum: 2,
            down_after: Duration::from_millis(1000),
            failover_timeout: Duration::from_millis(2000),
            password: None,
            sentinel_password: None,
        }
    }
}

/// One Redis Sentinel process (`redis-server <conf> --sentinel`). Its config file lives in its
/// temp dir, which stays writable: a sentinel rewrites its config as it learns the topology.
#[derive(Debug)]
pub struct RedisSentinel {
    port: u16,
    password: Option<String>,
    process: ManagedProcess,
}

delegate_faults!(RedisSentinel);

impl RedisSentinel {
    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Runs one command over a fresh raw RESP connection (see [`resp_command`]).
    pub fn command(&self, args: &[&str]) -> Result<String> {
        resp_command(self.port, self.password.as_deref(), args, COMMAND_TIMEOUT).map_err(|e| {
            HarnessError::server(
                self.process.name(),
                format!("`{}` failed: {e}", args.join(" ")),
            )
        })
    }

    /// The primary's port this sentinel names for `master_name` (`SENTINEL
    /// get-master-addr-by-name`).
    pub fn primary_port(&self, master_name: &str) -> Result<u16> {
        let answer = self.command(&["SENTINEL", "get-master-addr-by-name", master_name])?;
        answer
            .lines()
            .nth(1)
            .and_then(|p| p.trim().parse().ok())
            .ok_or_else(|| {
                HarnessError::server(
                    self.process.name(),
                    format!("get-master-addr-by-name answered {answer:?}"),
                )
            })
    }

    /// Starts the sentinel again on the same port and config file (as the sentinel rewrote it)
    /// and waits until it answers PING.
    pub fn restart(&self) -> Result<()> {
        restart_and_wait(&self.process, || self.ping())
    }

    fn ping(&self) -> std::result::Result<(), String> {
        match resp_command(
            self.port,
            self.password.as_deref(),
            &["PING"],
            Duration::from_secs(1),
        )? {
            pong if pong == "PONG" => Ok(()),
            other => Err(format!("PING answered {other:?}")),
        }
    }
}

/// A value for a Redis config file: double-quoted, with `"` and `\` escaped.
fn config_value(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Redis Sentinel as production runs it, on loopback: a primary, one replica of it, and
/// (by default) three sentinels monitoring the primary with quorum 2, which promote the replica
/// when the primary stops answering for [`SentinelOptions::down_after`]. Clients find the
/// primary through [`SentinelDeployment::url`].
///
/// [`SentinelDeployment::start`] returns once every sentinel serves, knows the replica and the
/// other sentinels, and `SENTINEL CKQUORUM` says a failover could be authorized; otherwise it
/// fails with the logs (never a silent skip).
#[derive(Debug)]
pub struct SentinelDeployment {
    options: SentinelOptions,
    // Sentinels first: dropped (killed) before the servers they watch.
    sentinels: Vec<RedisSentinel>,
    primary: RedisServer,
    replica: RedisServer,
}

impl SentinelDeployment {
    /// Starts a deployment with the default [`SentinelOptions`].
    pub fn start() -> Result<Self> {
        Self::start_with(SentinelOptions::default())
    }

    /// Starts a deployment as `options` say.
    pub fn start_with(options: SentinelOptions) -> Result<Self> {
        if options.sentinels == 0 || options.quorum == 0 || options.quorum > options.sentinels {
            return Err(HarnessError::server(
                "redis-sentinel",
                format!(
                    "{} sentinels with quorum {} cannot fail over",
                    options.sentinels, options.quorum
                ),
            ));
        }
        let primary = RedisServer::start_inner(options.password.clone(), None)?;
        let replica = RedisServer::start_replica_of(&primary)?;
        let program = require_program("redis-sentinel", "redis-server")?;
        let mut sentinels = Vec::new();
        for i in 0..options.sentinels {
            let name = format!("redis-sentinel-{}", i + 1);
            let sentinel = retry_on_port_clash(5, || {
                let port = free_ports(1)?[0];
                let dir = server_dir(&name)?;
                let conf = dir.path().join("sentinel.conf");
                std::fs::write(&conf, sentinel_config(&options, port, primary.port()))
                    .map_err(|e| HarnessError::io(format!("writing {}", conf.display()), e))?;
                let args = vec![conf.display().to_string(), "--sentinel".to_string()];
                let process = ManagedProcess::spawn(&name, dir, CommandSpec::new(&program, args))?;
                let sentinel = RedisSentinel {
                    port,
                    password: options.sentinel_password.clone(),
                    process,
                };
                sentinel
                    .process
                    .wait_ready(READY_TIMEOUT, || sentinel.ping())?;
                Ok(sentinel)
            })?;
            sentinels.push(sentinel);
        }
        let deployment = SentinelDeployment {
            options,
            sentinels,
            primary,
            replica,
        };
        let first = &deployment.sentinels[0];
        first
            .process
            .wait_ready(READY_TIMEOUT, || deployment.ready_check())?;
        Ok(deployment)
    }

    /// Every sentinel names the primary, knows the replica and the other sentinels, and could
    /// authorize a failover.
    fn ready_check(&self) -> std::result::Result<(), String> {
        let name = self.options.master_name.as_str();
        let timeout = Duration::from_secs(1);
        for sentinel in &self.sentinels {
            let password = sentinel.password.as_deref();
            let ask = |args: &[&str]| resp_command(sentinel.port, password, args, timeout);
            let quorum = ask(&["SENTINEL", "CKQUORUM", name])?;
            if !quorum.starts_with("OK") {
                return Err(format!("sentinel {}: CKQUORUM {quorum:?}", sentinel.port));
            }
            let known = ask(&["SENTINEL", "sentinels", name])?;
            let others = known.lines().filter(|l| *l == "runid").count();
            if others + 1 < self.sentinels.len() {
                return Err(format!(
                    "sentinel {} knows {others} other sentinels",
                    sentinel.port
                ));
            }
            let replicas = ask(&["SENTINEL", "replicas", name])?;
            let replica = format!("127.0.0.1:{}", self.replica.port());
            if !replicas.lines().any(|l| l == replica) {
                return Err(format!(
                    "sentinel {} does not know the replica {replica} yet",
                    sentinel.port
                ));
            }
            let named = sentinel.primary_port(name).map_err(|e| e.to_string())?;
            if named != self.primary.port() {
                return Err(format!("sentinel {} names port {named}", sentinel.port));
            }
        }
        Ok(())
    }

    /// `redis+sentinel://[:PASSWORD@]127.0.0.1:P1,127.0.0.1:P2,.../MASTER_NAME`, with
    /// `?sentinel_password=...` when the sentinels have a password (append further parameters
    /// with `&` then).
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect();
        let userinfo = match &self.options.password {
            Some(password) => format!(":{}@", url_encode(password)),
            None => String::new(),
        };
        let mut url = format!(
            "redis+sentinel://{userinfo}{}/{}",
            hosts.join(","),
            url_encode(&self.options.master_name)
        );
        if let Some(password) = &self.options.sentinel_password {
            url.push_str(&format!("?sentinel_password={}", url_encode(password)));
        }
        url
    }

    /// The options it was started with.
    pub fn options(&self) -> &SentinelOptions {
        &self.options
    }

    /// The name the sentinels monitor the primary under.
    pub fn master_name(&self) -> &str {
        &self.options.master_name
    }

    /// The sentinels.
    pub fn sentinels(&self) -> &[RedisSentinel] {
        &self.sentinels
    }

    /// The two data servers: the one started as the primary, and the one started as its
    /// replica (their roles swap in a failover).
    pub fn servers(&self) -> [&RedisServer; 2] {
        [&self.primary, &self.replica]
    }

    /// The port of the primary as the first sentinel that answers names it.
    pub fn named_primary_port(&self) -> Result<u16> {
        let mut last = None;
        for sentinel in &self.sentinels {
            match sentinel.primary_port(&self.options.master_name) {
                Ok(port) => return Ok(port),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| HarnessError::server("redis-sentinel", "no sentinels")))
    }

    /// The data server the sentinels name as the primary.
    pub fn current_primary(&self) -> Result<&RedisServer> {
        let port = self.named_primary_port()?;
        self.servers()
            .into_iter()
            .find(|s| s.port() == port)
            .ok_or_else(|| {
                HarnessError::server("redis-sentinel", format!("names unknown port {port}"))
            })
    }

    /// The data server that is not the one the sentinels name as the primary.
    pub fn current_replica(&self) -> Result<&RedisServer> {
        let primary = self.current_primary()?.port();
        Ok(if primary == self.primary.port() {
            &self.replica
        } else {
            &self.primary
        })
    }

    /// Waits up to `timeout` until every running sentinel names `server` as the primary and
    /// `server`'s `ROLE` says `master`: a failover to it is complete.
    pub fn wait_for_primary(&self, server: &RedisServer, timeout: Duration) -> Result<()> {
        let started = Instant::now();
        loop {
            let mut last = String::new();
            let named = self
                .sentinels
                .iter()
                .filter(|s| s.pid().is_some())
                .all(|s| match s.primary_port(&self.options.master_name) {
                    Ok(port) if port == server.port() => true,
                    Ok(port) => {
                        last = format!("sentinel {} still names port {port}", s.port);
                        false
                    }
                    Err(e) => {
                        last = e.to_string();
                        false
                    }
                });
            if named {
                match server.role() {
                    Ok(role) if role == "master" => return Ok(()),
                    Ok(role) => last = format!("port {} says it is a {role}", server.port()),
                    Err(e) => last = e.to_string(),
                }
            }
            if started.elapsed() >= timeout {
                let logs: Vec<String> = self
                    .sentinels
                    .iter()
                    .map(|s| s.process.log_excerpt())
                    .collect();
                return Err(HarnessError::server(
                    "redis-sentinel",
                    format!(
                        "no failover to port {} within {timeout:?}: {last}\n{}",
                        server.port(),
                        logs.join("\n")
                    ),
                ));
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// Sets `down-after-milliseconds` on every running sentinel (`SENTINEL SET`), e.g. raised
    /// while a test freezes the primary briefly and wants no failover.
    pub fn set_down_after(&self, down_after: Duration) -> Result<()> {
        let ms = down_after.as_millis().max(1).to_string();
        for sentinel in self.sentinels.iter().filter(|s| s.pid().is_some()) {
            sentinel.command(&[
                "SENTINEL",
                "SET",
                &self.options.master_name,
                "down-after-milliseconds",
                &ms,
            ])?;
        }
        Ok(())
    }

    /// Asks a sentinel to fail over now (`SENTINEL FAILOVER`), without waiting for it.
    pub fn failover(&self) -> Result<()> {
        self.sentinels[0].command(&["SENTINEL", "FAILOVER", &self.options.master_name])?;
        Ok(())
    }

    /// The longest a failover after the primary's death should take: detection
    /// ([`SentinelOptions::down_after`]), then a leader election, which a split vote retries
    /// after twice [`SentinelOptions::failover_timeout`] (three tries allowed), plus the
    /// promotion itself, which must finish within one failover timeout.
    pub fn failover_bound(&self) -> Duration {
        let o = &self.options;
        o.down_after
            .saturating_mul(2)
            .saturating_add(o.failover_timeout.saturating_mul(7))
            .saturating_add(Duration::from_secs(2))
    }
}

fn sentinel_config(options: &SentinelOptions, port: u16, primary_port: u16) -> String {
    let name = &options.master_name;
    let mut conf = format!(
        "port {port}\n\
         bind 127.0.0.1\n\
         daemonize no\n\
         sentinel resolve-hostnames no\n\
         sentinel announce-ip 127.0.0.1\n\
         sentinel announce-port {port}\n"
    );
    if let Some(password) = &options.sentinel_password {
        conf.push_str(&format!("requirepass {}\n", config_value(password)));
    }
    conf.push_str(&format!(
        "sentinel monitor {name} 127.0.0.1 {primary_port} {quorum}\n\
         sentinel down-after-milliseconds {name} {down}\n\
         sentinel failover-timeout {name} {failover}\n\
         sentinel parallel-syncs {name} 1\n",
        quorum = options.quorum,
        down = options.down_after.as_millis().max(1),
        failover = options.failover_timeout.as_millis().max(1),
    ));
    if let Some(password) = &options.password {
        conf.push_str(&format!(
            "sentinel auth-pass {name} {}\n",
            config_value(password)
        ));
    }
    conf
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_config_values() {
        assert_eq!(config_value(r#"a"b\c"#), r#""a\"b\\c""#);
        let conf = sentinel_config(&SentinelOptions::default(), 1, 2);
        assert!(
            conf.contains("sentinel monitor leasehold 127.0.0.1 2 2\n"),
            "{conf}"
        );
        assert!(
            conf.contains("down-after-milliseconds leasehold 1000\n"),
            "{conf}"
        );
    }

    #[test]
    fn encodes_url_userinfo() {
        assert_eq!(url_encode("a-b_c.d~e"), "a-b_c.d~e");
        assert_eq!(url_encode("p@ss:w/rd"), "p%40ss%3Aw%2Frd");
    }
}
