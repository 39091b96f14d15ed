//! The command line: `leasehold run [options] -- <command> [args...]`, `leasehold status` and
//! `leasehold migrate`.

use std::ffi::OsString;
use std::time::Duration;

use crate::duration;

/// What `leasehold run` was asked to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunArgs {
    /// The authority; `None`: the per-user default (see `crate::state`).
    pub url: Option<String>,
    pub key: String,
    pub ttl: Duration,
    pub wait: Duration,
    pub grace: Duration,
    /// The exit status when the lock is held by someone else (default 75).
    pub busy_exit_code: u8,
    /// The exit status when the lease is lost while the command runs (default 76).
    pub lost_exit_code: u8,
    /// No notice on stderr while waiting.
    pub quiet: bool,
    /// Serve Prometheus metrics at this address while running.
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// What to do when the authority cannot be reached.
    pub if_unavailable: IfUnavailableArg,
    pub command: Vec<OsString>,
}

/// `--if-unavailable`: what `run` does when the authority cannot be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IfUnavailableArg {
    /// Exit 69 without running the command (the default: fail closed).
    #[default]
    Fail,
    /// Exit 0 without running the command (a periodic job that can wait for its next turn).
    Skip,
    /// Run the command without a lock (fail open), with `LEASEHOLD_LOCK=unlocked` and no fence.
    Run,
}

/// What `leasehold status` was asked to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusArgs {
    /// The authority; `None`: the per-user default (see `crate::state`).
    pub url: Option<String>,
    /// One key, or every key under a prefix.
    pub target: StatusTarget,
    /// One JSON object (per key) instead of the line for people.
    pub json: bool,
}

/// Which keys `leasehold status` reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StatusTarget {
    /// `--key K`.
    Key(String),
    /// `--prefix P [--limit N]`: the first N keys under P, in order.
    Prefix { prefix: String, limit: usize },
}

/// How many keys `status --prefix` lists when `--limit` is not given.
pub const DEFAULT_LIST_LIMIT: usize = 100;

/// What the command line asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Invocation {
    Run(RunArgs),
    Status(StatusArgs),
    /// `leasehold migrate --url postgres://...`: create the lease table.
    Migrate {
        url: String,
    },
    Help,
    Version,
    /// Internal: the watcher of a command's process group, with its arguments (see
    /// `crate::watcher`).
    WatchGroup(Vec<String>),
}

/// What `--version` prints.
pub const VERSION: &str = concat!("leasehold ", env!("CARGO_PKG_VERSION"));

