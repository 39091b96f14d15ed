//! The compare mode's worker processes: the bench re-executes itself with hidden arguments, so
//! that contending holders are separate processes (separate connections, sessions, runtimes
//! and kernel scheduling), as separate application instances are.
//!
//! * `churn`: connects, says `ready`, waits for `go START END` on stdin (monotonic
//!   nanoseconds), then acquires and releases random keys of its set until END, and prints one
//!   line per hold (see [`Hold::to_line`]), `e COUNT FIRST-ERROR`, and `done`.
//! * `hold`: connects, holds one key, says `held`, and sleeps until it is killed.

use std::time::Duration;

use rand::{Rng, SeedableRng};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdout, Command};

use super::exclusion::Hold;
use super::locker::{self, Setting, Side};
use crate::BoxError;

/// The first argument that makes the bench a worker.
pub const WORKER_FLAG: &str = "__compare-worker";

/// How long a churning worker waits for a key before it counts an error.
const CHURN_WAIT: Duration = Duration::from_secs(10);

/// What a worker does, as its command line carries it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerArgs {
    pub mode: Mode,
    pub backend: String,
    pub side: Side,
    pub url: String,
    /// The lease TTL or session timeout; `None`: the side's default.
    pub ttl: Option<Duration>,
    /// How many keys the churn picks from (the hold takes key 0).
    pub keys: u32,
    /// The keys' common prefix, unique to one run.
    pub prefix: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Churn,
    Hold,
}

impl WorkerArgs {
    /// The arguments after the executable.
    pub fn to_args(&self) -> Vec<String> {
        vec![
            WORKER_FLAG.to_string(),
            match self.mode {
                Mode::Churn => "churn".into(),
                Mode::Hold => "hold".into(),
            },
            self.backend.clone(),
            self.side.as_str().to_string(),
            self.url.clone(),
            self.ttl.map_or(0, |t| t.as_millis()).to_string(),
            self.keys.to_string(),
            self.prefix.clone(),
        ]
    }

    /// Reads [`Self::to_args`] back (without the executable).
    pub fn parse(args: &[String]) -> Result<WorkerArgs, BoxError> {
        let [flag, mode, backend, side, url, ttl_ms, keys, prefix] = args else {
            return Err(format!("a worker takes 8 arguments, got {}", args.len()).into());
        };
        if flag != WORKER_FLAG {
            return Err(format!("not a worker command line: {flag}").into());
        }
        let ttl_ms: u64 = ttl_ms.parse()?;
        Ok(WorkerArgs {
            mode: match mode.as_str() {
                "churn" => Mode::Churn,
                "hold" => Mode::Hold,
                other => return Err(format!("unknown worker mode {other}").into()),
            },
            backend: backend.clone(),
            side: Side::parse(side)?,
            url: url.clone(),
            ttl: (ttl_ms > 0).then(|| Duration::from_millis(ttl_ms)),
            keys: keys.parse()?,
            prefix: prefix.clone(),
        })
    }

    /// The name of key `k` of this run.
    pub fn key(&self, k: u32) -> String {
        key_name(&self.prefix, k)
    }
}

/// The name of key `k` under `prefix`.
pub fn key_name(prefix: &str, k: u32) -> String {
    format!("{prefix}/{k}")
}

/// The machine's monotonic clock in nanoseconds: one clock for every process on it.
pub fn monotonic_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    u64::try_from(t.tv_sec)
        .unwrap_or(0)
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::try_from(t.tv_nsec).unwrap_or(0))
}

/// Sleeps until the monotonic clock reads `at`.
async fn sleep_until_ns(at: u64) {
    let now = monotonic_ns();
    if at > now {
        tokio::time::sleep(Duration::from_nanos(at - now)).await;
    }
}

