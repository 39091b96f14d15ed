//! # leasehold-etcd
//!
//! etcd as a leasehold [`Authority`](leasehold_core::Authority): the lock recipe of etcd's own
//! `client/v3/concurrency` package and `etcdctl lock`, with its known holes closed, and the
//! contender key's create revision as the fencing token.
//!
//! ```no_run
//! # async fn demo() -> leasehold_core::Result<()> {
//! use std::{sync::Arc, time::Duration};
//! use leasehold_core::{Lease, LeaseOptions, LockKey};
//! use leasehold_etcd::EtcdAuthority;
//!
//! let authority = Arc::new(EtcdAuthority::connect("etcd://10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379").await?);
//! let key = LockKey::new("invoice:inv_72")?;
//! let lease = Lease::acquire(authority, &key, Duration::from_secs(10), Duration::from_secs(5),
//!                            LeaseOptions::default()).await?;
//! // ... lease.fence() is the key's etcd create revision ...
//! lease.release().await?;
//! # Ok(()) }
//! ```
//!
//! ## How it maps to etcd
//! * **Sessions** ([`session`](crate) internals): like `concurrency.Session`, one etcd lease per
//!   distinct TTL, granted once and kept alive by one keep-alive stream, shared by every lock the
//!   authority holds with that TTL. Acquiring is then a single transaction (no lease grant on the
//!   hot path), and the lease traffic does not grow with the number of locks held. etcd TTLs are
//!   whole seconds with a server-side minimum; the authority learns the minimum when it connects
//!   and declares it in its capabilities. Any other TTL is `InvalidTtl`, never rounded.
//! * **Layout**: lock key `k` is the prefix `<namespace>/<k, with / and % escaped>/`, and each
//!   contender writes `<prefix><lease id hex>` on its session lease, exactly like etcd's Mutex.
//!   With the same name, `etcdctl lock` and leasehold exclude each other
//!   ([`EtcdAuthority::etcdctl_lock_name`]).
//! * **Fence**: the winning key's create revision ([`EtcdRevision`]): cluster-wide, agreed by
//!   Raft, durable, never reissued.
//! * **Waiting**: a watch on the one key just ahead of ours.
//! * **Proclaim** is etcd's `Election.Proclaim` (a put of our key, conditional on its create
//!   revision and lease), the value stored after our owner token; **waiting for a change** is a
//!   watch on the lock's prefix, from this client's last read of it, so `etcdctl elect` peers
//!   and leasehold elections observe each other.
//! * **Loss**: a keep-alive answered "lease not found" or failing until the session's deadline,
//!   a contender key deleted behind our back, or a grant left unrenewed past its TTL. Loss is
//!   pushed: every grant carries a [`LossSignal`](leasehold_core::LossSignal), fired as soon as
//!   a watch on the held key sees it deleted behind our back (the whole session when its lease
//!   is gone), so a `Lease` learns of it at once, not at its next renewal.
//!
//! The user's guide (the URL, capabilities, guarantees, what can break it, interoperation with
//! `etcdctl`, the tests) is
//! [docs/etcd.md](https://github.com/leasehold/leasehold/blob/main/docs/etcd.md) in the
//! repository.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod authority;
mod config;
mod contenders;
mod errors;
pub mod guarded;
mod held_watch_stream;
mod held_watches;
mod keys;
mod server_version;
mod session;
mod stored;
mod token;
mod wait;

pub use authority::EtcdAuthority;
pub use config::{EtcdConfig, DEFAULT_NAMESPACE};
pub use token::EtcdRevision;
