//! Listing keys under a prefix: every held key, only keys under the prefix, in order, read-only.

use leasehold_core::{Authority, Error, KeyPrefix, LockKey};

use super::helpers::take;
use crate::context::Context;
use crate::ensure;
use crate::verdict::{Failure, OrFail, Outcome, Verdict};

/// `client.list_keys(prefix, limit)`; `Ok(None)` when the backend declares it unsupported.
async fn list(
    client: &dyn Authority,
    prefix: &KeyPrefix,
    limit: usize,
    what: &str,
) -> Result<Option<Vec<LockKey>>, Failure> {
    match client.list_keys(prefix, limit).await {
        Err(Error::Unsupported { .. }) => Ok(None),
        other => other.or_fail(what).map(Some),
    }
}

/// A holds four keys under `<base>/` (one with a `/` and one with a `%` in its name, which
/// etcd and ZooKeeper escape) and one beside it (`<base>x`). B lists `<base>/` and must get
/// exactly the four, sorted (nothing else was ever taken under that prefix, so nothing else
/// may appear); with a limit of two, the first two; with none, nothing. After A releases one,
/// the others are still listed, and the released one, if listed, inspects as free. A's grants
/// still renew afterwards: listing took nothing.
pub async fn list_keys_finds_held_keys_under_a_prefix(ctx: &Context) -> Outcome {
    let (a, b) = (ctx.connect().await?, ctx.connect().await?);
    let base = ctx.key("list-keys");
    let key = |suffix: &str| {
        LockKey::new(format!("{base}{suffix}")).or_fail(format!("the key {base}{suffix}"))
    };
    let under = [key("/%2F")?, key("/a")?, key("/b")?, key("/b/c")?];
    let beside = key("x")?;
    let prefix = KeyPrefix::new(format!("{base}/")).or_fail("the prefix")?;
    let ttl = ctx.ttl();

    let mut grants = Vec::new();
    for k in under.iter().chain([&beside]) {
        grants.push(take(&*a, k, ttl, &format!("A takes {k}")).await?);
    }
    let Some(listed) = list(&*b, &prefix, 100, "B lists the prefix").await? else {
        for g in &grants {
            let _ = a.release(g).await;
        }
        return Ok(Verdict::NotApplicable(
            "the backend does not implement list_keys".into(),
        ));
    };
    let mut want = under.to_vec();
    want.sort();
    ensure!(
        listed == want,
        "listing `{prefix}` gave {listed:?}; A holds exactly {want:?} under it (and {beside} \
         beside it)"
    );
    let two = list(&*b, &prefix, 2, "B lists two")
        .await?
        .unwrap_or_default();
    ensure!(
        two == want[..2],
        "listing `{prefix}` with a limit of 2 gave {two:?}, not the first two of {want:?}"
    );
    let none = list(&*b, &prefix, 0, "B lists none")
        .await?
        .unwrap_or_default();
    ensure!(none.is_empty(), "a limit of 0 listed {none:?}");

    let released = &under[1];
    let _ = a.release(&grants[1]).await.or_fail("A releases one key")?;
    let after = list(&*b, &prefix, 100, "B lists after a release")
        .await?
        .unwrap_or_default();
    for k in under.iter().filter(|k| *k != released) {
        ensure!(
            after.contains(k),
            "after {released} was released, the listing {after:?} lost {k}, still held"
        );
    }
    if after.contains(released) {
        let seen = b
            .inspect(released)
            .await
            .or_fail("B inspects the released key")?;
        ensure!(
            !seen.held,
            "the released key {released} inspects as {seen:?}"
        );
    }
    for (i, g) in grants.iter().enumerate() {
        if i != 1 {
            a.renew(g, ttl)
                .await
                .or_fail(format!("A renews {} after the listings", g.key()))?;
            let _ = a.release(g).await.or_fail("A releases")?;
        }
    }
    Ok(Verdict::Passed)
}
