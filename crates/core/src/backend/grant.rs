//! Making a grant: only an authority hands one out.

use std::time::Duration;

use tokio::time::Instant;

use crate::contract::fence::Fence;
use crate::contract::grant::Grant;
use crate::contract::key::LockKey;
use crate::contract::owner::OwnerToken;

/// The grant an authority hands out after it took `key` for `owner` with `fence`.
///
/// A [`Grant`] is proof that an authority answered: its fence and deadline are what an
/// application presents to the protected resource and trusts before a side effect. So the
/// constructor lives here, with the backend plumbing the `leasehold` facade does not
/// re-export, and an application holds only grants an authority made. Backend bookkeeping and
/// a loss signal go on with [`Grant::with_backend_state`] and [`Grant::with_loss_signal`].
///
/// `deadline` must come from [`crate::SafetyMargin::deadline`] with the instant the request
/// was sent.
pub fn grant(
    key: LockKey,
    owner: OwnerToken,
    fence: Fence,
    ttl: Duration,
    deadline: Instant,
) -> Grant {
    Grant::new(key, owner, fence, ttl, deadline)
}
