//! ZooKeeper: a standalone server or an ensemble, from Debian's `zookeeper` package, run as a
//! plain JVM (`java -cp zookeeper.jar:slf4j-simple.jar ...`). A standalone server can also
//! serve TLS on a second client port ([`ZkServer::start_tls`]).

use std::fmt::Write as _;
use std::fs;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use crate::error::{HarnessError, Result};
use crate::partition::{chown_tree, not_isolatable, own_identity, Isolatable, MemberIdentity};
use crate::ports::free_ports;
use crate::process::{
    delegate_faults, require_program, restart_and_wait, retry_on_port_clash, server_dir,
    CommandSpec, ManagedProcess, READY_TIMEOUT,
};
use crate::tls::TestCerts;

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

/// The longest pause between leader-election rounds of an isolatable member (ZooKeeper's
/// default is a minute), so that a healed member rejoins within about this long.
const ISOLATABLE_MAX_NOTIFICATION_INTERVAL: Duration = Duration::from_secs(1);

/// Debian's ZooKeeper jar; its manifest's `Class-Path` names the other jars it needs.
const ZOOKEEPER_JAR: &str = "/usr/share/java/zookeeper.jar";

/// An SLF4J binding, so that the server's log reaches stderr (and thus the log file).
const SLF4J_SIMPLE_JAR: &str = "/usr/share/java/slf4j-simple.jar";

/// Netty jars that Debian's ZooKeeper jar does not name in its manifest but whose classes
/// Netty's TLS handler needs (`io.netty.handler.codec.ByteToMessageDecoder`, the resolver that
/// netty-transport loads): without them every TLS handshake fails with a
/// `ClassNotFoundException` in the server's log.
const NETTY_EXTRA_JARS: &[&str] = &[
    "/usr/share/java/netty-codec.jar",
    "/usr/share/java/netty-resolver.jar",
];

/// Lean JVM flags: a small heap, no JIT tiers beyond C1 and no perf-data file under /tmp.
const JVM_FLAGS: &[&str] = &[
    "-Xmx256m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-XX:-UsePerfData",
    "-Djava.net.preferIPv4Stack=true",
    "-Dzookeeper.jmx.log4j.disable=true",
];

/// How long an ensemble member waits for its initial sync with the leader, in ticks.
pub const ZK_INIT_LIMIT: u32 = 25;

/// How long a follower waits to hear from its leader before it gives up and stops serving, in
/// ticks (ZooKeeper's `syncLimit`): 2 s with the default tick.
pub const ZK_SYNC_LIMIT: u32 = 10;

/// How an ensemble is set up. [`ZkEnsemble::start`] uses the defaults ([`ZK_TICK_TIME`],
/// [`ZK_INIT_LIMIT`], [`ZK_SYNC_LIMIT`], members on `127.0.0.1`); a test that times a follower's
/// stale window sets its own `tick_time` and `sync_limit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ZkConfig {
    /// ZooKeeper's `tickTime`; session timeouts are clamped to at least 2x of it.
    pub tick_time: Duration,
    /// `initLimit`, in ticks.
    pub init_limit: u32,
    /// `syncLimit`, in ticks: a follower cut off from its leader keeps serving its last state
    /// for about `sync_limit x tick_time`.
    pub sync_limit: u32,
    /// Each member on a loopback address and uid of its own, so that a
    /// [`Partition`](crate::Partition) can cut it off (see [`ZkEnsemble::start_isolatable`]).
    pub isolatable: bool,
    /// `minSessionTimeout`, when set apart from `tickTime` (ZooKeeper's default is 2 ticks).
    pub min_session_timeout: Option<Duration>,
    /// How many of an ensemble's members are observers (the last ones): they serve clients
    /// and follow the leader but do not vote. An ensemble with observers runs with
    /// `standaloneEnabled=false`, so that even one voter forms an ensemble with them.
    pub observers: usize,
    /// Whether the `conf` four-letter word is in `4lw.commands.whitelist` (default yes), so
    /// that clients can read the server's `tickTime`.
    pub conf_word: bool,
}

