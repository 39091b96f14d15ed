//! The command line, declared with clap's derive API: `leasehold run [options] -- <command>
//! [args...]`, `leasehold status`, `leasehold migrate`, and `leasehold completions` and
//! `leasehold man`, which print what clap_complete and clap_mangen make of this same declaration.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::time::Duration;

use clap::error::ErrorKind;
use clap::{ArgGroup, Args, CommandFactory, Parser, Subcommand, ValueEnum};
use clap_complete::Shell;

use crate::duration;

// Each paragraph is one line, which clap wraps to the terminal's width.

/// The exit statuses, shared by `leasehold --help` and `leasehold run --help`.
macro_rules! exit_status {
    () => {
        "Exit status (run): COMMAND's own, or 128+N if it died of signal N (or leasehold did, by \
         SIGINT, SIGTERM or SIGHUP); 64 bad usage or input; 69 the authority is unreachable or \
         answered too late; 75 the lock is held by someone else (see --busy-exit-code); 76 the \
         lease was lost and COMMAND was stopped (see --lost-exit-code: pick one COMMAND never \
         returns); 77 the authority refused the credentials; 126 COMMAND is not executable; 127 \
         COMMAND was not found.\n\
         \n\
         Exit status (status): 0 free, 1 held, 64, 69 and 77 as for run."
    };
}

const ABOUT: &str = "Run a command while holding a lease on a key: hand it the fencing token, \
                     stop it when the lease is lost.";

const AFTER_HELP: &str = concat!(
    "The authority is --url URL, else $LEASEHOLD_URL: sqlite:///path/to/locks.db (no server; the \
     processes of one machine), postgres://, mysql://, mariadb://, redis://, rediss://, etcd://, \
     etcds://, zk://. With \
     neither, it is a per-user SQLite file, $XDG_STATE_HOME/leasehold/locks.db (or \
     $HOME/.local/state/leasehold/locks.db; the directory is created, mode 0700): it works with \
     no server and no setup, for the processes of this user on this machine. memory:// is \
     refused: it lives in one process, so two `leasehold` processes would both hold the lock.\n\
     \n\
     run: COMMAND gets LEASEHOLD_KEY, LEASEHOLD_FENCE (the fencing token: send it with every \
     protected write), LEASEHOLD_FENCE_SAFETY, LEASEHOLD_BACKEND and LEASEHOLD_LOCK=held in its \
     environment. If the lease is lost, COMMAND and everything it started are stopped (`leasehold \
     run --help` says how).\n\
     \n\
     Durations: 250ms, 1.5s, 1m30s, 2h, 1d.\n\
     \n\
     Set LEASEHOLD_LOG=info (or RUST_LOG) to see each acquire, renewal and release.\n\
     \n\
     Shell completions: `leasehold completions bash` (or zsh, fish, elvish, powershell). The \
     manual page: `leasehold man` (`leasehold man run` for run's).\n\
     \n",
    exit_status!()
);

const RUN_ABOUT: &str = "\
Runs COMMAND while holding a lease on KEY from the authority at --url (else $LEASEHOLD_URL, else \
the per-user SQLite file: `leasehold --help` says which URLs).\n\
\n\
COMMAND gets LEASEHOLD_KEY, LEASEHOLD_FENCE (the fencing token: send it with every protected \
write), LEASEHOLD_FENCE_SAFETY, LEASEHOLD_BACKEND and LEASEHOLD_LOCK=held in its environment. The \
lease is renewed every third of the TTL. If it is lost, COMMAND's process group and everything \
else COMMAND started (also what left the group: setsid, daemons) get SIGTERM, then SIGKILL after \
--grace, and in any case SIGKILL once the lease's deadline passes. If leasehold itself dies (even \
by SIGKILL) or is stopped (SIGSTOP), a watcher process kills COMMAND's process group by the \
lease's deadline. SIGINT, SIGTERM and SIGHUP stop COMMAND and release the lease; SIGTSTP (Ctrl-Z) \
stops COMMAND, then leasehold. When COMMAND ends, whatever it left running is ended the same way, \
then the lease is released. In a terminal, COMMAND is the foreground job: it can read the \
terminal.\n\
\n\
COMMAND and its arguments go after `--`: nothing after it is read as an option of leasehold's.";

