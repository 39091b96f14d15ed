//! The server's CPU time, read from `/proc`: every thread of the server's process and of its
//! children (PostgreSQL serves each connection from a process of its own), by each thread's
//! `schedstat` (nanoseconds on a CPU, kernel and user).
//!
//! On one core (`taskset -c 0`) a pair's wall time is the client's CPU, the server's CPU and
//! whatever neither spends (the kernel's network path is charged to whoever runs it). The bench
//! prints the server's share per pair next to the client's, so a gap between leasehold and a
//! raw pair can be told apart: our work, the server's work for what we ask, or waiting.

use std::path::PathBuf;
use std::time::Duration;

/// The threads of a server's process tree, found again every so often (a PostgreSQL backend
/// starts with each new connection, Go and the JVM start threads as they like).
#[derive(Debug)]
pub struct ServerCpu {
    root: u32,
    threads: Vec<PathBuf>,
}

impl ServerCpu {
    /// The tree under `root`, or `None` where `/proc` has no per-thread `schedstat`.
    pub fn new(root: u32) -> Option<Self> {
        let mut cpu = ServerCpu {
            root,
            threads: Vec::new(),
        };
        cpu.refresh();
        cpu.threads.iter().any(|t| t.exists()).then_some(cpu)
    }

    /// Finds the tree's threads again.
    pub fn refresh(&mut self) {
        self.threads = crate::process_tree::processes(self.root)
            .iter()
            .flat_map(|p| {
                std::fs::read_dir(format!("/proc/{p}/task"))
                    .into_iter()
                    .flatten()
                    .flatten()
                    .map(|t| t.path().join("schedstat"))
            })
            .collect();
    }

    /// The root process of the tree.
    pub fn root(&self) -> u32 {
        self.root
    }

    /// The tree's CPU time so far (threads that ended meanwhile no longer count: read it in
    /// pairs close together and subtract saturating).
    pub fn total(&self) -> Duration {
        let nanos: u64 = self
            .threads
            .iter()
            .filter_map(|t| {
                let text = std::fs::read_to_string(t).ok()?;
                text.split_whitespace().next()?.parse::<u64>().ok()
            })
            .sum();
        Duration::from_nanos(nanos)
    }
}
