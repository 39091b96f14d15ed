//! What a run records so that it can be told apart from another and made again: the source
//! revision, the versions of the server programs it started, and the command that reruns its
//! schedule from the seed.
//!
//! Every lookup runs a program and falls back to `unknown` (or leaves the program out): a run
//! on a machine without git or with a renamed package must still run, and a report that says
//! `unknown` is honest where a guess would not be.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::deployment::Backend;
use crate::resource::ResourceKind;
use crate::runner::{Arm, RunOptions};

/// What a commit reads as when git cannot tell.
pub const UNKNOWN: &str = "unknown";

/// The first line a program prints for `args`, on stdout or stderr; `None` if it cannot run
/// or fails.
fn first_line(program: impl AsRef<std::ffi::OsStr>, args: &[&str]) -> Option<String> {
    let output = Command::new(program).args(args).output().ok()?;
    if !output.status.success() {
        return None;
    }
    let text = if output.stdout.is_empty() {
        output.stderr
    } else {
        output.stdout
    };
    String::from_utf8_lossy(&text)
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .map(str::to_string)
}

/// `git rev-parse HEAD` of the source tree the workload was built from (the current directory
/// first, where `cargo run` runs it), with `-dirty` when the tree has uncommitted changes to
/// tracked files; [`UNKNOWN`] without git or outside a repository.
pub fn commit() -> String {
    let dirs = [
        std::env::current_dir().ok(),
        Some(Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()),
    ];
    for dir in dirs.into_iter().flatten() {
        let git = |args: &[&str]| Command::new("git").arg("-C").arg(&dir).args(args).output();
        let Ok(head) = git(&["rev-parse", "HEAD"]) else {
            continue;
        };
        let sha = String::from_utf8_lossy(&head.stdout).trim().to_string();
        if !head.status.success() || sha.is_empty() {
            continue;
        }
        let dirty = git(&["diff", "--quiet", "HEAD", "--"])
            .map(|o| o.status.code() == Some(1))
            .unwrap_or(false);
        return if dirty { format!("{sha}-dirty") } else { sha };
    }
    UNKNOWN.to_string()
}

/// The version of one server program, as it reports itself, trimmed to the version where the
/// format is known (`3.4.23` for `etcd Version: 3.4.23`).
pub fn version_of(program: &str) -> Option<String> {
    match program {
        "etcd" => first_line("etcd", &["--version"])
            .map(|l| l.trim_start_matches("etcd Version:").trim().to_string()),
        "zookeeper" => zookeeper_version(),
        "postgres" => {
            let bin = leasehold_servers::postgres::postgres_bin_dir().ok()?;
            first_line(bin.join("postgres"), &["--version"]).map(|l| {
                l.trim_start_matches("postgres (PostgreSQL)")
                    .trim()
                    .to_string()
            })
        }
        "redis-server" => first_line("redis-server", &["--version"]).map(|l| {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix("v="))
                .map_or(l.clone(), str::to_string)
        }),
        "azurite" => first_line("azurite-blob", &["--version"]),
        // `mariadbd  Ver 10.11.14-MariaDB-0+deb12u2 for debian-linux-gnu on x86_64 (...)`
        "mariadb" => {
            let server = leasehold_servers::mariadb::mariadbd_path().ok()?;
            first_line(server, &["--version"]).map(|l| {
                l.split_whitespace()
                    .skip_while(|w| *w != "Ver")
                    .nth(1)
                    .map_or(l.clone(), str::to_string)
            })
        }
        "pgbouncer" => first_line("pgbouncer", &["--version"])
            .map(|l| l.trim_start_matches("PgBouncer").trim().to_string()),
        other => first_line(other, &["--version"]),
    }
}

/// ZooKeeper runs from Debian's jar, which has no `--version`: the package's version, else the
/// versioned jar's name.
fn zookeeper_version() -> Option<String> {
    let package = Command::new("dpkg-query")
        .args(["-W", "-f", "${Version}", "zookeeper"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|v| !v.is_empty());
    package.or_else(|| {
        std::fs::read_dir("/usr/share/java").ok()?.find_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            let version = name.strip_prefix("zookeeper-")?.strip_suffix(".jar")?;
            version
                .starts_with(|c: char| c.is_ascii_digit())
                .then(|| version.to_string())
        })
    })
}

