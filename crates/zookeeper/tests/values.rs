//! Proclaimed values on a real ZooKeeper: a stale grant's proclaim is refused and leaves the new
//! holder's value, any bytes round-trip and belong to their grant (never a Curator's or kazoo's
//! node data), and `wait_for_change` wakes on another client's release, proclaim and grant.
//!
//! The value tests share one server, each under a chroot of its own; the wait test starts its
//! own, to count the watches at the server.

mod common;

use std::time::Duration;

use leasehold_conformance::kit::{ErrOrFail, OrFail, TestResult};
use leasehold_conformance::Failure;
use leasehold_core::{Authority, Error, Instant, LockKey, LostReason};
use leasehold_zookeeper::{names, ZkAuthority};

use common::{
    contenders, ephemeral_sequential, eventually, key, raw, shared_hosts, standalone, url,
};

fn is_refused(result: &leasehold_core::Result<()>) -> bool {
    matches!(
        result,
        Err(Error::LeaseLost {
            reason: LostReason::Refused,
            ..
        })
    )
}

/// The data of the node that holds `parent`'s lock.
async fn holder_data(raw: &zookeeper_client::Client, parent: &str) -> TestResult<Vec<u8>> {
    let holder = contenders(raw, parent)
        .await?
        .into_iter()
        .next()
        .or_fail("the holder's node")?;
    Ok(raw
        .get_data(&format!("{parent}/{holder}"))
        .await
        .or_fail("read the holder's node")?
        .0)
}

/// A grant that is no longer the holder cannot proclaim: not when its node is gone (deleted, as
/// an expired session's is) and the key went to another client, and not when its tenure ran out
/// unrenewed and the key went on. Each time the refusal is `LeaseLost(Refused)`, and the new
/// holder's value, read through inspect and straight from its node, is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_grants_proclaim_is_refused_and_leaves_the_new_holders_value() -> TestResult {
    let hosts = shared_hosts().await?;
    let raw = raw(&hosts).await?;
    let a = ZkAuthority::connect(&url(&hosts, "/proclaim-stale"))
        .await
        .or_fail("connect A")?;
    let b = ZkAuthority::connect(&url(&hosts, "/proclaim-stale"))
        .await
        .or_fail("connect B")?;
    let ttl = Duration::from_secs(1);
    let k = key("leader")?;
    let parent = a.lock_path(&k);

    // A's node is deleted under it; B takes the key and proclaims.
    let old = a
        .try_acquire(&k, ttl)
        .await
        .or_fail("A acquires")?
        .or_fail("the key is free")?;
    a.proclaim(&old, b"a-1").await.or_fail("A proclaims")?;
    let node = contenders(&raw, &parent)
        .await?
        .into_iter()
        .next()
        .or_fail("A's node")?;
    raw.delete(&format!("{parent}/{node}"), None)
        .await
        .or_fail("delete A's node")?;
    let new = b
        .try_acquire(&k, ttl)
        .await
        .or_fail("B acquires")?
        .or_fail("free once A's node is gone")?;
    b.proclaim(&new, b"b-1").await.or_fail("B proclaims")?;
    let written = holder_data(&raw, &parent).await?;
    assert_eq!(written, names::encode_value(b"b-1"));
    let stale = a.proclaim(&old, b"a-stale").await;
    assert!(is_refused(&stale), "{stale:?}");
    assert_eq!(holder_data(&raw, &parent).await?, written);
    let seen = a.inspect(&k).await.or_fail("A inspects")?;
    assert_eq!(seen.value.as_deref(), Some(&b"b-1"[..]), "{seen:?}");
    assert_eq!(seen.fence, Some(new.fence()));

    // B stops renewing: its tenure runs out, its node is deleted, and A, waiting, gets the key.
    let next = a
        .acquire(&k, ttl, ttl * 4)
        .await
        .or_fail("A waits for B's tenure to run out")?;
    assert!(next.fence() > new.fence());
    a.proclaim(&next, b"a-2").await.or_fail("A proclaims")?;
    let written = holder_data(&raw, &parent).await?;
    let lapsed = b.proclaim(&new, b"b-stale").await;
    assert!(is_refused(&lapsed), "{lapsed:?}");
    assert_eq!(holder_data(&raw, &parent).await?, written);
    let seen = b.inspect(&k).await.or_fail("B inspects")?;
    assert_eq!(seen.value.as_deref(), Some(&b"a-2"[..]), "{seen:?}");
    let _ = a.release(&next).await.or_fail("A releases")?;
    Ok(())
}

