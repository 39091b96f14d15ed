//! Expiry: a holder that vanishes frees the key within its TTL.

use leasehold_core::Instant;

use super::helpers::{acquire_within, take};
use crate::context::Context;
use crate::ensure;
use crate::verdict::{Failure, OrFail, Outcome, Verdict};

/// A client takes the key and vanishes (grant and client dropped, never released): another
/// client gets the key within TTL + tolerance.
pub async fn vanished_holder_frees_within_ttl(ctx: &Context) -> Outcome {
    let b = ctx.connect().await?;
    let key = ctx.key("vanished");
    let ttl = ctx.ttl();
    let sent = Instant::now();
    {
        let doomed = ctx.connect().await?;
        let grant = take(&*doomed, &key, ttl, "the doomed client acquires").await?;
        drop(grant);
        drop(doomed);
    }
    let got = acquire_within(ctx, &*b, &key, ttl, sent, ttl + ctx.tolerance()).await?;
    let (grant, at) = got.ok_or_else(|| {
        Failure::new(format!(
            "the key was still held {:?} after a holder vanished",
            sent.elapsed()
        ))
    })?;
    ensure!(
        at - sent <= ttl + ctx.tolerance(),
        "freed only after {:?}",
        at - sent
    );
    let _ = b.release(&grant).await.or_fail("B releases")?;
    Ok(Verdict::Passed)
}
