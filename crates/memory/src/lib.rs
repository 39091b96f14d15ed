//! # leasehold-memory
//!
//! The reference [`Authority`](leasehold_core::Authority): every contract of leasehold-core, implemented in one process
//! with a mutex and a map. It exists for two reasons:
//! * it is the yardstick the conformance suite is checked against (the suite must pass on it,
//!   and each deliberately broken variant of it must fail the suite);
//! * it runs on tokio's clock, so under `tokio::time::pause()` tests of lease logic (renewal,
//!   expiry, loss) run instantly and deterministically.
//!
//! A [`MemoryServer`] is the "server"; [`MemoryServer::authority`] makes clients of it. Faults a
//! real server has are available on the server: [`MemoryServer::pause`] (requests hang, like a
//! `SIGSTOP`ped process), [`MemoryServer::kill`] and [`MemoryServer::restart`] (leases are
//! volatile and lost, the fence counter is durable and kept).
//!
//! It is not a distributed lock: use it in tests, or to coordinate tasks inside one process.
//! `leasehold::connect("memory://name")` shares one server per name within a process.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod authority;
mod server;

pub use authority::MemoryAuthority;
pub use server::{MemoryServer, Snapshot, Unchecked};
