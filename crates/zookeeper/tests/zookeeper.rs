//! ZooKeeper-specific behaviour against real servers started by the harness: the fence is the
//! node's real czxid, waiters queue and leave nothing behind, Curator and kazoo nodes exclude
//! leasehold and are ordered by sequence, keys map to single node names, credentials make nodes
//! creator-only, a lost create reply leaves no orphan, disconnection versus expiry, bad input.

mod common;

use std::sync::OnceLock;
use std::time::Duration;

use leasehold_core::{Authority, Epoch, Error, Instant, LockKey, LostReason, TtlRange};
use leasehold_servers::{free_port, ZkServer, ZK_CONTAINER_CHECK_INTERVAL};
use leasehold_zookeeper::{names, ZkAuthority, ZkConfig};
use zookeeper_client::{Acls, CreateMode, LockOptions, LockPrefix};

use common::{contenders, raw, standalone, url};

/// One server for the tests that cannot disturb each other (each uses its own chroot); tests
/// that fault a server start their own.
fn shared() -> &'static ZkServer {
    static SERVER: OnceLock<ZkServer> = OnceLock::new();
    SERVER.get_or_init(|| ZkServer::start().expect("ZooKeeper must start for these tests"))
}

async fn shared_hosts() -> String {
    tokio::task::spawn_blocking(|| shared().connect_string())
        .await
        .unwrap()
}

fn key(name: &str) -> LockKey {
    LockKey::new(name).unwrap()
}

fn ephemeral_sequential() -> zookeeper_client::CreateOptions<'static> {
    CreateMode::EphemeralSequential.with_acls(Acls::anyone_all())
}

