//! `leasehold`: run a command under a lease.
//!
//! ```text
//! leasehold run --url postgres://app@db/app --key nightly-report --ttl 30s --wait 1m -- ./report.sh
//! ```
//!
//! The command gets the fence in `LEASEHOLD_FENCE` to send with every protected write. Unlike
//! `etcdctl lock`, which leaves its child running when the lease is lost, the child's process group
//! is stopped (SIGTERM, then SIGKILL after `--grace`) the moment the lease is lost; unlike
//! `consul lock`, the child gets a fencing token. See `leasehold run --help` for the exit codes.

/// `eprintln!` without its panic: a closed or broken stderr (`leasehold ... 2>&1 | head`) must
/// not turn a message into a crash.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

mod args;
mod child;

use std::io::Write;
use std::process::ExitCode;

use std::sync::Arc;

use leasehold::{Authority, Error, Lease, LeaseOptions, LockKey};
use tokio::signal::unix::{signal, SignalKind};

use crate::args::{RunArgs, USAGE, VERSION};
use crate::child::Child;

/// Exit codes, after sysexits.h where one fits.
mod code {
    pub const USAGE: u8 = 64;
    pub const UNAVAILABLE: u8 = 69;
    pub const HELD: u8 = 75;
    pub const LOST: u8 = 76;
    pub const NO_PERMISSION: u8 = 77;
    pub const CANNOT_START: u8 = 127;
}

fn main() -> ExitCode {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("LEASEHOLD_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let args = match args::parse(
        std::env::args_os().skip(1).collect(),
        std::env::var("LEASEHOLD_URL").ok(),
    ) {
        Ok(a) => a,
        Err(e) if e.is_empty() => return print_out(USAGE),
        Err(e) if e == VERSION => return print_out(VERSION),
        Err(e) => {
            say!("leasehold: {e}\n\n{USAGE}");
            return ExitCode::from(code::USAGE);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            say!("leasehold: cannot start: {e}");
            return ExitCode::from(code::UNAVAILABLE);
        }
    };
    ExitCode::from(runtime.block_on(run(args)))
}

/// Prints `text` on stdout. `println!` panics when the reader has gone away (`leasehold --help |
/// head`: EPIPE, since Rust ignores SIGPIPE); a reader that stopped reading is not an error of
/// ours, so stop quietly with success, as `ls | head` does.
fn print_out(text: &str) -> ExitCode {
    let mut out = std::io::stdout().lock();
    match writeln!(out, "{text}").and_then(|()| out.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            say!("leasehold: writing to stdout: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The exit code for an error before the command ran.
fn failed(e: &Error) -> u8 {
    say!("leasehold: {}", chain(e));
    match e {
        Error::Timeout { .. } => code::HELD,
        Error::Unavailable { .. } => code::UNAVAILABLE,
        Error::Unauthorized { .. } => code::NO_PERMISSION,
        Error::Backend {
            retryable: true, ..
        } => code::UNAVAILABLE,
        _ => code::USAGE,
    }
}

/// An error with its sources, one line.
fn chain(e: &Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(&format!(": {s}"));
        source = s.source();
    }
    text
}

async fn run(args: RunArgs) -> u8 {
    let key = match LockKey::new(&args.key) {
        Ok(k) => k,
        Err(e) => return failed(&e),
    };
    let authority = match leasehold::connect(&args.url).await {
        Ok(a) => a,
        Err(e) => return failed(&e),
    };
    let code = run_under_lease(&args, key, authority.clone()).await;
    // Whatever happened, nothing of ours outlives the process: close what the authority keeps
    // for this client (etcd's session lease, and with it any key still there) and wait for the
    // answer.
    if let Err(e) = authority.close().await {
        say!(
            "leasehold: closing the authority failed (what it keeps ends with its TTL): {}",
            chain(&e)
        );
    }
    code
}

async fn run_under_lease(args: &RunArgs, key: LockKey, authority: Arc<dyn Authority>) -> u8 {
    let backend = authority.capabilities().backend;
    let acquired = if args.wait.is_zero() {
        Lease::try_acquire(authority, &key, args.ttl, LeaseOptions::default())
            .await
            .and_then(|l| {
                l.ok_or(Error::Timeout {
                    key: key.to_string(),
                    waited: args.wait,
                })
            })
    } else {
        Lease::acquire(
            authority,
            &key,
            args.ttl,
            args.wait,
            LeaseOptions::default(),
        )
        .await
    };
    let lease = match acquired {
        Ok(l) => l,
        Err(e) => return failed(&e),
    };
    let mut child = match Child::spawn(&args.command, &key, lease.fence(), backend) {
        Ok(c) => c,
        Err(e) => {
            say!("leasehold: cannot start {:?}: {e}", args.command[0]);
            let _ = lease.release().await;
            return code::CANNOT_START;
        }
    };
    let (Ok(mut interrupt), Ok(mut terminate)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        child.stop(args.grace).await;
        let _ = lease.release().await;
        say!("leasehold: cannot watch for signals");
        return code::UNAVAILABLE;
    };
    let lost = lease.lost();
    tokio::select! {
        status = child.wait() => {
            if let Err(e) = lease.release().await {
                say!("leasehold: releasing the lease failed (its TTL will free it): {}", chain(&e));
            }
            status
        }
        reason = lost => {
            say!("leasehold: lease on `{key}` lost ({reason}); stopping the command");
            child.stop(args.grace).await;
            code::LOST
        }
        _ = interrupt.recv() => {
            child.stop(args.grace).await;
            let _ = lease.release().await;
            128 + 2
        }
        _ = terminate.recv() => {
            child.stop(args.grace).await;
            let _ = lease.release().await;
            128 + 15
        }
    }
}
