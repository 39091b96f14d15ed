//! Who may revoke on Redis: an ACL user that may not `DEL` gets `NOPERM` as `Unauthorized`, and
//! the holder keeps its lease (the script fails before it writes anything); granted `DEL`, the
//! same user revokes it.

use std::time::Duration;

use leasehold_conformance::kit::{self, OrFail, TestResult};
use leasehold_core::{Authority, LockKey};
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

    kit::revoke_is_refused_and_the_holder_keeps_its_lease(
        &holder,
        &grant,
        ttl,
        &ops,
        "",
        &["ops-pw"],
    )
    .await?;

    command(&server, &["ACL", "SETUSER", "ops", "+del"]).await?;
    kit::revoke_ends_the_holder(&holder, &grant, ttl, &ops).await?;
    Ok(())
}
