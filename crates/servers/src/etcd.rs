//! etcd: a single node or a cluster of members, from Debian's `etcd-server`.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use crate::error::{HarnessError, Result};
use crate::partition::{chown_tree, not_isolatable, own_identity, Isolatable, MemberIdentity};
use crate::ports::free_ports;
use crate::process::{
    delegate_faults, require_program, restart_and_wait, retry_on_port_clash, server_dir,
    CommandSpec, ManagedProcess, READY_TIMEOUT,
};

/// Raft heartbeat of every harness etcd. Small so that elections and failover are fast.
pub const ETCD_HEARTBEAT: Duration = Duration::from_millis(100);

/// Raft election timeout of every harness etcd: 5 heartbeats, fast yet stable on a loaded
/// 2-core machine. etcd's minimum lease TTL is 1.5x this, rounded up to whole seconds: 1 s.
pub const ETCD_ELECTION_TIMEOUT: Duration = Duration::from_millis(500);

/// The `etcdctl` program (from Debian's `etcd-client`), for tests that run `etcdctl lock`.
pub fn etcdctl_path() -> Result<PathBuf> {
    require_program("etcdctl", "etcdctl")
}

/// An `etcdctl` command using the v3 API against `endpoints`; add the subcommand and run it.
pub fn etcdctl_command(endpoints: &[String]) -> Result<Command> {
    let mut command = Command::new(etcdctl_path()?);
    command
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", endpoints.join(",")));
    Ok(command)
}

/// One etcd process: a single-node cluster or a member of an [`EtcdCluster`].
#[derive(Debug)]
pub struct EtcdServer {
    addr: Ipv4Addr,
    /// `Some` when it runs under a uid of its own (see [`EtcdCluster::start_isolatable`]).
    uid: Option<u32>,
    client_port: u16,
    peer_port: u16,
    process: ManagedProcess,
}

delegate_faults!(EtcdServer);

impl EtcdServer {
    /// Starts a single-node etcd on free loopback ports with its data in a temp dir, and waits
    /// until it serves (its `/health` says so).
    pub fn start() -> Result<Self> {
        retry_on_port_clash(5, || {
            let ports = free_ports(2)?;
            let member = MemberPlan {
                name: "etcd".into(),
                addr: Ipv4Addr::LOCALHOST,
                uid: None,
                client_port: ports[0],
                peer_port: ports[1],
            };
            let cluster = std::slice::from_ref(&member);
            let server = EtcdServer::spawn(&member, cluster, &cluster_token(&member))?;
            server.wait_ready()?;
            Ok(server)
        })
    }

