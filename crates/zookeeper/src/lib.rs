//! # leasehold-zookeeper
//!
//! A ZooKeeper ensemble as a leasehold [`Authority`](leasehold_core::Authority): a lease is the
//! lowest ephemeral-sequential node under the key's parent, it lives as long as the session
//! that created it, and its fence is the node's czxid.
//!
//! ```no_run
//! # async fn demo() -> leasehold_core::Result<()> {
//! use std::time::Duration;
//! use leasehold_core::{Authority, LockKey};
//! use leasehold_zookeeper::ZkAuthority;
//!
//! let authority = ZkAuthority::connect("zk://zk1:2181,zk2:2181,zk3:2181/locks").await?;
//! let key = LockKey::new("invoice:inv_72")?;
//! let grant = authority.acquire(&key, Duration::from_secs(10), Duration::from_secs(5)).await?;
//! // ... present grant.fence() with every write to the protected resource ...
//! let _ = authority.release(&grant).await?;
//! # Ok(()) }
//! ```
//!
//! # Sessions and TTLs
//! A ZooKeeper lease has no TTL of its own: its node disappears when its session expires, which
//! happens when the server has heard nothing from the client for the session timeout. So the
//! TTL of a lease *is* the session timeout, and:
//! * an authority opens **one session per distinct TTL**, lazily, and keeps it (at most
//!   eight; idle ones are closed to make room). Use few distinct TTLs.
//! * the server clamps session timeouts to its `minSessionTimeout..maxSessionTimeout`
//!   (2 to 20 `tickTime`s by default). Connecting measures that range and declares it in
//!   [`Capabilities::ttl`](leasehold_core::Capabilities::ttl); a TTL outside it, or one the
//!   server then does not grant exactly, is `InvalidTtl`. Nothing is rounded.
//! * renewal is the session's heartbeat plus a check, committed by the leader, that the node
//!   still exists; a grant that is
//!   not renewed within its TTL is deleted by the authority too (see `held.rs`), so the TTL
//!   means the same as on every other backend.
//!
//! # TLS
//! `zks://host:2281/chroot?tls_ca=ca.pem&tls_cert=client.pem&tls_key=client.key` connects to
//! the servers' `secureClientPort` over TLS, always verifying the server's certificate against
//! `tls_ca` and the host name; see [`ZkConfig`].
//!
//! The user's guide (the URL, sessions and TTLs, guarantees, TLS and ACLs, interoperation with
//! Curator and kazoo) is
//! [docs/zookeeper.md](https://github.com/leasehold/leasehold/blob/main/docs/zookeeper.md) in
//! the repository.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod authority;
mod cleanup;
mod config;
mod contend;
mod errors;
mod held;
pub mod names;
mod node_watch;
mod session;
mod tenure;
mod tick;
mod token;

pub use authority::ZkAuthority;
pub use config::{AclMode, ParentMode, ZkConfig, DEFAULT_CHROOT};
pub use token::Czxid;
