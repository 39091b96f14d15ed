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
        let mut processes = vec![self.root];
        // Parent of every process, once: then the tree is the closure of `root`.
        let parents: Vec<(u32, u32)> = std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|entry| {
                let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
                Some((pid, parent(pid)?))
            })
            .collect();
        let mut i = 0;
        while i < processes.len() {
            let p = processes[i];
            processes.extend(parents.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
            i += 1;
        }
        self.threads = processes
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

/// The parent of `pid`, from `/proc/<pid>/stat` (the field after the parenthesised name, which
/// may itself hold spaces and parentheses).
fn parent(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(1)?.parse().ok()
}
