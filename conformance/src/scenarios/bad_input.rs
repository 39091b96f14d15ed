//! Bad input: typed errors, no side effects.

use std::time::Duration;

use leasehold_core::{Error, LockKey, MAX_KEY_LEN};

use super::helpers::take;
use crate::context::Context;
use crate::ensure;
use crate::verdict::{OrFail, Outcome, Verdict};

/// Every invalid key is refused with `InvalidKey`; every TTL the backend cannot grant exactly
/// (zero, below the minimum, above the maximum, off the granularity) is refused with `InvalidTtl`
/// by try_acquire, acquire and renew; and none of it leaves anything held.
pub async fn bad_input_is_refused_without_side_effects(ctx: &Context) -> Outcome {
    let a = ctx.connect().await?;
    for bad in [
        "",
        "with space",
        "new\nline",
        "tab\t",
        "caf\u{e9}",
        &"k".repeat(MAX_KEY_LEN + 1),
    ] {
        ensure!(
            matches!(LockKey::new(bad), Err(Error::InvalidKey { .. })),
            "key {bad:?} was not refused with InvalidKey"
        );
    }
    let key = ctx.key("bad-input");
    let range = ctx.capabilities().ttl;
    let mut bad_ttls = vec![
        Duration::ZERO,
        range.max + range.granularity.max(Duration::from_millis(1)),
    ];
    if range.min > Duration::from_nanos(1) {
        bad_ttls.push(range.min - Duration::from_nanos(1));
    }
    if range.granularity > Duration::from_nanos(1) {
        bad_ttls.push(ctx.ttl() + range.granularity / 2);
    }
    for ttl in &bad_ttls {
        let t = a.try_acquire(&key, *ttl).await;
        ensure!(
            matches!(t, Err(Error::InvalidTtl { .. })),
            "try_acquire with TTL {ttl:?}: {t:?}"
        );
        let w = a.acquire(&key, *ttl, ctx.ttl()).await;
        ensure!(
            matches!(w, Err(Error::InvalidTtl { .. })),
            "acquire with TTL {ttl:?}: {w:?}"
        );
    }
    // Nothing above may have taken the key.
    let grant = take(&*a, &key, ctx.ttl(), "acquire after the bad calls").await?;
    for ttl in &bad_ttls {
        let r = a.renew(&grant, *ttl).await;
        ensure!(
            matches!(r, Err(Error::InvalidTtl { .. })),
            "renew with TTL {ttl:?}: {r:?}"
        );
    }
    let _ = a.release(&grant).await.or_fail("release")?;
    let b = ctx.connect().await?;
    let free = b.try_acquire(&key, ctx.ttl()).await.or_fail("B acquires")?;
    ensure!(
        free.is_some(),
        "the key was held after only invalid calls and a release"
    );
    if let Some(g) = free {
        let _ = b.release(&g).await.or_fail("B releases")?;
    }
    Ok(Verdict::Passed)
}
