//! A ZooKeeper follower cut off from the rest of its ensemble (but not from its clients) by a
//! [`Partition`]: once its leader's silence exceeds `syncLimit x tickTime` it stops serving and a
//! write through it fails, while the other two go on; once healed it rejoins and serves again.
//! Real servers; a server that cannot start fails the test (the harness never skips).
//!
//! The writes speak ZooKeeper's wire protocol directly (a connect, one create): the harness
//! crate has no ZooKeeper client, and a JVM per `zkCli.sh` call would cost a second each.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

type TestResult<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

use leasehold_servers::{Partition, ZkEnsemble};

/// Creates the persistent node `path` (no data, open ACL) through the server at `addr`, in a
/// fresh session. An error says what failed: a server that does not serve closes the connection
/// (or never answers while it waits for a leader it cannot reach).
fn create(addr: &str, path: &str, timeout: Duration) -> Result<(), String> {
    let addr: SocketAddr = addr.parse().map_err(|e| format!("{addr}: {e}"))?;
    let mut stream = TcpStream::connect_timeout(&addr, timeout).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(timeout))
        .and_then(|_| stream.set_write_timeout(Some(timeout)))
        .map_err(|e| e.to_string())?;

    // ConnectRequest: protocol version, last zxid seen, session timeout, session id, password,
    // read-only flag.
    let mut connect = Vec::new();
    connect.extend(0i32.to_be_bytes());
    connect.extend(0i64.to_be_bytes());
    connect.extend(
        i32::try_from(timeout.as_millis())
            .unwrap_or(i32::MAX)
            .to_be_bytes(),
    );
    connect.extend(0i64.to_be_bytes());
    connect.extend(16i32.to_be_bytes());
    connect.extend([0u8; 16]);
    connect.push(0);
    send(&mut stream, &connect).map_err(|e| format!("sending the connect request: {e}"))?;
    let answer = receive(&mut stream).map_err(|e| format!("reading the session: {e}"))?;
    let negotiated = answer
        .get(4..8)
        .map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
        .ok_or("short connect answer")?;
    if negotiated <= 0 {
        return Err("the server refused the session".into());
    }

    // RequestHeader (xid, type 1 = create), then CreateRequest: path, data, ACL, flags.
    let mut request = Vec::new();
    request.extend(1i32.to_be_bytes());
    request.extend(1i32.to_be_bytes());
    put_string(&mut request, path);
    request.extend(0i32.to_be_bytes());
    request.extend(1i32.to_be_bytes());
    request.extend(31i32.to_be_bytes());
    put_string(&mut request, "world");
    put_string(&mut request, "anyone");
    request.extend(0i32.to_be_bytes());
    send(&mut stream, &request).map_err(|e| format!("sending the create: {e}"))?;
    let reply = receive(&mut stream).map_err(|e| format!("reading the create's reply: {e}"))?;
    // ReplyHeader: xid, zxid, error code.
    let err = reply
        .get(12..16)
        .map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
        .ok_or("short create reply")?;
    // Close the session rather than leave it to expire (type -11, no body); the answer does
    // not matter.
    let mut close = Vec::new();
    close.extend(2i32.to_be_bytes());
    close.extend((-11i32).to_be_bytes());
    let _ = send(&mut stream, &close);
    if err == 0 {
        Ok(())
    } else {
        Err(format!("create {path} answered error code {err}"))
    }
}

fn put_string(buffer: &mut Vec<u8>, s: &str) {
    buffer.extend(i32::try_from(s.len()).unwrap_or(i32::MAX).to_be_bytes());
    buffer.extend(s.as_bytes());
}

fn send(stream: &mut TcpStream, body: &[u8]) -> std::io::Result<()> {
    let len = i32::try_from(body.len()).unwrap_or(i32::MAX);
    stream.write_all(&len.to_be_bytes())?;
    stream.write_all(body)
}

fn receive(stream: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    stream.read_exact(&mut len)?;
    let len = usize::try_from(i32::from_be_bytes(len)).unwrap_or(0);
    let mut body = vec![0u8; len];
    stream.read_exact(&mut body)?;
    Ok(body)
}