const RUN_AFTER_HELP: &str = concat!("Durations: 250ms, 1.5s, 1m30s, 2h, 1d.\n\n", exit_status!());

const STATUS_ABOUT: &str = "\
Prints whether KEY is held or free, as the authority tells: the holder's short id, fence and \
remaining TTL, the last fence issued, the backend. One line, or with --json one JSON object (key, \
held, owner, fence, last_fence, remaining_ms, backend, url). With --prefix, the same for each key \
that starts with P (every held one; free ones where the authority remembers them), in order, at \
most --limit of them (an empty P lists every key).\n\
\n\
It is a snapshot for people and scripts to read, not a lock: it decides nothing.";

const STATUS_AFTER_HELP: &str = "\
Exit status: 0 free (none held), 1 held (some held); 64 bad usage or input; 69 the authority is \
unreachable or answered too late; 77 the authority refused the credentials.";

const REVOKE_ABOUT: &str = "\
Ends the lease of whoever holds KEY now, as an operator taking a key away from a stuck holder: \
prints the fence of the lease it ended, or that the key was free (then nothing changed). Safe \
because of fences: the holder learns it at once or at its next renewal, the next holder's fence \
is greater, and the resource refuses the revoked holder's late writes once the next fence has \
reached it. The authority's own permissions decide who may revoke (see docs/revocation.md).";

const REVOKE_AFTER_HELP: &str = "\
Exit status: 0 revoked, 1 the key was free (nothing to revoke); 64 bad usage or input; 69 the \
authority is unreachable or answered too late; 77 the authority refused the credentials or the \
permission.";

const CONSOLE_ABOUT: &str = "\
Serves a web page that shows the keys under a prefix, refreshed live: each key's holder, fence, \
time left and waiters, the hand-offs and losses seen since the console started, a page per key \
with its fence history, and the process's metrics at /metrics. It prints `leasehold console: \
http://ADDR/` once it listens. It binds to loopback unless --listen says otherwise, which needs a \
token (--token-file, or $LEASEHOLD_CONSOLE_TOKEN): anyone who can reach the page sees the keys. \
Revoke buttons appear only with --allow-revoke; each asks for confirmation and is refused if the \
holder changed since the page showed it (see docs/console.md).";

const CONSOLE_AFTER_HELP: &str = "\
Exit status: 0 stopped by SIGINT or SIGTERM; 64 bad usage or input (a non-loopback --listen \
without a token); 69 the authority or the address is unavailable; 77 the authority refused the \
credentials.";

const MIGRATE_ABOUT: &str = "\
Creates the lease table in the PostgreSQL database at --url (or $LEASEHOLD_URL) if it is not \
there yet (safe to run again, and concurrently). Other backends need no schema.";

#[derive(Debug, Parser)]
#[command(
    name = "leasehold",
    version,
    about = ABOUT,
    after_help = AFTER_HELP,
    propagate_version = true,
    // An option given twice takes its last value, as `alias lh='leasehold run --ttl 30s'`
    // followed by `lh --ttl 1m` expects.
    args_override_self = true,
    subcommand_value_name = "SUBCOMMAND",
    subcommand_help_heading = "Subcommands"
)]
struct Cli {
    #[command(subcommand)]
    command: Sub,
}

