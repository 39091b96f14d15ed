//! The examples are the main job: run them as a user would and check what they print.

use std::path::PathBuf;
use std::process::Command;

#[cfg(feature = "postgres")]
use leasehold_conformance::kit::ErrOrFail;
use leasehold_conformance::kit::{OrFail, TestResult};
#[cfg(feature = "postgres")]
use leasehold_conformance::Failure;

/// `target/<profile>/examples/<name>`, built by `cargo test` next to this test binary.
fn example(name: &str) -> TestResult<PathBuf> {
    let exe = std::env::current_exe().or_fail("the test binary's path")?;
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .or_fail(format!("the profile directory above {}", exe.display()))?;
    let path = profile_dir.join("examples").join(name);
    assert!(
        path.is_file(),
        "example {name} not built at {} (cargo test builds examples unless a single --test target is named)",
        path.display()
    );
    Ok(path)
}

fn run(name: &str, args: &[&str]) -> TestResult<String> {
    run_with(name, args, &[])
}

fn run_with(name: &str, args: &[&str], env: &[(&str, &str)]) -> TestResult<String> {
    let out = Command::new(example(name)?)
        .args(args)
        .envs(env.iter().copied())
        .output()
        .or_fail(format!("run the {name} example"))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{name} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(stdout)
}

/// Workers contend while the metrics are served; the example scrapes itself and fails
/// unless acquires, hold-time ratios and at least one refused stale write are in the scrape.
#[test]
fn prometheus_serves_what_contending_workers_record() -> TestResult {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .or_fail("bind a free port")?
        .local_addr()
        .or_fail("the free port's address")?
        .port();
    let addr = format!("127.0.0.1:{port}");
    let out = run_with(
        "prometheus",
        &[],
        &[
            ("LEASEHOLD_METRICS_ADDR", &addr),
            ("LEASEHOLD_EXAMPLE_SECONDS", "2"),
        ],
    )?;
    assert!(
        out.contains(
            "leasehold_acquire_total{backend=\"memory\",key=\"report\",outcome=\"acquired\"}"
        ),
        "{out}"
    );
    assert!(
        out.contains("leasehold_fence_rejections_total{resource=\"register\"}"),
        "{out}"
    );
    assert!(
        out.contains("leasehold_leases_held{backend=\"memory\",key=\"report\"} 0"),
        "{out}"
    );
    Ok(())
}

/// Three nodes elected in turn on SQLite; the paused first leader's late command is
/// refused by the follower, epochs grow, and the observer sees each leader with its value.
#[cfg(feature = "sqlite")]
#[test]
fn election_refuses_the_deposed_leader() -> TestResult {
    let out = run("election", &[])?;
    assert!(
        out.contains("`drop table users` with epoch 1: REFUSED"),
        "{out}"
    );
    assert!(out.contains("one leader at a time."), "{out}");
    assert_eq!(out.matches("elected with epoch").count(), 3, "{out}");
    assert!(out.contains("value \"node-b.internal:7000\""), "{out}");
    Ok(())
}

#[cfg(feature = "sqlite")]
#[test]
fn billing_charges_once_and_refuses_the_paused_worker() -> TestResult {
    let out = run("billing", &[])?;
    assert!(out.contains("charge REFUSED"), "{out}");
    assert!(out.contains("charged exactly once."), "{out}");
    assert_eq!(out.matches("won the lock").count(), 1, "{out}");
    Ok(())
}

