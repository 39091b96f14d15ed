//! The queue of contender nodes on a real ZooKeeper: the fence is the node's real czxid, waiters
//! are served in queue order and leave nothing behind when cancelled or timed out, a waiter
//! behind a node it may not read still wakes, a waiter whose node was deleted does not hold a
//! phantom lease, `try_acquire` on a held key lists instead of queueing, and waits without limit
//! never panic.
//!
//! The tests share one server, each under a chroot of its own.

mod common;

use std::time::Duration;

use leasehold_conformance::kit::{ErrOrFail, OrFail, TestResult};
use leasehold_core::{Authority, Epoch, Error, Instant};
use leasehold_zookeeper::{ZkAuthority, ZkConfig};
use zookeeper_client::{Acls, CreateMode};

use common::{contenders, eventually, key, raw, shared_hosts, url};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fence_is_the_nodes_real_czxid_even_when_the_create_reply_has_no_stat() -> TestResult {
    let hosts = shared_hosts().await?;
    let url = format!("{}&epoch=3", url(&hosts, "/fence"));
    let modern = ZkAuthority::connect(&url).await.or_fail("connect")?;
    // Speaking the 3.4 protocol, creates are answered without a Stat (as ZOOKEEPER-4026 leaves
    // some replies), so the authority must read the czxid back.
    let old = ZkAuthority::with_config(
        ZkConfig::from_url(&url)
            .or_fail("the URL's configuration")?
            .with_server_version(3, 4, 0),
    )
    .await
    .or_fail("connect speaking 3.4")?;
    let raw = raw(&hosts).await?;
    let k = key("fence")?;
    let ttl = Duration::from_secs(2);
    let mut last = None;
    for (round, authority) in [&modern, &old, &modern, &old].into_iter().enumerate() {
        let grant = authority
            .try_acquire(&k, ttl)
            .await
            .or_fail("acquire")?
            .or_fail("the key is free")?;
        let parent = authority.lock_path(&k);
        let nodes = contenders(&raw, &parent).await?;
        assert_eq!(nodes.len(), 1, "round {round}: {nodes:?}");
        let (_, stat) = raw
            .get_data(&format!("{parent}/{}", nodes[0]))
            .await
            .or_fail("read the holder's node")?;
        assert_eq!(grant.fence().raw(), stat.czxid as u64, "round {round}");
        assert_eq!(grant.fence().epoch(), Epoch::new(3).or_fail("epoch 3")?);
        assert_ne!(stat.ephemeral_owner, 0, "an ephemeral node");
        if let Some(previous) = last {
            assert!(grant.fence() > previous, "round {round}: fences must grow");
        }
        last = Some(grant.fence());
        assert_eq!(
            authority.release(&grant).await.or_fail("release")?,
            leasehold_core::Released::Released
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_and_timed_out_waiters_leave_no_node_behind() -> TestResult {
    let hosts = shared_hosts().await?;
    let url = url(&hosts, "/cancel");
    let (a, b) = (
        ZkAuthority::connect(&url).await.or_fail("connect A")?,
        ZkAuthority::connect(&url).await.or_fail("connect B")?,
    );
    let raw = raw(&hosts).await?;
    let k = key("cancelled-waiter")?;
    let parent = a.lock_path(&k);
    let ttl = Duration::from_secs(2);
    let holder = a
        .try_acquire(&k, ttl)
        .await
        .or_fail("A acquires")?
        .or_fail("the key is free")?;
    let held = contenders(&raw, &parent).await?;
    assert_eq!(held.len(), 1);

    // A waiter whose future is dropped mid-wait: its node is there while it waits...
    let waiting = tokio::spawn({
        let (b, k) = (b.clone(), k.clone());
        async move { b.acquire(&k, ttl, Duration::from_secs(30)).await }
    });
    assert!(
        eventually(Duration::from_secs(2), async || Ok(contenders(
            &raw, &parent
        )
        .await?
        .len()
            == 2))
        .await?,
        "the waiter never queued"
    );
    waiting.abort();
    let _ = waiting.await;
    // ...and gone right after the cancellation (deleted in the background).
    assert!(
        eventually(Duration::from_secs(1), async || Ok(contenders(
            &raw, &parent
        )
        .await?
            == held))
        .await?,
        "a cancelled waiter left {:?}",
        contenders(&raw, &parent).await?
    );

    // A waiter that times out deletes its node before it returns.
    let started = Instant::now();
    let err = b
        .acquire(&k, ttl, Duration::from_millis(300))
        .await
        .err_or_fail("B waits behind the holder")?;
    assert!(matches!(err, Error::Timeout { .. }), "{err:?}");
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(
        contenders(&raw, &parent).await?,
        held,
        "a timed-out waiter left its node"
    );

    // A try_acquire that finds the key held withdraws its node too.
    assert!(b
        .try_acquire(&k, ttl)
        .await
        .or_fail("B tries the held key")?
        .is_none());
    assert_eq!(contenders(&raw, &parent).await?, held);
    let _ = a.release(&holder).await.or_fail("A releases")?;
    assert!(contenders(&raw, &parent).await?.is_empty());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_served_in_queue_order_with_growing_fences() -> TestResult {
    let hosts = shared_hosts().await?;
    let url = url(&hosts, "/queue");
    let holder_client = ZkAuthority::connect(&url)
        .await
        .or_fail("connect the holder")?;
    let raw = raw(&hosts).await?;
    let k = key("queue")?;
    let parent = holder_client.lock_path(&k);
    let ttl = Duration::from_secs(2);
    let mut held = holder_client
        .try_acquire(&k, ttl)
        .await
        .or_fail("the holder acquires")?
        .or_fail("the key is free")?;
    let mut waiters = Vec::new();
    for n in 0..3 {
        let client = ZkAuthority::connect(&url)
            .await
            .or_fail("connect a waiter")?;
        let k = k.clone();
        waiters.push(tokio::spawn(async move {
            let grant = client.acquire(&k, ttl, Duration::from_secs(20)).await;
            (n, client, grant)
        }));
        // Queue them one after another.
        assert!(
            eventually(Duration::from_secs(2), async || Ok(contenders(
                &raw, &parent
            )
            .await?
            .len()
                == n + 2))
            .await?
        );
    }
    let mut releaser = holder_client;
    for (expected, waiter) in waiters.into_iter().enumerate() {
        let released = Instant::now();
        let _ = releaser.release(&held).await.or_fail("release")?;
        let (n, client, grant) = waiter.await.or_fail("a waiting task")?;
        let grant = grant.or_fail("a waiter acquires")?;
        assert_eq!(n, expected, "served out of queue order");
        assert!(grant.fence() > held.fence());
        assert!(
            released.elapsed() < ttl,
            "the hand-off took {:?}",
            released.elapsed()
        );
        held = grant;
        releaser = client;
    }
    let _ = releaser.release(&held).await.or_fail("the last releases")?;
    Ok(())
}

/// A contender of another principal, with a creator-only ACL, cannot be read, and ZooKeeper
/// does not deliver watch events for nodes a client may not read (an exists watch on it would
/// never fire): the waiter watches the parent's children instead, and takes the key when the
/// node goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_behind_a_contender_it_may_not_read() -> TestResult {
    let hosts = shared_hosts().await?;
    let ours = ZkAuthority::connect(&url(&hosts, "/foreign"))
        .await
        .or_fail("connect")?;
    let k = key("foreign")?;
    let parent = ours.lock_path(&k);
    let carol = zookeeper_client::Client::connector()
        .with_auth("digest", b"carol:pw")
        .connect(&hosts)
        .await
        .or_fail("connect as carol")?;
    carol
        .mkdir(
            &parent,
            &CreateMode::Persistent.with_acls(Acls::anyone_all()),
        )
        .await
        .or_fail("carol makes the parent")?;
    let (_, seq) = carol
        .create(
            &format!("{parent}/_c_11111111-2222-3333-4444-555555555555-lock-"),
            &[],
            &CreateMode::EphemeralSequential.with_acls(Acls::creator_all()),
        )
        .await
        .or_fail("carol queues")?;
    let node = format!("{parent}/_c_11111111-2222-3333-4444-555555555555-lock-{seq}");
    let raw = raw(&hosts).await?;
    assert!(matches!(
        raw.get_data(&node).await,
        Err(zookeeper_client::Error::NoAuth)
    ));
    let ttl = Duration::from_secs(2);
    let waiter = tokio::spawn({
        let (ours, k) = (ours.clone(), k.clone());
        async move { ours.acquire(&k, ttl, Duration::from_secs(10)).await }
    });
    assert!(
        eventually(Duration::from_secs(2), async || Ok(contenders(
            &raw, &parent
        )
        .await?
        .len()
            == 2))
        .await?
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !waiter.is_finished(),
        "the waiter did not wait: {:?}",
        waiter.await
    );
    carol.delete(&node, None).await.or_fail("carol lets go")?;
    let grant = tokio::time::timeout(ttl, waiter)
        .await
        .or_fail("woken by the deletion")?
        .or_fail("the waiting task")?
        .or_fail("the waiter acquires")?;
    let _ = ours.release(&grant).await.or_fail("release")?;
    Ok(())
}

/// A waiter whose own node is deleted (by an operator) just before the holder releases must not
/// take the lock with the node it no longer has: it queues again, and its grant is a real node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_node_was_deleted_does_not_hold_a_phantom_lease() -> TestResult {
    let hosts = shared_hosts().await?;
    let url = url(&hosts, "/phantom");
    let (a, b) = (
        ZkAuthority::connect(&url).await.or_fail("connect A")?,
        ZkAuthority::connect(&url).await.or_fail("connect B")?,
    );
    let raw = raw(&hosts).await?;
    let k = key("phantom")?;
    let parent = a.lock_path(&k);
    let ttl = Duration::from_secs(5);
    let holder = a
        .try_acquire(&k, ttl)
        .await
        .or_fail("A acquires")?
        .or_fail("the key is free")?;
    let waiter = tokio::spawn({
        let (b, k) = (b.clone(), k.clone());
        async move { b.acquire(&k, ttl, Duration::from_secs(10)).await }
    });
    assert!(
        eventually(Duration::from_secs(2), async || Ok(contenders(
            &raw, &parent
        )
        .await?
        .len()
            == 2))
        .await?
    );
    // Let the waiter set its watches.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let queued = contenders(&raw, &parent).await?;
    let (_, doomed) = raw
        .get_data(&format!("{parent}/{}", queued[1]))
        .await
        .or_fail("read the waiter's node")?;
    raw.delete(&format!("{parent}/{}", queued[1]), None)
        .await
        .or_fail("delete the waiter's node")?;
    let _ = a.release(&holder).await.or_fail("A releases")?;
    let grant = waiter
        .await
        .or_fail("the waiting task")?
        .or_fail("B acquires")?;
    assert!(
        grant.fence().raw() > doomed.czxid as u64,
        "granted on the deleted node"
    );
    let now = contenders(&raw, &parent).await?;
    assert_eq!(now.len(), 1);
    let (_, node) = raw
        .get_data(&format!("{parent}/{}", now[0]))
        .await
        .or_fail("read B's node")?;
    assert_eq!(grant.fence().raw(), node.czxid as u64);
    b.renew(&grant, ttl).await.or_fail("B renews")?;
    let _ = b.release(&grant).await.or_fail("B releases")?;
    Ok(())
}

/// The parent's child version: every contender node created or deleted under it moves it on.
async fn child_version(raw: &zookeeper_client::Client, parent: &str) -> TestResult<i32> {
    Ok(raw
        .check_stat(parent)
        .await
        .or_fail("stat the parent")?
        .map_or(-1, |stat| stat.cversion))
}

/// `try_acquire` on a key someone holds must not queue a node only to delete it again: two
/// writes for nothing, and a waiter that queued behind that short-lived node is woken for
/// nothing. Once a client has seen the key held, it lists first, and only queues when the list is
/// empty. The parent's child version counts every create and delete under it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_acquire_on_a_held_key_lists_instead_of_queueing() -> TestResult {
    let hosts = shared_hosts().await?;
    let raw = raw(&hosts).await?;
    let a = ZkAuthority::connect(&url(&hosts, "/held"))
        .await
        .or_fail("connect A")?;
    let b = ZkAuthority::connect(&url(&hosts, "/held"))
        .await
        .or_fail("connect B")?;
    let ttl = Duration::from_secs(2);
    let k = key("busy")?;
    let parent = a.lock_path(&k);
    let held = a
        .try_acquire(&k, ttl)
        .await
        .or_fail("A acquires")?
        .or_fail("the key is free")?;

    // B does not know yet that the key is held: its first try may queue and withdraw.
    assert!(b.try_acquire(&k, ttl).await.or_fail("B tries")?.is_none());
    let known = child_version(&raw, &parent).await?;
    for _ in 0..5 {
        assert!(b
            .try_acquire(&k, ttl)
            .await
            .or_fail("B tries again")?
            .is_none());
    }
    assert_eq!(
        child_version(&raw, &parent).await?,
        known,
        "tries on a key known to be held created and deleted nodes"
    );
    assert_eq!(contenders(&raw, &parent).await?.len(), 1);

    // Once the holder is gone, the listing is empty and B's next try takes the key.
    let _ = a.release(&held).await.or_fail("A releases")?;
    let mine = b
        .try_acquire(&k, ttl)
        .await
        .or_fail("B tries the free key")?
        .or_fail("free after the release")?;
    assert!(mine.fence() > held.fence());
    // And B, the holder now, does not hold itself off: A, which saw it free, tries once more.
    assert!(a.try_acquire(&k, ttl).await.or_fail("A tries")?.is_none());
    let _ = b.release(&mine).await.or_fail("B releases")?;
    let again = a
        .try_acquire(&k, ttl)
        .await
        .or_fail("A tries again")?
        .or_fail("free again")?;
    let _ = a.release(&again).await.or_fail("A releases")?;
    Ok(())
}

/// `Duration::MAX` is how a caller says "wait forever", and a URL may carry a request timeout of
/// `u64::MAX` ms: neither may panic (`Instant + Duration` overflows), on the free path, behind a
/// holder, in renew and release. The wait behind a holder really waits (it neither fails nor
/// returns at once) and ends with the holder's release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duration_max_waits_and_huge_timeouts_never_panic() -> TestResult {
    let hosts = shared_hosts().await?;
    let huge = format!("zk://{hosts}/forever?timeout_ms={}", u64::MAX);
    let a = ZkAuthority::connect(&huge)
        .await
        .or_fail("connect with a huge timeout")?;
    let b = ZkAuthority::connect(&url(&hosts, "/forever"))
        .await
        .or_fail("connect B")?;
    let ttl = a.ttl_range().min.max(Duration::from_secs(1));
    let k = key("wait-forever")?;

    let held = b
        .acquire(&k, ttl, Duration::MAX)
        .await
        .or_fail("B acquires without limit")?;
    let waiter = tokio::spawn({
        let (a, k) = (a.clone(), k.clone());
        async move { a.acquire(&k, ttl, Duration::MAX).await }
    });
    // Behind the holder, renewed, for more than a TTL: still waiting.
    for _ in 0..4 {
        tokio::time::sleep(ttl / 3).await;
        b.renew(&held, ttl).await.or_fail("B renews")?;
    }
    if waiter.is_finished() {
        panic!("a wait without limit ended early: {:?}", waiter.await);
    }
    let released = Instant::now();
    let _ = b.release(&held).await.or_fail("B releases")?;
    let grant = tokio::time::timeout(ttl, waiter)
        .await
        .or_fail("the waiter gets the key within a TTL of the release")?
        .or_fail("the waiting task did not panic")?
        .or_fail("A acquires")?;
    assert!(grant.fence() > held.fence());
    eprintln!("hand-off after {:?}", released.elapsed());

    let deadline = a.renew(&grant, ttl).await.or_fail("A renews")?;
    assert!(deadline > Instant::now());
    assert!(a
        .try_acquire(&k, ttl)
        .await
        .or_fail("A tries its own key")?
        .is_none());
    let _ = a.release(&grant).await.or_fail("A releases")?;
    let again = a
        .try_acquire(&k, ttl)
        .await
        .or_fail("A tries again")?
        .or_fail("free again")?;
    let _ = a.release(&again).await.or_fail("A releases again")?;
    Ok(())
}