#[derive(Debug, Subcommand)]
enum Sub {
    /// Run COMMAND while holding a lease on KEY, with the fence in $LEASEHOLD_FENCE
    #[command(long_about = RUN_ABOUT, after_help = RUN_AFTER_HELP)]
    Run(RunArgs),
    /// Say whether KEY (or each key under a prefix) is held or free, as the authority tells
    #[command(long_about = STATUS_ABOUT, after_help = STATUS_AFTER_HELP)]
    Status(StatusCli),
    /// End the lease of whoever holds KEY now; its fence keeps the holder's late writes out
    #[command(long_about = REVOKE_ABOUT, after_help = REVOKE_AFTER_HELP)]
    Revoke {
        /// The authority [default: $LEASEHOLD_URL, else the per-user SQLite file]
        #[arg(long, value_name = "URL", allow_hyphen_values = true)]
        url: Option<String>,
        /// The key whose holder loses its lease
        #[arg(long, value_name = "KEY", allow_hyphen_values = true)]
        key: String,
    },
    /// Serve a live web page of the keys under a prefix (holders, fences, hand-offs; revoke)
    #[command(long_about = CONSOLE_ABOUT, after_help = CONSOLE_AFTER_HELP)]
    Console(ConsoleArgs),
    /// Create PostgreSQL's lease table (other backends need no schema)
    #[command(long_about = MIGRATE_ABOUT)]
    Migrate {
        /// The PostgreSQL database [default: $LEASEHOLD_URL]
        #[arg(long, value_name = "URL", allow_hyphen_values = true)]
        url: Option<String>,
    },
    /// Print the completion script of SHELL on stdout
    Completions {
        #[arg(value_enum)]
        shell: Shell,
    },
    /// Print the manual page (roff) of leasehold, or of one subcommand, on stdout
    Man {
        #[arg(value_parser = ["run", "status", "revoke", "console", "migrate", "completions", "man"])]
        subcommand: Option<String>,
    },
}

/// What `leasehold run` was asked to do.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct RunArgs {
    /// The authority [default: $LEASEHOLD_URL, else the per-user SQLite file]
    #[arg(long, value_name = "URL", allow_hyphen_values = true)]
    pub url: Option<String>,
    /// The lock key (printable ASCII, no spaces)
    #[arg(long, value_name = "KEY", allow_hyphen_values = true)]
    pub key: String,
    /// The lease's TTL: at least the URL's request timeout (timeout_ms, default 5s) plus the
    /// safety margin
    #[arg(long, value_name = "D", default_value = "10s", value_parser = duration::parse)]
    pub ttl: Duration,
    /// How long to wait for the lock if it is held (0s: fail at once)
    #[arg(long, value_name = "D", default_value = "0s", value_parser = duration::parse)]
    pub wait: Duration,
    /// Time between SIGTERM and SIGKILL when COMMAND is stopped
    #[arg(long, value_name = "D", default_value = "5s", value_parser = duration::parse)]
    pub grace: Duration,
    /// Exit N when the lock is held by someone else (flock's -E)
    #[arg(short = 'E', long, value_name = "N", default_value_t = 75, value_parser = exit_status)]
    pub busy_exit_code: u8,
    /// Exit N when the lease is lost while COMMAND runs
    #[arg(long, value_name = "N", default_value_t = crate::code::LOST, value_parser = exit_status)]
    pub lost_exit_code: u8,
    /// Say nothing while waiting for the lock
    #[arg(short, long)]
    pub quiet: bool,
    /// Serve Prometheus metrics at http://A/metrics while running (the lease's acquire,
    /// renewals, loss and hold time; docs/observability.md)
    #[arg(long, value_name = "A", value_parser = socket_addr)]
    pub metrics_addr: Option<SocketAddr>,
    /// What to do when the authority cannot be reached
    #[arg(long, value_name = "P", value_enum, default_value = "fail")]
    pub if_unavailable: IfUnavailableArg,
    /// The command to run and its arguments, after `--`
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<OsString>,
}

