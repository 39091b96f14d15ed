//! What the `leasehold` command's test binaries share: running it, reading what it said, a
//! holder's script that reports its fence, and `or_fail`, the way a test says what failed.
#![allow(dead_code)]

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use leasehold_servers::RedisServer;

/// Runs `leasehold` with `args`, with no `LEASEHOLD_URL` from the environment.
pub fn leasehold(args: &[&str]) -> Result<Output> {
    Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(args)
        .env_remove("LEASEHOLD_URL")
        .output()
        .or_fail(format!("run leasehold {args:?}"))
}

/// A fresh Redis; a server that cannot start is the test's failure.
pub fn redis() -> Result<RedisServer> {
    RedisServer::start().or_fail("Redis must start for these tests")
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

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Waits until `flag` exists (the holder's command runs), failing if `holder` exits first.
pub fn wait_for_file(flag: &std::path::Path, holder: &mut std::process::Child) -> Result {
    let started = Instant::now();
    while !flag.exists() {
        if let Some(status) = holder.try_wait().or_fail("look at the holder")? {
            return Err(format!("the holder exited ({status}) before its command ran").into());
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the holder's command did not run within 30 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
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

/// The fence a [`hold_script`] wrote to `file`.
pub fn read_fence(file: &std::path::Path) -> Result<u64> {
    std::fs::read_to_string(file)
        .or_fail(format!("read {}", file.display()))?
        .trim()
        .parse()
        .or_fail(format!("the fence in {}", file.display()))
}

/// What a test fails with, and `.or_fail("what was being done")?` instead of `unwrap()`: the
/// conformance kit's, shared by every backend's tests.
pub use leasehold_conformance::kit::OrFail;
pub use leasehold_conformance::Failure;

/// A test's outcome, and what its helpers return: the value, or the [`Failure`] that ends it.
pub type Result<T = (), E = Failure> = std::result::Result<T, E>;

/// The URL of a prefix `under` in moto's bucket; its credentials are [`S3_CREDENTIALS`].
pub fn s3_url(moto: &leasehold_servers::MotoServer, under: &str) -> String {
    format!(
        "s3://{}/{under}?endpoint={}&region=us-east-1&allow_http=true&timeout_ms=3000",
        leasehold_servers::object_stores::BUCKET,
        moto.url()
    )
}

/// The environment that gives a run moto's credentials (an object store URL refuses them).
pub const S3_CREDENTIALS: [(&str, &str); 2] = [
    ("AWS_ACCESS_KEY_ID", "leasehold"),
    ("AWS_SECRET_ACCESS_KEY", "leasehold"),
];

/// The URL of a prefix `under` in Azurite's container, path-style on its account's endpoint
/// (the `endpoint`, `account_name` and `allow_http` keys of `object_store`'s Azure builder);
/// its credentials are [`AZURE_CREDENTIALS`].
pub fn azure_url(azurite: &leasehold_servers::AzuriteServer, under: &str) -> String {
    format!(
        "az://{}/{under}?endpoint={}&account_name={}&allow_http=true&timeout_ms=3000",
        leasehold_servers::object_stores::BUCKET,
        azurite.url(),
        leasehold_servers::object_stores::AZURITE_ACCOUNT
    )
}

/// The environment that gives a run Azurite's account key (an object store URL refuses it).
pub const AZURE_CREDENTIALS: [(&str, &str); 1] = [(
    "AZURE_STORAGE_ACCOUNT_KEY",
    leasehold_servers::object_stores::AZURITE_KEY,
)];
