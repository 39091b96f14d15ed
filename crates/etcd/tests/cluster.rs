//! The etcd authority against the harness's 3-member etcd cluster: every member restarted on its
//! data, calls carried to a live member while one is down, a waiter that keeps its place when the
//! leader dies at the hand-off, the etcd-io/etcd#15247 declaration read from every member, and a
//! holder process frozen with SIGSTOP whose late write is refused. A leader crash or pause while
//! a lease is held, and the suite's failover, have a test file of their own.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Txn, TxnOp};
use leasehold_core::{
    Authority, FencedRegister, FencedResource, Instant, Lease, LeaseOptions, LostReason, Released,
};
use leasehold_etcd::guarded::still_holds;
use leasehold_servers::{self as servers, EtcdCluster};

mod common;

use common::cluster::{blocking, handover, rejoin, start_cluster, take_within, url, url_of};
use common::{connect, key, OrFail, Result, REQUEST_TIMEOUT};

/// Every member crashes while A holds a lease; they restart on their data. A's lease is lost,
/// A's key (its lease restored by etcd with a fresh TTL) frees within a TTL of the restart, and
/// the next fence is greater than every fence before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_members_restarted_fences_keep_increasing() -> Result {
    let cluster = start_cluster().await?;
    let url = url(&cluster);
    let a = Arc::new(connect(&url).await?);
    let key = key("restart/all")?;
    let ttl = Duration::from_secs(1);
    let first = a
        .try_acquire(&key, ttl)
        .await
        .or_fail("the first acquisition")?
        .or_fail("the first acquisition: a fresh key was held")?;
    assert_eq!(
        a.release(&first).await.or_fail("the first release")?,
        Released::Released
    );
    let lease = Lease::try_acquire(a.clone(), &key, ttl, LeaseOptions::default())
        .await
        .or_fail("A's lease")?
        .or_fail("A's lease: the released key was held")?;
    let held = lease.fence();
    assert!(held > first.fence());

    blocking(&cluster, |c| {
        for i in 0..c.len() {
            c.member(i).kill()?;
        }
        Ok(())
    })
    .await
    .or_fail("kill every member")?;
    // A's local deadline is at most a TTL after its last renewal, which came before the kill;
    // lost() fires at that deadline (plus a request timeout for a renewal in flight then).
    let reason = tokio::time::timeout(ttl + REQUEST_TIMEOUT, lease.lost())
        .await
        .or_fail("lost() fires while every member is down")?;
    assert!(
        matches!(
            reason,
            LostReason::RenewalFailed(_) | LostReason::DeadlinePassed | LostReason::SessionEnded
        ),
        "{reason:?}"
    );
    blocking(&cluster, |c| c.restart_members(&[0, 1, 2]))
        .await
        .or_fail("restart every member")?;
    let restarted = Instant::now();
    let b = connect(&url).await?;
    let (after, at) = take_within(&b, &key, ttl, handover(ttl, &b))
        .await
        .or_fail("the key frees after the restart")?;
    eprintln!("free {:?} after the restart", at - restarted);
    assert!(
        after.fence() > held,
        "{} after, {held} before",
        after.fence()
    );
    let _ = b.release(&after).await.or_fail("B releases")?;
    drop(lease);
    Ok(())
}

/// A client given three endpoints carries every call to a live member. The leader
/// is killed and a new one elected; then 60 rounds of acquire, renew and release through the
/// same client (which still lists the dead member) must all succeed. Calls balanced onto the
/// dead member fail with "connection refused" unless a request that never left is sent again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_reach_a_live_member_while_one_is_down() -> Result {
    let cluster = start_cluster().await?;
    let a = connect(&url(&cluster)).await?;
    let key = key("member-loss")?;
    let ttl = Duration::from_secs(2);
    for _ in 0..10 {
        let g = a
            .try_acquire(&key, ttl)
            .await
            .or_fail("acquire while every member is up")?
            .or_fail("acquire while every member is up: the released key was held")?;
        assert_eq!(
            a.release(&g)
                .await
                .or_fail("release while every member is up")?,
            Released::Released
        );
    }
    let leader = cluster.leader().or_fail("find the leader")?;
    blocking(&cluster, move |c| c.member(leader).kill())
        .await
        .or_fail("kill the leader")?;
    blocking(&cluster, |c| c.leader().map(|_| ()))
        .await
        .or_fail("a new leader")?;
    let mut failures = Vec::new();
    for round in 0..60 {
        match a.try_acquire(&key, ttl).await {
            Ok(Some(g)) => {
                if let Err(e) = a.renew(&g, ttl).await {
                    failures.push(format!("{round}: renew: {e}"));
                }
                match a.release(&g).await {
                    Ok(Released::Released) => {}
                    other => failures.push(format!("{round}: release: {other:?}")),
                }
            }
            Ok(None) => failures.push(format!("{round}: the free key was held")),
            Err(e) => failures.push(format!("{round}: acquire: {e}")),
        }
    }
    assert!(
        failures.is_empty(),
        "{} failed calls: {failures:#?}",
        failures.len()
    );
    Ok(())
}