/// What `leasehold console` was asked to do.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct ConsoleArgs {
    /// The authority [default: $LEASEHOLD_URL, else the per-user SQLite file]
    #[arg(long, value_name = "URL", allow_hyphen_values = true)]
    pub url: Option<String>,
    /// Show the keys that start with P (a plain prefix; empty: every key)
    #[arg(long, value_name = "P", default_value = "", allow_hyphen_values = true)]
    pub prefix: String,
    /// Show at most the first N keys, in byte order
    #[arg(long, value_name = "N", default_value_t = DEFAULT_LIST_LIMIT, value_parser = key_count)]
    pub limit: usize,
    /// Time between two looks at the authority
    #[arg(long, value_name = "D", default_value = "500ms", value_parser = duration::parse)]
    pub interval: Duration,
    /// The address and port to serve on (port 0: any free one)
    #[arg(long, value_name = "A", default_value = "127.0.0.1:0", value_parser = socket_addr)]
    pub listen: SocketAddr,
    /// Show revoke buttons, and accept the revocations they ask for
    #[arg(long)]
    pub allow_revoke: bool,
    /// A file whose first line is the token every request must carry [default:
    /// $LEASEHOLD_CONSOLE_TOKEN; none: no token asked]
    #[arg(long, value_name = "F")]
    pub token_file: Option<std::path::PathBuf>,
}

/// `--if-unavailable`: what `run` does when the authority cannot be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum IfUnavailableArg {
    /// Exit 69 without running the command (fail closed)
    #[default]
    Fail,
    /// Exit 0 without running the command (a periodic job that can wait for its next turn)
    Skip,
    /// Run the command WITHOUT a lock: LEASEHOLD_LOCK=unlocked and no LEASEHOLD_FENCE (only for
    /// work the resource itself protects)
    Run,
}

/// `leasehold status` as given; [`StatusArgs`] once the URL's default is applied.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("target").required(true).args(["key", "prefix"])))]
struct StatusCli {
    /// The authority [default: $LEASEHOLD_URL, else the per-user SQLite file]
    #[arg(long, value_name = "URL", allow_hyphen_values = true)]
    url: Option<String>,
    /// The key to look at
    #[arg(long, value_name = "KEY", allow_hyphen_values = true)]
    key: Option<String>,
    /// Every key that starts with P (a plain prefix, no wildcards; empty: every key)
    #[arg(long, value_name = "P", allow_hyphen_values = true)]
    prefix: Option<String>,
    /// With --prefix: show at most the first N keys, in byte order [default: 100]
    #[arg(long, value_name = "N", requires = "prefix", conflicts_with = "key", value_parser = key_count)]
    limit: Option<usize>,
    /// One JSON object on one line (per key) instead of the line for people; with --watch, one
    /// per key at the start and one per change after
    #[arg(long)]
    json: bool,
    /// Keep looking until interrupted: the keys refreshed live, each hand-off and loss below
    #[arg(long)]
    watch: bool,
    /// With --watch: how long from one look to the next
    #[arg(long, value_name = "D", default_value = "1s", requires = "watch", value_parser = duration::parse)]
    interval: Duration,
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
    /// `--watch`: look again every this long until interrupted.
    pub watch: Option<Duration>,
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
    /// `leasehold console ...`: the web console.
    Console(ConsoleArgs),
    /// `leasehold revoke --key K [--url URL]`: end the current holder's lease.
    Revoke {
        url: Option<String>,
        key: String,
    },
    /// `leasehold migrate --url postgres://...` (or `mysql://`, `mariadb://`): create the lease
    /// table.
    Migrate {
        url: String,
    },
    /// `leasehold completions SHELL`.
    Completions(Shell),
    /// `leasehold man [SUBCOMMAND]`.
    Man(Option<String>),
    /// Internal: the watcher of a command's process group, with its arguments (see
    /// `crate::watcher`).
    WatchGroup(Vec<String>),
}

/// What `--version` prints.
pub const VERSION: &str = concat!("leasehold ", env!("CARGO_PKG_VERSION"));

