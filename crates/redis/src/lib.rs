//! # leasehold-redis
//!
//! One Redis server as a leasehold [`Authority`](leasehold_core::Authority): `SET NX PX` with an
//! `INCR` fence in one script, compare-and-delete release, compare-and-`PEXPIRE` renewal, and
//! pub/sub hand-off to waiters.
//!
//! ```no_run
//! # async fn demo() -> leasehold_core::Result<()> {
//! use leasehold_redis::RedisAuthority;
//! let authority = RedisAuthority::connect("redis://:secret@cache:6379/0?prefix=billing:").await?;
//! // Behind Redis Sentinel: the hosts are sentinels, `locks` the name they monitor the primary
//! // under; the authority follows failovers (docs/redis.md, "Redis Sentinel").
//! let followed = RedisAuthority::connect("redis+sentinel://:secret@s1:26379,s2:26379/locks").await?;
//! # Ok(()) }
//! ```
//!
//! **Fences from Redis are failover-unsafe**, and not durable across a restart without
//! persistence: a replica promoted before it saw the last `INCR` hands the same fence out again.
//! The authority declares this in its capabilities (fences count as durable only on a server
//! seen at connect to fsync every write and evict no counter: [`ServerSettings`]). Use Redis for efficiency locks (a duplicate
//! is wasted work, not damage), or raise the deployment epoch after every failover and restart;
//! see docs/redis.md and docs/guarantees.md.
//!
//! The user's guide (URL parameters, choosing between one server, Sentinel and Cluster, the
//! server settings read at connect, errors, what can break it, why this is not Redlock) is
//! [docs/redis.md](https://github.com/leasehold/leasehold/blob/main/docs/redis.md) in the
//! repository.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod authority;
mod cluster;
mod config;
mod errors;
pub mod gate;
mod keys;
mod link;
mod scripts;
mod sentinel;
mod server;
mod subscription;
mod token;
mod waiters;

pub use authority::RedisAuthority;
pub use config::{RedisConfig, WaitReplicas};
pub use keys::{KeyLayout, DEFAULT_CHANNEL, DEFAULT_PREFIX};
pub use server::ServerSettings;
pub use token::RedisFence;
