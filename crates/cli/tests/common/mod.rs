//! What the `leasehold` command's test binaries share: running it, reading what it said, and
//! a holder's script that reports its fence.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use leasehold_servers::RedisServer;

pub fn leasehold(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(args)
        .env_remove("LEASEHOLD_URL")
        .output()
        .unwrap()
}

pub fn url(server: &RedisServer) -> String {
    format!("{}?timeout_ms=1000", server.url())
}

pub fn code(out: &Output) -> i32 {
    out.status.code().unwrap_or(-1)
}

pub fn text(out: &Output) -> String {
    format!(
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Waits until `flag` exists (the holder's command runs), failing if `holder` exits first.
pub fn wait_for_file(flag: &std::path::Path, holder: &mut std::process::Child) {
    let started = Instant::now();
    while !flag.exists() {
        if let Some(status) = holder.try_wait().unwrap() {
            panic!("the holder exited ({status}) before its command ran");
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the holder's command did not run within 30 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A script that writes the fence to `fence`, then waits until `done` exists.
pub fn hold_script(fence: &std::path::Path, done: &std::path::Path) -> String {
    format!(
        "echo $LEASEHOLD_FENCE > {fence}.tmp; mv {fence}.tmp {fence}; \
         while [ ! -e {done} ]; do sleep 0.05; done",
        fence = fence.display(),
        done = done.display()
    )
}

pub fn read_fence(file: &std::path::Path) -> u64 {
    std::fs::read_to_string(file)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}