/// Parses the arguments after the program name. `--help`, `--version` and `leasehold` alone
/// are errors of the kinds [`ErrorKind::DisplayHelp`] and [`ErrorKind::DisplayVersion`], as
/// clap reports them: they print on stdout and exit 0.
pub fn parse(args: Vec<OsString>, env_url: Option<String>) -> Result<Invocation, clap::Error> {
    // The watcher's arguments are an internal protocol, not a subcommand: no help, no
    // completion, no man page lists it.
    if args
        .first()
        .is_some_and(|a| a == crate::watcher::WATCH_GROUP)
    {
        let rest: Option<Vec<String>> = args[1..]
            .iter()
            .map(|a| a.to_str().map(String::from))
            .collect();
        return rest.map(Invocation::WatchGroup).ok_or_else(|| {
            Cli::command().error(ErrorKind::InvalidUtf8, "no process group to watch")
        });
    }
    let args = if args.is_empty() {
        vec![OsString::from("--help")]
    } else {
        args
    };
    let cli = Cli::try_parse_from(std::iter::once(OsString::from("leasehold")).chain(args))?;
    let missing = |sub, what| subcommand_error(sub, ErrorKind::MissingRequiredArgument, what);
    Ok(match cli.command {
        Sub::Run(run) => Invocation::Run(RunArgs {
            url: run.url.or(env_url),
            ..run
        }),
        Sub::Status(status) => {
            let target = match (status.key, status.prefix) {
                (Some(key), _) => StatusTarget::Key(key),
                (None, Some(prefix)) => StatusTarget::Prefix {
                    prefix,
                    limit: status.limit.unwrap_or(DEFAULT_LIST_LIMIT),
                },
                // Refused by clap already (`--key` or `--prefix` is required): said as clap
                // would, never a panic.
                (None, None) => return Err(missing("status", "--key (or --prefix) is required")),
            };
            Invocation::Status(StatusArgs {
                url: status.url.or(env_url),
                target,
                json: status.json,
                watch: status.watch.then_some(status.interval),
            })
        }
        Sub::Console(console) => Invocation::Console(ConsoleArgs {
            url: console.url.or(env_url),
            ..console
        }),
        Sub::Revoke { url, key } => Invocation::Revoke {
            url: url.or(env_url),
            key,
        },
        // Only PostgreSQL has a schema: there is no default to migrate.
        Sub::Migrate { url } => Invocation::Migrate {
            url: url.or(env_url).ok_or_else(|| {
                missing(
                    "migrate",
                    "migrate needs --url postgres://... or mysql://... (or LEASEHOLD_URL)",
                )
            })?,
        },
        Sub::Completions { shell } => Invocation::Completions(shell),
        Sub::Man { subcommand } => Invocation::Man(subcommand),
    })
}

/// A usage error of subcommand `name`, worded and shown with its usage as clap's own are.
fn subcommand_error(name: &str, kind: ErrorKind, message: &str) -> clap::Error {
    let mut cli = Cli::command();
    cli.build();
    match cli.find_subcommand_mut(name) {
        Some(sub) => sub.error(kind, message),
        None => cli.error(kind, message),
    }
}

/// `--busy-exit-code` and `--lost-exit-code`.
fn exit_status(value: &str) -> Result<u8, String> {
    value
        .parse()
        .map_err(|_| format!("`{value}` is not an exit status (0 to 255)"))
}

/// `--limit`.
fn key_count(value: &str) -> Result<usize, String> {
    value
        .parse()
        .map_err(|_| format!("`{value}` is not a number of keys (0 or more)"))
}

/// `--metrics-addr`.
fn socket_addr(value: &str) -> Result<SocketAddr, String> {
    value
        .parse()
        .map_err(|_| format!("`{value}` is not an address and port (127.0.0.1:9464, [::1]:9464)"))
}

/// The completion script of `shell` for `leasehold`.
pub fn completions(shell: Shell) -> Vec<u8> {
    let mut script = Vec::new();
    // Written to memory, which cannot fail: clap_complete panics on a failed write, and stdout
    // may be a closed pipe.
    clap_complete::generate(shell, &mut Cli::command(), "leasehold", &mut script);
    script
}