impl Default for ZkConfig {
    fn default() -> Self {
        ZkConfig {
            tick_time: ZK_TICK_TIME,
            init_limit: ZK_INIT_LIMIT,
            sync_limit: ZK_SYNC_LIMIT,
            isolatable: false,
            min_session_timeout: None,
            observers: 0,
            conf_word: true,
        }
    }
}

impl ZkConfig {
    /// Sets `tickTime`.
    pub fn tick_time(mut self, tick_time: Duration) -> Self {
        self.tick_time = tick_time;
        self
    }

    /// Sets `initLimit` (ticks).
    pub fn init_limit(mut self, ticks: u32) -> Self {
        self.init_limit = ticks;
        self
    }

    /// Sets `syncLimit` (ticks).
    pub fn sync_limit(mut self, ticks: u32) -> Self {
        self.sync_limit = ticks;
        self
    }

    /// Gives each member its own loopback address and uid.
    pub fn isolatable(mut self) -> Self {
        self.isolatable = true;
        self
    }

    /// Sets `minSessionTimeout` apart from `tickTime`.
    pub fn min_session_timeout(mut self, timeout: Duration) -> Self {
        self.min_session_timeout = Some(timeout);
        self
    }

    /// Makes the last `observers` members of an ensemble observers.
    pub fn observers(mut self, observers: usize) -> Self {
        self.observers = observers;
        self
    }

    /// Leaves `conf` out of `4lw.commands.whitelist`: the server's tick cannot be read then.
    pub fn without_conf_word(mut self) -> Self {
        self.conf_word = false;
        self
    }

    /// How long a follower cut off from its leader keeps serving: `sync_limit x tick_time`.
    pub fn sync_timeout(&self) -> Duration {
        self.tick_time.saturating_mul(self.sync_limit)
    }
}

/// Whether a TLS server asks its clients for a certificate (ZooKeeper's `ssl.clientAuth`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ZkClientAuth {
    /// `ssl.clientAuth=none`: the server does not ask; any client that verifies the server may
    /// connect.
    None,
    /// `ssl.clientAuth=need`: a client without a certificate signed by the trusted CA is refused
    /// during the handshake.
    Need,
}

/// A standalone server's TLS settings, chosen before it starts.
#[derive(Debug, Clone)]
struct ZkTlsPlan {
    secure_port: u16,
    /// The server's key and certificate in one PEM file (`ssl.keyStore.location`).
    key_store: String,
    /// The CA that client certificates must chain to (`ssl.trustStore.location`).
    trust_store: String,
    client_auth: ZkClientAuth,
}

/// Sends a four-letter word (`srvr`, `ruok`, `stat`, `mntr`) to `127.0.0.1:port` and returns the
/// answer.
pub fn four_letter_word(port: u16, word: &str) -> std::io::Result<String> {
    four_letter_word_at(SocketAddr::from((Ipv4Addr::LOCALHOST, port)), word)
}

/// Sends a four-letter word to `addr` (a member on an address of its own) and returns the
/// answer.
pub fn four_letter_word_at(addr: SocketAddr, word: &str) -> std::io::Result<String> {
    let timeout = Duration::from_secs(1);
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
    addr: Ipv4Addr,
    /// `Some` when it runs under a uid of its own (see [`ZkEnsemble::start_isolatable`]).
    uid: Option<u32>,
    client_port: u16,
    /// The TLS client port (`secureClientPort`), when started by [`ZkServer::start_tls`].
    secure_port: Option<u16>,
    tick_time: Duration,
    /// `None` when standalone, else its `myid`.
    myid: Option<usize>,
    process: ManagedProcess,
}

