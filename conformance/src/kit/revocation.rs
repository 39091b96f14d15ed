//! Who may revoke: the checks each backend's permission test makes around its own setup (a
//! role, an ACL, a read-only file or signature). A client without the grant must get a clear,
//! permanent permission error and change nothing; the same client granted it must end the lease.

use std::time::Duration;

use leasehold_core::{Authority, Error, Grant, Revoked};

use super::TestResult;
use crate::verdict::{Failure, OrFail};

/// `revoker`, which lacks the grant a revoke needs, tries to revoke `grant`'s key. The revoke
/// must fail as a permanent [`Error::Unauthorized`] whose text says `says` (when not empty) and
/// shows none of `secrets` (in Display or Debug); `holder` must still renew `grant` for `ttl`,
/// and the key must still show its fence. No half-done revoke.
pub async fn revoke_is_refused_and_the_holder_keeps_its_lease(
    holder: &dyn Authority,
    grant: &Grant,
    ttl: Duration,
    revoker: &dyn Authority,
    says: &str,
    secrets: &[&str],
) -> TestResult {
    let refused = revoker.revoke(grant.key()).await;
    let Err(e @ Error::Unauthorized { .. }) = &refused else {
        return Err(Failure::new(format!(
            "a client without the grant revoked {}: {refused:?}",
            grant.key()
        )));
    };
    if e.is_retryable() {
        return Err(Failure::new(format!(
            "a refused permission is retryable: {e}"
        )));
    }
    let shown = format!("{e} {e:?}");
    if !says.is_empty() && !e.to_string().contains(says) {
        return Err(Failure::new(format!(
            "the refusal does not say {says:?}: {e}"
        )));
    }
    if let Some(secret) = secrets.iter().find(|s| shown.contains(*s)) {
        return Err(Failure::new(format!(
            "the refusal shows the secret {secret:?}"
        )));
    }
    holder
        .renew(grant, ttl)
        .await
        .or_fail("the holder renews after the refused revoke")?;
    // Through the holder: an inspection may need more than a revoker without the grant has (an
    // object store's clock probe writes).
    let seen = holder
        .inspect(grant.key())
        .await
        .or_fail("inspect after the refused revoke")?;
    if !(seen.held && seen.fence == Some(grant.fence())) {
        return Err(Failure::new(format!(
            "after a refused revoke the key is {seen:?}"
        )));
    }
    Ok(())
}

/// `revoker`, granted what a revoke needs, revokes `grant`'s key: it must answer
/// [`Revoked::Revoked`] with `grant`'s fence, and `holder`'s next renewal must be refused.
pub async fn revoke_ends_the_holder(
    holder: &dyn Authority,
    grant: &Grant,
    ttl: Duration,
    revoker: &dyn Authority,
) -> TestResult {
    let revoked = revoker
        .revoke(grant.key())
        .await
        .or_fail("revoke with the grant")?;
    if revoked
        != (Revoked::Revoked {
            fence: grant.fence(),
        })
    {
        return Err(Failure::new(format!(
            "a revoke with the grant answered {revoked:?}, not the holder's fence {}",
            grant.fence()
        )));
    }
    let renewed = holder.renew(grant, ttl).await;
    if !matches!(renewed, Err(Error::LeaseLost { .. })) {
        return Err(Failure::new(format!(
            "the revoked holder renewed: {renewed:?}"
        )));
    }
    Ok(())
}
