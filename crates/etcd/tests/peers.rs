//! etcd's own lock and election clients against leasehold on the same server: `etcdctl lock` and
//! `etcdctl elect` share leasehold's key layout, so each excludes, and sees, the other.

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{Authority, Election, Released};
use leasehold_etcd::guarded::contender_key;
use leasehold_servers::{self as servers, EtcdServer};

mod common;

use common::{connect, key, start, url, OrFail, Result};

fn spawn_etcdctl_lock(server: &EtcdServer, name: &str, script: &str) -> Result<Child> {
    let mut command = server.etcdctl().or_fail("etcdctl")?;
    command
        .args(["lock", "--ttl=2", name, "--", "sh", "-c", script])
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    command.spawn().or_fail("spawn etcdctl lock")
}

/// `etcdctl lock <namespace>/<key>` and leasehold share one queue: each waits for the other,
/// and leasehold's fence comes after the revision etcdctl was granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_lock_and_leasehold_exclude_each_other() -> Result {
    let server = start().await?;
    let a = connect(&url(&server)).await?;
    let key = key("jobs/nightly")?;
    let name = a.etcdctl_lock_name(&key);
    assert_eq!(name, "leasehold/jobs%2Fnightly");
    let ttl = Duration::from_secs(2);

    // etcdctl holds the lock while its child waits for a file to appear (etcdctl does not hand
    // its stdin to the child).
    let dir = servers::process::server_dir("etcdctl-lock").or_fail("a scratch directory")?;
    let done = dir.path().join("done");
    let script = format!(
        "echo \"$ETCD_LOCK_KEY $ETCD_LOCK_REV\"; while [ ! -e {} ]; do sleep 0.05; done",
        done.display()
    );
    let mut held = spawn_etcdctl_lock(&server, &name, &script)?;
    let mut out = BufReader::new(held.stdout.take().or_fail("etcdctl's stdout")?);
    let line = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        out.read_line(&mut line).map(|_| line)
    })
    .await
    .or_fail("the reading task")?
    .or_fail("read etcdctl's line")?;
    let (lock_key, lock_rev) = line
        .trim()
        .split_once(' ')
        .or_fail("etcdctl prints key and revision")?;
    assert!(lock_key.starts_with(&a.prefix(&key)), "{lock_key}");
    let lock_rev: u64 = lock_rev.parse().or_fail("etcdctl's revision")?;
    assert!(
        a.try_acquire(&key, ttl)
            .await
            .or_fail("try the key etcdctl holds")?
            .is_none(),
        "leasehold ignored etcdctl's lock"
    );
    // inspect sees the peer as the holder, with the revision of its key as its fence.
    let seen = a.inspect(&key).await.or_fail("inspect")?;
    assert!(seen.held, "{seen:?}");
    assert_eq!(
        seen.owner.as_ref().map(|o| o.as_str()),
        Some("peer:etcd-mutex")
    );
    assert!(seen.fence.is_some_and(|f| f.raw() <= lock_rev), "{seen:?}");
    let waiter = {
        let a = a.clone();
        let key = key.clone();
        tokio::spawn(async move { a.acquire(&key, ttl, Duration::from_secs(10)).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiter.is_finished(),
        "leasehold acquired while etcdctl held the lock"
    );
    std::fs::write(&done, b"done").or_fail("let etcdctl's child finish")?;
    let ours = waiter
        .await
        .or_fail("the waiter's task")?
        .or_fail("leasehold gets the lock after etcdctl")?;
    assert!(ours.fence().raw() > lock_rev);
    let _ = tokio::task::spawn_blocking(move || held.wait())
        .await
        .or_fail("the task waiting for etcdctl")?;

    // Now leasehold holds it: etcdctl waits until leasehold releases.
    let mut blocked = spawn_etcdctl_lock(&server, &name, "echo \"$ETCD_LOCK_REV\"")?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        blocked.try_wait().or_fail("look at etcdctl")?.is_none(),
        "etcdctl got the lock while leasehold held it"
    );
    let fence = ours.fence().raw();
    assert_eq!(
        a.release(&ours).await.or_fail("release")?,
        Released::Released
    );
    let output = tokio::task::spawn_blocking(move || blocked.wait_with_output())
        .await
        .or_fail("the task waiting for etcdctl")?
        .or_fail("wait for etcdctl")?;
    assert!(output.status.success());
    let rev: u64 = String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .or_fail("etcdctl's revision")?;
    assert!(
        rev > fence,
        "etcdctl's revision {rev} is not after leasehold's fence {fence}"
    );
    Ok(())
}

