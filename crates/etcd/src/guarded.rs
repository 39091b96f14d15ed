//! Guarded writes inside etcd: the protected write and the ownership check in one transaction.
//!
//! When the protected resource is itself in etcd, the fence needs no separate `last_fence`
//! bookkeeping: put [`still_holds`] in the same transaction as the write. etcd then applies the
//! write only if, at that revision, the grant's contender key still exists with the create
//! revision it was granted at — that is, only while the grant still holds the lock. A holder that
//! paused past its lease (and whose key was deleted or expired) gets `succeeded == false`
//! instead of overwriting a newer holder's work.
//!
//! ```no_run
//! # async fn demo(authority: leasehold_etcd::EtcdAuthority, grant: leasehold_core::Grant)
//! # -> leasehold_core::Result<()> {
//! use etcd_client::{Txn, TxnOp};
//! use leasehold_etcd::guarded::still_holds;
//!
//! let txn = Txn::new()
//!     .when([still_holds(&grant)?])
//!     .and_then([TxnOp::put("invoices/inv_72/state", "paid", None)]);
//! let response = authority.client().kv_client().txn(txn).await
//!     .map_err(|e| leasehold_core::Error::backend("etcd", "guarded write", e))?;
//! if !response.succeeded() {
//!     // Not ours any more: the write was refused, nothing changed.
//! }
//! # Ok(()) }
//! ```

use etcd_client::{
    Compare, CompareOp, GetOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse,
};
use leasehold_core::{telemetry, FencingToken, Grant, Guarded, Result};

use crate::authority::{Contender, EtcdAuthority};
use crate::errors::{self, BACKEND};
use crate::token::EtcdRevision;

/// Runs `ops` in one transaction that applies them only while `grant` still holds the lock
/// ([`still_holds`]), and otherwise reads who holds it now, in the same round trip.
///
/// A refusal is a stale holder caught: it is counted
/// (`leasehold_fence_rejections_total{resource="etcd_txn"}`) and logged, and answers
/// `Stale { newest }` with the current holder's fence, or, when nobody holds the lock, the fence
/// the store's revision at the refusal stands for (every later grant's fence is greater).
pub async fn guarded_txn(
    authority: &EtcdAuthority,
    grant: &Grant,
    ops: impl Into<Vec<TxnOp>>,
) -> Result<Guarded> {
    let holder = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(1);
    let txn = Txn::new()
        .when([still_holds(grant)?])
        .and_then(ops)
        .or_else([TxnOp::get(authority.prefix(grant.key()), Some(holder))]);
    let response = authority
        .client()
        .kv_client()
        .txn(txn)
        .await
        .map_err(|e| errors::map(e, "guarded write"))?;
    if response.succeeded() {
        return Ok(Guarded::Accepted);
    }
    let store = response.header().map_or(0, |h| h.revision());
    let revision = response
        .op_responses()
        .into_iter()
        .find_map(|op| match op {
            TxnOpResponse::Get(get) => get.kvs().first().map(|kv| kv.create_revision()),
            _ => None,
        })
        .unwrap_or(store);
    let newest = EtcdRevision::from_revision(revision)?
        .to_fence(BACKEND, authority.config().client.epoch)?
        .value();
    telemetry::fence_rejected("etcd_txn", grant.fence().value(), newest);
    Ok(Guarded::Stale { newest })
}

/// A compare that holds exactly while `grant`'s contender key exists with the create revision it
/// was granted at (etcd's `Mutex.IsOwner()`). Fails only for a grant that no etcd authority made.
pub fn still_holds(grant: &Grant) -> Result<Compare> {
    let c = contender(grant)?;
    Ok(Compare::create_revision(
        c.name.as_str(),
        CompareOp::Equal,
        c.revision,
    ))
}

/// The etcd key of `grant`'s contender (for logs and operators), if an etcd authority made it.
pub fn contender_key(grant: &Grant) -> Option<&str> {
    grant.backend_state::<Contender>().map(|c| c.name.as_str())
}

fn contender(grant: &Grant) -> Result<&Contender> {
    grant
        .backend_state::<Contender>()
        .ok_or_else(|| leasehold_core::Error::InvalidConfig {
            reason: format!(
                "the grant on `{}` was not made by an etcd authority",
                grant.key()
            ),
        })
}
