//! leasehold among other ZooKeeper clients, on a real server: Curator and kazoo contenders
//! exclude leasehold and queue by sequence, keys map to one node name each, credentials make
//! lock nodes creator-only and never print, and persistent parents keep a kazoo lock working
//! after the key sat idle.
//!
//! The tests share one server, each under a chroot of its own.

mod common;

use std::time::Duration;

use leasehold_conformance::kit::{ErrOrFail, OrFail, TestResult};
use leasehold_core::{Authority, Error, Instant};
use leasehold_servers::ZK_CONTAINER_CHECK_INTERVAL;
use leasehold_zookeeper::{names, ZkAuthority};
use zookeeper_client::{Acls, CreateMode, LockOptions, LockPrefix};

use common::{contenders, ephemeral_sequential, eventually, key, raw, shared, shared_hosts, url};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_and_kazoo_contenders_exclude_leasehold_and_queue_by_sequence() -> TestResult {
    let hosts = shared_hosts().await?;
    let url = url(&hosts, "/interop");
    let ours = ZkAuthority::connect(&url).await.or_fail("connect")?;
    let raw = raw(&hosts).await?;
    let k = key("invoice:inv_7")?;
    let parent = ours.lock_path(&k);
    let ttl = Duration::from_secs(2);
    raw.mkdir(
        &parent,
        &CreateMode::Persistent.with_acls(Acls::anyone_all()),
    )
    .await
    .or_fail("make the parent")?;

    // A kazoo Lock holds the key: leasehold must not get it.
    let (_, kazoo_seq) = raw
        .create(
            &format!("{parent}/8f14e45fceea167a5a36dedd4bea2543__lock__"),
            &[],
            &ephemeral_sequential(),
        )
        .await
        .or_fail("kazoo's node")?;
    let kazoo = format!("8f14e45fceea167a5a36dedd4bea2543__lock__{kazoo_seq}");
    assert!(
        ours.try_acquire(&k, ttl)
            .await
            .or_fail("try the key kazoo holds")?
            .is_none(),
        "a kazoo holder was ignored"
    );
    // inspect shows the kazoo node as the holder, a peer, fenced by the node's czxid.
    let seen = ours.inspect(&k).await.or_fail("inspect")?;
    assert!(seen.held && seen.remaining.is_none(), "{seen:?}");
    assert_eq!(seen.owner.as_ref().map(|o| o.as_str()), Some("peer:kazoo"));
    let kazoo_czxid = raw
        .check_stat(&format!(
            "{parent}/8f14e45fceea167a5a36dedd4bea2543__lock__{kazoo_seq}"
        ))
        .await
        .or_fail("stat kazoo's node")?
        .or_fail("kazoo's node exists")?
        .czxid;
    assert_eq!(seen.fence.map(|f| f.raw()), Some(kazoo_czxid as u64));

    // leasehold queues behind it, and a Curator InterProcessMutex queues behind leasehold.
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
    let (_, curator_seq) = raw
        .create(
            &format!("{parent}/_c_0a1b2c3d-0000-4000-8000-00000000abcd-lock-"),
            &[],
            &ephemeral_sequential(),
        )
        .await
        .or_fail("Curator's node")?;
    let curator = format!("_c_0a1b2c3d-0000-4000-8000-00000000abcd-lock-{curator_seq}");
    let queue = contenders(&raw, &parent).await?;
    assert_eq!(queue.len(), 3);
    assert_eq!(queue[0], kazoo);
    assert_eq!(queue[2], curator);
    let leasehold_node = queue[1].clone();
    assert!(leasehold_node.starts_with("_c_") && leasehold_node.contains("-lock-"));

    // How Curator and kazoo order the same children (Curator: the text after the last
    // "lock-", kazoo with extra_lock_patterns=["-lock-"]: the sequence after either pattern).
    let mut children = raw
        .list_children(&parent)
        .await
        .or_fail("list the parent")?;
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
        .or_fail("kazoo lets go")?;
    let grant = waiter
        .await
        .or_fail("the waiting task")?
        .or_fail("leasehold acquires")?;
    assert!(ours
        .try_acquire(&k, ttl)
        .await
        .or_fail("try the held key")?
        .is_none());
    let seen = ours.inspect(&k).await.or_fail("inspect")?;
    assert_eq!(seen.fence, Some(grant.fence()), "{seen:?}");
    assert_eq!(
        seen.owner,
        Some(leasehold_core::OwnerId::of(&grant.owner()))
    );
    raw.delete(&format!("{parent}/{curator}"), None)
        .await
        .or_fail("Curator gives up")?;

    // zookeeper-client's own Curator-compatible lock recipe waits while leasehold holds...
    let recipe = tokio::spawn({
        let (raw, parent) = (raw.clone(), parent.clone());
        async move {
            let lock = raw
                .lock(
                    LockPrefix::new_curator(&parent, "lock-").or_fail("the recipe's prefix")?,
                    b"",
                    LockOptions::new(Acls::anyone_all()),
                )
                .await
                .or_fail("the recipe locks")?;
            let path = lock.lock_path().to_string();
            TestResult::Ok((path, Instant::now(), lock.into_owned()))
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !recipe.is_finished(),
        "the Curator-style recipe took the lock from leasehold"
    );
    let released = Instant::now();
    let _ = ours.release(&grant).await.or_fail("leasehold releases")?;
    let (recipe_path, got_at, recipe_lock) = recipe.await.or_fail("the recipe's task")??;
    assert!(got_at >= released);
    // ...and leasehold waits while the recipe holds.
    assert!(ours
        .try_acquire(&k, ttl)
        .await
        .or_fail("try the key the recipe holds")?
        .is_none());
    raw.delete(&recipe_path, None)
        .await
        .or_fail("the recipe lets go")?;
    drop(recipe_lock);
    let after = ours
        .try_acquire(&k, ttl)
        .await
        .or_fail("acquire after the recipe")?
        .or_fail("the key is free")?;
    assert!(after.fence() > grant.fence());
    let _ = ours.release(&after).await.or_fail("release")?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_map_to_one_node_name_each_reversibly() -> TestResult {
    let hosts = shared_hosts().await?;
    // The server's root as chroot: `zookeeper` is reserved there.
    let a = ZkAuthority::connect(&url(&hosts, "/"))
        .await
        .or_fail("connect")?;
    let raw = raw(&hosts).await?;
    let ttl = Duration::from_secs(2);
    for name in ["a/b/c", "zookeeper", "..", "100%", "tenant:1/invoice:2"] {
        let k = key(name)?;
        let grant = a.try_acquire(&k, ttl).await.or_fail(name)?.or_fail(name)?;
        let path = a.lock_path(&k);
        assert_eq!(path.matches('/').count(), 1, "{name} -> {path}");
        assert_eq!(names::key_from_node_name(&path[1..]), Some(k.clone()));
        assert_eq!(contenders(&raw, &path).await?.len(), 1, "{path}");
        let _ = a.release(&grant).await.or_fail(name)?;
    }
    // The reserved node is untouched.
    assert!(raw
        .check_stat("/zookeeper/quota")
        .await
        .or_fail("stat /zookeeper/quota")?
        .is_some());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_make_lock_nodes_creator_only_and_never_print() -> TestResult {
    let hosts = shared_hosts().await?;
    let alice = ZkAuthority::connect(&url(
        &hosts.replace("127.0.0.1", "alice:s3cret-pw@127.0.0.1"),
        "/acl",
    ))
    .await
    .or_fail("connect as alice")?;
    let k = key("payout:42")?;
    let ttl = Duration::from_secs(2);
    let grant = alice
        .try_acquire(&k, ttl)
        .await
        .or_fail("alice acquires")?
        .or_fail("the key is free")?;
    let as_alice = zookeeper_client::Client::connector()
        .with_auth("digest", b"alice:s3cret-pw")
        .connect(&hosts)
        .await
        .or_fail("a raw client as alice")?;
    let raw = raw(&hosts).await?;
    let parent = alice.lock_path(&k);
    assert!(
        matches!(
            raw.list_children(&parent).await,
            Err(zookeeper_client::Error::NoAuth)
        ),
        "others cannot even list the contenders"
    );
    let node = &contenders(&as_alice, &parent).await?[0];
    let (acl, _) = as_alice
        .get_acl(&format!("{parent}/{node}"))
        .await
        .or_fail("read the node's ACL")?;
    assert_eq!(acl.len(), 1);
    assert_eq!(acl[0].scheme(), "digest");
    assert!(acl[0].id().starts_with("alice:"));

    // Another principal, or none, may not queue under alice's parent: Unauthorized, not "held".
    for who in ["mallory:hunter2@127.0.0.1", "127.0.0.1"] {
        let other = ZkAuthority::connect(&url(&hosts.replace("127.0.0.1", who), "/acl"))
            .await
            .or_fail(who)?;
        let err = other
            .try_acquire(&k, ttl)
            .await
            .err_or_fail("another principal tries alice's key")?;
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
    .or_fail("connect as alice again")?;
    assert!(alice2
        .try_acquire(&k, ttl)
        .await
        .or_fail("alice's other client tries")?
        .is_none());
    assert!(!format!("{alice:?} {alice2:?}").contains("s3cret"));
    let _ = alice.release(&grant).await.or_fail("alice releases")?;
    Ok(())
}

/// kazoo's `Lock` makes sure of its path once (`ensure_path` on its first acquire) and from then
/// on creates `<uuid>__lock__` nodes under it without `makepath`. A container parent made by
/// leasehold is reaped by the server once the key sits idle, and kazoo's next acquire then fails
/// with `NoNodeError`. With `parent=persistent` the parent stays, and kazoo and leasehold go on
/// excluding each other on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn persistent_parents_keep_a_kazoo_lock_working_after_the_key_sat_idle() -> TestResult {
    let hosts = shared_hosts().await?;
    let raw = raw(&hosts).await?;
    let ttl = Duration::from_secs(1);
    // Idle for twice the reaping interval plus a tick: a container has certainly been reaped.
    let idle = ZK_CONTAINER_CHECK_INTERVAL * 2 + shared()?.tick_time();
    let kazoo_node = "0123456789abcdef0123456789abcdef__lock__";

    for (mode, reaped) in [("container", true), ("persistent", false)] {
        let a = ZkAuthority::connect(&format!(
            "zk://{hosts}/kazoo-{mode}?parent={mode}&timeout_ms=1000"
        ))
        .await
        .or_fail(mode)?;
        let k = key("nightly-report")?;
        let parent = a.lock_path(&k);
        // leasehold uses the key first, and so makes the parent.
        let g = a
            .try_acquire(&k, ttl)
            .await
            .or_fail("leasehold acquires")?
            .or_fail("the key is free")?;
        let _ = a.release(&g).await.or_fail("leasehold releases")?;
        // kazoo's first acquire: ensure_path finds it, then lock and unlock.
        assert!(raw
            .check_stat(&parent)
            .await
            .or_fail("stat the parent")?
            .is_some());
        let (_, seq) = raw
            .create(
                &format!("{parent}/{kazoo_node}"),
                &[],
                &ephemeral_sequential(),
            )
            .await
            .or_fail("kazoo's first lock")?;
        raw.delete(&format!("{parent}/{kazoo_node}{seq}"), None)
            .await
            .or_fail("kazoo's first unlock")?;

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
                second.err_or_fail("kazoo's second lock")?,
                zookeeper_client::Error::NoNode,
                "{mode}: the idle container was reaped under kazoo"
            );
            continue;
        }
        let (_, seq) = second.or_fail(format!("{mode}: kazoo's second lock"))?;
        // kazoo holds: leasehold waits its turn, and gets the key once kazoo lets go.
        assert!(a
            .try_acquire(&k, ttl)
            .await
            .or_fail("try the key kazoo holds")?
            .is_none());
        raw.delete(&format!("{parent}/{kazoo_node}{seq}"), None)
            .await
            .or_fail("kazoo lets go")?;
        let g = a
            .try_acquire(&k, ttl)
            .await
            .or_fail("leasehold acquires after kazoo")?
            .or_fail("free after kazoo")?;
        let _ = a.release(&g).await.or_fail("leasehold releases")?;
    }
    Ok(())
}
