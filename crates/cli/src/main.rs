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
mod console;
mod descendants;
mod duration;
mod logging;
mod revoke;
mod state;
mod status;
mod status_watch;
mod stop;
mod survey;
mod terminal;
mod watcher;

use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use leasehold::mysql::MysqlAuthority;
use leasehold::{
    redact_url, Authority, ClientOptions, Error, Instant, Lease, LeaseOptions, LeaseState, LockKey,
};
use leasehold_core::backend::{ConnectionUrl, UrlParams};
use leasehold_postgres::PostgresAuthority;
use tokio::signal::unix::{signal, Signal, SignalKind};

use crate::args::{IfUnavailableArg, Invocation, RunArgs, VERSION};
use crate::child::{Child, Job};
use crate::duration::human;

/// Exit codes, after sysexits.h where one fits.
mod code {
    /// `status`: the key is held.
    pub const HELD: u8 = 1;
    /// `revoke`: the key was free, nothing was revoked.
    pub const WAS_FREE: u8 = 1;
    pub const USAGE: u8 = 64;
    pub const UNAVAILABLE: u8 = 69;
    pub const LOST: u8 = 76;
    pub const NO_PERMISSION: u8 = 77;
}

fn main() -> ExitCode {
    let invocation = match args::parse(
        std::env::args_os().skip(1).collect(),
        std::env::var("LEASEHOLD_URL").ok(),
    ) {
        Ok(Invocation::Completions(shell)) => return print_bytes(&args::completions(shell)),
        Ok(Invocation::Man(name)) => {
            return match args::man(name.as_deref()) {
                Ok(roff) => print_bytes(&roff),
                Err(e) => {
                    say!("leasehold: writing the manual page: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Ok(Invocation::WatchGroup(args)) => return ExitCode::from(watcher::watch_group(&args)),
        Ok(i) => i,
        Err(e) => return refused(&e),
    };
    logging::init();
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
    // `block_on` polls on this, the main thread, so the command is forked from the thread that
    // lives as long as the process (its parent-death signal is tied to the forking thread).
    let status = runtime.block_on(async {
        match invocation {
            Invocation::Run(args) => run(args).await,
            Invocation::Status(args) => status::status(args).await,
            Invocation::Console(args) => console::console(args).await,
            Invocation::Revoke { url, key } => revoke::revoke(url.as_deref(), &key).await,
            Invocation::Migrate { url } => migrate(&url).await,
            Invocation::Completions(_) | Invocation::Man(_) | Invocation::WatchGroup(_) => 0,
        }
    });
    ExitCode::from(status)
}

/// What clap said instead of an invocation: `--help` on stdout with status 0, `--version` as
/// [`VERSION`], and a usage error on stderr with status 64, sysexits.h's EX_USAGE, as for any
/// bad input (clap's own status for it is 2).
fn refused(e: &clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    match e.kind() {
        ErrorKind::DisplayVersion => print_out(VERSION),
        _ if !e.use_stderr() => stdout_written(e.print()),
        _ => {
            // Nothing to be done if stderr is gone too.
            let _ = e.print();
            ExitCode::from(code::USAGE)
        }
    }
}

/// Prints `text` and a newline on stdout.
fn print_out(text: &str) -> ExitCode {
    print_bytes(format!("{text}\n").as_bytes())
}

/// Prints `bytes` on stdout as they are.
fn print_bytes(bytes: &[u8]) -> ExitCode {
    let mut out = std::io::stdout().lock();
    stdout_written(out.write_all(bytes).and_then(|()| out.flush()))
}

/// The status of a write to stdout. `println!` panics when the reader has gone away
/// (`leasehold --help | head`: EPIPE, since Rust ignores SIGPIPE); a reader that stopped reading
/// is not an error of ours, so stop quietly with success, as `ls | head` does.
fn stdout_written(written: std::io::Result<()>) -> ExitCode {
    match written {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            say!("leasehold: writing to stdout: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Prints an error from before the command ran, and returns its exit code (`busy` for a lock
/// held by someone else).
pub(crate) fn failed(e: &Error, url: &str, busy: u8) -> u8 {
    say!("leasehold: {}", chain(e));
    if tls_may_be_why(e, url) {
        let scheme = ConnectionUrl::scheme_of(url).unwrap_or_default();
        say!(
            "leasehold: {scheme}:// asks for TLS: a server that does not speak TLS never \
             answers the handshake, which looks like this; if so, use {}://",
            scheme.strip_suffix('s').unwrap_or(&scheme)
        );
    }
    if missing_table(e) {
        say!(
            "leasehold: create the lease table with `leasehold migrate --url {}`",
            redact_url(url)
        );
    }
    match e {
        Error::Timeout { .. } => busy,
        Error::Unavailable { .. } => code::UNAVAILABLE,
        Error::Unauthorized { .. } => code::NO_PERMISSION,
        Error::Backend {
            retryable: true, ..
        } => code::UNAVAILABLE,
        _ => code::USAGE,
    }
}

/// Whether `e` is a request with no answer on a TLS URL (`rediss://`, `etcds://`): a plain
/// server waits for a request that the client, waiting for the server's TLS hello, never sends.
fn tls_may_be_why(e: &Error, url: &str) -> bool {
    let scheme = ConnectionUrl::scheme_of(url).unwrap_or_default();
    matches!(e, Error::Unavailable { message, .. }
        if (scheme == "rediss" || scheme == "etcds")
            && (message.contains("no answer") || message.contains("timed out")))
}

/// Whether `e` is "the lease table does not exist" (PostgreSQL's SQLSTATE 42P01, MySQL's
/// 42S02), as leasehold-postgres and leasehold-mysql word it.
fn missing_table(e: &Error) -> bool {
    matches!(e, Error::Backend { backend: "postgres" | "mysql", message, .. }
        if message.contains("does not exist") && message.contains("migrate"))
}

/// An error and its sources on one line, each text once: a source whose text is already shown,
/// or that repeats a part of what is (client libraries often quote their cause in their own
/// message), is left out, and a Rust
/// Debug dump that a library appends to its message (`, source: Error(...)`) is cut off.
pub(crate) fn chain(e: &Error) -> String {
    let mut text = readable(&e.to_string()).to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        let shown = s.to_string();
        let part = readable(&shown);
        // Already said, or saying again something already said (a library's message that
        // quotes its cause): left out.
        let repeats = text.contains(part)
            || text
                .split(": ")
                .any(|said| said.len() >= 8 && part.contains(said));
        if !part.is_empty() && !repeats {
            text.push_str(": ");
            text.push_str(part);
        }
        source = s.source();
    }
    text
}

/// `text` without a Debug dump of a source appended to it, and without trailing punctuation.
fn readable(text: &str) -> &str {
    let cut = [", source: ", " source: ", ", details: "]
        .iter()
        .filter_map(|marker| text.find(marker))
        .min()
        .unwrap_or(text.len());
    text[..cut].trim_end_matches([',', ' ', ':'])
}

/// `memory://` lives in one process: two `leasehold` processes would each get an authority of
/// their own and both hold the "lock". Refused, with what to use instead.
/// The authority's URL: the one given, else the per-user default (created on first use); an
/// in-process URL is refused. A refusal is printed and becomes the exit status (64).
pub(crate) fn authority_url(given: Option<&str>) -> Result<String, u8> {
    let url = state::url_or_default(given).map_err(|e| {
        say!("leasehold: {e}");
        code::USAGE
    })?;
    refuse_in_process(&url).map_err(|e| {
        say!("leasehold: {e}");
        code::USAGE
    })?;
    Ok(url)
}

pub(crate) fn refuse_in_process(url: &str) -> Result<(), String> {
    if ConnectionUrl::scheme_of(url).as_deref() == Some("memory") {
        return Err(format!(
            "`{}` is an in-process authority: every `leasehold` process would have its own, so \
             two runs on one key would both hold it. For a lock between the processes of this \
             machine without a server, use sqlite:///path/to/locks.db (an embedded authority in \
             a file), or give no --url for the per-user one ({}); otherwise the URL of a \
             server: postgres://, redis://, etcd:// or zk://",
            redact_url(url),
            state::LOCATION,
        ));
    }
    Ok(())
}

/// The shortest TTL worth holding with these client options: one whose local validity (the TTL
/// less the safety margin) outlasts one request, answered as late as the request timeout allows.
/// Anything shorter can run out while the acquire's own answer is on its way, or before a
/// renewal could land: the command would run on a lease that may already be gone.
fn ttl_floor(options: &ClientOptions) -> Duration {
    let margin = options.safety_margin;
    let timeout = options.request_timeout;
    let enough = |ttl: Duration| ttl.saturating_sub(margin.for_ttl(ttl)) >= timeout;
    // The validity grows with the TTL (the margin's drift share is at most half of it), so
    // double until enough, then bisect to the millisecond.
    let mut high = timeout.max(Duration::from_millis(1));
    for _ in 0..64 {
        if enough(high) {
            break;
        }
        high = high.saturating_mul(2);
    }
    let mut low = Duration::ZERO;
    while high.saturating_sub(low) > Duration::from_millis(1) {
        let mid = low + (high - low) / 2;
        if enough(mid) {
            high = mid;
        } else {
            low = mid;
        }
    }
    // The least whole number of milliseconds that passes, so the number printed is one that
    // does: the threshold lies within the millisecond below `high`.
    let whole = Duration::from_millis(u64::try_from(high.as_millis()).unwrap_or(u64::MAX));
    if enough(whole) {
        whole.max(Duration::from_millis(1))
    } else {
        whole.saturating_add(Duration::from_millis(1))
    }
}

/// The request timeout of the per-user SQLite authority: a quarter of the TTL, between 100 ms
/// and the usual 5 s. A local file answers in microseconds unless another process holds its
/// write lock, so a flock-like `--ttl 1s` must not meet the 5 s floor a network authority needs;
/// and a renewal that waits a quarter of the TTL for the lock still leaves time to retry.
fn local_timeout(ttl: Duration) -> Duration {
    (ttl / 4).clamp(Duration::from_millis(100), Duration::from_secs(5))
}

/// Refuses a TTL below [`ttl_floor`] for the URL's client options, before connecting.
pub(crate) fn check_ttl(url: &str, ttl: Duration) -> Result<(), Error> {
    let mut params = UrlParams::parse(url)?;
    let options = params.take_client_options()?;
    let floor = ttl_floor(&options);
    if ttl < floor {
        return Err(Error::InvalidTtl {
            ttl,
            reason: format!(
                "too short: the lease must outlast one request to the authority, \
                 so it needs at least the request timeout ({}; timeout_ms in the URL) plus the \
                 safety margin ({} of a {} TTL): use --ttl {} or more, or a shorter timeout_ms",
                human(options.request_timeout),
                human(options.safety_margin.for_ttl(floor)),
                human(floor),
                human(floor),
            ),
        });
    }
    Ok(())
}

/// The time left on a grant whose local deadline is `deadline`, or an error if it has already
/// passed (the answer took longer than the lease's validity): such a grant is worth nothing
/// and must never be handed to the command.
fn time_left(key: &LockKey, deadline: Instant, now: Instant) -> Result<Duration, String> {
    match deadline.checked_duration_since(now) {
        Some(left) if !left.is_zero() => Ok(left),
        _ => Err(format!(
            "the lease on `{key}` had expired by the time the authority's answer arrived \
             ({} late); the command was not started",
            human(now.saturating_duration_since(deadline))
        )),
    }
}

async fn run(args: RunArgs) -> u8 {
    let busy = args.busy_exit_code;
    let key = match LockKey::new(&args.key) {
        Ok(k) => k,
        Err(e) => return failed(&e, "", busy),
    };
    let local = format!("timeout_ms={}", local_timeout(args.ttl).as_millis());
    if args.url.is_none() {
        // The TTL is checked before anything is created on disk.
        if let Err(e) = check_ttl(&format!("sqlite://?{local}"), args.ttl) {
            return failed(&e, "", busy);
        }
    }
    let url = match authority_url(args.url.as_deref()) {
        Ok(url) if args.url.is_none() => format!("{url}?{local}"),
        Ok(url) => url,
        Err(code) => return code,
    };
    if let Err(e) = check_ttl(&url, args.ttl) {
        return failed(&e, &url, busy);
    }
    if let Some(addr) = args.metrics_addr {
        if let Err(e) = serve_metrics(addr) {
            say!("leasehold: cannot serve metrics at {addr}: {e}");
            return code::UNAVAILABLE;
        }
    }
    let authority = match leasehold::connect(&url).await {
        Ok(a) => a,
        Err(e) if leasehold::is_unavailable(&e) => {
            return unavailable(&args, &url, &key, "", e).await;
        }
        Err(e) => return failed(&e, &url, busy),
    };
    let code = run_under_lease(&args, &url, key, authority.clone()).await;
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

/// Serves what this run records as Prometheus metrics at `http://addr/metrics`, labelled with
/// the key (one run holds one key, so the series are bounded).
fn serve_metrics(addr: std::net::SocketAddr) -> Result<(), String> {
    // Bind first, so an address in use is an error now, not a log line from a background task.
    std::net::TcpListener::bind(addr)
        .map_err(|e| e.to_string())
        .map(drop)?;
    metrics_exporter_prometheus::PrometheusBuilder::new()
        .with_http_listener(addr)
        .install()
        .map_err(|e| e.to_string())?;
    leasehold::telemetry::describe();
    leasehold::telemetry::set_key_labels(leasehold::telemetry::KeyLabels::Full);
    Ok(())
}

/// `HH:MM:SS UTC` of the wall-clock time `after` from now.
fn wall_clock_in(after: Duration) -> String {
    let at = SystemTime::now()
        .checked_add(after)
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs());
    let (h, m, s) = (at % 86_400 / 3_600, at % 3_600 / 60, at % 60);
    format!("{h:02}:{m:02}:{s:02} UTC")
}

/// Who holds `key` and for how long, as the authority tells (`1a2b3c4d (fence 7, 8.2s left)`),
/// for messages: asked once, within a second; "another owner" if the authority cannot tell.
async fn holder(authority: &dyn Authority, key: &LockKey) -> String {
    let asked = tokio::time::timeout(Duration::from_secs(1), authority.inspect(key)).await;
    let Ok(Ok(seen)) = asked else {
        return "another owner".into();
    };
    let mut about = Vec::new();
    if let Some(fence) = seen.fence {
        about.push(format!("fence {}", fence.value()));
    }
    if let Some(left) = seen.remaining {
        // To the millisecond: the authority's microseconds are noise in a message.
        let left = Duration::from_millis(u64::try_from(left.as_millis()).unwrap_or(u64::MAX));
        about.push(format!("{} left", human(left)));
    }
    let who = match (&seen.owner, seen.held) {
        (Some(owner), true) => owner.to_string(),
        _ => "another owner".into(),
    };
    if about.is_empty() {
        who
    } else {
        format!("{who} ({})", about.join(", "))
    }
}

/// Takes the lease: at once, or waiting up to `--wait` (saying so on stderr once the wait has
/// gone on for a second, unless `--quiet`). `Err` is the exit code, the reason already printed.
/// Why `take` did not hand over a lease.
enum NotTaken {
    /// Held by someone else, bad input, refused credentials...: the exit status, said already.
    Code(u8),
    /// The authority could not be reached: `--if-unavailable` decides.
    Unavailable(Error),
}

async fn take(
    args: &RunArgs,
    url: &str,
    key: &LockKey,
    authority: Arc<dyn Authority>,
) -> Result<Lease, NotTaken> {
    match take_or_code(args, url, key, authority).await {
        Ok(lease) => Ok(lease),
        Err(Ok(code)) => Err(NotTaken::Code(code)),
        Err(Err(e)) => Err(NotTaken::Unavailable(e)),
    }
}

/// `take`, with an unreachable authority as `Err(Err(error))`, unreported.
async fn take_or_code(
    args: &RunArgs,
    url: &str,
    key: &LockKey,
    authority: Arc<dyn Authority>,
) -> Result<Lease, Result<u8, Error>> {
    let busy = args.busy_exit_code;
    let started = Instant::now();
    match Lease::try_acquire(authority.clone(), key, args.ttl, LeaseOptions::default()).await {
        Ok(Some(lease)) => return Ok(lease),
        Ok(None) => {}
        Err(e) if leasehold::is_unavailable(&e) => return Err(Err(e)),
        Err(e) => return Err(Ok(failed(&e, url, busy))),
    }
    if args.wait.is_zero() {
        say!(
            "leasehold: `{key}` is held by {} (not waiting: --wait 0s)",
            holder(&*authority, key).await
        );
        return Err(Ok(busy));
    }
    let left = args.wait.saturating_sub(started.elapsed());
    let acquiring = Lease::acquire(
        authority.clone(),
        key,
        args.ttl,
        left,
        LeaseOptions::default(),
    );
    tokio::pin!(acquiring);
    let notice_at = started + Duration::from_secs(1);
    let result = if args.quiet || args.wait <= Duration::from_secs(1) {
        acquiring.await
    } else {
        tokio::select! {
            result = &mut acquiring => result,
            () = tokio::time::sleep_until(notice_at) => {
                let by = holder(&*authority, key).await;
                say!(
                    "leasehold: `{key}` is held by {by}; waiting until {} (--wait {})",
                    wall_clock_in(args.wait.saturating_sub(started.elapsed())),
                    human(args.wait)
                );
                acquiring.await
            }
        }
    };
    match result {
        Ok(lease) => Ok(lease),
        Err(Error::Timeout { .. }) => {
            say!(
                "leasehold: gave up on `{key}` after --wait {}: it is still held by {}",
                human(args.wait),
                holder(&*authority, key).await
            );
            Err(Ok(busy))
        }
        Err(e) if leasehold::is_unavailable(&e) => Err(Err(e)),
        Err(e) => Err(Ok(failed(&e, url, busy))),
    }
}

async fn run_under_lease(
    args: &RunArgs,
    url: &str,
    key: LockKey,
    authority: Arc<dyn Authority>,
) -> u8 {
    let backend = authority.capabilities().backend;
    let lease = match take(args, url, &key, authority).await {
        Ok(l) => l,
        Err(NotTaken::Code(code)) => return code,
        Err(NotTaken::Unavailable(e)) => return unavailable(args, url, &key, backend, e).await,
    };
    // The last moment before the command gets the fence: a grant that arrived after its own
    // deadline (or was lost meanwhile) is never handed over.
    let fresh = time_left(&key, lease.deadline(), Instant::now())
        .and_then(|_| lease.ensure_valid().map_err(|e| chain(&e)));
    if let Err(reason) = fresh {
        say!("leasehold: {reason}");
        let _ = lease.release().await;
        return code::UNAVAILABLE;
    }
    // Watch for signals before the command starts, so none falls between.
    let Some(mut signals) = Signals::watch() else {
        let _ = lease.release().await;
        say!("leasehold: cannot watch for signals");
        return code::UNAVAILABLE;
    };
    let mut child = match Child::spawn(&args.command, &key, Some(lease.fence()), backend) {
        Ok(c) => c,
        Err(e) => {
            say!(
                "leasehold: cannot start `{}`: {e}",
                args.command[0].to_string_lossy()
            );
            let _ = lease.release().await;
            return child::cannot_start_code(&e);
        }
    };
    // The watcher learns every deadline the lease reaches, so that it can end the command if
    // one passes while leasehold is stopped or gone.
    let confirming = child.confirmer().map(|confirmer| {
        let mut watch = lease.watch();
        confirmer.confirm(lease.deadline());
        tokio::spawn(async move {
            while let Some(deadline) = watch.deadline_changed().await {
                if watch.current().is_lost() {
                    return;
                }
                confirmer.confirm(deadline);
            }
        })
    });
    let job = child.job();
    let lost = lease.lost();
    tokio::pin!(lost);
    let stopped_by = loop {
        tokio::select! {
            biased;
            reason = &mut lost => {
                say!("leasehold: lease on `{key}` lost ({reason}); stopping the command");
                child.stop(args.grace).await;
                let _ = child.disarm().await;
                return args.lost_exit_code;
            }
            status = child.wait() => {
                // What it left running goes before the lease does.
                child.end_the_rest(args.grace).await;
                let fired = child.disarm().await;
                if let Some(confirming) = confirming {
                    confirming.abort();
                }
                if let LeaseState::Lost(reason) = lease.state() {
                    // It ended (or was ended by the watcher) after the lease was gone.
                    say!("leasehold: lease on `{key}` lost ({reason}) while the command ran");
                    return args.lost_exit_code;
                }
                if fired {
                    // A renewal that landed at the last moment reached the watcher too late:
                    // the command was killed as the lease would have run out. Reported as
                    // lost, as the command saw it; the lease itself is given back.
                    say!(
                        "leasehold: the watcher ended the command at the lease's deadline (no \
                         renewal confirmed in time)"
                    );
                    if let Err(e) = lease.release().await {
                        say!("leasehold: releasing the lease failed (its TTL will free it): {}", chain(&e));
                    }
                    return args.lost_exit_code;
                }
                if let Err(e) = lease.release().await {
                    say!("leasehold: releasing the lease failed (its TTL will free it): {}", chain(&e));
                }
                return status;
            }
            signal = signals.next(job) => match signal {
                Stop::Signal(number) => break number,
                Stop::Job => stop_the_job(&mut child),
            },
        }
    };
    child.stop(args.grace).await;
    child.disarm().await;
    if let Some(confirming) = confirming {
        confirming.abort();
    }
    if let Err(e) = lease.release().await {
        say!(
            "leasehold: releasing the lease failed (its TTL will free it): {}",
            chain(&e)
        );
    }
    128 + stopped_by
}

/// The signals `leasehold` acts on while the command runs.
struct Signals {
    interrupt: Signal,
    terminate: Signal,
    hangup: Signal,
    /// SIGTSTP: Ctrl-Z while leasehold has the terminal, or `kill -TSTP`.
    suspend: Signal,
    /// SIGCHLD: the command may have been stopped by Ctrl-Z at its terminal.
    child: Signal,
}

/// What a signal asks of `leasehold`.
enum Stop {
    /// End the command and exit 128 + this.
    Signal(u8),
    /// Stop the command, then leasehold itself, as a shell stops a job.
    Job,
}

impl Signals {
    fn watch() -> Option<Signals> {
        Some(Signals {
            interrupt: signal(SignalKind::interrupt()).ok()?,
            terminate: signal(SignalKind::terminate()).ok()?,
            // A closed terminal or a dropped ssh session: handled as SIGTERM.
            hangup: signal(SignalKind::hangup()).ok()?,
            suspend: signal(SignalKind::from_raw(libc::SIGTSTP)).ok()?,
            child: signal(SignalKind::child()).ok()?,
        })
    }

    /// The next signal that asks something of leasehold. A stop of the command is a job stop
    /// only when it has the terminal (Ctrl-Z reached it, not leasehold); a command stopped by
    /// someone's `kill -STOP` does nothing while stopped, and leasehold leaves it so.
    async fn next(&mut self, job: Job) -> Stop {
        loop {
            tokio::select! {
                _ = self.interrupt.recv() => return Stop::Signal(2),
                _ = self.terminate.recv() => return Stop::Signal(15),
                _ = self.hangup.recv() => return Stop::Signal(1),
                _ = self.suspend.recv() => return Stop::Job,
                _ = self.child.recv() => {
                    job.reap_orphans();
                    if job.stopped_at_its_terminal() {
                        return Stop::Job;
                    }
                }
            }
        }
    }
}

/// Stops the command's processes, then leasehold itself (SIGSTOP: what a shell shows as a
/// stopped job); continued, it continues them. The lease is not renewed meanwhile: if the stop
/// outlasts it, the watcher kills the command at its deadline, and leasehold, continued, finds
/// the lease lost.
fn stop_the_job(child: &mut Child) {
    child.suspend();
    let _ = rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::STOP);
    // Runs once SIGCONT has continued leasehold.
    child.resume();
}

/// The authority could not be reached (at connect or at acquire): what `--if-unavailable`
/// says. `backend` is empty when the connection itself failed (the error names it then).
async fn unavailable(args: &RunArgs, url: &str, key: &LockKey, backend: &str, e: Error) -> u8 {
    let backend = match (&e, backend) {
        (_, b) if !b.is_empty() => b.to_string(),
        (Error::Unavailable { backend, .. } | Error::Backend { backend, .. }, _) => {
            backend.to_string()
        }
        _ => "unknown".to_string(),
    };
    match args.if_unavailable {
        IfUnavailableArg::Fail => failed(&e, url, args.busy_exit_code),
        IfUnavailableArg::Skip => {
            say!(
                "leasehold: the authority is unavailable ({}); not running the command \
                 (--if-unavailable skip)",
                chain(&e)
            );
            0
        }
        IfUnavailableArg::Run => {
            say!(
                "leasehold: the authority is unavailable ({}); running the command WITHOUT a \
                 lock (--if-unavailable run): LEASEHOLD_LOCK=unlocked, no fence",
                chain(&e)
            );
            leasehold::telemetry::proceeded_unlocked(&backend, key);
            run_unlocked(args, key, &backend).await
        }
    }
}

/// Runs the command without a lease (`--if-unavailable run`): nothing to renew or lose, but
/// signals stop it as they would under a lease.
async fn run_unlocked(args: &RunArgs, key: &LockKey, backend: &str) -> u8 {
    let Some(mut signals) = Signals::watch() else {
        say!("leasehold: cannot watch for signals");
        return code::UNAVAILABLE;
    };
    let mut child = match Child::spawn(&args.command, key, None, backend) {
        Ok(c) => c,
        Err(e) => {
            say!(
                "leasehold: cannot start `{}`: {e}",
                args.command[0].to_string_lossy()
            );
            return child::cannot_start_code(&e);
        }
    };
    let job = child.job();
    let stopped_by = loop {
        tokio::select! {
            status = child.wait() => {
                child.end_the_rest(args.grace).await;
                child.disarm().await;
                return status;
            }
            signal = signals.next(job) => match signal {
                Stop::Signal(number) => break number,
                Stop::Job => stop_the_job(&mut child),
            },
        }
    };
    child.stop(args.grace).await;
    child.disarm().await;
    128 + stopped_by
}

/// `leasehold migrate`: creates the lease table of PostgreSQL or MySQL/MariaDB if it is not
/// there.
async fn migrate(url: &str) -> u8 {
    if let Err(e) = refuse_in_process(url) {
        say!("leasehold: {e}");
        return code::USAGE;
    }
    let scheme = ConnectionUrl::scheme_of(url).unwrap_or_default();
    let migrated = match scheme.as_str() {
        "postgres" | "postgresql" => match PostgresAuthority::connect(url).await {
            Ok(authority) => {
                let done = authority.migrate().await;
                let _ = Authority::close(&authority).await;
                done
            }
            Err(e) => Err(e),
        },
        "mysql" | "mariadb" => match MysqlAuthority::connect(url).await {
            Ok(authority) => {
                let done = authority.migrate().await;
                let _ = Authority::close(&authority).await;
                done
            }
            Err(e) => Err(e),
        },
        _ => {
            say!(
                "leasehold: migrate creates the lease table of PostgreSQL (postgres://...) or \
                 MySQL/MariaDB (mysql://..., mariadb://...); `{}` needs no schema",
                redact_url(url)
            );
            return code::USAGE;
        }
    };
    match migrated {
        Ok(()) => {
            say!("leasehold: the lease table is ready");
            0
        }
        Err(e) => failed(&e, url, code::UNAVAILABLE),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_conformance::kit::{ErrOrFail, OrFail, TestResult};

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_ttl_floor_is_the_timeout_plus_the_margin() {
        let mut options = ClientOptions::default();
        // 5 s timeout, 5 ms + 1 %: ttl * 0.99 - 5 ms >= 5 s.
        assert_eq!(ttl_floor(&options), 5056 * MS);
        options.request_timeout = Duration::from_secs(1);
        assert_eq!(ttl_floor(&options), 1016 * MS);
        assert!(check_ttl("redis://h?timeout_ms=1000", 1016 * MS).is_ok());
        for short in [MS, 1015 * MS, Duration::from_secs(1)] {
            let refused = check_ttl("redis://h?timeout_ms=1000", short);
            assert!(
                matches!(&refused, Err(Error::InvalidTtl { reason, .. }) if reason.contains("1.016s")),
                "{short:?}: {refused:?}"
            );
        }
        assert!(check_ttl("redis://h", Duration::from_secs(5)).is_err());
        assert!(check_ttl("redis://h", Duration::from_secs(10)).is_ok());
        assert!(check_ttl("redis://h?safety_margin_ms=100&timeout_ms=100", 199 * MS).is_err());
    }

    /// A grant is handed to the command only while its local deadline is ahead.
    #[test]
    fn a_grant_past_its_deadline_is_not_handed_over() -> TestResult {
        let key = LockKey::new("k").or_fail("the key `k`")?;
        let now = Instant::now();
        assert_eq!(time_left(&key, now + 5 * MS, now), Ok(5 * MS));
        assert!(time_left(&key, now, now).is_err());
        let late = time_left(&key, now, now + 250 * MS)
            .err_or_fail("time_left with a deadline already past")?;
        assert!(late.contains("250ms late"), "{late}");
        assert!(late.contains("not started"), "{late}");
        Ok(())
    }

    #[test]
    fn the_local_default_takes_short_ttls() {
        for (ttl, timeout) in [
            (1000, 250),
            (2000, 500),
            (10_000, 2500),
            (60_000, 5000),
            (200, 100),
        ] {
            let ttl = ttl * MS;
            assert_eq!(local_timeout(ttl), timeout * MS, "{ttl:?}");
        }
        for ttl in [
            MS * 200,
            Duration::from_secs(1),
            Duration::from_secs(2),
            Duration::from_secs(10),
        ] {
            let url = format!("sqlite:///x?timeout_ms={}", local_timeout(ttl).as_millis());
            assert!(check_ttl(&url, ttl).is_ok(), "{ttl:?} is refused");
        }
        let url = format!(
            "sqlite:///x?timeout_ms={}",
            local_timeout(MS * 50).as_millis()
        );
        assert!(check_ttl(&url, MS * 50).is_err());
    }

    #[test]
    fn memory_is_refused_and_others_pass() -> TestResult {
        for url in ["memory://", "memory://x", "MEMORY://x"] {
            let e =
                refuse_in_process(url).err_or_fail("refuse_in_process on the in-process URL")?;
            assert!(e.contains("sqlite://"), "{e}");
        }
        assert!(refuse_in_process("redis://h").is_ok());
        Ok(())
    }

    #[test]
    fn a_chain_shows_each_text_once_and_no_debug_dump() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let e = Error::unavailable("redis", "connect: refused", io);
        assert_eq!(chain(&e), "redis authority unavailable: connect: refused");
        let quoting = std::io::Error::other("grpc error: message: \"tcp connect error\"");
        let e = Error::unavailable("etcd", "probe: tcp connect error", quoting);
        assert_eq!(
            chain(&e),
            "etcd authority unavailable: probe: tcp connect error"
        );
        let new = std::io::Error::other("Connection refused (os error 111)");
        let e = Error::unavailable("etcd", "probe: tcp connect error", new);
        assert_eq!(
            chain(&e),
            "etcd authority unavailable: probe: tcp connect error: Connection refused (os error 111)"
        );
        assert_eq!(
            readable("grpc error: code: 14, source: Error(Os { code: 111 })"),
            "grpc error: code: 14"
        );
    }
}