pub const USAGE: &str = "\
usage: leasehold run [--url URL] --key KEY [--ttl 10s] [--wait 0s] [--grace 5s]
                     [--busy-exit-code N] [--lost-exit-code N] [--quiet]
                     [--metrics-addr HOST:PORT]
                     [--if-unavailable fail|skip|run]
                     -- COMMAND [ARGS...]
       leasehold status [--url URL] (--key KEY | --prefix P [--limit 100]) [--json]
       leasehold migrate [--url postgres://...]
       leasehold --help | --version

run: runs COMMAND while holding a lease on KEY from the authority at URL (or $LEASEHOLD_URL):
sqlite:///path/to/locks.db (no server; the processes of one machine), postgres://, redis://,
rediss://, etcd://, etcds://, zk://. With neither, the authority is a per-user SQLite file,
$XDG_STATE_HOME/leasehold/locks.db (or $HOME/.local/state/leasehold/locks.db; the directory is
created, mode 0700): it works with no server and no setup, for the processes of this user on
this machine. memory:// is refused: it lives in one process, so two `leasehold` processes
would both hold the lock.

COMMAND gets LEASEHOLD_KEY, LEASEHOLD_FENCE (the fencing token: send it with every protected
write), LEASEHOLD_FENCE_SAFETY, LEASEHOLD_BACKEND and LEASEHOLD_LOCK=held in its environment. The lease is renewed
every third of the TTL. If it is lost, COMMAND's process group and everything else COMMAND
started (also what left the group: setsid, daemons) get SIGTERM, then SIGKILL after --grace,
and in any case SIGKILL once the lease's deadline passes. If leasehold itself dies (even by
SIGKILL) or is stopped (SIGSTOP), a watcher process kills COMMAND's process group by the lease's
deadline. SIGINT, SIGTERM and SIGHUP stop COMMAND and release the lease; SIGTSTP (Ctrl-Z) stops
COMMAND, then leasehold. When COMMAND ends, whatever it left running is ended the same way, then
the lease is released. In a terminal, COMMAND is the foreground job: it can read the terminal.

  --url URL            the authority (default: $LEASEHOLD_URL, else the per-user SQLite file)
  --key KEY            the lock key (printable ASCII, no spaces)
  --ttl D              the lease's TTL (default 10s); at least the URL's request timeout
                       (timeout_ms, default 5s) plus the safety margin
  --wait D             how long to wait for the lock if it is held (default 0s: fail at once)
  --grace D            time between SIGTERM and SIGKILL when COMMAND is stopped (default 5s)
  --busy-exit-code N   exit N instead of 75 when the lock is held (flock's -E)
  --lost-exit-code N   exit N instead of 76 when the lease is lost while COMMAND runs
  -q, --quiet          say nothing while waiting for the lock
  --if-unavailable P   when the authority cannot be reached: fail (default: exit 69), skip
                       (exit 0, the command does not run) or run (the command runs WITHOUT a
                       lock: LEASEHOLD_LOCK=unlocked and no LEASEHOLD_FENCE; only for work
                       the resource itself protects)
  --metrics-addr A     serve Prometheus metrics at http://A/metrics while running (the
                       lease's acquire, renewals, loss and hold time; docs/observability.md)
Durations: 250ms, 1.5s, 1m30s, 2h, 1d.

status: prints whether KEY is held or free, as the authority tells: the holder's short id,
fence and remaining TTL, the last fence issued, the backend. One line, or with --json one JSON
object (key, held, owner, fence, last_fence, remaining_ms, backend, url). With --prefix, the
same for each key that starts with P (every held one; free ones where the authority remembers
them), in order, at most --limit of them (an empty P lists every key). Exit status 0 free (none
held), 1 held (some held). It is a snapshot for people and scripts to read, not a lock: it
decides nothing.

migrate: creates the lease table in the PostgreSQL database at URL if it is not there yet
(safe to run again, and concurrently). Other backends need no schema.

Set LEASEHOLD_LOG=info (or RUST_LOG) to see each acquire, renewal and release.

exit status (run): COMMAND's own, or 128+N if it died of signal N (or leasehold did, by SIGINT,
SIGTERM or SIGHUP); 64 bad usage or input; 69 the authority is unreachable or answered too late;
75 the lock is held by someone else (see --busy-exit-code); 76 the lease was lost and COMMAND
was stopped (see --lost-exit-code: pick one COMMAND never returns); 77 the authority refused the credentials; 126 COMMAND is not executable; 127
COMMAND was not found. status: 0 free, 1 held, 64, 69 and 77 as for run.";

#[derive(Clone, Copy, PartialEq, Eq)]
enum Sub {
    Run,
    Status,
    Migrate,
}

