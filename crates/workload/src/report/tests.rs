use leasehold_conformance::kit::{ErrOrFail, OrFail, TestResult};
use std::fmt::Write;

use leasehold_conformance::workload::History;

use super::{render, ReportRun};

const S: u64 = 1_000_000_000;
const MS: u64 = 1_000_000;

/// Two workers on one key; worker 1 is paused while holding, worker 2 takes the key, and
/// worker 1's late write is refused. Then a normal hand-off from 1 to 2.
fn fenced_history(header: bool) -> History {
    let mut lines = Vec::new();
    if header {
        lines.push(r#"{"t":0,"event":"run","seed":7,"backend":"memory","fenced":true,"failover_unsafe":false}"#.to_string());
    }
    let ev = |t: u64, rest: &str| format!(r#"{{"t":{t},{rest}}}"#);
    let at = |ms: u64| S + ms * MS;
    lines.extend([
        ev(
            at(0),
            r#""event":"acquire_invoke","worker":1,"key":"k0","ttl_ns":500000000"#,
        ),
        ev(
            at(10),
            &format!(
                r#""event":"acquire_ok","worker":1,"key":"k0","fence":1,"deadline":{}"#,
                at(500)
            ),
        ),
        ev(
            at(20),
            r#""event":"read_invoke","worker":1,"key":"k0","fence":1"#,
        ),
        ev(
            at(30),
            r#""event":"read_ok","worker":1,"key":"k0","fence":1,"elements":[]"#,
        ),
        ev(
            at(40),
            r#""event":"fault_start","fault":1,"kind":"pause_worker","worker":1"#,
        ),
        ev(
            at(50),
            r#""event":"acquire_invoke","worker":2,"key":"k0","ttl_ns":500000000"#,
        ),
        ev(
            at(600),
            &format!(
                r#""event":"acquire_ok","worker":2,"key":"k0","fence":2,"deadline":{}"#,
                at(1100)
            ),
        ),
        ev(
            at(610),
            r#""event":"read_invoke","worker":2,"key":"k0","fence":2"#,
        ),
        ev(
            at(620),
            r#""event":"read_ok","worker":2,"key":"k0","fence":2,"elements":[]"#,
        ),
        ev(
            at(630),
            r#""event":"write_invoke","worker":2,"key":"k0","fence":2,"element":200"#,
        ),
        ev(
            at(640),
            r#""event":"write_ok","worker":2,"key":"k0","fence":2,"element":200,"prior":2"#,
        ),
        ev(
            at(650),
            r#""event":"release_invoke","worker":2,"key":"k0","fence":2"#,
        ),
        ev(
            at(660),
            r#""event":"release_ok","worker":2,"key":"k0","fence":2"#,
        ),
        ev(
            at(1000),
            r#""event":"fault_start","fault":2,"kind":"kill_authority","node":"n1""#,
        ),
        ev(
            at(1000),
            r#""event":"fault_end","fault":1,"kind":"pause_worker","worker":1"#,
        ),
        ev(
            at(1010),
            r#""event":"write_invoke","worker":1,"key":"k0","fence":1,"element":100"#,
        ),
        ev(
            at(1020),
            r#""event":"write_stale","worker":1,"key":"k0","fence":1,"element":100,"newest":2"#,
        ),
        ev(
            at(1030),
            r#""event":"lost","worker":1,"key":"k0","fence":1,"reason":"expired""#,
        ),
        ev(
            at(1200),
            r#""event":"fault_end","fault":2,"kind":"kill_authority","node":"n1""#,
        ),
        ev(
            at(1240),
            r#""event":"acquire_invoke","worker":1,"key":"k0","ttl_ns":500000000"#,
        ),
        ev(
            at(1250),
            r#""event":"acquire_invoke","worker":2,"key":"k0","ttl_ns":500000000"#,
        ),
        ev(
            at(1260),
            &format!(
                r#""event":"acquire_ok","worker":1,"key":"k0","fence":3,"deadline":{}"#,
                at(1760)
            ),
        ),
        ev(
            at(1270),
            r#""event":"read_invoke","worker":1,"key":"k0","fence":3"#,
        ),
        ev(
            at(1280),
            r#""event":"read_ok","worker":1,"key":"k0","fence":3,"elements":[200]"#,
        ),
        ev(
            at(1290),
            r#""event":"write_invoke","worker":1,"key":"k0","fence":3,"element":101"#,
        ),
        ev(
            at(1300),
            r#""event":"write_ok","worker":1,"key":"k0","fence":3,"element":101,"prior":3"#,
        ),
        ev(
            at(1310),
            r#""event":"release_invoke","worker":1,"key":"k0","fence":3"#,
        ),
        ev(
            at(1320),
            r#""event":"release_ok","worker":1,"key":"k0","fence":3"#,
        ),
        ev(
            at(1360),
            &format!(
                r#""event":"acquire_ok","worker":2,"key":"k0","fence":4,"deadline":{}"#,
                at(1860)
            ),
        ),
        ev(
            at(1370),
            r#""event":"release_invoke","worker":2,"key":"k0","fence":4"#,
        ),
        ev(
            at(1380),
            r#""event":"release_ok","worker":2,"key":"k0","fence":4"#,
        ),
        ev(
            at(2000),
            r#""event":"final","key":"k0","elements":[200,101],"last_fence":3"#,
        ),
    ]);
    History::from_jsonl(&(lines.join("\n") + "\n")).expect("the test history parses")
}

/// The unfenced control: worker 1's late write overwrites worker 2's acknowledged one.
fn control_history() -> History {
    let at = |ms: u64| S + ms * MS;
    let text = [
        r#"{"t":0,"event":"run","seed":7,"backend":"memory","fenced":false,"failover_unsafe":false}"#.to_string(),
        format!(r#"{{"t":{},"event":"acquire_invoke","worker":1,"key":"k0","ttl_ns":500000000}}"#, at(0)),
        format!(r#"{{"t":{},"event":"acquire_ok","worker":1,"key":"k0","fence":1,"deadline":{}}}"#, at(10), at(500)),
        format!(r#"{{"t":{},"event":"read_invoke","worker":1,"key":"k0"}}"#, at(20)),
        format!(r#"{{"t":{},"event":"read_ok","worker":1,"key":"k0","elements":[]}}"#, at(30)),
        format!(r#"{{"t":{},"event":"fault_start","fault":1,"kind":"pause_worker","worker":1}}"#, at(40)),
        format!(r#"{{"t":{},"event":"acquire_invoke","worker":2,"key":"k0","ttl_ns":500000000}}"#, at(50)),
        format!(r#"{{"t":{},"event":"acquire_ok","worker":2,"key":"k0","fence":2,"deadline":{}}}"#, at(600), at(1100)),
        format!(r#"{{"t":{},"event":"read_invoke","worker":2,"key":"k0"}}"#, at(610)),
        format!(r#"{{"t":{},"event":"read_ok","worker":2,"key":"k0","elements":[]}}"#, at(620)),
        format!(r#"{{"t":{},"event":"write_invoke","worker":2,"key":"k0","fence":2,"element":200}}"#, at(630)),
        format!(r#"{{"t":{},"event":"write_ok","worker":2,"key":"k0","fence":2,"element":200}}"#, at(640)),
        format!(r#"{{"t":{},"event":"release_invoke","worker":2,"key":"k0","fence":2}}"#, at(650)),
        format!(r#"{{"t":{},"event":"fault_end","fault":1,"kind":"pause_worker","worker":1}}"#, at(1000)),
        format!(r#"{{"t":{},"event":"write_invoke","worker":1,"key":"k0","fence":1,"element":100}}"#, at(1010)),
        format!(r#"{{"t":{},"event":"write_ok","worker":1,"key":"k0","fence":1,"element":100}}"#, at(1020)),
        format!(r#"{{"t":{},"event":"release_invoke","worker":1,"key":"k0","fence":1}}"#, at(1030)),
        format!(r#"{{"t":{},"event":"final","key":"k0","elements":[100],"last_fence":2}}"#, at(2000)),
    ]
    .join("\n");
    History::from_jsonl(&(text + "\n")).expect("the control history parses")
}

fn run(label: &str, history: History) -> ReportRun {
    ReportRun {
        label: label.to_string(),
        history,
    }
}

fn read(dir: &std::path::Path, name: &str) -> TestResult<String> {
    std::fs::read_to_string(dir.join(name)).or_fail(format!("the report file {name} exists"))
}

#[test]
fn readme_has_the_figures_row_and_the_control_comparison() -> TestResult {
    let dir = tempfile::tempdir().or_fail("tempdir")?;
    let runs = [
        run("memory fenced", fenced_history(true)),
        run("memory control", control_history()),
    ];
    render(&runs, "Two hand-made histories.", dir.path()).or_fail("render")?;
    let md = read(dir.path(), "README.md")?;
    // The lock's evidence comes before the resource's figures.
    assert!(
        md.contains(
            "| run | backend | resource | mode | verdict | fences reissued | keys granted while a lease was \
             valid | leases ended early | hand-offs during a pause | writes acknowledged | \
             acknowledged lost |"
        ),
        "{md}"
    );
    assert!(
        md.contains(
            "| memory fenced | memory | postgres | fenced | pass | 0 | 0 | 0 | 1 | 2 | 0 of 2 | 0 | 0 | 1 | 0 | 1 |"
        ),
        "{md}"
    );
    assert!(
        md.contains(
            "| memory control | memory | postgres | unfenced control | pass | 0 | 0 | 0 | 1 | 2 | 1 of 2 (50.0%) | 0 | 1 |"
        ),
        "{md}"
    );
    assert!(
        md.contains("| memory | 1 | 0 | 0 | 0 of 2 | 0 | 1 | 1 of 2 (50.0%) | 1 |"),
        "{md}"
    );
    assert!(
        md.contains("fences kept every acknowledged write; without them 1 of 2 (50.0%) were lost"),
        "{md}"
    );
    assert!(
        md.contains("| run | pause_worker | kill_authority | total |"),
        "{md}"
    );
    assert!(md.contains("| memory fenced | 1 | 1 | 2 |"), "{md}");
    assert!(md.contains("## How the runs were made\n\nTwo hand-made histories."));
    // Fenced first within a backend, whatever the order given.
    let fenced_at = md.find("### memory fenced").or_fail("fenced verdict")?;
    let control_at = md.find("### memory control").or_fail("control verdict")?;
    assert!(fenced_at < control_at);
    Ok(())
}

#[test]
fn html_is_one_page_with_every_plot_and_nothing_external() -> TestResult {
    let dir = tempfile::tempdir().or_fail("tempdir")?;
    let runs = [run("memory fenced", fenced_history(true))];
    render(&runs, "how <b>escaped</b>", dir.path()).or_fail("render")?;
    let html = read(dir.path(), "report.html")?;

    assert_eq!(
        html.matches("<svg").count(),
        4,
        "timeline, fences, two histograms"
    );
    for text in [
        "Timeline: who held a key, faults, writes",
        "Fences granted over time, per key",
        "hand-off latency",
        "acquire latency",
        "seconds since the run started",
        "milliseconds",
        "worker 1",
        "worker 2",
        "held past its deadline",
        "worker paused",
        "kill_authority",
        "key k0",
    ] {
        assert!(html.contains(text), "report.html lacks {text:?}");
    }
    assert!(html.contains("how &lt;b&gt;escaped&lt;/b&gt;"));
    let lower = html.to_lowercase();
    for external in [
        "src=\"http",
        "href=\"http",
        "src='http",
        "href='http",
        "url(",
        "@import",
        "<script",
        "<link",
        "<img",
    ] {
        assert!(
            !lower.contains(external),
            "report.html references {external:?}"
        );
    }
    Ok(())
}

#[test]
fn a_history_without_header_is_a_row_not_an_error() -> TestResult {
    let dir = tempfile::tempdir().or_fail("tempdir")?;
    let runs = [
        run("headless", fenced_history(false)),
        run("empty", History::default()),
    ];
    render(&runs, "", dir.path()).or_fail("render without headers")?;
    let md = read(dir.path(), "README.md")?;
    assert!(
        md.contains("| headless | ? | ? | ? | not judged: no run header | — |"),
        "{md}"
    );
    assert!(
        md.contains("| empty | ? | ? | ? | not judged: no run header |"),
        "{md}"
    );
    let html = read(dir.path(), "report.html")?;
    assert!(html.contains("not judged: no run header"));
    assert_eq!(html.matches("<svg").count(), 8);
    Ok(())
}

#[test]
fn no_runs_still_renders() -> TestResult {
    let dir = tempfile::tempdir().or_fail("tempdir")?;
    render(&[], "nothing ran", dir.path().join("nested/out").as_path()).or_fail("render")?;
    assert!(read(&dir.path().join("nested/out"), "README.md")?.contains("No runs."));
    Ok(())
}

#[test]
fn unwritable_output_is_an_io_error() -> TestResult {
    let dir = tempfile::tempdir().or_fail("tempdir")?;
    let file = dir.path().join("a-file");
    std::fs::write(&file, "").or_fail("write")?;
    let err = render(&[], "", &file.join("sub")).err_or_fail("a file is in the way")?;
    assert!(matches!(err, super::ReportError::Io { .. }), "{err}");
    Ok(())
}

/// Ten minutes, eight workers on two keys, tens of thousands of events, with pauses, kills
/// and server faults.
fn long_history() -> History {
    let mut text = String::from(
        r#"{"t":0,"event":"run","seed":1,"backend":"memory","fenced":true,"failover_unsafe":false}"#,
    );
    text.push('\n');
    let mut fence = [0u64; 2];
    let mut element = 0u64;
    let mut t = S;
    let mut fault = 0u64;
    let end = S + 600 * S;
    let mut step = 0u64;
    while t < end {
        let worker = (step % 8) as u32;
        let k = (step % 2) as usize;
        fence[k] += 1;
        element += 1;
        let f = fence[k];
        for (dt, line) in [
            (
                0,
                format!(
                    r#""event":"acquire_invoke","worker":{worker},"key":"k{k}","ttl_ns":500000000"#
                ),
            ),
            (
                2 * MS,
                format!(
                    r#""event":"acquire_ok","worker":{worker},"key":"k{k}","fence":{f},"deadline":{}"#,
                    t + 502 * MS
                ),
            ),
            (
                3 * MS,
                format!(
                    r#""event":"write_invoke","worker":{worker},"key":"k{k}","fence":{f},"element":{element}"#
                ),
            ),
            (
                4 * MS,
                format!(
                    r#""event":"write_ok","worker":{worker},"key":"k{k}","fence":{f},"element":{element}"#
                ),
            ),
            (
                5 * MS,
                format!(r#""event":"release_invoke","worker":{worker},"key":"k{k}","fence":{f}"#),
            ),
            (
                6 * MS,
                format!(r#""event":"release_ok","worker":{worker},"key":"k{k}","fence":{f}"#),
            ),
        ] {
            let _ = writeln!(text, r#"{{"t":{},{line}}}"#, t + dt);
        }
        if step.is_multiple_of(500) {
            fault += 1;
            let kind = ["pause_worker", "kill_worker", "kill_authority"][(fault % 3) as usize];
            let _ = writeln!(
                text,
                r#"{{"t":{},"event":"fault_start","fault":{fault},"kind":"{kind}","worker":{worker}}}"#,
                t + 7 * MS
            );
            let _ = writeln!(
                text,
                r#"{{"t":{},"event":"fault_end","fault":{fault},"kind":"{kind}","worker":{worker}}}"#,
                t + 8 * MS
            );
        }
        t += 20 * MS;
        step += 1;
    }
    let _ = writeln!(
        text,
        r#"{{"t":{t},"event":"final","key":"k0","elements":[],"last_fence":{}}}"#,
        fence[0]
    );
    History::from_jsonl(&text).expect("the long history parses")
}

#[test]
fn a_reissued_fence_is_declared_and_circled() -> TestResult {
    let text = [
        r#"{"t":0,"event":"run","seed":3,"backend":"redis","fenced":true,"failover_unsafe":true}"#,
        r#"{"t":1000000000,"event":"acquire_invoke","worker":1,"key":"k0","ttl_ns":500000000}"#,
        r#"{"t":1010000000,"event":"acquire_ok","worker":1,"key":"k0","fence":5}"#,
        r#"{"t":1020000000,"event":"release_invoke","worker":1,"key":"k0","fence":5}"#,
        r#"{"t":1030000000,"event":"release_ok","worker":1,"key":"k0","fence":5}"#,
        r#"{"t":1031000000,"event":"fault_start","fault":1,"kind":"promote_replica","node":"redis-2"}"#,
        r#"{"t":1032000000,"event":"fault_end","fault":1,"kind":"promote_replica","node":"redis-2"}"#,
        r#"{"t":1040000000,"event":"acquire_invoke","worker":2,"key":"k0","ttl_ns":500000000}"#,
        r#"{"t":1050000000,"event":"acquire_ok","worker":2,"key":"k0","fence":5}"#,
        r#"{"t":1060000000,"event":"release_invoke","worker":2,"key":"k0","fence":5}"#,
        r#"{"t":2000000000,"event":"final","key":"k0","elements":[]}"#,
    ]
    .join("\n");
    let history = History::from_jsonl(&(text + "\n")).or_fail("parses")?;
    let dir = tempfile::tempdir().or_fail("tempdir")?;
    render(&[run("redis failover", history)], "", dir.path()).or_fail("render")?;
    let md = read(dir.path(), "README.md")?;
    assert!(
        md.contains("| redis failover | redis | postgres | fenced | declared |"),
        "{md}"
    );
    assert!(md.contains("declared: 1 x fence reissued"), "{md}");
    let html = read(dir.path(), "report.html")?;
    assert!(html.contains("fence reissued (1)"));
    Ok(())
}

/// A run line as the runner writes it: the commit, the server versions and the command.
fn recorded_history() -> History {
    let text = fenced_history(true).to_jsonl().replacen(
        r#""early_revocation":false"#,
        r#""early_revocation":false,"commit":"0123abcd","versions":{"etcd":"3.4.23","postgres":"15.18"},"command":"cargo run -p leasehold-workload -- run --backend etcd --seed 7""#,
        1,
    );
    History::from_jsonl(&text).expect("the recorded history parses")
}

#[test]
fn every_run_shows_its_commit_server_versions_and_the_command_that_reruns_it() -> TestResult {
    let dir = tempfile::tempdir().or_fail("tempdir")?;
    let runs = [
        run("etcd fenced", recorded_history()),
        run("old run", fenced_history(true)),
    ];
    render(&runs, "", dir.path()).or_fail("render")?;
    let md = read(dir.path(), "README.md")?;
    let html = read(dir.path(), "report.html")?;
    for page in [&md, &html] {
        for text in [
            "commit: <code>0123abcd</code>",
            "server versions: <code>etcd 3.4.23, postgres 15.18</code>",
            "reproduce with: <code>cargo run -p leasehold-workload -- run --backend etcd --seed 7</code>",
            "history: <code>etcd-fenced.history.jsonl.gz</code>",
            // A history from before these were recorded says so instead of showing nothing.
            "commit: <code>not recorded</code>",
            "reproduce with: <code>not recorded (seed 7)</code>",
        ] {
            let text = if std::ptr::eq(page, &md) {
                text.replace("<code>", "`").replace("</code>", "`")
            } else {
                text.to_string()
            };
            assert!(page.contains(&text), "{text:?} missing from:\n{page}");
        }
    }
    Ok(())
}

#[test]
fn each_history_is_kept_beside_the_report_compressed_and_reads_back() -> TestResult {
    let dir = tempfile::tempdir().or_fail("tempdir")?;
    let history = recorded_history();
    render(&[run("etcd fenced", history.clone())], "", dir.path()).or_fail("render")?;
    let kept = dir.path().join("etcd-fenced.history.jsonl.gz");
    let bytes = std::fs::read(&kept).or_fail("the history is kept beside the report")?;
    assert_eq!(&bytes[..2], &[0x1f, 0x8b], "gzip's magic number");
    assert!(bytes.len() < history.to_jsonl().len());
    assert_eq!(History::read_file(&kept).or_fail("reads back")?, history);
    // A report rendered again from the kept histories is the same report.
    let again = tempfile::tempdir().or_fail("tempdir")?;
    let reread = History::read_file(&kept).or_fail("reads back")?;
    render(&[run("etcd fenced", reread)], "", again.path()).or_fail("render again")?;
    assert_eq!(
        read(dir.path(), "README.md")?,
        read(again.path(), "README.md")?
    );
    Ok(())
}

/// The page budget: a long run's report must open quickly, so its plots are drawn as a few
/// paths, not an element per event. Eight ten-minute runs (four backends, two arms) stay
/// within 320 KB; an element per held interval or write took 160 KB per run.
const HTML_BUDGET_PER_RUN: u64 = 40_000;

#[test]
fn a_long_run_keeps_the_page_within_its_budget() -> TestResult {
    let history = long_history();
    let dir = tempfile::tempdir().or_fail("tempdir")?;
    render(&[run("long", history)], "", dir.path()).or_fail("render")?;
    let size = std::fs::metadata(dir.path().join("report.html"))
        .or_fail("html")?
        .len();
    println!("report.html: {size} bytes for one ten-minute run");
    let html = read(dir.path(), "report.html")?;
    assert_eq!(html.matches("<svg").count(), 4, "every figure is drawn");
    assert!(html.contains("write accepted") && html.contains("worker paused"));
    assert!(
        size < HTML_BUDGET_PER_RUN,
        "report.html is {size} bytes for one ten-minute run, over its {HTML_BUDGET_PER_RUN}"
    );
    Ok(())
}
