//! A follower cut off from the rest of its ensemble, while its clients still reach it.
//!
//! Such a follower keeps answering reads from its last state for up to `syncLimit x tickTime`,
//! while the leader and the other follower go on: they expire the sessions of the clients behind
//! it and hand their locks on. A lease renewed (or granted) by a read from that follower would be
//! valid on two clients at once.
//!
//! The ensemble here is built for that cut: each member listens on its own loopback address
//! (127.a.b.2, .3, .4: `lo` carries all of 127/8) and runs under its own uid, so nftables can
//! drop the traffic between one member and the others (by its address for what others send it,
//! by its uid for what it sends: connections a member opens leave from 127.0.0.1) while clients
//! still reach its client port. The rules live in a table of this test run's own, deleted when
//! the test ends, also when it fails.

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_core::{Authority, Error, Instant, LockKey};
use leasehold_servers::process::find_program;
use leasehold_servers::{free_ports, CommandSpec, ManagedProcess, READY_TIMEOUT};
use leasehold_zookeeper::ZkAuthority;

/// Runs a blocking harness step off the runtime; its error fails the test.
async fn off<T: Send + 'static>(
    what: &str,
    f: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> T {
    match tokio::task::spawn_blocking(f).await {
        Ok(Ok(value)) => value,
        Ok(Err(e)) => panic!("{what}: {e}"),
        Err(e) => panic!("{what}: {e}"),
    }
}

/// Short ticks, and a follower that waits 50 of them (5 s) before it gives up on its leader:
/// the window in which it serves stale reads is long against the TTL used here.
const TICK: Duration = Duration::from_millis(100);
const SYNC_LIMIT: u32 = 50;

const ZOOKEEPER_JAR: &str = "/usr/share/java/zookeeper.jar";
const SLF4J_SIMPLE_JAR: &str = "/usr/share/java/slf4j-simple.jar";

/// One member: its own address, ports and uid.
struct Member {
    addr: Ipv4Addr,
    client_port: u16,
    uid: u32,
    process: ManagedProcess,
}

impl Member {
    fn connect_string(&self) -> String {
        format!("{}:{}", self.addr, self.client_port)
    }

    fn mode(&self) -> Option<String> {
        let answer = four_letter_word(self.addr, self.client_port, "srvr").ok()?;
        answer
            .lines()
            .find_map(|line| line.strip_prefix("Mode:"))
            .map(|mode| mode.trim().to_string())
    }
}