/// Polls `probe` every 10 ms until it returns true, for at most `within`.
async fn eventually(within: Duration, mut probe: impl AsyncFnMut() -> bool) -> bool {
    let start = Instant::now();
    loop {
        if probe().await {
            return true;
        }
        if start.elapsed() > within {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fence_is_the_nodes_real_czxid_even_when_the_create_reply_has_no_stat() {
    let hosts = shared_hosts().await;
    let url = format!("{}&epoch=3", url(&hosts, "/fence"));
    let modern = ZkAuthority::connect(&url).await.unwrap();
    // Speaking the 3.4 protocol, creates are answered without a Stat (as ZOOKEEPER-4026 leaves
    // some replies), so the authority must read the czxid back.
    let old = ZkAuthority::with_config(
        ZkConfig::from_url(&url)
            .unwrap()
            .with_server_version(3, 4, 0),
    )
    .await
    .unwrap();
    let raw = raw(&hosts).await;
    let k = key("fence");
    let ttl = Duration::from_secs(2);
    let mut last = None;
    for (round, authority) in [&modern, &old, &modern, &old].into_iter().enumerate() {
        let grant = authority.try_acquire(&k, ttl).await.unwrap().unwrap();
        let parent = authority.lock_path(&k);
        let nodes = contenders(&raw, &parent).await;
        assert_eq!(nodes.len(), 1, "round {round}: {nodes:?}");
        let (_, stat) = raw
            .get_data(&format!("{parent}/{}", nodes[0]))
            .await
            .unwrap();
        assert_eq!(grant.fence().raw(), stat.czxid as u64, "round {round}");
        assert_eq!(grant.fence().epoch(), Epoch::new(3).unwrap());
        assert_ne!(stat.ephemeral_owner, 0, "an ephemeral node");
        if let Some(previous) = last {
            assert!(grant.fence() > previous, "round {round}: fences must grow");
        }
        last = Some(grant.fence());
        assert_eq!(
            authority.release(&grant).await.unwrap(),
            leasehold_core::Released::Released
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_and_timed_out_waiters_leave_no_node_behind() {
    let hosts = shared_hosts().await;
    let url = url(&hosts, "/cancel");
    let (a, b) = (
        ZkAuthority::connect(&url).await.unwrap(),
        ZkAuthority::connect(&url).await.unwrap(),
    );
    let raw = raw(&hosts).await;
    let k = key("cancelled-waiter");
    let parent = a.lock_path(&k);
    let ttl = Duration::from_secs(2);
    let holder = a.try_acquire(&k, ttl).await.unwrap().unwrap();
    let held = contenders(&raw, &parent).await;
    assert_eq!(held.len(), 1);

    // A waiter whose future is dropped mid-wait: its node is there while it waits...
    let waiting = tokio::spawn({
        let (b, k) = (b.clone(), k.clone());
        async move { b.acquire(&k, ttl, Duration::from_secs(30)).await }
    });
    assert!(
        eventually(Duration::from_secs(2), async || contenders(&raw, &parent)
            .await
            .len()
            == 2)
        .await,
        "the waiter never queued"
    );
    waiting.abort();
    let _ = waiting.await;
    // ...and gone right after the cancellation (deleted in the background).
    assert!(
        eventually(Duration::from_secs(1), async || contenders(&raw, &parent)
            .await
            == held)
        .await,
        "a cancelled waiter left {:?}",
        contenders(&raw, &parent).await
    );

    // A waiter that times out deletes its node before it returns.
    let started = Instant::now();
    let err = b
        .acquire(&k, ttl, Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }), "{err:?}");
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(
        contenders(&raw, &parent).await,
        held,
        "a timed-out waiter left its node"
    );

    // A try_acquire that finds the key held withdraws its node too.
    assert!(b.try_acquire(&k, ttl).await.unwrap().is_none());
    assert_eq!(contenders(&raw, &parent).await, held);
    let _ = a.release(&holder).await.unwrap();
    assert!(contenders(&raw, &parent).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_served_in_queue_order_with_growing_fences() {
    let hosts = shared_hosts().await;
    let url = url(&hosts, "/queue");
    let holder_client = ZkAuthority::connect(&url).await.unwrap();
    let raw = raw(&hosts).await;
    let k = key("queue");
    let parent = holder_client.lock_path(&k);
    let ttl = Duration::from_secs(2);
    let mut held = holder_client.try_acquire(&k, ttl).await.unwrap().unwrap();
    let mut waiters = Vec::new();
    for n in 0..3 {
        let client = ZkAuthority::connect(&url).await.unwrap();
        let k = k.clone();
        waiters.push(tokio::spawn(async move {
            let grant = client.acquire(&k, ttl, Duration::from_secs(20)).await;
            (n, client, grant)
        }));
        // Queue them one after another.
        assert!(
            eventually(Duration::from_secs(2), async || contenders(&raw, &parent)
                .await
                .len()
                == n + 2)
            .await
        );
    }
    let mut releaser = holder_client;
    for (expected, waiter) in waiters.into_iter().enumerate() {
        let released = Instant::now();
        let _ = releaser.release(&held).await.unwrap();
        let (n, client, grant) = waiter.await.unwrap();
        let grant = grant.unwrap();
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
    let _ = releaser.release(&held).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_and_kazoo_contenders_exclude_leasehold_and_queue_by_sequence() {
    let hosts = shared_hosts().await;
    let url = url(&hosts, "/interop");
    let ours = ZkAuthority::connect(&url).await.unwrap();
    let raw = raw(&hosts).await;
    let k = key("invoice:inv_7");
    let parent = ours.lock_path(&k);
    let ttl = Duration::from_secs(2);
    raw.mkdir(
        &parent,
        &CreateMode::Persistent.with_acls(Acls::anyone_all()),
    )
    .await
    .unwrap();

    // A kazoo Lock holds the key: leasehold must not get it.
    let (_, kazoo_seq) = raw
        .create(
            &format!("{parent}/8f14e45fceea167a5a36dedd4bea2543__lock__"),
            &[],
            &ephemeral_sequential(),
        )
        .await
        .unwrap();
    let kazoo = format!("8f14e45fceea167a5a36dedd4bea2543__lock__{kazoo_seq}");
    assert!(
        ours.try_acquire(&k, ttl).await.unwrap().is_none(),
        "a kazoo holder was ignored"
    );
    // inspect shows the kazoo node as the holder, a peer, fenced by the node's czxid.
    let seen = ours.inspect(&k).await.unwrap();
    assert!(seen.held && seen.remaining.is_none(), "{seen:?}");
    assert_eq!(seen.owner.as_ref().map(|o| o.as_str()), Some("peer:kazoo"));
    let kazoo_czxid = raw
        .check_stat(&format!(
            "{parent}/8f14e45fceea167a5a36dedd4bea2543__lock__{kazoo_seq}"
        ))
        .await
        .unwrap()
        .unwrap()
        .czxid;
    assert_eq!(seen.fence.map(|f| f.raw()), Some(kazoo_czxid as u64));

    // leasehold queues behind it, and a Curator InterProcessMutex queues behind leasehold.
    let waiter = tokio::spawn({
        let (ours, k) = (ours.clone(), k.clone());
        async move { ours.acquire(&k, ttl, Duration::from_secs(10)).await }
    });
    assert!(
        eventually(Duration::from_secs(2), async || contenders(&raw, &parent)
            .await
            .len()
            == 2)
        .await
    );
    let (_, curator_seq) = raw
        .create(
            &format!("{parent}/_c_0a1b2c3d-0000-4000-8000-00000000abcd-lock-"),
            &[],
            &ephemeral_sequential(),
        )
        .await
        .unwrap();
    let curator = format!("_c_0a1b2c3d-0000-4000-8000-00000000abcd-lock-{curator_seq}");
    let queue = contenders(&raw, &parent).await;
    assert_eq!(queue.len(), 3);
    assert_eq!(queue[0], kazoo);
    assert_eq!(queue[2], curator);
    let leasehold_node = queue[1].clone();
    assert!(leasehold_node.starts_with("_c_") && leasehold_node.contains("-lock-"));

    // How Curator and kazoo order the same children (Curator: the text after the last
    // "lock-", kazoo with extra_lock_patterns=["-lock-"]: the sequence after either pattern).
    let mut children = raw.list_children(&parent).await.unwrap();
    let curator_key = |c: &String| match c.rfind("lock-") {
        Some(i) => c[i + 5..].to_string(),
        None => c.clone(),
    };
    children.sort_by_key(curator_key);
    let curator_order: Vec<_> = children
        .iter()
        .filter(|c| c.contains("-lock-"))
        .cloned()
        .collect();
    assert_eq!(
        curator_order,
        vec![leasehold_node.clone(), curator.clone()],
        "Curator sees leasehold first"
    );
    let kazoo_key = |c: &String| {
        ["__lock__", "-lock-"]
            .iter()
            .find_map(|p| c.rfind(p).map(|i| c[i + p.len()..].to_string()))
    };
    let mut kazoo_order: Vec<_> = children
        .iter()
        .filter(|c| kazoo_key(c).is_some())
        .cloned()
        .collect();
    kazoo_order.sort_by_key(kazoo_key);
    assert_eq!(kazoo_order, queue, "kazoo orders them as leasehold does");

    // The kazoo holder releases: leasehold is next, not the Curator contender.
    raw.delete(&format!("{parent}/{kazoo}"), None)
        .await
        .unwrap();
    let grant = waiter.await.unwrap().unwrap();
    assert!(ours.try_acquire(&k, ttl).await.unwrap().is_none());
    let seen = ours.inspect(&k).await.unwrap();
    assert_eq!(seen.fence, Some(grant.fence()), "{seen:?}");
    assert_eq!(
        seen.owner,
        Some(leasehold_core::OwnerId::of(&grant.owner()))
    );
    raw.delete(&format!("{parent}/{curator}"), None)
        .await
        .unwrap();

    // zookeeper-client's own Curator-compatible lock recipe waits while leasehold holds...
    let recipe = tokio::spawn({
        let (raw, parent) = (raw.clone(), parent.clone());
        async move {
            let lock = raw
                .lock(
                    LockPrefix::new_curator(&parent, "lock-").unwrap(),
                    b"",
                    LockOptions::new(Acls::anyone_all()),
                )
                .await
                .unwrap();
            let path = lock.lock_path().to_string();
            (path, Instant::now(), lock.into_owned())
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !recipe.is_finished(),
        "the Curator-style recipe took the lock from leasehold"
    );
    let released = Instant::now();
    let _ = ours.release(&grant).await.unwrap();
    let (recipe_path, got_at, recipe_lock) = recipe.await.unwrap();
    assert!(got_at >= released);
    // ...and leasehold waits while the recipe holds.
    assert!(ours.try_acquire(&k, ttl).await.unwrap().is_none());
    raw.delete(&recipe_path, None).await.unwrap();
    drop(recipe_lock);
    let after = ours.try_acquire(&k, ttl).await.unwrap().unwrap();
    assert!(after.fence() > grant.fence());
    let _ = ours.release(&after).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_map_to_one_node_name_each_reversibly() {
    let hosts = shared_hosts().await;
    // The server's root as chroot: `zookeeper` is reserved there.
    let a = ZkAuthority::connect(&url(&hosts, "/")).await.unwrap();
    let raw = raw(&hosts).await;
    let ttl = Duration::from_secs(2);
    for name in ["a/b/c", "zookeeper", "..", "100%", "tenant:1/invoice:2"] {
        let k = key(name);
        let grant = a.try_acquire(&k, ttl).await.unwrap().unwrap();
        let path = a.lock_path(&k);
        assert_eq!(path.matches('/').count(), 1, "{name} -> {path}");
        assert_eq!(names::key_from_node_name(&path[1..]), Some(k.clone()));
        assert_eq!(contenders(&raw, &path).await.len(), 1, "{path}");
        let _ = a.release(&grant).await.unwrap();
    }
    // The reserved node is untouched.
    assert!(raw.check_stat("/zookeeper/quota").await.unwrap().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_make_lock_nodes_creator_only_and_never_print() {
    let hosts = shared_hosts().await;
    let alice = ZkAuthority::connect(&url(
        &hosts.replace("127.0.0.1", "alice:s3cret-pw@127.0.0.1"),
        "/acl",
    ))
    .await
    .unwrap();
    let k = key("payout:42");
    let ttl = Duration::from_secs(2);
    let grant = alice.try_acquire(&k, ttl).await.unwrap().unwrap();
    let as_alice = zookeeper_client::Client::connector()
        .with_auth("digest", b"alice:s3cret-pw")
        .connect(&hosts)
        .await
        .unwrap();
    let raw = raw(&hosts).await;
    let parent = alice.lock_path(&k);
    assert!(
        matches!(
            raw.list_children(&parent).await,
            Err(zookeeper_client::Error::NoAuth)
        ),
        "others cannot even list the contenders"
    );
    let node = &contenders(&as_alice, &parent).await[0];
    let (acl, _) = as_alice.get_acl(&format!("{parent}/{node}")).await.unwrap();
    assert_eq!(acl.len(), 1);
    assert_eq!(acl[0].scheme(), "digest");
    assert!(acl[0].id().starts_with("alice:"));

    // Another principal, or none, may not queue under alice's parent: Unauthorized, not "held".
    for who in ["mallory:hunter2@127.0.0.1", "127.0.0.1"] {
        let other = ZkAuthority::connect(&url(&hosts.replace("127.0.0.1", who), "/acl"))
            .await
            .unwrap();
        let err = other.try_acquire(&k, ttl).await.unwrap_err();
        assert!(matches!(err, Error::Unauthorized { .. }), "{who}: {err:?}");
        let shown = format!("{err} {err:?} {other:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        // Nor delete alice's node.
        assert!(matches!(
            raw.delete(&format!("{parent}/{node}"), None).await,
            Err(zookeeper_client::Error::NoAuth)
        ));
    }
    // Alice's other processes (same credentials) see the lock held.
    let alice2 = ZkAuthority::connect(&url(
        &hosts.replace("127.0.0.1", "alice:s3cret-pw@127.0.0.1"),
        "/acl",
    ))
    .await
    .unwrap();
    assert!(alice2.try_acquire(&k, ttl).await.unwrap().is_none());
    assert!(!format!("{alice:?} {alice2:?}").contains("s3cret"));
    let _ = alice.release(&grant).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_typed_errors() {
    let hosts = shared_hosts().await;

    // Unreachable hosts: Unavailable, retryable, within the request timeout (twice: two probes
    // at most).
    let port = free_port().unwrap();
    let started = Instant::now();
    let err = ZkAuthority::connect(&format!("zk://127.0.0.1:{port}/x?timeout_ms=500"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::Unavailable { .. }) && err.is_retryable(),
        "{err:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "took {:?}",
        started.elapsed()
    );

    // Chroots ZooKeeper cannot have: refused before connecting.
    for chroot in ["/a//b", "/a/", "/a/./b", "/a/../b"] {
        let err = ZkAuthority::connect(&url(&hosts, chroot))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::InvalidUrl { .. }), "{chroot}: {err:?}");
    }
    // A chroot under an ephemeral node cannot exist: a permanent backend error that says so.
    let raw = raw(&hosts).await;
    raw.create(
        "/ephemeral-root",
        &[],
        &CreateMode::Ephemeral.with_acls(Acls::anyone_all()),
    )
    .await
    .unwrap();
    let err = ZkAuthority::connect(&url(&hosts, "/ephemeral-root/locks"))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Backend {
                retryable: false,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("chroot"), "{err}");

    // TTLs the server does not grant: InvalidTtl before any request...
    let a = ZkAuthority::connect(&url(&hosts, "/bad-ttl"))
        .await
        .unwrap();
    let range = a.ttl_range();
    assert_eq!(range.min, Duration::from_millis(400), "2 ticks of 200 ms");
    assert_eq!(
        range.max,
        Duration::from_secs(60),
        "the harness's maxSessionTimeout"
    );
    let k = key("bad-ttl");
    for ttl in [
        range.min - Duration::from_millis(1),
        range.max + Duration::from_millis(1),
        Duration::from_micros(1_000_500),
    ] {
        let err = a.try_acquire(&k, ttl).await.unwrap_err();
        assert!(matches!(err, Error::InvalidTtl { .. }), "{ttl:?}: {err:?}");
    }
    // ...and, with a range declared wider than the server's, when the session is negotiated:
    // the server would grant 400 ms for 100 ms, and that is refused, never rounded.
    let declared = ZkConfig::from_url(&url(&hosts, "/bad-ttl"))
        .unwrap()
        .with_ttl_range(TtlRange::new(
            Duration::from_millis(100),
            Duration::from_secs(60),
            Duration::from_millis(1),
        ));
    let optimistic = ZkAuthority::with_config(declared).await.unwrap();
    let err = optimistic
        .try_acquire(&k, Duration::from_millis(100))
        .await
        .unwrap_err();
    match &err {
        Error::InvalidTtl { reason, .. } => assert!(
            reason.contains("granted a session timeout of 400ms"),
            "{reason}"
        ),
        other => panic!("{other:?}"),
    }
    // A renewal must keep the grant's TTL: it is the session's timeout.
    let grant = a
        .try_acquire(&k, Duration::from_secs(1))
        .await
        .unwrap()
        .unwrap();
    let err = a.renew(&grant, Duration::from_secs(2)).await.unwrap_err();
    assert!(matches!(err, Error::InvalidTtl { .. }), "{err:?}");
    a.renew(&grant, Duration::from_secs(1)).await.unwrap();
    let _ = a.release(&grant).await.unwrap();
}

/// The server freezes while a create is in flight, so the client loses the reply although the
/// server applies the create when it resumes: the authority must find that node by its UUID
/// (or delete it) instead of leaving an orphan that would block the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_whose_reply_is_lost_leaves_no_orphan() {
    let server = standalone().await;
    let hosts = server.connect_string();
    let url = format!("zk://{hosts}/protected?timeout_ms=5000");
    let a = ZkAuthority::connect(&url).await.unwrap();
    let k = key("protected");
    let ttl = Duration::from_secs(2);
    // Open the TTL's session first.
    let warm = a.try_acquire(&k, ttl).await.unwrap().unwrap();
    let _ = a.release(&warm).await.unwrap();

    let paused = {
        let s = server.clone();
        common::blocking(move || s.pause()).await.unwrap();
        Instant::now()
    };
    let attempt = tokio::spawn({
        let (a, k) = (a.clone(), k.clone());
        async move { a.try_acquire(&k, ttl).await }
    });
    // The client gives up on the connection after 2/5 of the session timeout (800 ms); resume
    // after that but well within the session timeout.
    tokio::time::sleep_until(paused + Duration::from_millis(1100)).await;
    {
        let s = server.clone();
        common::blocking(move || s.resume()).await.unwrap();
    }
    let grant = attempt
        .await
        .unwrap()
        .expect("the attempt succeeds once the server answers again")
        .expect("the key was free");
    let raw = raw(&hosts).await;
    let parent = a.lock_path(&k);
    // Exactly one node for this grant, however the race between the lost create and the
    // reconnection went (a duplicate, if the server applied the create late, is swept).
    assert!(
        eventually(ttl * 2, async || contenders(&raw, &parent).await.len() == 1).await,
        "{:?}",
        contenders(&raw, &parent).await
    );
    // The held node carries the grant's UUID, whichever way the race went: found by its UUID,
    // or adopted as the lowest of my nodes while the later duplicate was deleted. (Its sequence
    // says nothing: the harness reaps the empty parent quickly, and a new one counts from 0.)
    let held = contenders(&raw, &parent).await;
    let hex = grant.owner().to_hex();
    let uuid = format!(
        "_c_{}-{}-{}-{}-{}-lock-",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    );
    assert!(held[0].starts_with(&uuid), "{held:?}, {uuid}");
    let (_, node) = raw
        .get_data(&format!("{parent}/{}", held[0]))
        .await
        .unwrap();
    assert_eq!(grant.fence().raw(), node.czxid as u64);
    let b = ZkAuthority::connect(&url).await.unwrap();
    assert!(b.try_acquire(&k, ttl).await.unwrap().is_none());
    let _ = a.release(&grant).await.unwrap();
    assert!(
        eventually(ttl, async || contenders(&raw, &parent).await.is_empty()).await,
        "an orphan remained: {:?}",
        contenders(&raw, &parent).await
    );
    let next = b
        .try_acquire(&k, ttl)
        .await
        .unwrap()
        .expect("the key is free after release");
    assert!(next.fence() > grant.fence());
}

/// Curator's SUSPENDED versus LOST: while the client is cut off, a renewal does not succeed
/// until the session is confirmed alive again (and its deadline counts from before it was
/// sent); once the session expired, the renewal reports the lease lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disconnection_suspends_renewal_and_an_expiry_loses_the_lease() {
    let server = standalone().await;
    let hosts = server.connect_string();
    let url = format!("zk://{hosts}/suspend?timeout_ms=5000");
    let a = ZkAuthority::connect(&url).await.unwrap();
    let k = key("suspend");
    let ttl = Duration::from_secs(2);
    let grant = a.try_acquire(&k, ttl).await.unwrap().unwrap();

    // SUSPENDED: frozen for 1.2 s, longer than the client's connection timeout (800 ms) but
    // shorter than the session timeout.
    let s = server.clone();
    common::blocking(move || s.pause()).await.unwrap();
    let sent = Instant::now();
    let renewal = tokio::spawn({
        let (a, grant) = (a.clone(), grant.clone());
        async move { (a.renew(&grant, ttl).await, Instant::now()) }
    });
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(
        !renewal.is_finished(),
        "a renewal succeeded or failed while the server was frozen"
    );
    let resumed = Instant::now();
    let s = server.clone();
    common::blocking(move || s.resume()).await.unwrap();
    let (renewed, at) = renewal.await.unwrap();
    let deadline = renewed.expect("the session survived a pause shorter than its timeout");
    assert!(
        at >= resumed,
        "the renewal succeeded before the session answered"
    );
    assert!(
        deadline <= sent + ttl,
        "the deadline counts from before the request"
    );

    // LOST: frozen for longer than the session timeout. A renewal asked meanwhile waits for the
    // session, and the client gives it up after 7/5 of its timeout without an answer.
    let s = server.clone();
    common::blocking(move || s.pause()).await.unwrap();
    let frozen = Instant::now();
    let err = a.renew(&grant, ttl).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::LeaseLost {
                reason: LostReason::SessionEnded,
                ..
            }
        ),
        "{err:?} after {:?}",
        frozen.elapsed()
    );
    assert!(
        frozen.elapsed() >= ttl,
        "the session ended after only {:?}",
        frozen.elapsed()
    );
    let s = server.clone();
    common::blocking(move || s.resume()).await.unwrap();
    // The node goes with the session; a new session takes the key with a greater fence. The
    // server expires the session on its own clock once it runs again, and that can be a whole
    // session timeout after it resumes: a ping the client sent before giving up sits in the
    // socket during the freeze, and the server reads it first and extends the session by its
    // timeout (rounded up to a tick) before it reads the close. Measured here: free 5-10 ms
    // after the resume in two runs of three, 2.03-2.13 s (one timeout) in the third. So the
    // wait is bounded by two TTLs: the extension, and as much again for the tick and a JVM
    // that resumes slowly on a loaded machine.
    let next = a
        .acquire(&k, ttl, ttl * 2)
        .await
        .expect("the key is free within two session timeouts of the server resuming");
    assert!(next.fence() > grant.fence());
    let _ = a.release(&next).await.unwrap();
}

/// Each distinct TTL is a session of its own (the TTL is the session timeout); one client keeps
/// at most eight, closing an idle one to make room, and refuses a ninth TTL while all are busy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_ttl_is_a_session_and_a_client_keeps_at_most_eight() {
    let hosts = shared_hosts().await;
    let a = ZkAuthority::connect(&url(&hosts, "/sessions"))
        .await
        .unwrap();
    let raw = raw(&hosts).await;
    let owner = async |grant: &leasehold_core::Grant| {
        let parent = a.lock_path(grant.key());
        let node = contenders(&raw, &parent).await.remove(0);
        raw.get_data(&format!("{parent}/{node}"))
            .await
            .unwrap()
            .1
            .ephemeral_owner
    };
    let ttl = |i: u64| Duration::from_millis(10_000 + i);
    let mut grants = Vec::new();
    for i in 0..8 {
        grants.push(
            a.try_acquire(&key(&format!("s{i}")), ttl(i))
                .await
                .unwrap()
                .unwrap(),
        );
    }
    let same_ttl = a
        .try_acquire(&key("s0-again"), ttl(0))
        .await
        .unwrap()
        .unwrap();
    let mut owners = Vec::new();
    for g in &grants {
        owners.push(owner(g).await);
    }
    assert_eq!(owner(&same_ttl).await, owners[0], "one TTL, one session");
    let mut distinct = owners.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 8, "eight TTLs, eight sessions");

    let err = a.try_acquire(&key("s8"), ttl(8)).await.unwrap_err();
    match &err {
        Error::InvalidTtl { reason, .. } => assert!(reason.contains("sessions"), "{reason}"),
        other => panic!("{other:?}"),
    }
    // Once a session has no lease left, it makes room.
    let _ = a.release(&grants.remove(3)).await.unwrap();
    let ninth = a.try_acquire(&key("s8"), ttl(8)).await.unwrap().unwrap();
    assert!(!owners.contains(&owner(&ninth).await));
    for g in grants.iter().chain([&same_ttl, &ninth]) {
        let _ = a.release(g).await.unwrap();
    }
}

/// A contender of another principal, with a creator-only ACL, cannot be read, and ZooKeeper
/// does not deliver watch events for nodes a client may not read (an exists watch on it would
/// never fire): the waiter watches the parent's children instead, and takes the key when the
/// node goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_behind_a_contender_it_may_not_read() {
    let hosts = shared_hosts().await;
    let ours = ZkAuthority::connect(&url(&hosts, "/foreign"))
        .await
        .unwrap();
    let k = key("foreign");
    let parent = ours.lock_path(&k);
    let carol = zookeeper_client::Client::connector()
        .with_auth("digest", b"carol:pw")
        .connect(&hosts)
        .await
        .unwrap();
    carol
        .mkdir(
            &parent,
            &CreateMode::Persistent.with_acls(Acls::anyone_all()),
        )
        .await
        .unwrap();
    let (_, seq) = carol
        .create(
            &format!("{parent}/_c_11111111-2222-3333-4444-555555555555-lock-"),
            &[],
            &CreateMode::EphemeralSequential.with_acls(Acls::creator_all()),
        )
        .await
        .unwrap();
    let node = format!("{parent}/_c_11111111-2222-3333-4444-555555555555-lock-{seq}");
    let raw = raw(&hosts).await;
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
        eventually(Duration::from_secs(2), async || contenders(&raw, &parent)
            .await
            .len()
            == 2)
        .await
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !waiter.is_finished(),
        "the waiter did not wait: {:?}",
        waiter.await
    );
    carol.delete(&node, None).await.unwrap();
    let grant = tokio::time::timeout(ttl, waiter)
        .await
        .expect("woken by the deletion")
        .unwrap()
        .unwrap();
    let _ = ours.release(&grant).await.unwrap();
}

/// A waiter whose own node is deleted (by an operator) just before the holder releases must not
/// take the lock with the node it no longer has: it queues again, and its grant is a real node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_node_was_deleted_does_not_hold_a_phantom_lease() {
    let hosts = shared_hosts().await;
    let url = url(&hosts, "/phantom");
    let (a, b) = (
        ZkAuthority::connect(&url).await.unwrap(),
        ZkAuthority::connect(&url).await.unwrap(),
    );
    let raw = raw(&hosts).await;
    let k = key("phantom");
    let parent = a.lock_path(&k);
    let ttl = Duration::from_secs(5);
    let holder = a.try_acquire(&k, ttl).await.unwrap().unwrap();
    let waiter = tokio::spawn({
        let (b, k) = (b.clone(), k.clone());
        async move { b.acquire(&k, ttl, Duration::from_secs(10)).await }
    });
    assert!(
        eventually(Duration::from_secs(2), async || contenders(&raw, &parent)
            .await
            .len()
            == 2)
        .await
    );
    // Let the waiter set its watches.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let queued = contenders(&raw, &parent).await;
    let (_, doomed) = raw
        .get_data(&format!("{parent}/{}", queued[1]))
        .await
        .unwrap();
    raw.delete(&format!("{parent}/{}", queued[1]), None)
        .await
        .unwrap();
    let _ = a.release(&holder).await.unwrap();
    let grant = waiter.await.unwrap().unwrap();
    assert!(
        grant.fence().raw() > doomed.czxid as u64,
        "granted on the deleted node"
    );
    let now = contenders(&raw, &parent).await;
    assert_eq!(now.len(), 1);
    let (_, node) = raw.get_data(&format!("{parent}/{}", now[0])).await.unwrap();
    assert_eq!(grant.fence().raw(), node.czxid as u64);
    b.renew(&grant, ttl).await.unwrap();
    let _ = b.release(&grant).await.unwrap();
}

/// `Duration::MAX` is how a caller says "wait forever", and a URL may carry a request timeout of
/// `u64::MAX` ms: neither may panic (`Instant + Duration` overflows), on the free path, behind a
/// holder, in renew and release. The wait behind a holder really waits (it neither fails nor
/// returns at once) and ends with the holder's release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duration_max_waits_and_huge_timeouts_never_panic() {
    let hosts = shared_hosts().await;
    let huge = format!("zk://{hosts}/forever?timeout_ms={}", u64::MAX);
    let a = ZkAuthority::connect(&huge).await.unwrap();
    let b = ZkAuthority::connect(&url(&hosts, "/forever"))
        .await
        .unwrap();
    let ttl = a.ttl_range().min.max(Duration::from_secs(1));
    let k = key("wait-forever");

    let held = b.acquire(&k, ttl, Duration::MAX).await.unwrap();
    let waiter = tokio::spawn({
        let (a, k) = (a.clone(), k.clone());
        async move { a.acquire(&k, ttl, Duration::MAX).await }
    });
    // Behind the holder, renewed, for more than a TTL: still waiting.
    for _ in 0..4 {
        tokio::time::sleep(ttl / 3).await;
        b.renew(&held, ttl).await.unwrap();
    }
    if waiter.is_finished() {
        panic!("a wait without limit ended early: {:?}", waiter.await);
    }
    let released = Instant::now();
    let _ = b.release(&held).await.unwrap();
    let grant = tokio::time::timeout(ttl, waiter)
        .await
        .expect("the waiter gets the key within a TTL of the release")
        .expect("the waiting task did not panic")
        .unwrap();
    assert!(grant.fence() > held.fence());
    eprintln!("hand-off after {:?}", released.elapsed());

    let deadline = a.renew(&grant, ttl).await.unwrap();
    assert!(deadline > Instant::now());
    assert!(a.try_acquire(&k, ttl).await.unwrap().is_none());
    let _ = a.release(&grant).await.unwrap();
    let again = a.try_acquire(&k, ttl).await.unwrap().expect("free again");
    let _ = a.release(&again).await.unwrap();
}

/// kazoo's `Lock` makes sure of its path once (`ensure_path` on its first acquire) and from then
/// on creates `<uuid>__lock__` nodes under it without `makepath`. A container parent made by
/// leasehold is reaped by the server once the key sits idle, and kazoo's next acquire then fails
/// with `NoNodeError`. With `parent=persistent` the parent stays, and kazoo and leasehold go on
/// excluding each other on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn persistent_parents_keep_a_kazoo_lock_working_after_the_key_sat_idle() {
    let hosts = shared_hosts().await;
    let raw = raw(&hosts).await;
    let ttl = Duration::from_secs(1);
    // Idle for twice the reaping interval plus a tick: a container has certainly been reaped.
    let idle = ZK_CONTAINER_CHECK_INTERVAL * 2 + shared().tick_time();
    let kazoo_node = "0123456789abcdef0123456789abcdef__lock__";

    for (mode, reaped) in [("container", true), ("persistent", false)] {
        let a = ZkAuthority::connect(&format!(
            "zk://{hosts}/kazoo-{mode}?parent={mode}&timeout_ms=1000"
        ))
        .await
        .unwrap();
        let k = key("nightly-report");
        let parent = a.lock_path(&k);
        // leasehold uses the key first, and so makes the parent.
        let g = a.try_acquire(&k, ttl).await.unwrap().unwrap();
        let _ = a.release(&g).await.unwrap();
        // kazoo's first acquire: ensure_path finds it, then lock and unlock.
        assert!(raw.check_stat(&parent).await.unwrap().is_some());
        let (_, seq) = raw
            .create(
                &format!("{parent}/{kazoo_node}"),
                &[],
                &ephemeral_sequential(),
            )
            .await
            .unwrap();
        raw.delete(&format!("{parent}/{kazoo_node}{seq}"), None)
            .await
            .unwrap();

        // The key sits idle.
        tokio::time::sleep(idle).await;
        let second = raw
            .create(
                &format!("{parent}/{kazoo_node}"),
                &[],
                &ephemeral_sequential(),
            )
            .await;
        if reaped {
            assert_eq!(
                second.unwrap_err(),
                zookeeper_client::Error::NoNode,
                "{mode}: the idle container was reaped under kazoo"
            );
            continue;
        }
        let (_, seq) = second.unwrap_or_else(|e| panic!("{mode}: kazoo's second lock: {e}"));
        // kazoo holds: leasehold waits its turn, and gets the key once kazoo lets go.
        assert!(a.try_acquire(&k, ttl).await.unwrap().is_none());
        raw.delete(&format!("{parent}/{kazoo_node}{seq}"), None)
            .await
            .unwrap();
        let g = a
            .try_acquire(&k, ttl)
            .await
            .unwrap()
            .expect("free after kazoo");
        let _ = a.release(&g).await.unwrap();
    }
}

/// The parent's child version: every contender node created or deleted under it moves it on.
async fn child_version(raw: &zookeeper_client::Client, parent: &str) -> i32 {
    raw.check_stat(parent)
        .await
        .unwrap()
        .map_or(-1, |stat| stat.cversion)
}

/// `try_acquire` on a key someone holds must not queue a node only to delete it again: two
/// writes for nothing, and a waiter that queued behind that short-lived node is woken for
/// nothing. Once a client has seen the key held, it lists first, and only queues when the list is
/// empty. The parent's child version counts every create and delete under it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_acquire_on_a_held_key_lists_instead_of_queueing() {
    let hosts = shared_hosts().await;
    let raw = raw(&hosts).await;
    let a = ZkAuthority::connect(&url(&hosts, "/held")).await.unwrap();
    let b = ZkAuthority::connect(&url(&hosts, "/held")).await.unwrap();
    let ttl = Duration::from_secs(2);
    let k = key("busy");
    let parent = a.lock_path(&k);
    let held = a.try_acquire(&k, ttl).await.unwrap().unwrap();

    // B does not know yet that the key is held: its first try may queue and withdraw.
    assert!(b.try_acquire(&k, ttl).await.unwrap().is_none());
    let known = child_version(&raw, &parent).await;
    for _ in 0..5 {
        assert!(b.try_acquire(&k, ttl).await.unwrap().is_none());
    }
    assert_eq!(
        child_version(&raw, &parent).await,
        known,
        "tries on a key known to be held created and deleted nodes"
    );
    assert_eq!(contenders(&raw, &parent).await.len(), 1);

    // Once the holder is gone, the listing is empty and B's next try takes the key.
    let _ = a.release(&held).await.unwrap();
    let mine = b
        .try_acquire(&k, ttl)
        .await
        .unwrap()
        .expect("free after the release");
    assert!(mine.fence() > held.fence());
    // And B, the holder now, does not hold itself off: A, which saw it free, tries once more.
    assert!(a.try_acquire(&k, ttl).await.unwrap().is_none());
    let _ = b.release(&mine).await.unwrap();
    let again = a.try_acquire(&k, ttl).await.unwrap().expect("free again");
    let _ = a.release(&again).await.unwrap();
}

/// A declared TTL range may reach `Duration::MAX`, but ZooKeeper carries a session timeout as
/// 32-bit milliseconds (under 25 days): a TTL beyond that is `InvalidTtl`, not a panic in the
/// client's session task, and connecting with such a range works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_ttls_are_refused_not_handed_to_the_session() {
    let hosts = shared_hosts().await;
    let range = TtlRange::new(
        Duration::from_millis(400),
        Duration::MAX,
        Duration::from_millis(1),
    );
    let config = ZkConfig::from_url(&url(&hosts, "/huge-ttl"))
        .unwrap()
        .with_ttl_range(range);
    let a = tokio::time::timeout(Duration::from_secs(5), ZkAuthority::with_config(config))
        .await
        .expect("connecting with a huge declared range answers")
        .unwrap();
    for ttl in [
        Duration::from_millis(i32::MAX as u64 + 1),
        Duration::from_secs(u32::MAX.into()),
    ] {
        let tried = tokio::time::timeout(Duration::from_secs(5), a.try_acquire(&key("huge"), ttl))
            .await
            .expect("a huge TTL gets an answer");
        assert!(
            matches!(tried, Err(Error::InvalidTtl { .. })),
            "{ttl:?}: {tried:?}"
        );
    }
    let g = a
        .try_acquire(&key("huge"), Duration::from_secs(2))
        .await
        .unwrap()
        .expect("an ordinary TTL still works");
    let _ = a.release(&g).await.unwrap();
}

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
async fn holder_data(raw: &zookeeper_client::Client, parent: &str) -> Vec<u8> {
    let holder = &contenders(raw, parent).await[0];
    raw.get_data(&format!("{parent}/{holder}")).await.unwrap().0
}