/// The manual page (roff) of `leasehold`, or of its subcommand `name`. What `--help` shows
/// after the options goes into the page's DESCRIPTION (clap_mangen would title it EXTRA).
pub fn man(name: Option<&str>) -> std::io::Result<Vec<u8>> {
    // `leasehold help` has no page of its own.
    let mut cli = Cli::command().disable_help_subcommand(true);
    cli.build();
    let mut command = match name {
        Some(name) => cli
            .find_subcommand(name)
            .cloned()
            .ok_or_else(|| std::io::Error::other(format!("no subcommand {name}")))?,
        None => cli,
    };
    if let Some(after) = command.get_after_help().map(|a| a.to_string()) {
        let about = command
            .get_long_about()
            .or(command.get_about())
            .map(|a| a.to_string())
            .unwrap_or_default();
        command = command
            .long_about(format!("{about}\n\n{after}"))
            .after_help(None::<&str>);
    }
    let mut roff = Vec::new();
    clap_mangen::Man::new(command)
        .source(VERSION)
        .render(&mut roff)?;
    Ok(roff)
}

#[cfg(test)]
mod tests {
    use super::*;

    type Result = std::result::Result<(), String>;

    fn args(s: &[&str]) -> Vec<OsString> {
        s.iter().map(OsString::from).collect()
    }

    fn run_args(
        args: Vec<OsString>,
        env_url: Option<String>,
    ) -> std::result::Result<RunArgs, String> {
        match parse(args, env_url).map_err(|e| e.to_string())? {
            Invocation::Run(a) => Ok(a),
            other => Err(format!("not a run: {other:?}")),
        }
    }

    /// `got` equals `want`, or a message saying what differed.
    fn same<T: PartialEq + std::fmt::Debug>(what: &str, got: T, want: T) -> Result {
        if got == want {
            Ok(())
        } else {
            Err(format!("{what}: got {got:?}, want {want:?}"))
        }
    }

    /// The message clap would print for `line`, which must be refused.
    fn refusal(line: &[&str]) -> std::result::Result<String, String> {
        match parse(args(line), None) {
            Ok(i) => Err(format!("{line:?} was accepted: {i:?}")),
            Err(e) if !e.use_stderr() => Err(format!("{line:?} is not a usage error: {e}")),
            Err(e) => Ok(e.to_string()),
        }
    }

    #[test]
    fn the_declaration_is_consistent() {
        // clap's own checks of the derive declaration (conflicting names, bad groups).
        Cli::command().debug_assert();
    }

