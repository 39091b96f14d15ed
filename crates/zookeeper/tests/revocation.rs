//! Revocation on ZooKeeper: the holder hears of it at once through the watch on its own node,
//! and only an identity that may delete under the lock's parent can revoke.

use std::sync::Arc;
use std::time::Duration;

use leasehold_conformance::kit::{self, OrFail, TestResult};
use leasehold_core::{Authority, Instant, Lease, LeaseOptions, LostReason, Revoked};
use leasehold_zookeeper::ZkAuthority;
use zookeeper_client::{Acl, AuthId, Permission};

mod common;

use common::{key, shared_hosts, url};

/// A grant whose node is deleted by someone else loses at once (its own loss signal, with
/// `Refused`), well before its next renewal; a grant on the same session is untouched, and a
/// released grant reports nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_holder_learns_at_once_and_its_neighbour_keeps_its_lease() -> TestResult {
    let hosts = shared_hosts().await?;
    let chroot = "/revoke-push";
    let holder: Arc<dyn Authority> = Arc::new(
        ZkAuthority::connect(&url(&hosts, chroot))
            .await
            .or_fail("connect the holder")?,
    );
    let admin = ZkAuthority::connect(&url(&hosts, chroot))
        .await
        .or_fail("connect the admin")?;
    let ttl = Duration::from_secs(9);
    let (k, other) = (key("revoked")?, key("neighbour")?);
    let lease = Lease::try_acquire(holder.clone(), &k, ttl, LeaseOptions::default())
        .await
        .or_fail("acquire")?
        .or_fail("the key is free")?;
    let neighbour = Lease::try_acquire(holder.clone(), &other, ttl, LeaseOptions::default())
        .await
        .or_fail("acquire the neighbour")?
        .or_fail("the neighbour key is free")?;
    // Past the first moments of the grant, as an operator's revoke would be.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let lost = lease.lost();
    let revoked = admin.revoke(&k).await.or_fail("revoke")?;
    let at = Instant::now();
    assert_eq!(
        revoked,
        Revoked::Revoked {
            fence: lease.fence()
        }
    );
    // Far sooner than the next renewal, a third of the TTL.
    let reason = tokio::time::timeout(Duration::from_secs(1), lost)
        .await
        .or_fail("the revoked holder's lost() within 1 s")?;
    let heard = at.elapsed();
    assert!(matches!(reason, LostReason::Refused), "{reason:?}");
    eprintln!("the revoked holder heard of it {heard:?} after the revoke");
    assert!(lease.ensure_valid().is_err());
    neighbour
        .ensure_valid()
        .or_fail("the neighbour on the same session is still valid")?;
    let renewed = holder
        .renew(neighbour.grant(), ttl)
        .await
        .or_fail("the neighbour renews")?;
    assert!(renewed > at);

    // Releasing is not a loss.
    let signal = neighbour
        .grant()
        .loss_signal()
        .or_fail("a ZooKeeper grant carries a loss signal")?
        .clone();
    let _ = neighbour.release().await.or_fail("release the neighbour")?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        signal.fired().is_none(),
        "a release fired {:?}",
        signal.fired()
    );
    drop(lease);
    Ok(())
}

/// An identity that may read the lock's parent but not delete under it gets ZooKeeper's
/// permission error, and the holder keeps its lease; once the parent's ACL lets it delete, the
/// same identity revokes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_identity_without_delete_cannot_revoke_and_the_holder_keeps_its_lease() -> TestResult {
    let hosts = shared_hosts().await?;
    let chroot = "/revoke-acl";
    let as_user = |who: &str| {
        url(
            &hosts.replace("127.0.0.1", &format!("{who}@127.0.0.1")),
            chroot,
        )
    };
    let holder = ZkAuthority::connect(&as_user("holder:h0lder-pw"))
        .await
        .or_fail("connect as holder")?;
    let operator = ZkAuthority::connect(&as_user("operator:0ps-pw"))
        .await
        .or_fail("connect as operator")?;
    let k = key("revoke-denied")?;
    let ttl = Duration::from_secs(9);
    let grant = holder
        .try_acquire(&k, ttl)
        .await
        .or_fail("the holder acquires")?
        .or_fail("the key is free")?;
    let parent = holder.lock_path(&k);
    let as_holder = zookeeper_client::Client::connector()
        .with_auth("digest", b"holder:h0lder-pw")
        .connect(&hosts)
        .await
        .or_fail("a raw client as holder")?;
    // The creator keeps everything; anyone may read (list the contenders), nobody else delete.
    let (mut acl, _) = as_holder
        .get_acl(&parent)
        .await
        .or_fail("read the parent's ACL")?;
    acl.push(Acl::new(Permission::READ, AuthId::anyone()));
    as_holder
        .set_acl(&parent, &acl, None)
        .await
        .or_fail("let anyone read the parent")?;

    kit::revoke_is_refused_and_the_holder_keeps_its_lease(
        &holder,
        &grant,
        ttl,
        &operator,
        "",
        &["0ps-pw"],
    )
    .await?;
    assert!(grant.loss_signal().is_some_and(|s| s.fired().is_none()));

    // A session authenticated as both sets `auth` ALL: both identities may do everything.
    let as_both = zookeeper_client::Client::connector()
        .with_auth("digest", b"holder:h0lder-pw")
        .with_auth("digest", b"operator:0ps-pw")
        .connect(&hosts)
        .await
        .or_fail("a raw client as holder and operator")?;
    as_both
        .set_acl(
            &parent,
            &[Acl::new(Permission::ALL, AuthId::authed())],
            None,
        )
        .await
        .or_fail("let the operator delete under the parent")?;
    kit::revoke_ends_the_holder(&holder, &grant, ttl, &operator).await?;
    Ok(())
}