/// Polls `check` every tick until it holds or `within` has passed; returns how long it took.
fn wait_until(
    what: &str,
    within: Duration,
    tick: Duration,
    mut check: impl FnMut() -> bool,
) -> Duration {
    let start = Instant::now();
    loop {
        if check() {
            return start.elapsed();
        }
        assert!(start.elapsed() < within, "{what} within {within:?}");
        thread::sleep(tick / 2);
    }
}

#[test]
fn an_isolated_zookeeper_follower_stops_serving_until_healed() -> TestResult {
    let ensemble = ZkEnsemble::start_isolatable(3)
        .map_err(|e| format!("start an isolatable ensemble: {e}"))?;
    let config = ensemble.config();
    let tick = config.tick_time;
    for member in ensemble.members() {
        assert!(member.addr().is_loopback() && member.addr() != std::net::Ipv4Addr::LOCALHOST);
        assert!(member.uid().is_some());
        assert!(member
            .connect_string()
            .starts_with(&format!("{}:", member.addr())));
    }
    let leader = ensemble.leader().map_err(|e| format!("a leader: {e}"))?;
    let f = (0..3).find(|&i| i != leader).ok_or("a follower")?;
    let follower = ensemble.member(f);
    let rest: Vec<String> = (0..3)
        .filter(|&i| i != f)
        .map(|i| ensemble.member(i).connect_string())
        .collect();
    // A request through a member that serves takes milliseconds; one through a member waiting
    // for an unreachable leader takes as long as the follower's patience.
    let request_timeout = config.sync_timeout();
    create(&follower.connect_string(), "/before", request_timeout)
        .map_err(|e| format!("a write through the follower works before the cut: {e}"))?;

    let partition =
        Partition::isolate(follower).map_err(|e| format!("isolate the follower: {e}"))?;
    // The follower gives up on its leader after syncLimit ticks without a ping, then looks for a
    // leader it cannot reach. Slack on top for a loaded 2-core machine.
    let within = config
        .sync_timeout()
        .saturating_add(tick.saturating_mul(2))
        .saturating_add(Duration::from_secs(2));
    let took = wait_until(
        "the isolated follower stops serving (while still answering `srvr`)",
        within,
        tick,
        || {
            follower
                .four_letter_word("srvr")
                .is_ok_and(|answer| !answer.contains("Mode:"))
        },
    );
    eprintln!("the isolated follower stopped serving {took:?} after the cut");
    assert!(
        create(
            &follower.connect_string(),
            "/through-the-isolated",
            request_timeout
        )
        .is_err(),
        "a write through the isolated follower fails"
    );
    for i in (0..3).filter(|&i| i != f) {
        let mode = ensemble.member(i).mode();
        assert!(
            matches!(mode.as_deref(), Some("leader" | "follower")),
            "member {i} still serves: {mode:?}"
        );
    }
    for (i, member) in rest.iter().enumerate() {
        create(member, &format!("/during-{i}"), request_timeout)
            .unwrap_or_else(|e| panic!("a write through {member} succeeds: {e}"));
    }

    partition
        .heal()
        .map_err(|e| format!("heal the partition: {e}"))?;
    // It rejoins at its next election round (backed off while it was cut off) and syncs.
    let within = config
        .sync_timeout()
        .saturating_mul(3)
        .saturating_add(Duration::from_secs(3));
    let mut attempt = 0;
    let took = wait_until("the healed follower serves again", within, tick, || {
        attempt += 1;
        create(
            &follower.connect_string(),
            &format!("/after-{attempt}"),
            request_timeout,
        )
        .is_ok()
    });
    eprintln!("the healed follower served a write {took:?} after the heal");

    // The member still restarts under its own uid on its own address.
    follower
        .restart()
        .map_err(|e| format!("restart the follower: {e}"))?;
    assert!(matches!(
        follower.mode().as_deref(),
        Some("leader" | "follower")
    ));
    Ok(())
}