/// Any bytes round-trip (NUL, 0xff, even a value that starts with the tag itself), up to
/// `MAX_VALUE_LEN`; one byte more is `InvalidConfig` and changes nothing. The empty value is a
/// value, not none. A value belongs to its grant: the next grant starts with none. A Curator
/// node (named as ours) and a kazoo node carry data of their own, which is never shown as a
/// value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proclaimed_values_round_trip_any_bytes_and_belong_to_their_grant() -> TestResult {
    let hosts = shared_hosts().await?;
    let raw = raw(&hosts).await?;
    let a = ZkAuthority::connect(&url(&hosts, "/proclaim-bytes"))
        .await
        .or_fail("connect A")?;
    let b = ZkAuthority::connect(&url(&hosts, "/proclaim-bytes"))
        .await
        .or_fail("connect B")?;
    let ttl = Duration::from_secs(2);
    let k = key("binary")?;
    let parent = a.lock_path(&k);
    let grant = a
        .try_acquire(&k, ttl)
        .await
        .or_fail("A acquires")?
        .or_fail("the key is free")?;
    assert_eq!(
        b.inspect(&k).await.or_fail("B inspects")?.value,
        None,
        "nothing proclaimed yet"
    );

    let mut value = names::VALUE_TAG.to_vec();
    value.extend(
        (0..=255u8)
            .cycle()
            .take(leasehold_core::MAX_VALUE_LEN - value.len()),
    );
    assert_eq!(value.len(), leasehold_core::MAX_VALUE_LEN);
    a.proclaim(&grant, &value)
        .await
        .or_fail("proclaim the largest value")?;
    assert_eq!(
        b.inspect(&k).await.or_fail("B inspects")?.value,
        Some(value.clone())
    );
    a.proclaim(&grant, b"")
        .await
        .or_fail("proclaim the empty value")?;
    assert_eq!(
        b.inspect(&k).await.or_fail("B inspects")?.value,
        Some(Vec::new())
    );
    let too_long = vec![7u8; leasehold_core::MAX_VALUE_LEN + 1];
    let err = a
        .proclaim(&grant, &too_long)
        .await
        .err_or_fail("proclaim a value over the limit")?;
    assert!(matches!(err, Error::InvalidConfig { .. }), "{err:?}");
    assert_eq!(
        b.inspect(&k).await.or_fail("B inspects")?.value,
        Some(Vec::new())
    );
    a.proclaim(&grant, b"\x00\xff\x00")
        .await
        .or_fail("proclaim NUL and 0xff")?;
    assert_eq!(
        a.inspect(&k).await.or_fail("A inspects")?.value.as_deref(),
        Some(&b"\x00\xff\x00"[..])
    );
    let _ = a.release(&grant).await.or_fail("A releases")?;
    assert_eq!(
        b.inspect(&k).await.or_fail("B inspects")?.value,
        None,
        "free"
    );
    let later = b
        .try_acquire(&k, ttl)
        .await
        .or_fail("B acquires")?
        .or_fail("the key is free")?;
    let seen = a.inspect(&k).await.or_fail("A inspects")?;
    assert!(
        seen.held && seen.value.is_none(),
        "a later grant inherited a value: {seen:?}"
    );
    let _ = b.release(&later).await.or_fail("B releases")?;

    // Curator's InterProcessMutex writes its client's address by default; kazoo's Lock its
    // identifier.
    for (name, data) in [
        (
            "_c_0a1b2c3d-0000-4000-8000-00000000abcd-lock-",
            &b"127.0.1.1"[..],
        ),
        ("8f14e45fceea167a5a36dedd4bea2543__lock__", b"worker-1"),
    ] {
        let (_, seq) = raw
            .create(&format!("{parent}/{name}"), data, &ephemeral_sequential())
            .await
            .or_fail(name)?;
        let seen = a.inspect(&k).await.or_fail("A inspects")?;
        assert!(seen.held, "{seen:?}");
        assert_eq!(seen.value, None, "{name}: {seen:?}");
        raw.delete(&format!("{parent}/{name}{seq}"), None)
            .await
            .or_fail(name)?;
    }
    Ok(())
}

