//! `leasehold run` with the authorities other than Redis, each real: etcd leaves no session lease
//! behind, `leasehold migrate` makes PostgreSQL's and MariaDB's tables (and the psql recipe in
//! the docs guards with the fence), two processes exclude each other through one SQLite file and
//! through an S3 bucket, and a run serves its metrics.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use leasehold_servers::RedisServer;

mod common;

use common::{code, hold_script, leasehold, stderr, text, url, wait_for_file, OrFail, Result};

/// The etcd leases on the server, by `etcdctl lease list`.
fn etcd_leases(server: &leasehold_servers::EtcdServer) -> Result<Vec<String>> {
    let out = server
        .etcdctl()
        .or_fail("etcdctl")?
        .args(["lease", "list"])
        .output()
        .or_fail("run etcdctl lease list")?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // "found N leases" and then one id per line.
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .skip(1)
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect())
}

/// With etcd, `leasehold run` leaves no session lease behind when it exits: not
/// after the command ran, nor after the lock was found held. (Exiting without closing the
/// authority would leave the session lease granted, to live out its TTL.)
#[test]
fn etcd_runs_leave_no_lease_behind() -> Result {
    let server = leasehold_servers::EtcdServer::start().or_fail("etcd must start")?;
    let url = format!("etcd://{}?timeout_ms=1000", server.endpoint());
    let ran = leasehold(&[
        "run",
        "--url",
        &url,
        "--key",
        "job:etcd",
        "--ttl",
        "30s",
        "--",
        "sh",
        "-c",
        "echo $LEASEHOLD_FENCE",
    ])?;
    assert_eq!(code(&ran), 0, "{}", text(&ran));
    assert_eq!(etcd_leases(&server)?, Vec::<String>::new(), "after a run");

    // While one run holds the key, a second finds it held (75); neither leaves a lease.
    let dir = leasehold_servers::process::server_dir("cli-etcd").or_fail("a scratch directory")?;
    let (holding, done) = (dir.path().join("holding"), dir.path().join("done"));
    let wait = format!(
        "touch {}; while [ ! -e {} ]; do sleep 0.05; done",
        holding.display(),
        done.display()
    );
    let mut holder = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args([
            "run", "--url", &url, "--key", "job:etcd", "--ttl", "30s", "--",
        ])
        .args(["sh", "-c", &wait])
        .env_remove("LEASEHOLD_URL")
        .spawn()
        .or_fail("start the holder")?;
    let started = Instant::now();
    // Only once the holder's command runs (so it holds the key) does the second run try.
    wait_for_file(&holding, &mut holder)?;
    let held = loop {
        let out = leasehold(&["run", "--url", &url, "--key", "job:etcd", "--", "true"])?;
        if code(&out) == 75 {
            break out;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{}",
            text(&out)
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(code(&held), 75);
    std::fs::write(&done, b"done").or_fail("let the holder finish")?;
    assert!(holder.wait().or_fail("wait for the holder")?.success());
    assert_eq!(
        etcd_leases(&server)?,
        Vec::<String>::new(),
        "after the runs"
    );
    Ok(())
}

/// `leasehold migrate` creates the lease table on a fresh database (twice is fine); before it,
/// `run` says which command creates the table.
#[test]
fn migrate_creates_the_table_and_run_names_it_when_it_is_missing() -> Result {
    let server = leasehold_servers::PostgresServer::start().or_fail("PostgreSQL must start")?;
    let url = format!("{}?timeout_ms=3000", server.url());
    let before = leasehold(&["run", "--url", &url, "--key", "job:pg", "--", "true"])?;
    assert_ne!(code(&before), 0, "{}", text(&before));
    assert!(
        stderr(&before).contains("leasehold migrate"),
        "{}",
        text(&before)
    );
    // The error once, and the hint.
    assert_eq!(stderr(&before).lines().count(), 2, "{}", text(&before));
    for _ in 0..2 {
        let out = leasehold(&["migrate", "--url", &url])?;
        assert_eq!(code(&out), 0, "{}", text(&out));
    }
    let after = leasehold(&[
        "run",
        "--url",
        &url,
        "--key",
        "job:pg",
        "--",
        "sh",
        "-c",
        "echo $LEASEHOLD_FENCE",
    ])?;
    assert_eq!(code(&after), 0, "{}", text(&after));
    assert!(
        String::from_utf8_lossy(&after.stdout)
            .trim()
            .parse::<u64>()
            .or_fail(format!("the fence in {}", text(&after)))?
            > 0
    );
    // Only PostgreSQL has a schema to create.
    let redis = leasehold(&["migrate", "--url", "redis://127.0.0.1:1"])?;
    assert_eq!(code(&redis), 64, "{}", text(&redis));
    Ok(())
}

/// `leasehold migrate` creates MySQL/MariaDB's lease table too (twice is fine); before it,
/// `run` says which command creates the table, and after it `run` hands the command a fence.
#[test]
fn migrate_creates_the_mariadb_table_and_run_names_it_when_it_is_missing() -> Result {
    let server = leasehold_servers::MariaDbServer::start().or_fail("MariaDB must start")?;
    let url = server.url();
    let before = leasehold(&["run", "--url", &url, "--key", "job:my", "--", "true"])?;
    assert_ne!(code(&before), 0, "{}", text(&before));
    assert!(
        stderr(&before).contains("leasehold migrate"),
        "{}",
        text(&before)
    );
    for _ in 0..2 {
        let out = leasehold(&["migrate", "--url", &url])?;
        assert_eq!(code(&out), 0, "{}", text(&out));
    }
    let after = leasehold(&[
        "run",
        "--url",
        &url,
        "--key",
        "job:my",
        "--",
        "sh",
        "-c",
        "echo $LEASEHOLD_FENCE",
    ])?;
    assert_eq!(code(&after), 0, "{}", text(&after));
    assert!(
        String::from_utf8_lossy(&after.stdout)
            .trim()
            .parse::<u64>()
            .or_fail(format!("the fence in {}", text(&after)))?
            > 0
    );
    Ok(())
}

/// The psql recipe in docs/cli.md, run as written: under `leasehold`, its guarded UPDATE lands
/// with the fence; a row already written under a newer fence refuses it and the script says so.
#[test]
fn the_psql_recipe_in_the_docs_guards_with_the_fence() -> Result {
    let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/cli.md"))
        .or_fail("read docs/cli.md")?;
    let script = docs
        .split("The script (`charge.sh`):\n\n```sh\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .or_fail("the recipe's script in docs/cli.md")?;
    let redis = RedisServer::start().or_fail("Redis must start")?;
    let postgres = leasehold_servers::PostgresServer::start().or_fail("PostgreSQL must start")?;
    let database = postgres.url();
    let psql = |sql: &str| -> Result<String> {
        let out = Command::new("psql")
            .args([
                &database,
                "--no-psqlrc",
                "-qtA",
                "-v",
                "ON_ERROR_STOP=1",
                "-c",
                sql,
            ])
            .output()
            .or_fail(format!("run psql -c {sql}"))?;
        assert!(out.status.success(), "{sql}: {}", text(&out));
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    psql("CREATE TABLE invoices (id text PRIMARY KEY, status text NOT NULL)")?;
    psql("INSERT INTO invoices VALUES ('inv_72', 'open')")?;
    psql(
        docs.split("```sql\n")
            .nth(1)
            .and_then(|rest| rest.split("```").next())
            .or_fail("the recipe's SQL in docs/cli.md")?,
    )?;
    let dir =
        leasehold_servers::process::server_dir("cli-recipe").or_fail("a scratch directory")?;
    let path = dir.path().join("charge.sh");
    std::fs::write(&path, script).or_fail("write charge.sh")?;
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .or_fail("make charge.sh executable")?;
    let url = url(&redis);
    let charge = || -> Result<Output> {
        Command::new(env!("CARGO_BIN_EXE_leasehold"))
            .args([
                "run",
                "--url",
                &url,
                "--key",
                "invoice:inv_72",
                "--ttl",
                "30s",
                "--",
            ])
            .arg(&path)
            .arg("inv_72")
            .env_remove("LEASEHOLD_URL")
            .env("DATABASE_URL", &database)
            .output()
            .or_fail("run charge.sh under leasehold")
    };
    let first = charge()?;
    assert_eq!(code(&first), 0, "{}", text(&first));
    let row = psql("SELECT status || ' ' || last_fence FROM invoices WHERE id = 'inv_72'")?;
    let fence: u64 = row
        .strip_prefix("charged ")
        .or_fail(format!("a charged row: {row}"))?
        .parse()
        .or_fail(format!("the fence in {row}"))?;
    assert!(fence > 0, "{row}");
    // A newer holder wrote the row; this run's fence is older now.
    psql("UPDATE invoices SET status = 'refunded', last_fence = 281474976710655")?;
    let stale = charge()?;
    assert_eq!(code(&stale), 3, "{}", text(&stale));
    assert!(stderr(&stale).contains("stale"), "{}", text(&stale));
    assert_eq!(
        psql("SELECT status FROM invoices WHERE id = 'inv_72'")?,
        "refunded"
    );
    Ok(())
}

/// What the memory:// refusal points to works: two `leasehold` processes on one SQLite file
/// exclude each other, and fences grow from run to run.
#[test]
fn sqlite_urls_exclude_across_processes() -> Result {
    let dir =
        leasehold_servers::process::server_dir("cli-sqlite").or_fail("a scratch directory")?;
    let url = format!("sqlite://{}", dir.path().join("locks.db").display());
    let fence_of = |out: &Output| -> Result<u64> {
        let line = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert!(line.ends_with(" sqlite"), "{line}");
        line.split(' ')
            .next()
            .or_fail(format!("a fence in {line}"))?
            .parse()
            .or_fail(format!("the fence in {line}"))
    };
    let echo = "echo $LEASEHOLD_FENCE $LEASEHOLD_BACKEND";
    let first = leasehold(&[
        "run", "--url", &url, "--key", "job:sq", "--", "sh", "-c", echo,
    ])?;
    assert_eq!(code(&first), 0, "{}", text(&first));
    let (holding, done) = (dir.path().join("holding"), dir.path().join("done"));
    let wait = format!(
        "touch {}; while [ ! -e {} ]; do sleep 0.05; done",
        holding.display(),
        done.display()
    );
    let mut holder = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(["run", "--url", &url, "--key", "job:sq", "--"])
        .args(["sh", "-c", &wait])
        .env_remove("LEASEHOLD_URL")
        .spawn()
        .or_fail("start the holder")?;
    let started = Instant::now();
    while !holding.exists() {
        if let Some(status) = holder.try_wait().or_fail("look at the holder")? {
            return Err(format!("the holder exited ({status}) before its command ran").into());
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the holder never ran"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let held = leasehold(&["run", "--url", &url, "--key", "job:sq", "--", "true"])?;
    std::fs::write(&done, b"done").or_fail("let the holder finish")?;
    assert!(holder.wait().or_fail("wait for the holder")?.success());
    assert_eq!(code(&held), 75, "{}", text(&held));
    let last = leasehold(&[
        "run", "--url", &url, "--key", "job:sq", "--", "sh", "-c", echo,
    ])?;
    assert_eq!(code(&last), 0, "{}", text(&last));
    assert!(fence_of(&last)? > fence_of(&first)?);
    Ok(())
}

/// The Prometheus text a server at `port` serves at `/metrics`.
fn scrape(port: u16) -> Result<String> {
    use std::io::{Read, Write};
    let mut stream =
        std::net::TcpStream::connect(("127.0.0.1", port)).or_fail("connect to the metrics")?;
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .or_fail("ask for the metrics")?;
    let mut body = String::new();
    stream
        .read_to_string(&mut body)
        .or_fail("read the metrics")?;
    Ok(body)
}

/// The value of the series `name` whose labels include `labels`, if served.
fn series(body: &str, name: &str, labels: &[&str]) -> Option<f64> {
    body.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .find(|l| labels.iter().all(|label| l.contains(label)))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// `leasehold run --metrics-addr` serves the run's metrics while the command runs:
/// the lease held (1), the acquire that got it, labelled with the backend and the key; an
/// address already in use is refused before anything is acquired (69).
#[test]
fn run_serves_prometheus_metrics_while_the_command_runs() -> Result {
    let dir =
        leasehold_servers::process::server_dir("cli-metrics").or_fail("a scratch directory")?;
    let url = format!("sqlite://{}", dir.path().join("locks.db").display());
    let taken = std::net::TcpListener::bind("127.0.0.1:0").or_fail("a port to take")?;
    let port = {
        let free = std::net::TcpListener::bind("127.0.0.1:0").or_fail("a free port")?;
        free.local_addr().or_fail("the free port")?.port()
    };
    let (fence_file, done) = (dir.path().join("fence"), dir.path().join("done"));
    let mut holder = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(["run", "--url", &url, "--key", "metrics:job", "--ttl", "30s"])
        .args(["--metrics-addr", &format!("127.0.0.1:{port}"), "--"])
        .args(["sh", "-c", &hold_script(&fence_file, &done)])
        .env_remove("LEASEHOLD_URL")
        .spawn()
        .or_fail("start the holder")?;
    wait_for_file(&fence_file, &mut holder)?;
    let body = scrape(port)?;
    let ours = ["backend=\"sqlite\"", "key=\"metrics:job\""];
    assert_eq!(
        series(&body, "leasehold_leases_held", &ours),
        Some(1.0),
        "{body}"
    );
    let acquired = [ours[0], ours[1], "outcome=\"acquired\""];
    assert_eq!(
        series(&body, "leasehold_acquire_total", &acquired),
        Some(1.0),
        "{body}"
    );
    assert!(body.contains("# HELP leasehold_acquire_total"), "{body}");
    std::fs::write(&done, b"done").or_fail("let the holder finish")?;
    assert!(holder.wait().or_fail("wait for the holder")?.success());

    let in_use = taken.local_addr().or_fail("the taken port")?.to_string();
    let out = leasehold(&[
        "run",
        "--url",
        &url,
        "--key",
        "metrics:job",
        "--metrics-addr",
        &in_use,
        "--",
        "true",
    ])?;
    assert_eq!(code(&out), 69, "{}", text(&out));
    assert!(
        text(&out).contains("cannot serve metrics"),
        "{}",
        text(&out)
    );
    Ok(())
}

/// `leasehold run` on an S3 bucket (moto's server mode): the command gets a fence, a second run
/// finds the key held while the first runs (75), and the next run's fence is greater. The
/// credentials come from the environment, as the URL refuses them.
#[test]
fn run_on_an_s3_bucket_hands_out_growing_fences_and_excludes_a_second_run() -> Result {
    let moto = leasehold_servers::MotoServer::start().or_fail("moto must start")?;
    let url = common::s3_url(&moto, "cli");
    let run = |args: &[&str]| -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_leasehold"));
        command
            .args(["run", "--url", &url, "--key", "job:s3", "--ttl", "10s"])
            .args(args)
            .env_remove("LEASEHOLD_URL")
            .envs(common::S3_CREDENTIALS);
        command
    };
    let dir = leasehold_servers::process::server_dir("cli-s3").or_fail("a scratch directory")?;
    let (fence_file, done) = (dir.path().join("fence"), dir.path().join("done"));
    let mut holder = run(&["--", "sh", "-c", &hold_script(&fence_file, &done)])
        .spawn()
        .or_fail("start the holder")?;
    wait_for_file(&fence_file, &mut holder)?;
    let first = common::read_fence(&fence_file)?;
    assert!(first > 0, "the first run's fence: {first}");

    let held = run(&["--", "true"]).output().or_fail("run a second")?;
    assert_eq!(code(&held), 75, "{}", text(&held));

    std::fs::write(&done, b"done").or_fail("let the holder finish")?;
    assert!(holder.wait().or_fail("wait for the holder")?.success());
    let next = run(&["--", "sh", "-c", "echo $LEASEHOLD_FENCE"])
        .output()
        .or_fail("run a third")?;
    assert_eq!(code(&next), 0, "{}", text(&next));
    let fence: u64 = String::from_utf8_lossy(&next.stdout)
        .trim()
        .parse()
        .or_fail(format!("the fence in {}", text(&next)))?;
    assert!(
        fence > first,
        "the next run's fence {fence} must exceed {first}"
    );
    Ok(())
}
