//! ZooKeeper: a standalone server or an ensemble, from Debian's `zookeeper` package, run as a
//! plain JVM (`java -cp zookeeper.jar:slf4j-simple.jar ...`).

use std::fmt::Write as _;
use std::fs;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use crate::error::{HarnessError, Result};
use crate::ports::free_ports;
use crate::process::{
    delegate_faults, require_program, restart_and_wait, retry_on_port_clash, server_dir,
    CommandSpec, ManagedProcess, READY_TIMEOUT,
};

/// ZooKeeper's `tickTime` in every harness server. The server clamps session timeouts to
/// 2x..20x this unless configured otherwise; the harness keeps the 2x minimum (400 ms, for fast
/// expiry tests) and raises the maximum to [`ZK_MAX_SESSION_TIMEOUT`].
pub const ZK_TICK_TIME: Duration = Duration::from_millis(200);

/// The largest session timeout the harness servers grant.
pub const ZK_MAX_SESSION_TIMEOUT: Duration = Duration::from_secs(60);

/// How often the harness servers reap empty container nodes (ZooKeeper's default is a minute).
/// Short, so that tests see what a long-lived deployment sees: a lock's parent removed while
/// the key is idle. A key idle for twice this (plus a tick) has certainly been reaped.
pub const ZK_CONTAINER_CHECK_INTERVAL: Duration = Duration::from_millis(500);

/// Debian's ZooKeeper jar; its manifest's `Class-Path` names the other jars it needs.
const ZOOKEEPER_JAR: &str = "/usr/share/java/zookeeper.jar";

/// An SLF4J binding, so that the server's log reaches stderr (and thus the log file).
const SLF4J_SIMPLE_JAR: &str = "/usr/share/java/slf4j-simple.jar";

/// Lean JVM flags: a small heap, no JIT tiers beyond C1 and no perf-data file under /tmp.
const JVM_FLAGS: &[&str] = &[
    "-Xmx256m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-XX:-UsePerfData",
    "-Djava.net.preferIPv4Stack=true",
    "-Dzookeeper.jmx.log4j.disable=true",
];

/// Sends a four-letter word (`srvr`, `ruok`, `stat`, `mntr`) to `127.0.0.1:port` and returns the
/// answer.
pub fn four_letter_word(port: u16, word: &str) -> std::io::Result<String> {
    let timeout = Duration::from_secs(1);
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    stream.write_all(word.as_bytes())?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    Ok(answer)
}

/// One ZooKeeper process: standalone, or a member of a [`ZkEnsemble`].
#[derive(Debug)]
pub struct ZkServer {
    client_port: u16,
    /// `None` when standalone, else its `myid`.
    myid: Option<usize>,
    process: ManagedProcess,
}

delegate_faults!(ZkServer);

impl ZkServer {
    /// Starts a standalone server on a free loopback port with its data in a temp dir and waits
    /// until it serves (`srvr` reports a `Mode:`; `ruok` answers earlier than that).
    pub fn start() -> Result<Self> {
        retry_on_port_clash(5, || {
            let client_port = free_ports(1)?[0];
            let server = ZkServer::spawn(client_port, None, &[])?;
            server.wait_ready()?;
            Ok(server)
        })
    }

    /// `quorum` holds `(myid, quorum port, election port)` of every member; empty when
    /// standalone.
    fn spawn(client_port: u16, myid: Option<usize>, quorum: &[(usize, u16, u16)]) -> Result<Self> {
        let name = match myid {
            Some(id) => format!("zookeeper-{id}"),
            None => "zookeeper".to_string(),
        };
        let java = require_program(&name, "java")?;
        if !Path::new(ZOOKEEPER_JAR).is_file() {
            return Err(HarnessError::missing(&name, ZOOKEEPER_JAR));
        }
        let dir = server_dir(&name)?;
        let data = dir.path().join("data");
        fs::create_dir_all(&data)
            .map_err(|e| HarnessError::io(format!("creating {}", data.display()), e))?;
        let mut config = format!(
            "tickTime={tick}\n\
             initLimit=25\n\
             syncLimit=10\n\
             dataDir={data}\n\
             clientPort={client_port}\n\
             clientPortAddress=127.0.0.1\n\
             maxSessionTimeout={max_session}\n\
             admin.enableServer=false\n\
             4lw.commands.whitelist=ruok,srvr,stat,mntr\n\
             forceSync=no\n",
            tick = ZK_TICK_TIME.as_millis(),
            data = data.display(),
            max_session = ZK_MAX_SESSION_TIMEOUT.as_millis(),
        );
        for (id, quorum_port, election_port) in quorum {
            let _ = writeln!(
                config,
                "server.{id}=127.0.0.1:{quorum_port}:{election_port}"
            );
        }
        let config_path = dir.path().join("zoo.cfg");
        write_file(&config_path, &config)?;
        if let Some(id) = myid {
            write_file(&data.join("myid"), &format!("{id}\n"))?;
        }
        let main_class = if myid.is_some() {
            "org.apache.zookeeper.server.quorum.QuorumPeerMain"
        } else {
            "org.apache.zookeeper.server.ZooKeeperServerMain"
        };
        let mut class_path = ZOOKEEPER_JAR.to_string();
        if Path::new(SLF4J_SIMPLE_JAR).is_file() {
            class_path = format!("{class_path}:{SLF4J_SIMPLE_JAR}");
        }
        let mut args: Vec<String> = JVM_FLAGS.iter().map(|s| s.to_string()).collect();
        args.push(format!(
            "-Dznode.container.checkIntervalMs={}",
            ZK_CONTAINER_CHECK_INTERVAL.as_millis()
        ));
        args.extend([
            "-cp".to_string(),
            class_path,
            main_class.to_string(),
            config_path.display().to_string(),
        ]);
        let process = ManagedProcess::spawn(name, dir, CommandSpec::new(java, args))?;
        Ok(ZkServer {
            client_port,
            myid,
            process,
        })
    }