/// A payout whose provider pays but answers late (the worker's lease runs out, another takes
/// over) across 12 seeded rounds: every payout made exactly once (or, declined, FAILED with
/// nothing paid), and the rounds really exercised the late answer and the retry with the same
/// key.
#[cfg(feature = "postgres")]
#[test]
fn payout_is_made_exactly_once_across_seeded_interleavings() -> TestResult {
    let server = leasehold_servers::PostgresServer::start().or_fail("PostgreSQL starts")?;
    let out = run("payout", &[&server.url(), "12", "7"])?;
    println!("{out}");
    assert!(
        out.contains("every payout made exactly once, or FAILED with nothing paid."),
        "{out}"
    );
    let summary = out
        .lines()
        .find(|l| l.starts_with("12 round(s), seed 7:"))
        .or_fail(format!("the summary line in:\n{out}"))?;
    assert!(
        summary.ends_with("12 right (paid exactly once, or FAILED with nothing paid)"),
        "{summary}"
    );
    assert!(!summary.contains("too late in 0,"), "{summary}");
    assert!(!summary.contains("same key in 0;"), "{summary}");
    // One round tells the story line by line.
    let story = run("payout", &[&server.url(), "1", "3"])?;
    println!("{story}");
    assert!(
        story.contains("calling the provider with key pk_"),
        "{story}"
    );
    assert!(
        story.contains("every payout made exactly once, or FAILED with nothing paid."),
        "{story}"
    );
    Ok(())
}

/// The payout's fence is what keeps a stale worker's late answer from overwriting a newer
/// worker's outcome: the provider declines A's call (a decline that keeps no record of the key),
/// A freezes past its lease, B retries with the same key and is paid, and A then records FAILED,
/// a transition a payout may take after SUBMITTED (a returned transfer). With the fence, A's
/// FAILED is refused in some rounds and every row tells what the provider did; run with
/// `unfenced` (the same transitions without the fence check), the same seeded rounds end with
/// a row saying FAILED for money that moved, and the example fails.
#[cfg(feature = "postgres")]
#[test]
fn payout_needs_the_fence_against_a_late_failed_answer() -> TestResult {
    let server = leasehold_servers::PostgresServer::start().or_fail("PostgreSQL")?;
    let fenced = run("payout", &[&server.url(), "12", "7"])?;
    let summary = fenced
        .lines()
        .find(|l| l.starts_with("12 round(s), seed 7:"))
        .ok_or_else(|| Failure::new(format!("no summary line:\n{fenced}")))?;
    if summary.contains("stale FAILED was refused by the fence in 0,") {
        return Err(Failure::new(format!(
            "no round met a stale FAILED answer: {summary}"
        )));
    }
    let unfenced = Command::new(example("payout")?)
        .args([&server.url(), "12", "7", "unfenced"])
        .output()
        .or_fail("run payout unfenced")?;
    let said = String::from_utf8_lossy(&unfenced.stdout);
    println!("{summary}\n{said}");
    if unfenced.status.success() || !said.contains("FAILED recorded over SUBMITTED") {
        return Err(Failure::new(format!(
            "without the fence the payout example still passed ({}): the fence was not what \
             kept it right\n{said}",
            unfenced.status
        )));
    }
    Ok(())
}

#[cfg(feature = "postgres")]
#[test]
fn invoice_is_paid_once_in_a_real_postgres() -> TestResult {
    let server = leasehold_servers::PostgresServer::start().or_fail("PostgreSQL starts")?;
    let out = run("invoice", &[&server.url()])?;
    assert!(out.contains("charge REFUSED"), "{out}");
    assert!(out.contains("charged exactly once."), "{out}");
    Ok(())
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_picks_postgres_by_scheme_and_hides_the_password() -> TestResult {
    let server = tokio::task::spawn_blocking(|| {
        leasehold_servers::PostgresServer::start_with_password("pw-s3cret")
    })
    .await
    .or_fail("start PostgreSQL off the runtime")?
    .or_fail("PostgreSQL with a password starts")?;
    for scheme_url in [
        server.url_with_password("pw-s3cret"),
        server
            .url_with_password("pw-s3cret")
            .replacen("postgres://", "postgresql://", 1),
    ] {
        let authority = leasehold::connect(&scheme_url)
            .await
            .or_fail("connect with the right password")?;
        assert_eq!(authority.capabilities().backend, "postgres");
        assert!(!format!("{authority:?}").contains("pw-s3cret"));
    }
    let err = leasehold::connect(&server.url_with_password("hunter2"))
        .await
        .err_or_fail("connect with a wrong password")?;
    assert!(
        matches!(err, leasehold::Error::Unauthorized { .. }),
        "{err:?}"
    );
    assert!(!format!("{err} {err:?}").contains("hunter2"));
    Ok(())
}