/// Address, uid and ports of one ensemble member, chosen before any member starts.
#[derive(Debug, Clone)]
struct ZkMemberPlan {
    myid: usize,
    addr: Ipv4Addr,
    uid: Option<u32>,
    client_port: u16,
    quorum_port: u16,
    election_port: u16,
    /// A non-voting member (`peerType=observer`).
    observer: bool,
}

delegate_faults!(ZkServer);

impl ZkServer {
    /// Starts a standalone server on a free loopback port with its data in a temp dir and waits
    /// until it serves (`srvr` reports a `Mode:`; `ruok` answers earlier than that).
    pub fn start() -> Result<Self> {
        Self::start_with(ZkConfig::default())
    }

    /// Starts a standalone server set up as `config` says (its tick, session timeouts and
    /// four-letter words; the ensemble settings do not apply) and waits until it serves.
    pub fn start_with(config: ZkConfig) -> Result<Self> {
        retry_on_port_clash(5, || {
            let client_port = free_ports(1)?[0];
            let member = ZkMemberPlan {
                myid: 0,
                addr: Ipv4Addr::LOCALHOST,
                uid: None,
                client_port,
                quorum_port: 0,
                election_port: 0,
                observer: false,
            };
            let server = ZkServer::spawn(&member, None, &config, None)?;
            server.wait_ready()?;
            Ok(server)
        })
    }

    /// Starts a standalone server that also serves TLS, on a second client port
    /// ([`ZkServer::secure_port`]), through Netty (`serverCnxnFactory=NettyServerCnxnFactory`,
    /// `secureClientPort`, PEM key and trust stores): its certificate is `certs`' server
    /// certificate (for `localhost` and `127.0.0.1`), and client certificates must chain to
    /// `certs`' CA (asked for or not as `client_auth` says). The plain client port stays open
    /// (for `srvr`, and for tests of a plain client at the TLS port). Waits until both ports
    /// serve. The certificate files are copied into the server's dir, so `certs` may be dropped.
    pub fn start_tls(certs: &TestCerts, client_auth: ZkClientAuth) -> Result<Self> {
        Self::start_tls_on(Ipv4Addr::LOCALHOST, certs, client_auth)
    }

    /// Like [`ZkServer::start_tls`], with both ports on the loopback address `addr` (any in
    /// 127/8). On one other than `127.0.0.1` the server's certificate does not name the address
    /// a client connects to, which is what a test of host name verification needs.
    pub fn start_tls_on(
        addr: Ipv4Addr,
        certs: &TestCerts,
        client_auth: ZkClientAuth,
    ) -> Result<Self> {
        retry_on_port_clash(5, || {
            let ports = free_ports(2)?;
            let member = ZkMemberPlan {
                myid: 0,
                addr,
                uid: None,
                client_port: ports[0],
                quorum_port: 0,
                election_port: 0,
                observer: false,
            };
            let server = ZkServer::spawn(
                &member,
                None,
                &ZkConfig::default(),
                Some((certs, ports[1], client_auth)),
            )?;
            server.wait_ready()?;
            Ok(server)
        })
    }