/// The server programs a run starts: the backend's (unless given by URL) and PostgreSQL for
/// the resource (unless given by URL).
pub fn programs(options: &RunOptions) -> Vec<&'static str> {
    let mut programs = Vec::new();
    if options.authority_url.is_none() {
        // SQLite is a library inside the workers, not a program the run starts.
        programs.extend(match options.backend {
            Backend::Etcd => &["etcd"][..],
            Backend::Zookeeper => &["zookeeper"],
            Backend::Postgres | Backend::PostgresStandby => &["postgres"],
            Backend::PostgresPgbouncer => &["postgres", "pgbouncer"],
            Backend::Redis | Backend::RedisSentinel | Backend::RedisCluster => &["redis-server"],
            Backend::Sqlite => &[],
            Backend::MySql => &["mariadb"],
            Backend::ObjectStore => &["azurite"],
        });
    }
    if options.resource_url.is_none() {
        // Each kind is named for the program that serves it.
        let program = options.resource.name();
        if !programs.contains(&program) {
            programs.push(program);
        }
    }
    programs
}

/// The versions of the programs a run starts; a program that cannot tell is recorded as
/// [`UNKNOWN`], so the report shows it was looked for.
pub fn versions(options: &RunOptions) -> BTreeMap<String, String> {
    programs(options)
        .into_iter()
        .map(|p| {
            (
                p.to_string(),
                version_of(p).unwrap_or_else(|| UNKNOWN.to_string()),
            )
        })
        .collect()
}

/// A duration as the command line reads it: whole seconds as `20s`, anything else in `ms`.
fn duration_flag(d: Duration) -> String {
    let ms = d.as_millis();
    if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

/// The command that runs `options` again: every option spelled out, so the defaults of a
/// later version cannot change what it means. Servers given by URL stay placeholders: a URL
/// may carry a password, and the report is published.
pub fn command(options: &RunOptions) -> String {
    let arms: Vec<&str> = options.arms.iter().map(|a| Arm::name(*a)).collect();
    let mut parts = vec![
        "cargo run -p leasehold-workload -- run".to_string(),
        format!("--backend {}", options.backend.name()),
        format!("--nodes {}", options.nodes),
        format!("--duration {}", duration_flag(options.duration)),
        format!("--seed {}", options.seed),
        format!("--workers {}", options.workers),
        format!("--keys {}", options.keys),
        format!("--arms {}", arms.join(",")),
        format!("--pause-probability {}", options.pause_probability),
        format!("--cancel-probability {}", options.cancel_probability),
        format!(
            "--fault-gap {}..{}",
            duration_flag(options.fault_gap.0),
            duration_flag(options.fault_gap.1)
        ),
    ];
    if options.authority_url.is_some() {
        parts.push("--url AUTHORITY_URL".to_string());
    }
    if options.resource_url.is_some() {
        parts.push("--resource-url RESOURCE_URL".to_string());
    } else if options.resource != ResourceKind::Postgres {
        parts.push(format!("--resource {}", options.resource.name()));
    }
    parts.push(format!("--out {}", options.out.display()));
    parts.join(" ")
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    #[test]
    fn the_command_spells_out_every_option_the_schedule_depends_on() {
        let mut options = RunOptions::new(
            Backend::Zookeeper,
            Duration::from_secs(600),
            2026,
            PathBuf::from("/tmp/wl"),
        );
        options.fault_gap = (Duration::from_millis(500), Duration::from_millis(1500));
        assert_eq!(
            command(&options),
            "cargo run -p leasehold-workload -- run --backend zookeeper --nodes 3 \
             --duration 600s --seed 2026 --workers 4 --keys 2 --arms fenced,control \
             --pause-probability 0.2 --cancel-probability 0.1 --fault-gap 500ms..1500ms \
             --out /tmp/wl"
        );
        options.authority_url = Some("postgres://user:secret@db/x".into());
        assert!(!command(&options).contains("secret"));
    }

    #[test]
    fn a_run_on_its_own_servers_names_the_backend_and_the_resource() {
        let options = RunOptions::new(Backend::Etcd, Duration::ZERO, 1, PathBuf::new());
        assert_eq!(programs(&options), ["etcd", "postgres"]);
        let options = RunOptions::new(Backend::Postgres, Duration::ZERO, 1, PathBuf::new());
        assert_eq!(programs(&options), ["postgres"]);
        let mut options = RunOptions::new(Backend::Zookeeper, Duration::ZERO, 1, PathBuf::new());
        options.resource = ResourceKind::Azurite;
        assert_eq!(programs(&options), ["zookeeper", "azurite"]);
        assert!(command(&options).contains("--resource azurite"));
    }
}