/// How many contender keys are queued under `prefix` right now, read with `client`.
async fn queued(client: &etcd_client::Client, prefix: &str) -> Result<usize> {
    let options = etcd_client::GetOptions::new()
        .with_prefix()
        .with_count_only();
    let found = client
        .kv_client()
        .get(prefix, Some(options))
        .await
        .or_fail(format!("count the keys under {prefix}"))?;
    usize::try_from(found.count()).or_fail("a key count out of range")
}

/// The leader dies at the moment of a hand-off: A releases the key B waits for, and the leader
/// is killed 0 to 1.9 ms after the release was sent, while B's look at the key ahead may be in
/// flight. That look is a
/// read: B must send it again through the new leader and get the key, not give up its place in
/// the queue with `Unavailable`. Twenty rounds, each with a fresh leader (the killed member
/// rejoins before the next). B's `max_wait` is the bound on a hand-off through a failover
/// ([`handover`]); every round must end with B holding the key with a greater fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_keeps_its_place_when_the_leader_dies_at_the_hand_off() -> Result {
    let cluster = start_cluster().await?;
    let url = url(&cluster);
    let key = key("handoff/leader-killed")?;
    // A TTL that outlasts an election, as docs/guarantees.md recommends: with one near the
    // server's minimum, B's session itself can end in the election, and B's place with it.
    let ttl = Duration::from_secs(5);
    let mut failures = Vec::new();
    for round in 0..20u32 {
        // Fresh clients every round, connected once the cluster is whole: a session kept
        // alive through one failover per second for twenty seconds is not what is tested.
        let a = connect(&url).await.or_fail(format!("round {round}: A"))?;
        let b = Arc::new(connect(&url).await.or_fail(format!("round {round}: B"))?);
        let prefix = a.prefix(&key);
        let max_wait = handover(ttl, &b);
        let held = a
            .acquire(&key, ttl, max_wait)
            .await
            .or_fail(format!("round {round}: A's acquire"))?;
        let waiter = {
            let (b, key) = (b.clone(), key.clone());
            tokio::spawn(async move { b.acquire(&key, ttl, max_wait).await })
        };
        // B is queued behind A before the hand-off begins. (The raw client may still pick
        // the member that rejoined last round before its connection is back: read again.)
        let queued_by = Instant::now() + REQUEST_TIMEOUT;
        loop {
            let seen = queued(a.client(), &prefix).await;
            if matches!(seen, Ok(n) if n >= 2) {
                break;
            }
            if Instant::now() > queued_by {
                return Err(format!(
                    "round {round}: B did not queue within {REQUEST_TIMEOUT:?} ({seen:?})"
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let leader = blocking(&cluster, |c| c.leader())
            .await
            .or_fail(format!("round {round}: find the leader"))?;
        // The kill is timed from the moment A's release is sent, 0 to 1.9 ms later: a release
        // takes about a millisecond here, and B's look at the key ahead leaves as it is applied
        // and takes a fraction of one, so the kills fall before, during and after the look. A
        // kill before the release is applied may leave the release unanswered: then A's
        // session withdraws the key, and B must still get it.
        let delay = Duration::from_micros(100 * u64::from(round));
        let kill = blocking(&cluster, move |c| {
            std::thread::sleep(delay);
            c.member(leader).kill()
        });
        let (released, killed) = tokio::join!(a.release(&held), kill);
        killed.or_fail(format!("round {round}: kill the leader"))?;
        match released {
            Ok(Released::Released) | Err(_) => {}
            Ok(other) => return Err(format!("round {round}: A's release found {other:?}").into()),
        }
        let taken = match waiter.await {
            Ok(Ok(grant)) => {
                if grant.fence() <= held.fence() {
                    failures.push(format!(
                        "round {round}: B's fence {} is not above A's {}",
                        grant.fence(),
                        held.fence()
                    ));
                }
                Some(grant)
            }
            Ok(Err(e)) => {
                failures.push(format!(
                    "round {round} (leader killed {delay:?} after the release was sent): {e}"
                ));
                None
            }
            Err(e) => return Err(format!("round {round}: B's task: {e}").into()),
        };
        rejoin(&cluster, leader).await?;
        // Released once the cluster is whole again: a delete sent during the election may
        // go unanswered, which is not what this test is about.
        if let Some(grant) = taken {
            let _released_or_withdrawn = b
                .release(&grant)
                .await
                .or_fail(format!("round {round}: B's release"))?;
        }
        for (name, client) in [("A", &a), ("B", &*b)] {
            client
                .close()
                .await
                .or_fail(format!("round {round}: close {name}"))?;
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} of 20 waiters lost their place: {failures:#?}",
            failures.len()
        )
        .into())
    }
}

/// Each member's version, read from the member itself with a raw client.
async fn member_versions(cluster: &EtcdCluster) -> Result<Vec<String>> {
    let mut versions = Vec::new();
    for member in cluster.members() {
        let mut raw = etcd_client::Client::connect([member.endpoint()], None)
            .await
            .or_fail(format!("a raw client of {}", member.endpoint()))?;
        let status = raw
            .status()
            .await
            .or_fail(format!("the status of {}", member.endpoint()))?;
        versions.push(status.version().to_string());
    }
    Ok(versions)
}

/// Whether etcd `version` has etcd-io/etcd#15247 (fixed in 3.4.31 and 3.5.13; an unreadable
/// version may have it).
fn affected(version: &str) -> bool {
    let mut parts = version.split('.').map(|p| p.parse::<u64>().ok());
    match (parts.next(), parts.next(), parts.next()) {
        (Some(Some(3)), Some(Some(4)), Some(Some(patch))) => patch < 31,
        (Some(Some(3)), Some(Some(5)), Some(Some(patch))) => patch < 13,
        (Some(Some(major)), Some(Some(minor)), Some(Some(_))) => (major, minor) < (3, 4),
        _ => true,
    }
}

/// The etcd-io/etcd#15247 declaration is made from every member's version, not from whichever
/// member the client happens to reach: a client that lists one member only still declares from
/// all three (any of them can lead), and a member whose version cannot be read (paused with
/// SIGSTOP while the client connects) is declared, named, as one that may have the defect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_declaration_reads_every_members_version() -> Result {
    let cluster = start_cluster().await?;
    let leader = blocking(&cluster, |c| c.leader())
        .await
        .or_fail("find the leader")?;
    let followers: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    let (reached, paused) = match followers[..] {
        [reached, paused] => (reached, paused),
        _ => return Err(format!("two followers expected, found {followers:?}").into()),
    };
    let versions = member_versions(&cluster).await?;
    let alone = url_of(&[cluster.member(reached).endpoint()]);

    let a = connect(&alone)
        .await
        .or_fail(format!("connect through member {reached} alone"))?;
    let exclusion = a.capabilities().exclusion.clone();
    let shown = exclusion.to_string();
    eprintln!("every member up: {shown}");
    if exclusion.can_end_early() != versions.iter().any(|v| affected(v)) {
        return Err(format!("members run {versions:?}, declared: {shown}").into());
    }
    if exclusion.can_end_early() && !shown.contains("3 members") {
        return Err(format!("the declaration does not say it read all 3 members: {shown}").into());
    }
    a.close().await.or_fail("close")?;

    blocking(&cluster, move |c| c.member(paused).pause())
        .await
        .or_fail(format!("pause member {paused}"))?;
    let connected = connect(&alone).await;
    blocking(&cluster, move |c| c.member(paused).resume())
        .await
        .or_fail(format!("resume member {paused}"))?;
    let b = connected.or_fail(format!("connect while member {paused} is paused"))?;
    let exclusion = b.capabilities().exclusion.clone();
    let shown = exclusion.to_string();
    eprintln!("member {paused} paused: {shown}");
    if !exclusion.can_end_early() {
        return Err(
            format!("member {paused}'s version could not be read, yet declared: {shown}").into(),
        );
    }
    let name = format!("member etcd-{paused} (");
    if !shown.contains(&name) || !shown.contains("could not be read") {
        return Err(format!(
            "the declaration does not name the unread member etcd-{paused}: {shown}"
        )
        .into());
    }
    b.close().await.or_fail("close")
}

/// The child's next output line that starts with `prefix`, without it.
async fn next_line(
    lines: &mut tokio::sync::mpsc::UnboundedReceiver<String>,
    prefix: &str,
) -> Result<String> {
    loop {
        let line = tokio::time::timeout(Duration::from_secs(30), lines.recv())
            .await
            .or_fail(format!("no `{prefix}` line from the child"))?
            .or_fail(format!("the child ended before `{prefix}`"))?;
        if let Some(at) = line.find(prefix) {
            return Ok(line[at + prefix.len()..].trim().to_string());
        }
    }
}

const CHILD_KEY: &str = "paused/holder";
const RESOURCE_KEY: &str = "resources/paused";

/// The `paused_holder` example, built by `cargo test` next to this test binary.
fn paused_holder_example() -> Result<std::path::PathBuf> {
    let exe = std::env::current_exe().or_fail("this test binary's path")?;
    let path = exe
        .parent()
        .and_then(|deps| deps.parent())
        .or_fail("the target directory")?
        .join("examples")
        .join("paused_holder");
    assert!(
        path.is_file(),
        "example paused_holder not built at {} (cargo test builds examples unless a single --test target is named)",
        path.display()
    );
    Ok(path)
}

/// A holder process is frozen (SIGSTOP) between its validity check and its write, so its
/// session's keep-alive stops too. Its lease expires at etcd, B takes the lock with a greater
/// fence and claims the resources; when the holder thaws, its write is refused both by the
/// in-etcd guard (the key's create revision) and by a fenced register.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_holder_process_is_fenced_out() -> Result {
    let cluster = start_cluster().await?;
    let url = url(&cluster);
    let go_dir = servers::process::server_dir("paused-holder").or_fail("a scratch directory")?;
    let go = go_dir.path().join("go");
    let mut child = Command::new(paused_holder_example()?)
        .arg(&url)
        .arg(&go)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .or_fail("start the paused_holder example")?;
    let pid = child.id().to_string();
    // The child's lines, as they come.
    let (tx, mut lines) = tokio::sync::mpsc::unbounded_channel::<String>();
    let stdout = child.stdout.take().or_fail("the child's stdout")?;
    std::thread::spawn(move || {
        for line in BufReader::new(stdout)
            .lines()
            .map_while(std::result::Result::ok)
        {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let held: u64 = next_line(&mut lines, "HELD ")
        .await?
        .parse()
        .or_fail("the child's fence")?;
    let signal = |sig: &str| -> Result {
        let status = Command::new("kill")
            .args([sig, &pid])
            .status()
            .or_fail(format!("run kill {sig} {pid}"))?;
        assert!(status.success(), "kill {sig} {pid}");
        Ok(())
    };
    signal("-STOP")?;
    let frozen = Instant::now();

    let b = connect(&url).await?;
    let key = key(CHILD_KEY)?;
    let ttl = Duration::from_secs(1);
    // The child's lease lasts a TTL from its last keep-alive; etcd notices within its slack.
    let (grant, at) = take_within(&b, &key, ttl, handover(ttl, &b))
        .await
        .or_fail("B gets the key once the frozen holder's lease expires")?;
    eprintln!("B took the key {:?} after the freeze", at - frozen);
    assert!(grant.fence().raw() > held);
    let guarded = Txn::new()
        .when([still_holds(&grant).or_fail("B's guard")?])
        .and_then([TxnOp::put(RESOURCE_KEY, "B", None)]);
    assert!(b
        .client()
        .kv_client()
        .txn(guarded)
        .await
        .or_fail("B's guarded write")?
        .succeeded());
    let register = FencedRegister::new();
    assert!(register
        .claim(grant.fence())
        .await
        .or_fail("B claims the register")?
        .is_accepted());
    let child_fence = leasehold_core::Fence::compose(
        "etcd",
        leasehold_core::Epoch::ZERO,
        held,
        leasehold_core::FenceSafety::Linearizable,
    )
    .or_fail("the child's fence, composed")?;
    assert!(!register
        .write(child_fence, "child")
        .await
        .or_fail("the child's write to the register")?
        .is_accepted());

    std::fs::write(&go, b"go").or_fail("tell the child to go on")?;
    signal("-CONT")?;
    assert_eq!(
        next_line(&mut lines, "WROTE ").await?,
        "false",
        "etcd applied the frozen holder's guarded write"
    );
    assert_eq!(
        next_line(&mut lines, "VALID ").await?,
        "false",
        "the thawed holder still believes in its lease"
    );
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .or_fail("the task waiting for the child")?
        .or_fail("wait for the child")?;
    assert!(status.success(), "the child failed: {status:?}");
    let value = b
        .client()
        .kv_client()
        .get(RESOURCE_KEY, None)
        .await
        .or_fail("read the resource")?;
    assert_eq!(
        value.kvs()[0].value(),
        b"B",
        "the frozen holder's late write went through"
    );
    let _ = b.release(&grant).await.or_fail("B releases")?;
    Ok(())
}