/// A worker process's body.
pub async fn run(args: WorkerArgs) -> Result<(), BoxError> {
    let setting = Setting { ttl: args.ttl };
    let locker = locker::connect(&args.backend, args.side, &args.url, setting).await?;
    let mut out = tokio::io::stdout();
    match args.mode {
        Mode::Hold => {
            let held = locker
                .acquire(&args.key(0), Duration::from_secs(30))
                .await?;
            out.write_all(b"held\n").await?;
            out.flush().await?;
            // Holds until killed: the hold ends only by the side's own loss detection.
            let _held = held;
            loop {
                tokio::time::sleep(Duration::from_secs(3600)).await;
            }
        }
        Mode::Churn => {
            out.write_all(b"ready\n").await?;
            out.flush().await?;
            let mut line = String::new();
            BufReader::new(tokio::io::stdin())
                .read_line(&mut line)
                .await?;
            let mut parts = line.split_whitespace().skip(1);
            let (start, end): (u64, u64) = match (parts.next(), parts.next()) {
                (Some(s), Some(e)) => (s.parse()?, e.parse()?),
                _ => return Err(format!("expected `go START END`, got {line:?}").into()),
            };
            sleep_until_ns(start).await;
            let mut rng = rand::rngs::StdRng::seed_from_u64(u64::from(std::process::id()));
            let mut holds = Vec::new();
            let (mut errors, mut first_error) = (0u64, String::new());
            while monotonic_ns() < end {
                let k = rng.random_range(0..args.keys.max(1));
                match locker.acquire(&args.key(k), CHURN_WAIT).await {
                    Ok(held) => {
                        let acquired = monotonic_ns();
                        let fence = held.fence();
                        let released = monotonic_ns();
                        let freed = locker.release(held).await;
                        holds.push(Hold {
                            key: k,
                            fence,
                            acquired,
                            released,
                        });
                        if let Err(e) = freed {
                            errors += 1;
                            if first_error.is_empty() {
                                first_error = format!("release: {e}");
                            }
                        }
                    }
                    Err(e) => {
                        errors += 1;
                        if first_error.is_empty() {
                            first_error = format!("acquire: {e}");
                        }
                    }
                }
            }
            let mut text = String::new();
            for h in holds {
                text += &h.to_line();
                text.push('\n');
            }
            let first_error = first_error.replace('\n', " ");
            text += &format!("e {errors} {first_error}\ndone\n");
            out.write_all(text.as_bytes()).await?;
            out.flush().await?;
            Ok(())
        }
    }
}

/// A worker process the parent started, its stdout read line by line.
pub struct Worker {
    pub child: Child,
    pub lines: tokio::io::Lines<BufReader<ChildStdout>>,
}

impl Worker {
    /// Starts a worker with `args`.
    pub fn spawn(args: &WorkerArgs) -> Result<Worker, BoxError> {
        let mut child = Command::new(std::env::current_exe()?)
            .args(args.to_args())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let stdout = child.stdout.take().ok_or("a worker without stdout")?;
        Ok(Worker {
            child,
            lines: BufReader::new(stdout).lines(),
        })
    }

    /// Waits (at most `limit`) for the worker to print `want`.
    pub async fn await_line(&mut self, want: &str, limit: Duration) -> Result<(), BoxError> {
        let read = async {
            while let Some(line) = self.lines.next_line().await? {
                if line == want {
                    return Ok(());
                }
            }
            Err::<(), BoxError>(format!("a worker ended before saying {want}").into())
        };
        tokio::time::timeout(limit, read)
            .await
            .map_err(|_| format!("a worker did not say {want} within {limit:?}"))?
    }

    /// Sends the churn's window.
    pub async fn go(&mut self, start: u64, end: u64) -> Result<(), BoxError> {
        let stdin = self.child.stdin.as_mut().ok_or("a worker without stdin")?;
        stdin
            .write_all(format!("go {start} {end}\n").as_bytes())
            .await?;
        stdin.flush().await?;
        Ok(())
    }

    /// Reads the churn's report to its end: the holds, the error count and the first error.
    pub async fn report(mut self) -> Result<(Vec<Hold>, u64, String), BoxError> {
        let (mut holds, mut errors, mut first_error, mut done) =
            (Vec::new(), 0, String::new(), false);
        while let Some(line) = self.lines.next_line().await? {
            if let Some(hold) = Hold::from_line(&line) {
                holds.push(hold);
            } else if let Some(rest) = line.strip_prefix("e ") {
                let (count, message) = rest.split_once(' ').unwrap_or((rest, ""));
                errors = count.parse()?;
                first_error = message.to_string();
            } else if line == "done" {
                done = true;
            }
        }
        let status = self.child.wait().await?;
        if !done || !status.success() {
            return Err(format!("a churn worker failed ({status})").into());
        }
        Ok((holds, errors, first_error))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_arguments_read_back_as_they_were_written() -> Result<(), BoxError> {
        let args = WorkerArgs {
            mode: Mode::Churn,
            backend: "zookeeper".into(),
            side: Side::Peer,
            url: "zk://127.0.0.1:2181/x?ttl=1".into(),
            ttl: Some(Duration::from_millis(2000)),
            keys: 100,
            prefix: "cmp/1/tp".into(),
        };
        let back = WorkerArgs::parse(&args.to_args())?;
        if back != args {
            return Err(format!("{args:?} read back as {back:?}").into());
        }
        let default = WorkerArgs {
            ttl: None,
            mode: Mode::Hold,
            ..args
        };
        if WorkerArgs::parse(&default.to_args())?.ttl.is_some() {
            return Err("a default TTL read back as a set one".into());
        }
        Ok(())
    }
}
