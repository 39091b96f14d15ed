//! Who may revoke on Redis: an ACL user that may not `DEL` gets `NOPERM` as `Unauthorized`, and
//! the holder keeps its lease (the script fails before it writes anything); granted `DEL`, the
//! same user revokes it.

use std::time::Duration;

use leasehold_conformance::kit::{OrFail, TestResult};
use leasehold_core::{Authority, Error, LockKey, Revoked};
use leasehold_redis::RedisAuthority;

mod common;

use common::{command, start, url};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_user_without_del_cannot_revoke_and_the_holder_keeps_its_lease() -> TestResult {
    let server = start().await?;
    command(
        &server,
        &[
            "ACL", "SETUSER", "ops", "on", ">ops-pw", "~*", "&*", "+@all", "-del",
        ],
    )
    .await?;
    let holder = RedisAuthority::connect(&url(&server))
        .await
        .or_fail("connect the holder")?;
    let ops = RedisAuthority::connect(&format!(
        "redis://ops:ops-pw@127.0.0.1:{}?timeout_ms=1000",
        server.port()
    ))
    .await
    .or_fail("connect the operator")?;
    let key = LockKey::new("revoke-denied").or_fail("the key")?;
    let ttl = Duration::from_secs(10);
    let grant = holder
        .try_acquire(&key, ttl)
        .await
        .or_fail("the holder acquires")?
        .or_fail("the key is free")?;

    let refused = ops.revoke(&key).await;
    assert!(
        matches!(&refused, Err(e @ Error::Unauthorized { .. }) if !e.is_retryable()),
        "a user without DEL revoked: {refused:?}"
    );
    holder
        .renew(&grant, ttl)
        .await
        .or_fail("the holder renews after the refused revoke")?;
    let seen = ops.inspect(&key).await.or_fail("inspect")?;
    assert!(
        seen.held && seen.fence == Some(grant.fence()),
        "after a refused revoke the key is {seen:?}"
    );

    command(&server, &["ACL", "SETUSER", "ops", "+del"]).await?;
    let revoked = ops.revoke(&key).await.or_fail("revoke with DEL")?;
    assert_eq!(
        revoked,
        Revoked::Revoked {
            fence: grant.fence()
        }
    );
    let renewed = holder.renew(&grant, ttl).await;
    assert!(
        matches!(renewed, Err(Error::LeaseLost { .. })),
        "the revoked holder renewed: {renewed:?}"
    );
    Ok(())
}