    /// `ensemble` holds every member's plan, `None` when standalone (then only the member's
    /// address, uid and client port count).
    ///
    /// `tls` (standalone only): the certificates, the TLS port and whether client certificates
    /// are required.
    fn spawn(
        member: &ZkMemberPlan,
        ensemble: Option<&[ZkMemberPlan]>,
        config: &ZkConfig,
        tls: Option<(&TestCerts, u16, ZkClientAuth)>,
    ) -> Result<Self> {
        let myid = ensemble.map(|_| member.myid);
        let client_port = member.client_port;
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
        let mut zoo_cfg = format!(
            "tickTime={tick}\n\
             initLimit={init_limit}\n\
             syncLimit={sync_limit}\n\
             dataDir={data}\n\
             clientPort={client_port}\n\
             clientPortAddress={addr}\n\
             maxSessionTimeout={max_session}\n\
             admin.enableServer=false\n\
             4lw.commands.whitelist=ruok,srvr,stat,mntr{conf}\n\
             forceSync=no\n",
            conf = if config.conf_word { ",conf" } else { "" },
            tick = config.tick_time.as_millis(),
            init_limit = config.init_limit,
            sync_limit = config.sync_limit,
            data = data.display(),
            addr = member.addr,
            max_session = ZK_MAX_SESSION_TIMEOUT.as_millis(),
        );
        let tls = match tls {
            None => None,
            Some(_) if ensemble.is_some() => {
                return Err(HarnessError::server(
                    &name,
                    "TLS is only set up for a standalone server",
                ))
            }
            Some((certs, secure_port, client_auth)) => {
                Some(tls_plan(dir.path(), certs, secure_port, client_auth)?)
            }
        };
        if let Some(tls) = &tls {
            let _ = write!(
                zoo_cfg,
                "secureClientPort={port}\n\
                 secureClientPortAddress={addr}\n\
                 serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory\n\
                 ssl.keyStore.location={key_store}\n\
                 ssl.keyStore.type=PEM\n\
                 ssl.trustStore.location={trust_store}\n\
                 ssl.trustStore.type=PEM\n\
                 ssl.clientAuth={client_auth}\n",
                port = tls.secure_port,
                addr = member.addr,
                key_store = tls.key_store,
                trust_store = tls.trust_store,
                client_auth = match tls.client_auth {
                    ZkClientAuth::None => "none",
                    ZkClientAuth::Need => "need",
                },
            );
        }
        if let Some(min) = config.min_session_timeout {
            let _ = writeln!(zoo_cfg, "minSessionTimeout={}", min.as_millis());
        }
        let ensemble = ensemble.unwrap_or_default();
        if ensemble.iter().any(|m| m.observer) {
            // Else one voter with observers would start as a standalone server.
            zoo_cfg.push_str("standaloneEnabled=false\n");
        }
        if member.observer {
            zoo_cfg.push_str("peerType=observer\n");
        }
        for m in ensemble {
            let _ = writeln!(
                zoo_cfg,
                "server.{}={}:{}:{}{}",
                m.myid,
                m.addr,
                m.quorum_port,
                m.election_port,
                if m.observer { ":observer" } else { "" }
            );
        }
        let config_path = dir.path().join("zoo.cfg");
        write_file(&config_path, &zoo_cfg)?;
        if let Some(id) = myid {
            write_file(&data.join("myid"), &format!("{id}\n"))?;
        }
        if let Some(uid) = member.uid {
            // ZooKeeper writes its snapshots and logs under the data dir.
            chown_tree(dir.path(), uid)?;
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
        if tls.is_some() {
            for jar in NETTY_EXTRA_JARS {
                if !Path::new(jar).is_file() {
                    return Err(HarnessError::missing(&name, *jar));
                }
                class_path = format!("{class_path}:{jar}");
            }
        }
        let mut args: Vec<String> = JVM_FLAGS.iter().map(|s| s.to_string()).collect();
        args.push(format!(
            "-Dznode.container.checkIntervalMs={}",
            ZK_CONTAINER_CHECK_INTERVAL.as_millis()
        ));
        if member.uid.is_some() {
            // A uid without a passwd entry has no home; the JVM would use "?".
            args.push(format!("-Duser.home={}", dir.path().display()));
            // A member cut off keeps looking for a leader, doubling the pause between rounds up
            // to a minute: healed, it would rejoin that late.
            args.push(format!(
                "-Dzookeeper.fastleader.maxNotificationInterval={}",
                ISOLATABLE_MAX_NOTIFICATION_INTERVAL.as_millis()
            ));
        }
        args.extend([
            "-cp".to_string(),
            class_path,
            main_class.to_string(),
            config_path.display().to_string(),
        ]);
        let mut spec = CommandSpec::new(java, args);
        spec.user = member.uid.map(|uid| (uid, uid));
        let process = ManagedProcess::spawn(name, dir, spec)?;
        Ok(ZkServer {
            addr: member.addr,
            uid: member.uid,
            client_port,
            secure_port: tls.map(|tls| tls.secure_port),
            tick_time: config.tick_time,
            myid,
            process,
        })
    }

    /// The connect string for this server alone, `ADDR:PORT` (`ADDR` is `127.0.0.1`, or the
    /// member's own address when started by [`ZkEnsemble::start_isolatable`]).
    pub fn connect_string(&self) -> String {
        format!("{}:{}", self.addr, self.client_port)
    }

    /// The loopback address all its ports listen on.
    pub fn addr(&self) -> Ipv4Addr {
        self.addr
    }

    /// The uid it runs under, `None` when it runs as the test's user.
    pub fn uid(&self) -> Option<u32> {
        self.uid
    }

    fn client_addr(&self) -> SocketAddr {
        SocketAddr::from((self.addr, self.client_port))
    }

    /// The client port.
    pub fn client_port(&self) -> u16 {
        self.client_port
    }

    /// The TLS client port (`secureClientPort`), `None` unless started by
    /// [`ZkServer::start_tls`].
    pub fn secure_port(&self) -> Option<u16> {
        self.secure_port
    }

    /// The connect string of the TLS port, `ADDR:PORT`, `None` unless started by
    /// [`ZkServer::start_tls`]. The server's certificate names `127.0.0.1` and `localhost`.
    pub fn secure_connect_string(&self) -> Option<String> {
        self.secure_port.map(|port| format!("{}:{port}", self.addr))
    }

    /// The server's `tickTime`; session timeouts are clamped to 2x of it at least.
    pub fn tick_time(&self) -> Duration {
        self.tick_time
    }

    /// The server's `myid` in an ensemble, `None` when standalone.
    pub fn myid(&self) -> Option<usize> {
        self.myid
    }

    /// Sends a four-letter word (`srvr`, `ruok`, `stat`, `mntr`) and returns the answer.
    pub fn four_letter_word(&self, word: &str) -> Result<String> {
        four_letter_word_at(self.client_addr(), word).map_err(|e| {
            HarnessError::io(format!("sending `{word}` to {}", self.process.name()), e)
        })
    }

    /// The server's mode as `srvr` reports it (`standalone`, `leader`, `follower`), `None` when
    /// it does not serve.
    pub fn mode(&self) -> Option<String> {
        let answer = four_letter_word_at(self.client_addr(), "srvr").ok()?;
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
        let answer = four_letter_word_at(self.client_addr(), "srvr").map_err(|e| e.to_string())?;
        let mode = answer
            .lines()
            .find_map(|line| line.strip_prefix("Mode:"))
            .map(str::trim);
        match (mode, self.myid) {
            (Some("standalone"), None) | (Some("leader" | "follower" | "observer"), Some(_)) => {}
            _ => return Err(format!("srvr answered {:?}", answer.trim())),
        }
        // The server binds its TLS port after it serves on the plain one.
        if let Some(port) = self.secure_port {
            let addr = SocketAddr::from((self.addr, port));
            TcpStream::connect_timeout(&addr, Duration::from_secs(1))
                .map_err(|e| format!("the TLS port {port} does not accept connections: {e}"))?;
        }
        Ok(())
    }
}

/// Copies `certs`' server key and certificate (one PEM file, key first, as ZooKeeper's PEM key
/// store reads it) and CA into the server's dir, readable by the server's user only.
fn tls_plan(
    dir: &Path,
    certs: &TestCerts,
    secure_port: u16,
    client_auth: ZkClientAuth,
) -> Result<ZkTlsPlan> {
    use std::os::unix::fs::PermissionsExt;
    let read = |path: PathBuf| {
        fs::read_to_string(&path)
            .map_err(|e| HarnessError::io(format!("reading {}", path.display()), e))
    };
    let key_store = dir.join("server-keystore.pem");
    let key_and_cert = format!(
        "{}{}",
        read(certs.server_key())?,
        read(certs.server_cert())?
    );
    write_file(&key_store, &key_and_cert)?;
    fs::set_permissions(&key_store, fs::Permissions::from_mode(0o600))
        .map_err(|e| HarnessError::io(format!("restricting {}", key_store.display()), e))?;
    let trust_store = dir.join("truststore.pem");
    write_file(&trust_store, &read(certs.ca())?)?;
    Ok(ZkTlsPlan {
        secure_port,
        key_store: key_store.display().to_string(),
        trust_store: trust_store.display().to_string(),
        client_auth,
    })
}

fn write_file(path: &PathBuf, text: &str) -> Result<()> {
    fs::write(path, text).map_err(|e| HarnessError::io(format!("writing {}", path.display()), e))
}

/// A ZooKeeper ensemble on loopback (`QuorumPeerMain`, `server.N` lines, a `myid` per member).
#[derive(Debug)]
pub struct ZkEnsemble {
    members: Vec<ZkServer>,
    config: ZkConfig,
}

impl ZkEnsemble {
    /// Starts `size` members (3 for a quorum that survives one crash) on `127.0.0.1` and waits
    /// until each one serves as leader or follower. Panics if `size` is 0.
    pub fn start(size: usize) -> Result<Self> {
        assert!(size > 0, "a ZooKeeper ensemble needs at least one member");
        Self::start_with(size, ZkConfig::default())
    }