/// Reads `n` lines from a child's stdout, or fails the test after `within`.
async fn read_lines(
    out: &mut Option<BufReader<std::process::ChildStdout>>,
    n: usize,
    within: Duration,
) -> Result<Vec<String>> {
    let mut reader = out.take().or_fail("the child's stdout")?;
    let read = tokio::task::spawn_blocking(move || {
        let mut lines = Vec::new();
        for _ in 0..n {
            let mut line = String::new();
            reader.read_line(&mut line).or_fail("read a line")?;
            lines.push(line.trim_end_matches('\n').to_string());
        }
        Ok::<_, common::Failure>((lines, reader))
    });
    let (lines, reader) = tokio::time::timeout(within, read)
        .await
        .or_fail("the child printed in time")?
        .or_fail("the reading task")??;
    *out = Some(reader);
    Ok(lines)
}

/// Sends SIGINT, on which `etcdctl elect` resigns and exits.
fn interrupt(child: &Child) -> Result {
    let status = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .or_fail("run kill")?;
    assert!(status.success());
    Ok(())
}

/// `etcdctl elect` (etcd's `concurrency.Election`) shares the layout, so each side sees the
/// other's leader and value: an `etcdctl elect --listen` observer prints our leader's key and
/// its stored value (our owner token, then on the next line what we proclaimed, each time we
/// proclaim); an `etcdctl elect` campaigner's proposal is what leasehold's `inspect` and
/// `Election::leader` report as its value, and it excludes our candidates until it resigns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_elect_and_leasehold_see_each_others_values() -> Result {
    let server = start().await?;
    let a = connect(&url(&server)).await?;
    let authority: Arc<dyn Authority> = Arc::new(a.clone());
    let key = key("elect/leader")?;
    let name = a.etcdctl_lock_name(&key);
    let ttl = Duration::from_secs(2);
    let election = Election::new(authority, &key)
        .with_value("10.0.0.1:7000")
        .or_fail("the election's value")?;

    let mut leading = election.campaign(ttl, ttl).await.or_fail("campaign")?;
    let ours = contender_key(leading.lease().grant())
        .or_fail("our contender key")?
        .to_string();
    let token = leading.lease().grant().owner().to_hex();
    let mut listener = server
        .etcdctl()
        .or_fail("etcdctl")?
        .args(["elect", "--listen", &name])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .or_fail("spawn etcdctl elect --listen")?;
    let mut out = listener.stdout.take().map(BufReader::new);
    let seen = read_lines(&mut out, 3, ttl * 5).await?;
    assert_eq!(seen, [ours.as_str(), &token, "10.0.0.1:7000"]);
    leading
        .proclaim("10.0.0.1:7001")
        .await
        .or_fail("the leader proclaims")?;
    let seen = read_lines(&mut out, 3, ttl * 5).await?;
    assert_eq!(seen, [ours.as_str(), &token, "10.0.0.1:7001"]);
    let _ = listener.kill();
    let _ = listener.wait();
    let _ = leading.resign().await.or_fail("resign")?;

    let mut campaigner = server
        .etcdctl()
        .or_fail("etcdctl")?
        .args(["elect", &name, "proposal-x"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .or_fail("spawn etcdctl elect")?;
    let mut out = campaigner.stdout.take().map(BufReader::new);
    // Elected, it prints its key and value.
    let elected = read_lines(&mut out, 2, ttl * 5).await?;
    assert!(elected[0].starts_with(&a.prefix(&key)), "{elected:?}");
    assert_eq!(elected[1], "proposal-x");
    let seen = a.inspect(&key).await.or_fail("inspect")?;
    assert!(seen.held);
    assert_eq!(seen.value, Some(b"proposal-x".to_vec()));
    assert_eq!(
        seen.owner.as_ref().map(|o| o.as_str()),
        Some("peer:etcd-election")
    );
    let leader = election
        .leader()
        .await
        .or_fail("the election's leader")?
        .or_fail("etcdctl leads")?;
    assert_eq!(leader.value_str(), Some("proposal-x"));
    assert!(
        election
            .try_campaign(ttl)
            .await
            .or_fail("try to campaign")?
            .is_none(),
        "leasehold was elected while etcdctl led"
    );
    interrupt(&campaigner)?;
    let next = election
        .campaign(ttl, ttl * 5)
        .await
        .or_fail("leasehold leads once etcdctl resigned")?;
    assert!(next.epoch() > leader.epoch);
    let _ = tokio::task::spawn_blocking(move || campaigner.wait())
        .await
        .or_fail("the task waiting for etcdctl")?;
    let _ = next.resign().await.or_fail("resign")?;
    Ok(())
}

/// A set taken in one transaction is exactly as exclusive as one try per key: an `etcdctl lock`
/// peer holding one key of the set makes the whole step answer "held", and the step writes no
/// key under any other prefix of the set. Once the peer is gone the step takes all three keys
/// with one fence (the transaction's revision, after the peer's), and a new `etcdctl lock` on a
/// key of the set waits until leasehold releases it. A set too large for one transaction (129
/// keys) is refused before anything is written; 128 keys go in one step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcdctl_lock_peer_on_one_key_makes_the_one_step_set_held() -> Result {
    let server = start().await?;
    let a = connect(&url(&server)).await?;
    let raw = common::raw_client(&server).await?;
    let named = [key("set/c")?, key("set/a")?, key("set/b")?];
    let keys = leasehold_core::canonical(&named).or_fail("order the set")?;
    let ttl = Duration::from_secs(2);

    let dir = servers::process::server_dir("etcdctl-set").or_fail("a scratch directory")?;
    let done = dir.path().join("done");
    let script = format!(
        "echo \"$ETCD_LOCK_REV\"; while [ ! -e {} ]; do sleep 0.05; done",
        done.display()
    );
    let mut peer = spawn_etcdctl_lock(&server, &a.etcdctl_lock_name(&keys[1]), &script)?;
    let mut out = Some(BufReader::new(
        peer.stdout.take().or_fail("etcdctl's stdout")?,
    ));
    let lines = read_lines(&mut out, 1, Duration::from_secs(10)).await?;
    let peer_rev: u64 = lines[0].trim().parse().or_fail("etcdctl's revision")?;

    let busy = a
        .try_acquire_all(&keys, ttl)
        .await
        .or_fail("try the set while etcdctl holds its middle key")?;
    assert!(busy.is_none(), "the set was taken beside etcdctl's lock");
    for (i, key) in keys.iter().enumerate() {
        let under = common::keys_under(&raw, &a.prefix(key)).await?;
        let expected = usize::from(i == 1);
        assert_eq!(
            under.len(),
            expected,
            "{key} has {under:?} after the refused step (only etcdctl's key may be there)"
        );
    }

    // 129 keys need more operations than etcd's default per transaction.
    let many: Vec<_> = (0..129)
        .map(|i| key(&format!("many/{i:03}")))
        .collect::<Result<_>>()?;
    let many = leasehold_core::canonical(&many).or_fail("order the large set")?;
    match a.try_acquire_all(&many, ttl).await {
        Err(leasehold_core::Error::Unsupported { .. }) => {}
        other => {
            return Err(common::Failure::new(format!(
                "129 keys in one step gave {:?}, not Unsupported",
                other.map(|g| g.map(|g| g.len()))
            )))
        }
    }
    let first = common::keys_under(&raw, &a.prefix(&many[0])).await?;
    assert!(first.is_empty(), "the refused large set wrote {first:?}");
    // 128 keys, the most one transaction takes, go in one step.
    let largest = a
        .try_acquire_all(&many[..128], ttl)
        .await
        .or_fail("take 128 keys in one step")?
        .or_fail("the 128 keys are free")?;
    assert_eq!(largest.len(), 128);
    for grant in &largest {
        assert_eq!(
            a.release(grant).await.or_fail("release")?,
            Released::Released
        );
    }

    std::fs::write(&done, b"done").or_fail("let etcdctl's child finish")?;
    let _ = tokio::task::spawn_blocking(move || peer.wait())
        .await
        .or_fail("the task waiting for etcdctl")?;
    let grants = a
        .try_acquire_all(&keys, ttl)
        .await
        .or_fail("take the set once etcdctl is gone")?
        .or_fail("the set is free once etcdctl is gone")?;
    assert_eq!(grants.len(), keys.len());
    let leases = a.session_leases();
    for (grant, key) in grants.iter().zip(&keys) {
        assert_eq!(grant.key(), key);
        assert!(
            grant.fence().raw() > peer_rev,
            "{key}'s fence {} is not after etcdctl's revision {peer_rev}",
            grant.fence()
        );
        assert_eq!(
            grant.fence(),
            grants[0].fence(),
            "one transaction gives every key its revision"
        );
        let under = common::keys_under(&raw, &a.prefix(key)).await?;
        assert!(
            under.len() == 1 && leases.contains(&under[0].1),
            "{key} holds {under:?}, not one key on our session lease {leases:?}"
        );
    }

    // etcdctl waits on a key the set holds until leasehold releases it.
    let mut blocked = spawn_etcdctl_lock(
        &server,
        &a.etcdctl_lock_name(&keys[1]),
        "echo \"$ETCD_LOCK_REV\"",
    )?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        blocked.try_wait().or_fail("look at etcdctl")?.is_none(),
        "etcdctl got a key the set holds"
    );
    for grant in &grants {
        assert_eq!(
            a.release(grant).await.or_fail("release")?,
            Released::Released
        );
    }
    let output = tokio::task::spawn_blocking(move || blocked.wait_with_output())
        .await
        .or_fail("the task waiting for etcdctl")?
        .or_fail("wait for etcdctl")?;
    assert!(output.status.success());
    Ok(())
}