    fn spawn(member: &MemberPlan, cluster: &[MemberPlan], token: &str) -> Result<Self> {
        let etcd = require_program(&member.name, "etcd")?;
        let dir = server_dir(&member.name)?;
        if let Some(uid) = member.uid {
            // etcd creates its data dir inside: the dir must be the member's.
            chown_tree(dir.path(), uid)?;
        }
        let data = dir.path().join("data");
        let initial_cluster = cluster
            .iter()
            .map(|m| format!("{}=http://{}:{}", m.name, m.addr, m.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        let client_url = format!("http://{}:{}", member.addr, member.client_port);
        let peer_url = format!("http://{}:{}", member.addr, member.peer_port);
        // On a restart the data dir already holds the member and its cluster, and etcd ignores
        // the --initial-* flags: the same command line rejoins.
        let args: Vec<String> = vec![
            format!("--name={}", member.name),
            format!("--data-dir={}", data.display()),
            format!("--listen-client-urls={client_url}"),
            format!("--advertise-client-urls={client_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster={initial_cluster}"),
            format!("--initial-cluster-token={token}"),
            "--initial-cluster-state=new".into(),
            format!("--heartbeat-interval={}", ETCD_HEARTBEAT.as_millis()),
            format!("--election-timeout={}", ETCD_ELECTION_TIMEOUT.as_millis()),
            "--logger=zap".into(),
            "--log-outputs=stderr".into(),
        ];
        let mut spec = CommandSpec::new(etcd, args);
        spec.user = member.uid.map(|uid| (uid, uid));
        let process = ManagedProcess::spawn(member.name.clone(), dir, spec)?;
        Ok(EtcdServer {
            addr: member.addr,
            uid: member.uid,
            client_port: member.client_port,
            peer_port: member.peer_port,
            process,
        })
    }

    /// The client endpoint, `ADDR:PORT`, as etcd clients take it (`ADDR` is `127.0.0.1`, or the
    /// member's own address when started by [`EtcdCluster::start_isolatable`]).
    pub fn endpoint(&self) -> String {
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

    /// The client URL, `http://ADDR:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.endpoint())
    }

    /// The client port.
    pub fn client_port(&self) -> u16 {
        self.client_port
    }

    /// The peer (Raft) port.
    pub fn peer_port(&self) -> u16 {
        self.peer_port
    }

    /// Starts the server again on the same data dir and ports (killing it first if it runs) and
    /// waits until it serves. A cluster member rejoins its cluster; it only becomes healthy if a
    /// quorum is up (restart several members with [`EtcdCluster::restart_members`]).
    pub fn restart(&self) -> Result<()> {
        restart_and_wait(&self.process, || self.health())
    }

    /// An `etcdctl` command against this server.
    pub fn etcdctl(&self) -> Result<Command> {
        etcdctl_command(&[self.endpoint()])
    }

    /// Whether `/health` reports a healthy member (it has a leader and can serve a read).
    pub fn is_healthy(&self) -> bool {
        self.health().is_ok()
    }

    fn wait_ready(&self) -> Result<()> {
        self.process.wait_ready(READY_TIMEOUT, || self.health())
    }

    fn health(&self) -> std::result::Result<(), String> {
        let body = http(
            self.addr,
            self.client_port,
            "GET",
            "/health",
            "",
            Duration::from_secs(1),
        )?;
        if body.contains("\"health\":\"true\"") {
            Ok(())
        } else {
            Err(format!("/health answered {}", body.trim()))
        }
    }

    /// Whether this member knows a leader, by its maintenance status. A member cut off from its
    /// quorum says no within about two election timeouts (once it campaigns), while it still
    /// answers its clients.
    pub fn has_leader(&self) -> Result<bool> {
        let body = http(
            self.addr,
            self.client_port,
            "POST",
            "/v3/maintenance/status",
            "{}",
            Duration::from_secs(1),
        )
        .map_err(|e| HarnessError::server(self.process.name(), e))?;
        // The gateway leaves out zero fields: no `leader` is no leader.
        Ok(json_string_field(&body, "leader").is_some_and(|leader| leader != "0"))
    }

    /// `(member id, leader id)` from the maintenance status endpoint.
    fn status(&self) -> std::result::Result<(String, String), String> {
        let body = http(
            self.addr,
            self.client_port,
            "POST",
            "/v3/maintenance/status",
            "{}",
            Duration::from_secs(1),
        )?;
        let member = json_string_field(&body, "member_id")
            .ok_or_else(|| format!("no member_id in {body}"))?;
        let leader =
            json_string_field(&body, "leader").ok_or_else(|| format!("no leader in {body}"))?;
        Ok((member, leader))
    }
}

/// Name and ports of one member, chosen before any member starts.
#[derive(Debug, Clone)]
struct MemberPlan {
    name: String,
    addr: Ipv4Addr,
    uid: Option<u32>,
    client_port: u16,
    peer_port: u16,
}

fn cluster_token(first: &MemberPlan) -> String {
    format!("leasehold-{}-{}", std::process::id(), first.client_port)
}

/// A cluster of etcd members on loopback, each with its own ports and data dir.
#[derive(Debug)]
pub struct EtcdCluster {
    members: Vec<EtcdServer>,
}

impl EtcdCluster {
    /// Starts `size` members (3 for a quorum that survives one crash) on `127.0.0.1` and waits
    /// until every one is healthy. Panics if `size` is 0.
    pub fn start(size: usize) -> Result<Self> {
        assert!(size > 0, "an etcd cluster needs at least one member");
        Self::start_members(size, false)
    }

    /// Like [`EtcdCluster::start`], but each member listens on a loopback address of its own
    /// (unique per process and call) and runs under a uid of its own, so that a
    /// [`Partition`](crate::Partition) can cut it off from the others while clients still reach
    /// it. Everything else (faults, restarts, `leader()`) works the same; endpoints name the
    /// members' addresses. Needs root (to run members as other uids).
    pub fn start_isolatable(size: usize) -> Result<Self> {
        if size == 0 {
            return Err(HarnessError::server(
                "etcd cluster",
                "a cluster needs at least one member",
            ));
        }
        Self::start_members(size, true)
    }

    fn start_members(size: usize, isolatable: bool) -> Result<Self> {
        retry_on_port_clash(5, || {
            let ports = free_ports(2 * size)?;
            let mut plan = Vec::with_capacity(size);
            for i in 0..size {
                let (addr, uid) = if isolatable {
                    let (addr, uid) = own_identity()?;
                    (addr, Some(uid))
                } else {
                    (Ipv4Addr::LOCALHOST, None)
                };
                plan.push(MemberPlan {
                    name: format!("etcd-{i}"),
                    addr,
                    uid,
                    client_port: ports[2 * i],
                    peer_port: ports[2 * i + 1],
                });
            }
            let Some(first) = plan.first() else {
                return Err(HarnessError::server("etcd cluster", "no members planned"));
            };
            let token = cluster_token(first);
            let members = plan
                .iter()
                .map(|m| EtcdServer::spawn(m, &plan, &token))
                .collect::<Result<Vec<_>>>()?;
            for member in &members {
                member.wait_ready()?;
            }
            Ok(EtcdCluster { members })
        })
    }

    /// The client endpoints of all members, `ADDR:PORT` each.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(EtcdServer::endpoint).collect()
    }

    /// Member `i` (0-based), to fault or restart it.
    pub fn member(&self, i: usize) -> &EtcdServer {
        &self.members[i]
    }

    /// All members.
    pub fn members(&self) -> &[EtcdServer] {
        &self.members
    }

    /// The number of members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Always false: a cluster has at least one member.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Which member leads, asking the running members' maintenance status; waits (up to 10 s)
    /// while an election is under way.
    pub fn leader(&self) -> Result<usize> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut last = String::from("no member answered");
        loop {
            for (i, member) in self.members.iter().enumerate() {
                if member.pid().is_none() {
                    continue;
                }
                match member.status() {
                    Ok((id, leader)) if id == leader => return Ok(i),
                    Ok((_, leader)) => last = format!("member {i} follows {leader}"),
                    Err(e) => last = format!("member {i}: {e}"),
                }
            }
            if Instant::now() >= deadline {
                return Err(HarnessError::server(
                    "etcd cluster",
                    format!("no leader within 10 s ({last})"),
                ));
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// Restarts several members at once (e.g. after a quorum loss, when none can become healthy
    /// alone) on their data dirs, and waits until all serve. After a quorum loss this takes
    /// about 6 s: a member that could not publish itself retries after etcd's request timeout
    /// (5 s + 2 election timeouts).
    pub fn restart_members(&self, which: &[usize]) -> Result<()> {
        for &i in which {
            self.members[i].process.respawn()?;
        }
        for &i in which {
            self.members[i].wait_ready()?;
        }
        Ok(())
    }

    /// An `etcdctl` command against all members.
    pub fn etcdctl(&self) -> Result<Command> {
        etcdctl_command(&self.endpoints())
    }
}

impl Isolatable for EtcdServer {
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

/// A minimal HTTP/1.0 request over loopback, returning the body; errors are check messages.
fn http(
    ip: Ipv4Addr,
    port: u16,
    method: &str,
    path: &str,
    body: &str,
    timeout: Duration,
) -> std::result::Result<String, String> {
    let addr = SocketAddr::from((ip, port));
    let mut stream = TcpStream::connect_timeout(&addr, timeout).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(timeout))
        .and_then(|_| stream.set_write_timeout(Some(timeout)))
        .map_err(|e| e.to_string())?;
    let request = format!(
        "{method} {path} HTTP/1.0\r\nHost: {ip}:{port}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream
        .write_all(request.as_bytes())
        .map_err(|e| e.to_string())?;
    let mut response = Vec::new();
    stream
        .read_to_end(&mut response)
        .map_err(|e| e.to_string())?;
    let response = String::from_utf8_lossy(&response);
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("malformed HTTP answer: {response}"))?;
    if !head.starts_with("HTTP/1.0 200") && !head.starts_with("HTTP/1.1 200") {
        return Err(format!(
            "{} {path}: {}",
            method,
            head.lines().next().unwrap_or("")
        ));
    }
    Ok(body.to_string())
}

/// The value of the first `"field":"value"` in a JSON text (etcd's gateway quotes its ids).
fn json_string_field(json: &str, field: &str) -> Option<String> {
    let key = format!("\"{field}\":\"");
    let start = json.find(&key)? + key.len();
    let end = json[start..].find('"')? + start;
    Some(json[start..end].to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_quoted_json_field() {
        let body = r#"{"header":{"member_id":"42","raft_term":"2"},"leader":"42"}"#;
        assert_eq!(json_string_field(body, "member_id").as_deref(), Some("42"));
        assert_eq!(json_string_field(body, "leader").as_deref(), Some("42"));
        assert_eq!(json_string_field(body, "missing"), None);
    }
}