    /// Like [`ZkEnsemble::start`], but each member listens on a loopback address of its own
    /// (unique per process and call) and runs under a uid of its own, so that a
    /// [`Partition`](crate::Partition) can cut it off from the others while clients still reach
    /// it. Everything else (faults, restarts, `leader()`) works the same; the connect strings
    /// name the members' addresses. Needs root (to run members as other uids).
    pub fn start_isolatable(size: usize) -> Result<Self> {
        Self::start_with(size, ZkConfig::default().isolatable())
    }

    /// Starts `size` members set up as `config` says and waits until each one serves as leader
    /// or follower.
    pub fn start_with(size: usize, config: ZkConfig) -> Result<Self> {
        if config.observers >= size {
            return Err(HarnessError::server(
                "zookeeper ensemble",
                format!(
                    "{} observers of {size} members leave no voter",
                    config.observers
                ),
            ));
        }
        if size == 0 {
            return Err(HarnessError::server(
                "zookeeper ensemble",
                "an ensemble needs at least one member",
            ));
        }
        retry_on_port_clash(5, || {
            let ports = free_ports(3 * size)?;
            let mut plan = Vec::with_capacity(size);
            for i in 0..size {
                let (addr, uid) = if config.isolatable {
                    let (addr, uid) = own_identity()?;
                    (addr, Some(uid))
                } else {
                    (Ipv4Addr::LOCALHOST, None)
                };
                plan.push(ZkMemberPlan {
                    myid: i + 1,
                    addr,
                    uid,
                    client_port: ports[3 * i],
                    quorum_port: ports[3 * i + 1],
                    election_port: ports[3 * i + 2],
                    observer: i + config.observers >= size,
                });
            }
            let members = plan
                .iter()
                .map(|m| ZkServer::spawn(m, Some(&plan), &config, None))
                .collect::<Result<Vec<_>>>()?;
            for member in &members {
                member.wait_ready()?;
            }
            Ok(ZkEnsemble { members, config })
        })
    }

    /// The connect string naming every member, `ADDR1:P1,ADDR2:P2,...`.
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
        self.config.tick_time
    }

    /// How the ensemble was set up.
    pub fn config(&self) -> ZkConfig {
        self.config
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

impl Isolatable for ZkServer {
    fn identity(&self) -> Result<MemberIdentity> {
        let uid = self
            .uid
            .ok_or_else(|| not_isolatable(self.process.name()))?;
        Ok(MemberIdentity {
            name: self.process.name().to_string(),
            addr: self.addr,
            uid,
            client_port: self.client_port,
        })
    }
}
