//! `leasehold-workload`: runs the fault workload, re-executes itself as a worker, renders the report.

fn main() {}