    /// The connect string for this server alone, `127.0.0.1:PORT`.
    pub fn connect_string(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    /// The client port.
    pub fn client_port(&self) -> u16 {
        self.client_port
    }

    /// The server's `tickTime`; session timeouts are clamped to 2x of it at least.
    pub fn tick_time(&self) -> Duration {
        ZK_TICK_TIME
    }

    /// The server's `myid` in an ensemble, `None` when standalone.
    pub fn myid(&self) -> Option<usize> {
        self.myid
    }

    /// Sends a four-letter word (`srvr`, `ruok`, `stat`, `mntr`) and returns the answer.
    pub fn four_letter_word(&self, word: &str) -> Result<String> {
        four_letter_word(self.client_port, word).map_err(|e| {
            HarnessError::io(format!("sending `{word}` to {}", self.process.name()), e)
        })
    }

    /// The server's mode as `srvr` reports it (`standalone`, `leader`, `follower`), `None` when
    /// it does not serve.
    pub fn mode(&self) -> Option<String> {
        let answer = four_letter_word(self.client_port, "srvr").ok()?;
        answer
            .lines()
            .find_map(|line| line.strip_prefix("Mode:"))
            .map(|mode| mode.trim().to_string())
    }

    /// Starts the server again on the same data dir and ports (killing it first if it runs) and
    /// waits until it serves. An ensemble member only serves if a quorum is up (restart several
    /// with [`ZkEnsemble::restart_members`]).
    pub fn restart(&self) -> Result<()> {
        restart_and_wait(&self.process, || self.serving())
    }

    fn wait_ready(&self) -> Result<()> {
        self.process.wait_ready(READY_TIMEOUT, || self.serving())
    }

    fn serving(&self) -> std::result::Result<(), String> {
        let answer = four_letter_word(self.client_port, "srvr").map_err(|e| e.to_string())?;
        let mode = answer
            .lines()
            .find_map(|line| line.strip_prefix("Mode:"))
            .map(str::trim);
        match (mode, self.myid) {
            (Some("standalone"), None) | (Some("leader" | "follower"), Some(_)) => Ok(()),
            _ => Err(format!("srvr answered {:?}", answer.trim())),
        }
    }
}

fn write_file(path: &PathBuf, text: &str) -> Result<()> {
    fs::write(path, text).map_err(|e| HarnessError::io(format!("writing {}", path.display()), e))
}

/// A ZooKeeper ensemble on loopback (`QuorumPeerMain`, `server.N` lines, a `myid` per member).
#[derive(Debug)]
pub struct ZkEnsemble {
    members: Vec<ZkServer>,
}

impl ZkEnsemble {
    /// Starts `size` members (3 for a quorum that survives one crash) and waits until each one
    /// serves as leader or follower. Panics if `size` is 0.
    pub fn start(size: usize) -> Result<Self> {
        assert!(size > 0, "a ZooKeeper ensemble needs at least one member");
        retry_on_port_clash(5, || {
            let ports = free_ports(3 * size)?;
            let quorum: Vec<(usize, u16, u16)> = (0..size)
                .map(|i| (i + 1, ports[3 * i + 1], ports[3 * i + 2]))
                .collect();
            let members = (0..size)
                .map(|i| ZkServer::spawn(ports[3 * i], Some(i + 1), &quorum))
                .collect::<Result<Vec<_>>>()?;
            for member in &members {
                member.wait_ready()?;
            }
            Ok(ZkEnsemble { members })
        })
    }

    /// The connect string naming every member, `127.0.0.1:P1,127.0.0.1:P2,...`.
    pub fn connect_string(&self) -> String {
        self.members
            .iter()
            .map(ZkServer::connect_string)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Member `i` (0-based; its `myid` is `i + 1`), to fault or restart it.
    pub fn member(&self, i: usize) -> &ZkServer {
        &self.members[i]
    }

    /// All members.
    pub fn members(&self) -> &[ZkServer] {
        &self.members
    }

    /// The number of members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Always false: an ensemble has at least one member.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The ensemble's `tickTime`.
    pub fn tick_time(&self) -> Duration {
        ZK_TICK_TIME
    }

    /// Which member (0-based) leads, by `srvr`'s `Mode:`; waits (up to 10 s) while an election is
    /// under way.
    pub fn leader(&self) -> Result<usize> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let mut modes = Vec::new();
            for (i, member) in self.members.iter().enumerate() {
                if member.pid().is_none() {
                    modes.push(format!("{i}: down"));
                    continue;
                }
                match member.mode() {
                    Some(mode) if mode == "leader" => return Ok(i),
                    Some(mode) => modes.push(format!("{i}: {mode}")),
                    None => modes.push(format!("{i}: not serving")),
                }
            }
            if Instant::now() >= deadline {
                return Err(HarnessError::server(
                    "zookeeper ensemble",
                    format!("no leader within 10 s ({})", modes.join(", ")),
                ));
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// Restarts several members at once (e.g. after a quorum loss, when none can serve alone) on
    /// their data dirs, and waits until all serve.
    pub fn restart_members(&self, which: &[usize]) -> Result<()> {
        for &i in which {
            self.members[i].process.respawn()?;
        }
        for &i in which {
            self.members[i].wait_ready()?;
        }
        Ok(())
    }
}