/// Parses the arguments after the program name.
pub fn parse(args: Vec<OsString>, env_url: Option<String>) -> Result<Invocation, String> {
    let mut args = args.into_iter();
    let sub = match args.next().as_ref().and_then(|a| a.to_str()) {
        Some("run") => Sub::Run,
        Some("status") => Sub::Status,
        Some("migrate") => Sub::Migrate,
        Some("-h" | "--help" | "help") | None => return Ok(Invocation::Help),
        Some("-V" | "--version") => return Ok(Invocation::Version),
        Some(crate::watcher::WATCH_GROUP) => {
            let rest: Option<Vec<String>> = args.map(|a| a.into_string().ok()).collect();
            return rest
                .map(Invocation::WatchGroup)
                .ok_or_else(|| "no process group to watch".into());
        }
        Some(other) => {
            return Err(format!(
                "unknown subcommand `{other}` (run, status or migrate)"
            ))
        }
    };
    let run = sub == Sub::Run;
    let keyed = sub != Sub::Migrate;
    let mut url = env_url;
    let (mut key, mut ttl, mut wait, mut grace) = (None, None, None, None);
    let (mut busy_exit_code, mut lost_exit_code) = (None, None);
    let (mut quiet, mut json) = (false, false);
    let (mut prefix, mut limit) = (None, None);
    let mut metrics_addr = None;
    let mut if_unavailable = IfUnavailableArg::default();
    let mut command = Vec::new();
    while let Some(arg) = args.next() {
        let text = arg
            .to_str()
            .ok_or_else(|| format!("option {arg:?} is not UTF-8"))?
            .to_string();
        if text == "--" && run {
            command.extend(args.by_ref());
            break;
        }
        let (name, inline) = match text.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n.to_string(), Some(v.to_string())),
            _ => (text.clone(), None),
        };
        let mut value = || -> Result<String, String> {
            match inline.clone() {
                Some(v) => Ok(v),
                None => args
                    .next()
                    .and_then(|v| v.into_string().ok())
                    .ok_or_else(|| format!("{name} needs a value")),
            }
        };
        let dur = |v: String| duration::parse(&v).map_err(|e| format!("{name}: {e}"));
        match (name.as_str(), run) {
            ("--url", _) => url = Some(value()?),
            ("--key", _) if keyed => key = Some(value()?),
            ("--json", _) if sub == Sub::Status => json = true,
            ("--prefix", _) if sub == Sub::Status => prefix = Some(value()?),
            ("--limit", _) if sub == Sub::Status => {
                let v = value()?;
                limit =
                    Some(v.parse::<usize>().map_err(|_| {
                        format!("{name}: `{v}` is not a number of keys (0 or more)")
                    })?);
            }
            ("--ttl", true) => ttl = Some(dur(value()?)?),
            ("--wait", true) => wait = Some(dur(value()?)?),
            ("--grace", true) => grace = Some(dur(value()?)?),
            ("--busy-exit-code" | "-E", true) => {
                let v = value()?;
                busy_exit_code = Some(
                    v.parse::<u8>()
                        .map_err(|_| format!("{name}: `{v}` is not an exit status (0 to 255)"))?,
                );
            }
            ("--lost-exit-code", true) => {
                let v = value()?;
                lost_exit_code = Some(
                    v.parse::<u8>()
                        .map_err(|_| format!("{name}: `{v}` is not an exit status (0 to 255)"))?,
                );
            }
            ("-q" | "--quiet", true) => quiet = true,
            ("--if-unavailable", true) => {
                if_unavailable = match value()?.as_str() {
                    "fail" => IfUnavailableArg::Fail,
                    "skip" => IfUnavailableArg::Skip,
                    "run" => IfUnavailableArg::Run,
                    other => return Err(format!("{name}: `{other}` is not fail, skip or run")),
                };
            }
            ("--metrics-addr", true) => {
                let v = value()?;
                metrics_addr = Some(v.parse().map_err(|_| {
                    format!("{name}: `{v}` is not an address and port (127.0.0.1:9464, [::1]:9464)")
                })?);
            }
            ("-h" | "--help", _) => return Ok(Invocation::Help),
            ("-V" | "--version", _) => return Ok(Invocation::Version),
            (other, true) => {
                return Err(format!(
                    "unknown option `{other}` (the command goes after `--`)"
                ))
            }
            (other, false) => {
                let sub = if sub == Sub::Status {
                    "status"
                } else {
                    "migrate"
                };
                return Err(format!("unknown option `{other}` for {sub}"));
            }
        }
    }
    match sub {
        Sub::Migrate => {
            // Only PostgreSQL has a schema: there is no default to migrate.
            let url = url.ok_or("migrate needs --url postgres://... (or LEASEHOLD_URL)")?;
            return Ok(Invocation::Migrate { url });
        }
        Sub::Status => {
            let target = match (key, prefix, limit) {
                (Some(key), None, None) => StatusTarget::Key(key),
                (None, Some(prefix), limit) => StatusTarget::Prefix {
                    prefix,
                    limit: limit.unwrap_or(DEFAULT_LIST_LIMIT),
                },
                (Some(_), Some(_), _) => return Err("give --key or --prefix, not both".into()),
                (Some(_), None, Some(_)) => return Err("--limit goes with --prefix".into()),
                (None, None, _) => return Err("--key (or --prefix) is required".into()),
            };
            return Ok(Invocation::Status(StatusArgs { url, target, json }));
        }
        Sub::Run => {}
    }
    if command.is_empty() {
        return Err("no command to run: put it after `--`".into());
    }
    Ok(Invocation::Run(RunArgs {
        url,
        key: key.ok_or("--key is required")?,
        ttl: ttl.unwrap_or(Duration::from_secs(10)),
        wait: wait.unwrap_or(Duration::ZERO),
        grace: grace.unwrap_or(Duration::from_secs(5)),
        busy_exit_code: busy_exit_code.unwrap_or(75),
        lost_exit_code: lost_exit_code.unwrap_or(crate::code::LOST),
        quiet,
        metrics_addr,
        if_unavailable,
        command,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &[&str]) -> Vec<OsString> {
        s.iter().map(OsString::from).collect()
    }

    fn run_args(args: Vec<OsString>, env_url: Option<String>) -> Result<RunArgs, String> {
        match parse(args, env_url)? {
            Invocation::Run(a) => Ok(a),
            other => Err(format!("{other:?}")),
        }
    }

    #[test]
    fn parses_a_full_command_line() {
        let a = run_args(
            args(&[
                "run",
                "--url",
                "redis://h",
                "--key=k",
                "--ttl",
                "2s",
                "--wait",
                "500ms",
                "--",
                "sh",
                "-c",
                "x --y",
            ]),
            None,
        )
        .unwrap();
        assert_eq!(a.url.as_deref(), Some("redis://h"));
        assert_eq!(a.key, "k");
        assert_eq!(a.ttl, Duration::from_secs(2));
        assert_eq!(a.wait, Duration::from_millis(500));
        assert_eq!(a.grace, Duration::from_secs(5));
        assert_eq!(a.command, args(&["sh", "-c", "x --y"]));
    }

    #[test]
    fn takes_the_url_from_the_environment_and_refuses_bad_input() {
        let a = run_args(
            args(&["run", "--key", "k", "--", "true"]),
            Some("redis://h".into()),
        )
        .unwrap();
        assert_eq!(a.url.as_deref(), Some("redis://h"));
        assert_eq!(a.busy_exit_code, 75);
        // No URL at all: the per-user default, resolved when the command runs.
        let a = run_args(args(&["run", "--key", "k", "--", "true"]), None).unwrap();
        assert_eq!(a.url, None);
        assert!(!a.quiet);
        for bad in [
            &["run", "--url", "u", "--", "true"][..],
            &["run", "--url", "u", "--key", "k"],
            &[
                "run", "--url", "u", "--key", "k", "--ttl", "10", "--", "true",
            ],
            &[
                "run", "--url", "u", "--key", "k", "--ttl", "10w", "--", "true",
            ],
            &["run", "--url", "u", "--key", "k", "--bogus", "--", "true"],
            &["walk"],
            &[
                "run",
                "--url",
                "u",
                "--key",
                "k",
                "--busy-exit-code",
                "256",
                "--",
                "true",
            ],
            &["run", "--key", "k", "--lost-exit-code", "-1", "--", "true"],
            &["run", "--key", "k", "--lost-exit-code", "--", "true"],
            &["status", "--key", "k", "--lost-exit-code", "9"],
            &["migrate"],
            &["migrate", "--url", "u", "--key", "k"],
            &["status"],
            &["status", "--url", "u"],
            &["status", "--key", "k", "--ttl", "1s"],
            &["status", "--key", "k", "--", "true"],
            &["run", "--url", "u", "--key", "k", "--json", "--", "true"],
            &["status", "--key", "k", "--prefix", "p"],
            &["status", "--key", "k", "--limit", "3"],
            &["status", "--prefix", "p", "--limit", "-1"],
            &["status", "--prefix"],
            &["run", "--prefix", "p", "--", "true"],
        ] {
            assert!(parse(args(bad), None).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn reads_the_exit_code_quiet_and_migrate() {
        let a = run_args(
            args(&[
                "run", "--url", "u", "--key", "k", "--ttl", "1m30s", "-E", "3", "-q", "--", "true",
            ]),
            None,
        )
        .unwrap();
        assert_eq!(a.busy_exit_code, 3);
        assert_eq!(a.lost_exit_code, 76);
        assert!(a.quiet);
        assert_eq!(a.ttl, Duration::from_secs(90));
        assert_eq!(a.metrics_addr, None);
        assert_eq!(a.if_unavailable, IfUnavailableArg::Fail);
        let lost = run_args(
            args(&["run", "--key", "k", "--lost-exit-code=90", "--", "true"]),
            None,
        )
        .unwrap();
        assert_eq!(lost.lost_exit_code, 90);
        for (word, want) in [
            ("fail", IfUnavailableArg::Fail),
            ("skip", IfUnavailableArg::Skip),
            ("run", IfUnavailableArg::Run),
        ] {
            let a = run_args(
                args(&["run", "--key", "k", "--if-unavailable", word, "--", "true"]),
                None,
            )
            .unwrap();
            assert_eq!(a.if_unavailable, want);
        }
        assert!(parse(
            args(&[
                "run",
                "--key",
                "k",
                "--if-unavailable",
                "open",
                "--",
                "true"
            ]),
            None
        )
        .is_err());
        let a = run_args(
            args(&[
                "run",
                "--key",
                "k",
                "--metrics-addr",
                "127.0.0.1:9464",
                "--",
                "true",
            ]),
            None,
        )
        .unwrap();
        assert_eq!(a.metrics_addr, Some("127.0.0.1:9464".parse().unwrap()));
        assert!(parse(
            args(&[
                "run",
                "--key",
                "k",
                "--metrics-addr",
                "localhost",
                "--",
                "true"
            ]),
            None
        )
        .is_err());
        assert_eq!(
            parse(args(&["migrate"]), Some("postgres://h".into())),
            Ok(Invocation::Migrate {
                url: "postgres://h".into()
            })
        );
        assert_eq!(
            parse(args(&["status", "--key", "k", "--json"]), None),
            Ok(Invocation::Status(StatusArgs {
                url: None,
                target: StatusTarget::Key("k".into()),
                json: true
            }))
        );
        assert_eq!(
            parse(args(&["status", "--key=k", "--url", "u"]), Some("e".into())),
            Ok(Invocation::Status(StatusArgs {
                url: Some("u".into()),
                target: StatusTarget::Key("k".into()),
                json: false
            }))
        );
        assert_eq!(
            parse(args(&["status", "--prefix", "", "--limit=3"]), None),
            Ok(Invocation::Status(StatusArgs {
                url: None,
                target: StatusTarget::Prefix {
                    prefix: String::new(),
                    limit: 3
                },
                json: false
            }))
        );
        assert_eq!(
            parse(args(&["status", "--prefix", "job:"]), None),
            Ok(Invocation::Status(StatusArgs {
                url: None,
                target: StatusTarget::Prefix {
                    prefix: "job:".into(),
                    limit: DEFAULT_LIST_LIMIT
                },
                json: false
            }))
        );
        assert_eq!(parse(args(&["--version"]), None), Ok(Invocation::Version));
        assert_eq!(parse(args(&[]), None), Ok(Invocation::Help));
    }
}