fn four_letter_word(addr: Ipv4Addr, port: u16, word: &str) -> std::io::Result<String> {
    let timeout = Duration::from_secs(1);
    let mut stream = TcpStream::connect_timeout(&SocketAddr::from((addr, port)), timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.write_all(word.as_bytes())?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    Ok(answer)
}

/// A 3-member ensemble on per-member loopback addresses.
struct Ensemble {
    members: Vec<Member>,
}

static RUNS: AtomicUsize = AtomicUsize::new(0);

impl Ensemble {
    fn start() -> Result<Self, String> {
        let java = find_program("java").ok_or("java is not installed")?;
        if !Path::new(ZOOKEEPER_JAR).is_file() {
            return Err(format!(
                "{ZOOKEEPER_JAR} is missing (apt-get install zookeeper)"
            ));
        }
        // Addresses and uids nobody else on the machine uses: from this process's id.
        let pid = std::process::id();
        let run = RUNS.fetch_add(1, Ordering::Relaxed) as u32;
        let (a, b) = (100 + (pid % 100) as u8, ((pid / 100 + run) % 250) as u8 + 1);
        let addrs: Vec<Ipv4Addr> = (2..5).map(|d| Ipv4Addr::new(127, a, b, d)).collect();
        let uid_base = 50_000 + (pid % 5_000) * 3;
        let ports = free_ports(9).map_err(|e| e.to_string())?;
        let mut servers = String::new();
        for (i, addr) in addrs.iter().enumerate() {
            let _ = writeln!(
                servers,
                "server.{}={addr}:{}:{}",
                i + 1,
                ports[3 * i + 1],
                ports[3 * i + 2]
            );
        }
        let mut members = Vec::new();
        for (i, addr) in addrs.iter().enumerate() {
            let uid = uid_base + i as u32;
            let dir = leasehold_servers::process::server_dir(&format!("zk-partition-{}", i + 1))
                .map_err(|e| e.to_string())?;
            let data = dir.path().join("data");
            std::fs::create_dir_all(&data).map_err(|e| e.to_string())?;
            let config = format!(
                "tickTime={tick}\ninitLimit=50\nsyncLimit={SYNC_LIMIT}\ndataDir={data}\n\
                 clientPort={port}\nclientPortAddress={addr}\nmaxSessionTimeout=20000\n\
                 admin.enableServer=false\n4lw.commands.whitelist=ruok,srvr,stat,mntr\n\
                 forceSync=no\n{servers}",
                tick = TICK.as_millis(),
                data = data.display(),
                port = ports[3 * i],
            );
            let config_path = dir.path().join("zoo.cfg");
            std::fs::write(&config_path, config).map_err(|e| e.to_string())?;
            std::fs::write(data.join("myid"), format!("{}\n", i + 1)).map_err(|e| e.to_string())?;
            for path in [dir.path(), data.as_path()] {
                std::os::unix::fs::chown(path, Some(uid), Some(uid)).map_err(|e| e.to_string())?;
            }
            let class_path = if Path::new(SLF4J_SIMPLE_JAR).is_file() {
                format!("{ZOOKEEPER_JAR}:{SLF4J_SIMPLE_JAR}")
            } else {
                ZOOKEEPER_JAR.to_string()
            };
            let mut spec = CommandSpec::new(
                java.clone(),
                [
                    "-Xmx256m",
                    "-XX:+UseSerialGC",
                    "-XX:TieredStopAtLevel=1",
                    "-XX:-UsePerfData",
                    "-Djava.net.preferIPv4Stack=true",
                    "-Duser.home=/tmp",
                    "-cp",
                    &class_path,
                    "org.apache.zookeeper.server.quorum.QuorumPeerMain",
                    &config_path.display().to_string(),
                ],
            );
            spec.user = Some((uid, uid));
            let process = ManagedProcess::spawn(format!("zookeeper-{}", i + 1), dir, spec)
                .map_err(|e| e.to_string())?;
            members.push(Member {
                addr: *addr,
                client_port: ports[3 * i],
                uid,
                process,
            });
        }
        let ensemble = Ensemble { members };
        for member in &ensemble.members {
            member
                .process
                .wait_ready(READY_TIMEOUT, || match member.mode().as_deref() {
                    Some("leader" | "follower") => Ok(()),
                    other => Err(format!("mode {other:?}")),
                })
                .map_err(|e| e.to_string())?;
        }
        Ok(ensemble)
    }

    fn leader(&self) -> Option<usize> {
        self.members
            .iter()
            .position(|m| m.mode().as_deref() == Some("leader"))
    }
}

/// nftables rules that cut one member off from the others but not from its clients. The table
/// is deleted on drop.
struct Partition {
    table: String,
}

fn nft(args: &[&str]) -> Result<(), String> {
    let nft = find_program("nft").ok_or("nft is not installed (apt-get install nftables)")?;
    let out = Command::new(nft)
        .args(args)
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "nft {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

impl Partition {
    fn isolate(member: &Member) -> Result<Self, String> {
        let table = format!(
            "leasehold_zk_{}_{}",
            std::process::id(),
            RUNS.fetch_add(1, Ordering::Relaxed)
        );
        nft(&["add", "table", "inet", &table])?;
        let partition = Partition { table };
        let t = partition.table.as_str();
        let port = member.client_port.to_string();
        let uid = member.uid.to_string();
        let addr = member.addr.to_string();
        nft(&[
            "add",
            "chain",
            "inet",
            t,
            "out",
            "{ type filter hook output priority 0; }",
        ])?;
        // What the member sends from any port but its client port (its own connections to the
        // others leave from 127.0.0.1, so they are told apart by the uid).
        nft(&[
            "add", "rule", "inet", t, "out", "meta", "skuid", &uid, "tcp", "sport", "!=", &port,
            "drop",
        ])?;
        // What anyone sends to the member's quorum and election ports.
        nft(&[
            "add", "rule", "inet", t, "out", "ip", "daddr", &addr, "tcp", "dport", "!=", &port,
            "drop",
        ])?;
        Ok(partition)
    }
}

impl Drop for Partition {
    fn drop(&mut self) {
        if let Err(e) = nft(&["delete", "table", "inet", &self.table]) {
            eprintln!("could not delete nftables table {}: {e}", self.table);
        }
    }
}

fn key(name: &str) -> LockKey {
    LockKey::new(name).unwrap()
}

/// A holds a lease through follower F; F is cut off from the leader and the other follower
/// (A still reaches it). The leader expires A's session after the TTL and hands the lock to B.
/// Meanwhile A keeps renewing through F, which still has A's node in its frozen state: no such
/// renewal may succeed with a deadline past the moment B holds the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_cut_off_from_its_quorum_cannot_renew_a_lease_the_leader_expired() {
    let ensemble = Arc::new(off("start the partition ensemble", Ensemble::start).await);
    let e = ensemble.clone();
    let leader = off("find the leader", move || {
        e.leader().ok_or("no leader".into())
    })
    .await;
    let f = (0..3).find(|&i| i != leader).unwrap();
    let rest: Vec<String> = (0..3)
        .filter(|&i| i != f)
        .map(|i| ensemble.members[i].connect_string())
        .collect();
    let ttl = Duration::from_secs(1);
    let params = format!("timeout_ms={}", ttl.as_millis() / 3);
    let a = ZkAuthority::connect(&format!(
        "zk://{}/partition?{params}",
        ensemble.members[f].connect_string()
    ))
    .await
    .unwrap();
    let b = ZkAuthority::connect(&format!("zk://{}/partition?{params}", rest.join(",")))
        .await
        .unwrap();
    let k = key("stale-follower");
    let grant = a
        .try_acquire(&k, ttl)
        .await
        .unwrap()
        .expect("A holds the key");

    // A renews every quarter of the TTL, and notes every renewal that succeeded.
    let renewed: Arc<Mutex<Vec<(Instant, Instant)>>> = Arc::default();
    let stop = Arc::new(tokio::sync::Notify::new());
    let (succeeded, mut successes) = tokio::sync::watch::channel(0usize);
    let renewer = tokio::spawn({
        let (a, grant, renewed, stop) = (a.clone(), grant.clone(), renewed.clone(), stop.clone());
        async move {
            let mut failures = Vec::new();
            loop {
                let sent = Instant::now();
                match a.renew(&grant, ttl).await {
                    Ok(deadline) => {
                        renewed.lock().unwrap().push((sent, deadline));
                        succeeded.send_modify(|n| *n += 1);
                    }
                    Err(e) => failures.push(e),
                }
                tokio::select! {
                    _ = stop.notified() => return failures,
                    _ = tokio::time::sleep(ttl / 4) => {}
                }
            }
        }
    });
    // A renews while F is part of the quorum (a renewal may time out on a loaded machine, so
    // wait for the first success rather than a fixed time).
    tokio::time::timeout(ttl * 5, successes.wait_for(|n| *n > 0))
        .await
        .expect("A renews while F is part of the quorum")
        .unwrap();

    // Cut right after a renewal succeeded: the worst case, its deadline is the furthest out.
    successes.borrow_and_update();
    successes.changed().await.unwrap();
    let partition = {
        let e = ensemble.clone();
        off("cut F off", move || Partition::isolate(&e.members[f])).await
    };
    let cut = Instant::now();
    let b_result = b.acquire(&k, ttl, ttl * 4).await;
    let b_holds = Instant::now();
    // F serves stale reads until SYNC_LIMIT ticks after the cut; keep A renewing for a TTL more,
    // well inside that window.
    tokio::time::sleep(ttl).await;
    stop.notify_one();
    let failures = renewer.await.unwrap();
    drop(partition);

    let fresh = b_result.expect("B gets the key once the leader expired A's session");
    assert!(fresh.fence() > grant.fence());
    assert!(
        b_holds - cut >= ttl / 2,
        "B got the key {:?} after the cut: A's session cannot have expired yet",
        b_holds - cut
    );
    let renewed = renewed.lock().unwrap().clone();
    let late: Vec<_> = renewed
        .iter()
        .filter(|(_, deadline)| *deadline > b_holds)
        .map(|(sent, deadline)| (*sent - cut, *deadline - cut))
        .collect();
    let furthest = renewed.iter().map(|(_, d)| *d).max().unwrap();
    eprintln!(
        "A's furthest deadline {:?} before B held",
        b_holds.saturating_duration_since(furthest)
    );
    eprintln!(
        "cut at 0; B held at {:?}; A renewed {} times, {} of them valid past B's grant; {} failed ({:?})",
        b_holds - cut,
        renewed.len(),
        late.len(),
        failures.len(),
        failures.first()
    );
    assert!(
        late.is_empty(),
        "A's renewals through the cut-off follower (sent, deadline after the cut) overlap B's lease from {:?}: {late:?}",
        b_holds - cut
    );
    assert!(
        failures
            .iter()
            .all(|e| matches!(e, Error::Unavailable { .. } | Error::LeaseLost { .. })),
        "renewals through the cut-off follower fail as unreachable or lost: {failures:?}"
    );
    let _ = b.release(&fresh).await;
}
