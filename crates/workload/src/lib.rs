//! The fault workload: Jepsen's lock-set run with fences, on real servers, with worker
//! processes that a seeded nemesis pauses and kills. See `docs/workload.md`.
//!
//! The history and the checker live in `leasehold_conformance::workload`; this crate runs the
//! workload and renders the report. It is a crate of its own because it needs every backend,
//! and every backend's tests depend on `leasehold-conformance`.

pub mod broken;
pub mod cli_round;
pub mod cli_worker;
pub mod deployment;
pub mod forwarder;
pub mod handoff;
pub mod in_process;
mod primary_watch;
pub mod provenance;
pub mod report;
pub mod resource;
pub mod resource_faults;
pub mod resource_server;
pub mod runner;
mod server_fault;
pub mod worker;
pub mod worker_cut;