/// A grant that is no longer the holder cannot proclaim: not when its node is gone (deleted, as
/// an expired session's is) and the key went to another client, and not when its tenure ran out
/// unrenewed and the key went on. Each time the refusal is `LeaseLost(Refused)`, and the new
/// holder's value, read through inspect and straight from its node, is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_grants_proclaim_is_refused_and_leaves_the_new_holders_value() {
    let hosts = shared_hosts().await;
    let raw = raw(&hosts).await;
    let a = ZkAuthority::connect(&url(&hosts, "/proclaim-stale"))
        .await
        .unwrap();
    let b = ZkAuthority::connect(&url(&hosts, "/proclaim-stale"))
        .await
        .unwrap();
    let ttl = Duration::from_secs(1);
    let k = key("leader");
    let parent = a.lock_path(&k);

    // A's node is deleted under it; B takes the key and proclaims.
    let old = a.try_acquire(&k, ttl).await.unwrap().unwrap();
    a.proclaim(&old, b"a-1").await.unwrap();
    let node = &contenders(&raw, &parent).await[0];
    raw.delete(&format!("{parent}/{node}"), None).await.unwrap();
    let new = b
        .try_acquire(&k, ttl)
        .await
        .unwrap()
        .expect("free once A's node is gone");
    b.proclaim(&new, b"b-1").await.unwrap();
    let written = holder_data(&raw, &parent).await;
    assert_eq!(written, names::encode_value(b"b-1"));
    let stale = a.proclaim(&old, b"a-stale").await;
    assert!(is_refused(&stale), "{stale:?}");
    assert_eq!(holder_data(&raw, &parent).await, written);
    let seen = a.inspect(&k).await.unwrap();
    assert_eq!(seen.value.as_deref(), Some(&b"b-1"[..]), "{seen:?}");
    assert_eq!(seen.fence, Some(new.fence()));

    // B stops renewing: its tenure runs out, its node is deleted, and A, waiting, gets the key.
    let next = a.acquire(&k, ttl, ttl * 4).await.unwrap();
    assert!(next.fence() > new.fence());
    a.proclaim(&next, b"a-2").await.unwrap();
    let written = holder_data(&raw, &parent).await;
    let lapsed = b.proclaim(&new, b"b-stale").await;
    assert!(is_refused(&lapsed), "{lapsed:?}");
    assert_eq!(holder_data(&raw, &parent).await, written);
    let seen = b.inspect(&k).await.unwrap();
    assert_eq!(seen.value.as_deref(), Some(&b"a-2"[..]), "{seen:?}");
    let _ = a.release(&next).await.unwrap();
}

