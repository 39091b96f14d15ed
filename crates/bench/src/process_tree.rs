//! A server's process tree, read from `/proc`: the root and every process below it (PostgreSQL
//! serves each connection from a process of its own; Go and the JVM keep one process).

/// `root` and every process below it now.
pub fn processes(root: u32) -> Vec<u32> {
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
    let mut processes = vec![root];
    let mut i = 0;
    while i < processes.len() {
        let p = processes[i];
        processes.extend(parents.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    processes
}

/// The parent of `pid`, from `/proc/<pid>/stat` (the field after the parenthesised name, which
/// may itself hold spaces and parentheses).
fn parent(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(1)?.parse().ok()
}

/// The tree's memory: the sum of each process's proportional set size (`Pss` in
/// `/proc/<pid>/smaps_rollup`), which counts a page shared by k processes as 1/k in each, so
/// PostgreSQL's shared buffers count once however many backends map them. `None` where the
/// kernel has no `smaps_rollup`.
pub fn proportional_set(root: u32) -> Option<u64> {
    let mut total = None;
    for pid in processes(root) {
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")) else {
            continue;
        };
        let kb = text
            .lines()
            .find_map(|l| l.strip_prefix("Pss:"))
            .and_then(|rest| rest.split_whitespace().next()?.parse::<u64>().ok());
        if let Some(kb) = kb {
            total = Some(total.unwrap_or(0) + kb * 1024);
        }
    }
    total
}