/// Starts `waiter.wait_for_change(k, max_wait)` in a task, after an inspect (an observer reads,
/// then waits), and checks that it is still waiting a moment later, with nothing changed.
async fn start_waiting(
    waiter: &ZkAuthority,
    k: &LockKey,
    max_wait: Duration,
) -> TestResult<tokio::task::JoinHandle<leasehold_core::Result<()>>> {
    waiter.inspect(k).await.or_fail("the waiter inspects")?;
    let (waiter, k) = (waiter.clone(), k.clone());
    let task = tokio::spawn(async move { waiter.wait_for_change(&k, max_wait).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !task.is_finished(),
        "the wait returned with nothing changed"
    );
    Ok(task)
}

/// How long after `since` the wait in `task` ended (`Ok`).
async fn woken(
    task: tokio::task::JoinHandle<leasehold_core::Result<()>>,
    since: Instant,
    what: &str,
) -> TestResult<Duration> {
    tokio::time::timeout(Duration::from_secs(30), task)
        .await
        .or_fail(format!("the wait did not end after {what}"))?
        .or_fail("the waiting task")?
        .or_fail("the wait")?;
    let took = since.elapsed();
    eprintln!("woken {took:?} after {what}");
    Ok(took)
}

/// Another client waiting for a change on a key wakes soon after a release, as well as after a
/// proclaim and after a grant on a key never used before (no parent node yet), each far sooner
/// than its `max_wait` (a minute, or `Duration::MAX`); a proclaim between the waiter's inspect
/// and its wait returns the wait at once; with nothing happening it returns at `max_wait`.
/// Waits dropped half-way leave the client able to wait and be woken again.
///
/// Its own server, so that the server's count of watches (`mntr`) is this test's alone: waits
/// that returned, timed out or were dropped leave none registered there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_for_change_wakes_on_a_release_from_another_client() -> TestResult {
    let server = standalone().await?;
    let hosts = server.connect_string();
    let watches = async || {
        let server = server.clone();
        let mntr = tokio::task::spawn_blocking(move || server.four_letter_word("mntr"))
            .await
            .or_fail("the mntr task")?
            .or_fail("mntr")?;
        mntr.lines()
            .find_map(|l| l.strip_prefix("zk_watch_count"))
            .and_then(|n| n.trim().parse::<u64>().ok())
            .ok_or_else(|| Failure::new(format!("no zk_watch_count in {mntr}")))
    };
    let a = ZkAuthority::connect(&url(&hosts, "/change"))
        .await
        .or_fail("connect A")?;
    let b = ZkAuthority::connect(&url(&hosts, "/change"))
        .await
        .or_fail("connect B")?;
    let ttl = Duration::from_secs(2);
    let soon = Duration::from_secs(1);
    let k = key("watched")?;
    let held = a
        .try_acquire(&k, ttl)
        .await
        .or_fail("A acquires")?
        .or_fail("the key is free")?;

    // A release by another client.
    let waiting = start_waiting(&b, &k, Duration::from_secs(60)).await?;
    let released = Instant::now();
    let _ = a.release(&held).await.or_fail("A releases")?;
    let took = woken(waiting, released, "a release").await?;
    assert!(took < soon, "woken {took:?} after a release");

    // A proclaim by the holder, without limit.
    let held = a
        .try_acquire(&k, ttl)
        .await
        .or_fail("A acquires again")?
        .or_fail("the key is free")?;
    let waiting = start_waiting(&b, &k, Duration::MAX).await?;
    let proclaimed = Instant::now();
    a.proclaim(&held, b"10.0.0.1:7000")
        .await
        .or_fail("A proclaims")?;
    let took = woken(waiting, proclaimed, "a proclaim").await?;
    assert!(took < soon, "woken {took:?} after a proclaim");

    // A proclaim between the caller's read and its wait (a new leader proclaims right after its
    // grant, while an observer woken by the grant reads): the wait returns at once.
    assert!(b.inspect(&k).await.or_fail("B inspects")?.value.is_some());
    a.proclaim(&held, b"10.0.0.1:7001")
        .await
        .or_fail("A proclaims again")?;
    let started = Instant::now();
    b.wait_for_change(&k, Duration::from_secs(60))
        .await
        .or_fail("B waits")?;
    let took = started.elapsed();
    assert!(
        took < soon,
        "a change before the wait was noticed {took:?} later"
    );
    assert_eq!(
        b.inspect(&k).await.or_fail("B inspects")?.value.as_deref(),
        Some(&b"10.0.0.1:7001"[..])
    );

    // Nothing happens: back at max_wait.
    let started = Instant::now();
    b.wait_for_change(&k, Duration::from_millis(200))
        .await
        .or_fail("B waits 200 ms")?;
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(200) && took < Duration::from_millis(200) + soon,
        "a wait of 200 ms with nothing changed took {took:?}"
    );

    // Dropped waits leave nothing that stops the next one from being woken. The holder's watch
    // on its own node (its loss is pushed) stays: one watch, set again after each proclaim.
    let held_watches = 1;
    assert!(
        eventually(Duration::from_secs(1), async || Ok(
            watches().await? == held_watches
        ))
        .await?,
        "the holder's node watch: {} watches at the server",
        watches().await?
    );
    for _ in 0..20 {
        let cut = tokio::time::timeout(
            Duration::from_millis(2),
            b.wait_for_change(&k, Duration::MAX),
        );
        assert!(cut.await.is_err(), "a wait returned with nothing changed");
    }
    assert!(
        eventually(Duration::from_secs(2), async || Ok(
            watches().await? == held_watches
        ))
        .await?,
        "dropped waits left {} watches at the server, beside the holder's {held_watches}",
        watches().await?
    );
    let waiting = start_waiting(&b, &k, Duration::MAX).await?;
    assert!(watches().await? > held_watches, "a wait without a watch");
    let released = Instant::now();
    let _ = a.release(&held).await.or_fail("A releases")?;
    let took = woken(waiting, released, "a release after dropped waits").await?;
    assert!(took < soon, "woken {took:?} after a release");

    // A grant on a key nobody has used: its parent does not exist yet.
    let fresh = key("never-used")?;
    let waiting = start_waiting(&b, &fresh, Duration::MAX).await?;
    let granted = Instant::now();
    let first = a
        .try_acquire(&fresh, ttl)
        .await
        .or_fail("A acquires a new key")?
        .or_fail("the new key is free")?;
    let took = woken(waiting, granted, "a grant on a new key").await?;
    assert!(took < soon, "woken {took:?} after a grant on a new key");
    let _ = a.release(&first).await.or_fail("A releases the new key")?;
    assert!(
        eventually(Duration::from_secs(2), async || Ok(watches().await? == 0)).await?,
        "finished waits left {} watches at the server",
        watches().await?
    );
    Ok(())
}
