//! Redis: a primary, replicas of it, and a password-protected variant, from Debian's
//! `redis-server`. Without persistence: a restart starts empty (which is what a crash of a
//! Redis without AOF does).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::Duration;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_url_userinfo() {
        assert_eq!(url_encode("a-b_c.d~e"), "a-b_c.d~e");
        assert_eq!(url_encode("p@ss:w/rd"), "p%40ss%3Aw%2Frd");
    }
}