/// Any bytes round-trip (NUL, 0xff, even a value that starts with the tag itself), up to
/// `MAX_VALUE_LEN`; one byte more is `InvalidConfig` and changes nothing. The empty value is a
/// value, not none. A value belongs to its grant: the next grant starts with none. A Curator
/// node (named as ours) and a kazoo node carry data of their own, which is never shown as a
/// value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proclaimed_values_round_trip_any_bytes_and_belong_to_their_grant() {
    let hosts = shared_hosts().await;
    let raw = raw(&hosts).await;
    let a = ZkAuthority::connect(&url(&hosts, "/proclaim-bytes"))
        .await
        .unwrap();
    let b = ZkAuthority::connect(&url(&hosts, "/proclaim-bytes"))
        .await
        .unwrap();
    let ttl = Duration::from_secs(2);
    let k = key("binary");
    let parent = a.lock_path(&k);
    let grant = a.try_acquire(&k, ttl).await.unwrap().unwrap();
    assert_eq!(
        b.inspect(&k).await.unwrap().value,
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
    a.proclaim(&grant, &value).await.unwrap();
    assert_eq!(b.inspect(&k).await.unwrap().value, Some(value.clone()));
    a.proclaim(&grant, b"").await.unwrap();
    assert_eq!(b.inspect(&k).await.unwrap().value, Some(Vec::new()));
    let too_long = vec![7u8; leasehold_core::MAX_VALUE_LEN + 1];
    let err = a.proclaim(&grant, &too_long).await.unwrap_err();
    assert!(matches!(err, Error::InvalidConfig { .. }), "{err:?}");
    assert_eq!(b.inspect(&k).await.unwrap().value, Some(Vec::new()));
    a.proclaim(&grant, b"\x00\xff\x00").await.unwrap();
    assert_eq!(
        a.inspect(&k).await.unwrap().value.as_deref(),
        Some(&b"\x00\xff\x00"[..])
    );
    let _ = a.release(&grant).await.unwrap();
    assert_eq!(b.inspect(&k).await.unwrap().value, None, "free");
    let later = b.try_acquire(&k, ttl).await.unwrap().unwrap();
    let seen = a.inspect(&k).await.unwrap();
    assert!(
        seen.held && seen.value.is_none(),
        "a later grant inherited a value: {seen:?}"
    );
    let _ = b.release(&later).await.unwrap();

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
            .unwrap();
        let seen = a.inspect(&k).await.unwrap();
        assert!(seen.held, "{seen:?}");
        assert_eq!(seen.value, None, "{name}: {seen:?}");
        raw.delete(&format!("{parent}/{name}{seq}"), None)
            .await
            .unwrap();
    }
}

