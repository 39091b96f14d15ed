//! # leasehold-conformance
//!
//! One suite of scenarios that every leasehold authority must pass against a real server, faults
//! included, in the manner of arrow's `object_store` integration tests:
//!
//! * [`scenarios`]: public async functions over a [`Context`] (clients made by a [`Connector`],
//!   a [`Faults`] injector, a protected resource), selected by the backend's declared
//!   [`leasehold_core::Capabilities`]. [`scenarios::run_all`] runs them all and returns a
//!   [`Report`] that also shows the backend's declared weaknesses.
//! * [`mutants`]: deliberately broken authorities. The suite is only worth something if each of
//!   them fails at least one scenario, and a test checks that it does.
//! * [`servers`]: the `leasehold-servers` crate, re-exported: a harness that starts etcd,
//!   ZooKeeper, Redis and PostgreSQL from Debian's packages as plain processes on free loopback
//!   ports, and faults them.
//! * [`resource`]: a recording fenced resource and the history checker.
//! * [`gate`]: the resource suite: scenarios every gate (a store that checks fences) must pass,
//!   over a [`gate::GateContext`], and broken gates it must catch.
//! * [`workload`]: the fault workload's history (one JSON line per event) and its checker:
//!   lost acknowledgements, stale writes accepted, reissued fences, overlapping holders,
//!   availability and hand-off latency, from a run's history and the resource's final state.
//!
//! * [`kit`]: what binds a backend's tests to all this in a few lines: a [`Connector`] for any
//!   URL ([`kit::UrlConnector`]), [`Faults`] for any harness server ([`kit::ServerFaults`]),
//!   and [`OrFail`] on `Result` and `Option` for tests that say what failed.
//!
//! A backend's test calls the whole suite in one line:
//! ```ignore
//! let clients = UrlConnector::new(url, |url| async move { MyAuthority::connect(&url).await });
//! let ctx = Context::new(Arc::new(clients)).await.or_fail("connect")?.with_faults(faults);
//! leasehold_conformance::scenarios::run_all("mybackend", &ctx).await.assert_passed();
//! ```
#![deny(missing_docs)]

mod context;
mod faults;
pub mod gate;
pub mod kit;
pub mod memory;
pub mod mutants;
pub mod recipe_mutants;
pub mod recorded;
pub mod resource;
pub mod scenarios;
mod verdict;
pub mod workload;

/// The server harness, from its own crate (`leasehold-servers`), re-exported under the name the
/// suite has always used.
pub use leasehold_servers as servers;

pub use context::{poll_until, Connector, Context, InMemoryResources, Residue, ResourceFactory};
pub use faults::{harness_call, harness_error, Faults, NoFaults};
pub use verdict::{Failure, Line, OrFail, Outcome, Report, Verdict};
