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

use etcd_client::{Compare, CompareOp};
use leasehold_core::{Grant, Result};

use crate::authority::Contender;

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