/// Starts `waiter.wait_for_change(k, max_wait)` in a task, after an inspect (an observer reads,
/// then waits), and checks that it is still waiting a moment later, with nothing changed.
async fn start_waiting(
    waiter: &ZkAuthority,
    k: &LockKey,
    max_wait: Duration,
) -> tokio::task::JoinHandle<leasehold_core::Result<()>> {
    waiter.inspect(k).await.unwrap();
    let (waiter, k) = (waiter.clone(), k.clone());
    let task = tokio::spawn(async move { waiter.wait_for_change(&k, max_wait).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !task.is_finished(),
        "the wait returned with nothing changed"
    );
    task
}

/// How long after `since` the wait in `task` ended (`Ok`).
async fn woken(
    task: tokio::task::JoinHandle<leasehold_core::Result<()>>,
    since: Instant,
    what: &str,
) -> Duration {
    tokio::time::timeout(Duration::from_secs(30), task)
        .await
        .unwrap_or_else(|_| panic!("the wait did not end after {what}"))
        .unwrap()
        .unwrap();
    let took = since.elapsed();
    eprintln!("woken {took:?} after {what}");
    took
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
async fn wait_for_change_wakes_on_a_release_from_another_client() {
    let server = standalone().await;
    let hosts = server.connect_string();
    let watches = async || {
        let server = server.clone();
        let mntr = tokio::task::spawn_blocking(move || server.four_letter_word("mntr"))
            .await
            .unwrap()
            .unwrap();
        mntr.lines()
            .find_map(|l| l.strip_prefix("zk_watch_count"))
            .and_then(|n| n.trim().parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no zk_watch_count in {mntr}"))
    };
    let a = ZkAuthority::connect(&url(&hosts, "/change")).await.unwrap();
    let b = ZkAuthority::connect(&url(&hosts, "/change")).await.unwrap();
    let ttl = Duration::from_secs(2);
    let soon = Duration::from_secs(1);
    let k = key("watched");
    let held = a.try_acquire(&k, ttl).await.unwrap().unwrap();

    // A release by another client.
    let waiting = start_waiting(&b, &k, Duration::from_secs(60)).await;
    let released = Instant::now();
    let _ = a.release(&held).await.unwrap();
    let took = woken(waiting, released, "a release").await;
    assert!(took < soon, "woken {took:?} after a release");

    // A proclaim by the holder, without limit.
    let held = a.try_acquire(&k, ttl).await.unwrap().unwrap();
    let waiting = start_waiting(&b, &k, Duration::MAX).await;
    let proclaimed = Instant::now();
    a.proclaim(&held, b"10.0.0.1:7000").await.unwrap();
    let took = woken(waiting, proclaimed, "a proclaim").await;
    assert!(took < soon, "woken {took:?} after a proclaim");

    // A proclaim between the caller's read and its wait (a new leader proclaims right after its
    // grant, while an observer woken by the grant reads): the wait returns at once.
    assert!(b.inspect(&k).await.unwrap().value.is_some());
    a.proclaim(&held, b"10.0.0.1:7001").await.unwrap();
    let started = Instant::now();
    b.wait_for_change(&k, Duration::from_secs(60))
        .await
        .unwrap();
    let took = started.elapsed();
    assert!(
        took < soon,
        "a change before the wait was noticed {took:?} later"
    );
    assert_eq!(
        b.inspect(&k).await.unwrap().value.as_deref(),
        Some(&b"10.0.0.1:7001"[..])
    );

    // Nothing happens: back at max_wait.
    let started = Instant::now();
    b.wait_for_change(&k, Duration::from_millis(200))
        .await
        .unwrap();
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(200) && took < Duration::from_millis(200) + soon,
        "a wait of 200 ms with nothing changed took {took:?}"
    );

    // Dropped waits leave nothing that stops the next one from being woken.
    for _ in 0..20 {
        let cut = tokio::time::timeout(
            Duration::from_millis(2),
            b.wait_for_change(&k, Duration::MAX),
        );
        assert!(cut.await.is_err(), "a wait returned with nothing changed");
    }
    assert!(
        eventually(Duration::from_secs(2), async || watches().await == 0).await,
        "dropped waits left {} watches at the server",
        watches().await
    );
    let waiting = start_waiting(&b, &k, Duration::MAX).await;
    assert!(watches().await > 0, "a wait without a watch");
    let released = Instant::now();
    let _ = a.release(&held).await.unwrap();
    let took = woken(waiting, released, "a release after dropped waits").await;
    assert!(took < soon, "woken {took:?} after a release");

    // A grant on a key nobody has used: its parent does not exist yet.
    let fresh = key("never-used");
    let waiting = start_waiting(&b, &fresh, Duration::MAX).await;
    let granted = Instant::now();
    let first = a.try_acquire(&fresh, ttl).await.unwrap().unwrap();
    let took = woken(waiting, granted, "a grant on a new key").await;
    assert!(took < soon, "woken {took:?} after a grant on a new key");
    let _ = a.release(&first).await.unwrap();
    assert!(
        eventually(Duration::from_secs(2), async || watches().await == 0).await,
        "finished waits left {} watches at the server",
        watches().await
    );
}

/// A standalone server touches a session on every request, so its deadlines need no tick: one
/// that does not tell its tick (`conf` not whitelisted) is not declared, and its expiry slack
/// falls back to half the minimum session timeout; one that tells it is believed, also with a
/// minimum session timeout of four ticks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standalone_server_needs_no_tick_for_its_deadlines() -> Result<(), String> {
    let start = |config: leasehold_servers::ZkConfig| async move {
        tokio::task::spawn_blocking(move || ZkServer::start_with(config))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("ZooKeeper must start for this test: {e}"))
    };
    let tick = Duration::from_millis(300);
    // Four ticks of minimum session timeout: half of it is no tick.
    let told = start(
        leasehold_servers::ZkConfig::default()
            .tick_time(tick)
            .min_session_timeout(tick * 4),
    )
    .await?;
    let untold = start(leasehold_servers::ZkConfig::default().without_conf_word()).await?;
    for (server, slack) in [
        (&told, tick),
        // Its minimum session timeout is two ticks of the harness's 200 ms.
        (&untold, untold.tick_time()),
    ] {
        let a = ZkAuthority::connect(&url(&server.connect_string(), "/standalone-tick"))
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let capabilities = a.capabilities();
        if capabilities.exclusion.can_end_early() || capabilities.expiry_slack != slack {
            return Err(format!(
                "a standalone server with tickTime {:?}: declared {}, expiry slack {:?} (expected \
                 {slack:?})",
                server.tick_time(),
                capabilities.exclusion,
                capabilities.expiry_slack
            ));
        }
    }
    Ok(())
}
