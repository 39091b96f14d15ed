//! The local deadline counts from before the request.

use leasehold_core::Instant;

use super::helpers::take;
use crate::context::Context;
use crate::ensure;
use crate::verdict::{OrFail, Outcome, Verdict};

/// A grant's deadline, and a renewal's, are never later than (the instant before the request was
/// sent) + TTL: counted from the response, the client would believe in its lease for a whole
/// round trip longer than the authority keeps it.
pub async fn deadline_counts_from_the_request(ctx: &Context) -> Outcome {
    let a = ctx.connect().await?;
    let key = ctx.key("deadline");
    let ttl = ctx.ttl();
    let sent = Instant::now();
    let grant = take(&*a, &key, ttl, "A acquires").await?;
    ensure!(
        grant.deadline() <= sent + ttl,
        "the grant's deadline is {:?} after the request was sent, beyond the TTL of {ttl:?}",
        grant.deadline() - sent
    );
    ensure!(
        grant.deadline() > sent,
        "the grant's deadline is not after the request"
    );
    let renew_sent = Instant::now();
    let renewed = a.renew(&grant, ttl).await.or_fail("A renews")?;
    ensure!(
        renewed <= renew_sent + ttl,
        "the renewal's deadline is {:?} after it was sent, beyond the TTL of {ttl:?}",
        renewed - renew_sent
    );
    let _ = a.release(&grant).await.or_fail("A releases")?;
    Ok(Verdict::Passed)
}
