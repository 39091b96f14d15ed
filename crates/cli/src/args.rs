//! The command line: `leasehold run [options] -- <command> [args...]`.

use std::ffi::OsString;
use std::time::Duration;

/// What `leasehold run` was asked to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunArgs {
    pub url: String,
    pub key: String,
    pub ttl: Duration,
    pub wait: Duration,
    pub grace: Duration,
    pub command: Vec<OsString>,
}

/// What `--version` prints.
pub const VERSION: &str = concat!("leasehold ", env!("CARGO_PKG_VERSION"));

pub const USAGE: &str = "\
usage: leasehold run [--url URL] --key KEY [--ttl 10s] [--wait 0s] [--grace 5s] -- COMMAND [ARGS...]
       leasehold --help | --version

Runs COMMAND while holding a lease on KEY from the authority at URL (or $LEASEHOLD_URL):
postgres://, redis://, rediss://, etcd://, etcds://, zk://, memory://.

COMMAND gets LEASEHOLD_KEY, LEASEHOLD_FENCE (the fencing token: send it with every protected
write), LEASEHOLD_FENCE_SAFETY and LEASEHOLD_BACKEND in its environment. The lease is renewed
every third of the TTL. If it is lost, COMMAND's process group gets SIGTERM, then SIGKILL after
--grace. When COMMAND ends, the lease is released.

  --url URL      the authority (default: $LEASEHOLD_URL)
  --key KEY      the lock key (printable ASCII, no spaces)
  --ttl D        the lease's TTL (default 10s)
  --wait D       how long to wait for the lock if it is held (default 0s: fail at once)
  --grace D      time between SIGTERM and SIGKILL when the lease is lost (default 5s)
Durations: 250ms, 10s, 2m.

exit status: COMMAND's own, or 128+N if it died of signal N; 64 bad usage or input;
69 the authority is unreachable; 75 the lock is held by someone else; 76 the lease was lost
and COMMAND was stopped; 77 the authority refused the credentials; 127 COMMAND could not start.";

/// Parses `250ms`, `10s`, `2m`, `1h`.
pub fn duration(text: &str) -> Result<Duration, String> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("`{text}` needs a unit: ms, s, m or h"))?;
    let (number, unit) = text.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a duration"))?;
    let scale = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return Err(format!("`{text}`: unknown unit `{unit}` (ms, s, m, h)")),
    };
    n.checked_mul(scale)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("`{text}` is too long"))
}

/// Parses the arguments after the program name. `Err("")` asks for the usage text and
/// `Err(VERSION)` for the version, both on stdout with exit status 0.
pub fn parse(args: Vec<OsString>, env_url: Option<String>) -> Result<RunArgs, String> {
    let mut args = args.into_iter();
    match args.next().as_ref().and_then(|a| a.to_str()) {
        Some("run") => {}
        Some("-h" | "--help" | "help") | None => return Err(String::new()),
        Some("-V" | "--version") => return Err(VERSION.into()),
        Some(other) => return Err(format!("unknown subcommand `{other}`")),
    }
    let mut url = env_url;
    let (mut key, mut ttl, mut wait, mut grace) = (None, None, None, None);
    let mut command = Vec::new();
    while let Some(arg) = args.next() {
        let text = arg
            .to_str()
            .ok_or_else(|| format!("option {arg:?} is not UTF-8"))?
            .to_string();
        if text == "--" {
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
        match name.as_str() {
            "--url" => url = Some(value()?),
            "--key" => key = Some(value()?),
            "--ttl" => ttl = Some(duration(&value()?)?),
            "--wait" => wait = Some(duration(&value()?)?),
            "--grace" => grace = Some(duration(&value()?)?),
            "-h" | "--help" => return Err(String::new()),
            other => {
                return Err(format!(
                    "unknown option `{other}` (the command goes after `--`)"
                ))
            }
        }
    }
    if command.is_empty() {
        return Err("no command to run: put it after `--`".into());
    }
    Ok(RunArgs {
        url: url.ok_or("no authority: give --url or set LEASEHOLD_URL")?,
        key: key.ok_or("--key is required")?,
        ttl: ttl.unwrap_or(Duration::from_secs(10)),
        wait: wait.unwrap_or(Duration::ZERO),
        grace: grace.unwrap_or(Duration::from_secs(5)),
        command,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &[&str]) -> Vec<OsString> {
        s.iter().map(OsString::from).collect()
    }

    #[test]
    fn parses_a_full_command_line() {
        let a = parse(
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
        assert_eq!(a.url, "redis://h");
        assert_eq!(a.key, "k");
        assert_eq!(a.ttl, Duration::from_secs(2));
        assert_eq!(a.wait, Duration::from_millis(500));
        assert_eq!(a.grace, Duration::from_secs(5));
        assert_eq!(a.command, args(&["sh", "-c", "x --y"]));
    }

    #[test]
    fn takes_the_url_from_the_environment_and_refuses_bad_input() {
        let a = parse(
            args(&["run", "--key", "k", "--", "true"]),
            Some("memory://".into()),
        )
        .unwrap();
        assert_eq!(a.url, "memory://");
        for bad in [
            &["run", "--key", "k", "--", "true"][..],
            &["run", "--url", "u", "--", "true"],
            &["run", "--url", "u", "--key", "k"],
            &[
                "run", "--url", "u", "--key", "k", "--ttl", "10", "--", "true",
            ],
            &[
                "run", "--url", "u", "--key", "k", "--ttl", "10d", "--", "true",
            ],
            &["run", "--url", "u", "--key", "k", "--bogus", "--", "true"],
            &["walk"],
        ] {
            assert!(parse(args(bad), None).is_err(), "{bad:?}");
        }
        assert_eq!(duration("2m"), Ok(Duration::from_secs(120)));
        assert!(duration("99999999999999999999h").is_err());
    }
}
