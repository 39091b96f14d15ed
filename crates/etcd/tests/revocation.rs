//! Who may revoke, with etcd's authentication on: a user whose role may only read the lock's
//! key range gets etcd's permission error, and the holder keeps its lease; once the role may
//! write there, the same user revokes it.

use std::time::Duration;

use leasehold_core::Authority;

mod common;

use leasehold_conformance::kit;

use common::{connect, key, start, OrFail, Result};

const ROOT: &str = "root:r00t-pw";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_role_cannot_revoke_and_the_holder_keeps_its_lease() -> Result {
    let server = start().await?;
    // Before authentication is on, no credentials; after, root's.
    let etcdctl = |args: &[&str], authed: bool| -> Result {
        let mut command = server.etcdctl().or_fail("etcdctl")?;
        if authed {
            command.arg(format!("--user={ROOT}"));
        }
        let out = command
            .args(args)
            .output()
            .or_fail(format!("run etcdctl {args:?}"))?;
        assert!(
            out.status.success(),
            "etcdctl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    };
    etcdctl(&["user", "add", ROOT], false)?;
    etcdctl(&["auth", "enable"], false)?;
    let holder = connect(&format!(
        "etcd://{ROOT}@{}?timeout_ms=2000",
        server.endpoint()
    ))
    .await?;
    let k = key("revoke-denied")?;
    // The lock's own prefix: the range a revoker of this key needs.
    let prefix = holder.prefix(&k);
    // Connecting reads the namespace (so that refused credentials fail at connect): a revoker
    // may read all of it, and at first nothing more.
    let namespace = prefix
        .trim_end_matches('/')
        .rfind('/')
        .map(|end| &prefix[..=end])
        .or_fail("the lock's prefix lies under the namespace")?;
    etcdctl(&["role", "add", "ops"], true)?;
    etcdctl(
        &[
            "role",
            "grant-permission",
            "ops",
            "read",
            "--prefix=true",
            namespace,
        ],
        true,
    )?;
    etcdctl(&["user", "add", "operator:0ps-pw"], true)?;
    etcdctl(&["user", "grant-role", "operator", "ops"], true)?;
    let operator = connect(&format!(
        "etcd://operator:0ps-pw@{}?timeout_ms=2000",
        server.endpoint()
    ))
    .await?;

    let ttl = Duration::from_secs(10);
    let grant = holder
        .try_acquire(&k, ttl)
        .await
        .or_fail("the holder acquires")?
        .or_fail("the key must be free")?;
    kit::revoke_is_refused_and_the_holder_keeps_its_lease(
        &holder,
        &grant,
        ttl,
        &operator,
        "permission denied",
        &["0ps-pw"],
    )
    .await?;
    assert!(grant.loss_signal().is_some_and(|s| s.fired().is_none()));

    etcdctl(
        &[
            "role",
            "grant-permission",
            "ops",
            "readwrite",
            "--prefix=true",
            &prefix,
        ],
        true,
    )?;
    kit::revoke_ends_the_holder(&holder, &grant, ttl, &operator).await?;
    Ok(())
}