    #[test]
    fn parses_a_full_command_line() -> Result {
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
        )?;
        same("url", a.url.as_deref(), Some("redis://h"))?;
        same("key", a.key.as_str(), "k")?;
        same("ttl", a.ttl, Duration::from_secs(2))?;
        same("wait", a.wait, Duration::from_millis(500))?;
        same("grace", a.grace, Duration::from_secs(5))?;
        same("command", a.command, args(&["sh", "-c", "x --y"]))
    }

    #[test]
    fn takes_the_url_from_the_environment_and_refuses_bad_input() -> Result {
        let a = run_args(
            args(&["run", "--key", "k", "--", "true"]),
            Some("redis://h".into()),
        )?;
        same(
            "url from the environment",
            a.url.as_deref(),
            Some("redis://h"),
        )?;
        same("busy exit code", a.busy_exit_code, 75)?;
        // No URL at all: the per-user default, resolved when the command runs.
        let a = run_args(args(&["run", "--key", "k", "--", "true"]), None)?;
        same("url", a.url, None)?;
        same("quiet", a.quiet, false)?;
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
            // The command goes after `--`, never before it.
            &["run", "--key", "k", "true"],
            &["completions", "tcsh"],
            &["man", "help"],
        ] {
            refusal(bad)?;
        }
        Ok(())
    }

    #[test]
    fn reads_the_exit_code_quiet_and_migrate() -> Result {
        let a = run_args(
            args(&[
                "run", "--url", "u", "--key", "k", "--ttl", "1m30s", "-E", "3", "-q", "--", "true",
            ]),
            None,
        )?;
        same("busy exit code", a.busy_exit_code, 3)?;
        same("lost exit code", a.lost_exit_code, 76)?;
        same("quiet", a.quiet, true)?;
        same("ttl", a.ttl, Duration::from_secs(90))?;
        same("metrics address", a.metrics_addr, None)?;
        same("if unavailable", a.if_unavailable, IfUnavailableArg::Fail)?;
        let lost = run_args(
            args(&["run", "--key", "k", "--lost-exit-code=90", "--", "true"]),
            None,
        )?;
        same("lost exit code", lost.lost_exit_code, 90)?;
        for (word, want) in [
            ("fail", IfUnavailableArg::Fail),
            ("skip", IfUnavailableArg::Skip),
            ("run", IfUnavailableArg::Run),
        ] {
            let a = run_args(
                args(&["run", "--key", "k", "--if-unavailable", word, "--", "true"]),
                None,
            )?;
            same(word, a.if_unavailable, want)?;
        }
        refusal(&[
            "run",
            "--key",
            "k",
            "--if-unavailable",
            "open",
            "--",
            "true",
        ])?;
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
        )?;
        same(
            "metrics address",
            a.metrics_addr,
            Some(SocketAddr::from(([127, 0, 0, 1], 9464))),
        )?;
        refusal(&[
            "run",
            "--key",
            "k",
            "--metrics-addr",
            "localhost",
            "--",
            "true",
        ])?;
        let parsed = |line: &[&str], env: Option<&str>| {
            parse(args(line), env.map(String::from)).map_err(|e| e.to_string())
        };
        same(
            "migrate",
            parsed(&["migrate"], Some("postgres://h")),
            Ok(Invocation::Migrate {
                url: "postgres://h".into(),
            }),
        )?;
        same(
            "revoke",
            parsed(&["revoke", "--key", "k"], Some("e")),
            Ok(Invocation::Revoke {
                url: Some("e".into()),
                key: "k".into(),
            }),
        )?;
        same(
            "status --json",
            parsed(&["status", "--key", "k", "--json"], None),
            Ok(Invocation::Status(StatusArgs {
                url: None,
                target: StatusTarget::Key("k".into()),
                json: true,
                watch: None,
            })),
        )?;
        same(
            "status --url over the environment",
            parsed(&["status", "--key=k", "--url", "u"], Some("e")),
            Ok(Invocation::Status(StatusArgs {
                url: Some("u".into()),
                target: StatusTarget::Key("k".into()),
                json: false,
                watch: None,
            })),
        )?;
        same(
            "status --prefix '' --limit=3",
            parsed(&["status", "--prefix", "", "--limit=3"], None),
            Ok(Invocation::Status(StatusArgs {
                url: None,
                target: StatusTarget::Prefix {
                    prefix: String::new(),
                    limit: 3,
                },
                json: false,
                watch: None,
            })),
        )?;
        same(
            "status --prefix",
            parsed(&["status", "--prefix", "job:"], None),
            Ok(Invocation::Status(StatusArgs {
                url: None,
                target: StatusTarget::Prefix {
                    prefix: "job:".into(),
                    limit: DEFAULT_LIST_LIMIT,
                },
                json: false,
                watch: None,
            })),
        )?;
        same(
            "status --watch --interval 250ms",
            parsed(
                &[
                    "status",
                    "--prefix",
                    "job:",
                    "--watch",
                    "--interval",
                    "250ms",
                ],
                None,
            ),
            Ok(Invocation::Status(StatusArgs {
                url: None,
                target: StatusTarget::Prefix {
                    prefix: "job:".into(),
                    limit: DEFAULT_LIST_LIMIT,
                },
                json: false,
                watch: Some(Duration::from_millis(250)),
            })),
        )?;
        let kind = |line: &[&str]| parse(args(line), None).map_err(|e| e.kind());
        same(
            "--interval without --watch",
            kind(&["status", "--key", "k", "--interval", "1s"]),
            Err(ErrorKind::MissingRequiredArgument),
        )?;
        same(
            "--version",
            kind(&["--version"]),
            Err(ErrorKind::DisplayVersion),
        )?;
        same("nothing", kind(&[]), Err(ErrorKind::DisplayHelp))
    }

    /// Everything after the first `--` is the command's, options and `--` alike.
    #[test]
    fn after_the_separator_nothing_is_ours() -> Result {
        let a = run_args(
            args(&[
                "run", "--key", "k", "--", "sh", "--help", "--", "--ttl", "x", "-V", "-q",
            ]),
            None,
        )?;
        same(
            "command",
            a.command,
            args(&["sh", "--help", "--", "--ttl", "x", "-V", "-q"]),
        )?;
        same("quiet", a.quiet, false)?;
        same("ttl", a.ttl, Duration::from_secs(10))?;
        // Not UTF-8 is fine for the command: it is handed on as it is.
        let raw = std::os::unix::ffi::OsStringExt::from_vec(vec![b'x', 0xff]);
        let mut line = args(&["run", "--key", "k", "--", "echo"]);
        line.push(raw);
        let a = run_args(line.clone(), None)?;
        same("non-UTF-8 argument", a.command, line[4..].to_vec())
    }

    /// An option given twice takes its last value; a value may start with `-`.
    #[test]
    fn the_last_of_an_option_counts_and_values_may_start_with_a_hyphen() -> Result {
        let a = run_args(
            args(&[
                "run", "--key", "a", "--ttl", "1m", "--key", "-b", "--ttl", "2s", "-E", "3", "-E4",
                "--", "true",
            ]),
            None,
        )?;
        same("key", a.key.as_str(), "-b")?;
        same("ttl", a.ttl, Duration::from_secs(2))?;
        same("busy exit code", a.busy_exit_code, 4)
    }

    /// Refusals say what was wrong, in the words the old parser used where the value is ours
    /// to check.
    #[test]
    fn refusals_say_what_was_wrong() -> Result {
        for (line, says) in [
            (
                &["run", "--key", "k", "--ttl", "10", "--", "true"][..],
                "needs a unit",
            ),
            (
                &["run", "--key", "k", "--wait", "1w", "--", "true"],
                "unknown unit `w`",
            ),
            (
                &["run", "--key", "k", "-E", "256", "--", "true"],
                "is not an exit status (0 to 255)",
            ),
            (
                &[
                    "run",
                    "--key",
                    "k",
                    "--metrics-addr",
                    "localhost",
                    "--",
                    "true",
                ],
                "is not an address and port",
            ),
            (
                &[
                    "run",
                    "--key",
                    "k",
                    "--if-unavailable",
                    "open",
                    "--",
                    "true",
                ],
                "fail, skip, run",
            ),
            (
                &["status", "--prefix", "p", "--limit", "x"],
                "is not a number of keys",
            ),
            (&["migrate"], "LEASEHOLD_URL"),
            (&["run", "--key", "k"], "<COMMAND>"),
            (
                &["status", "--key", "k", "--prefix", "p"],
                "cannot be used with",
            ),
        ] {
            let message = refusal(line)?;
            if !message.contains(says) {
                return Err(format!("{line:?}: no `{says}` in {message}"));
            }
        }
        Ok(())
    }

    #[test]
    fn help_and_version_are_not_usage_errors() -> Result {
        for (line, want) in [
            (&["-h"][..], ErrorKind::DisplayHelp),
            (&["--help"], ErrorKind::DisplayHelp),
            (&["help"], ErrorKind::DisplayHelp),
            (&["help", "run"], ErrorKind::DisplayHelp),
            (&["run", "--help"], ErrorKind::DisplayHelp),
            (&["status", "-h"], ErrorKind::DisplayHelp),
            (&["-V"], ErrorKind::DisplayVersion),
            (&["run", "--version"], ErrorKind::DisplayVersion),
        ] {
            match parse(args(line), None) {
                Err(e) if e.kind() == want && !e.use_stderr() => {}
                other => return Err(format!("{line:?}: {other:?}")),
            }
        }
        Ok(())
    }

    #[test]
    fn the_watcher_gets_its_arguments_as_they_are() -> Result {
        same(
            "watcher",
            parse(args(&[crate::watcher::WATCH_GROUP, "12", "-34"]), None)
                .map_err(|e| e.to_string()),
            Ok(Invocation::WatchGroup(vec!["12".into(), "-34".into()])),
        )
    }
}
