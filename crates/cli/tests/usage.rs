//! The `leasehold` command's usage as a user meets it, with no server: help and usage errors
//! and their exit statuses, the `--` separator, shell completions and the manual page.

use std::process::{Command, Output, Stdio};

type Result = std::result::Result<(), String>;

// The few helpers of tests/common this file needs: the rest start servers, which it does not.
fn leasehold(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(args)
        .env_remove("LEASEHOLD_URL")
        .output()
        .unwrap_or_else(|e| panic!("cannot run leasehold: {e}"))
}

fn code(out: &Output) -> i32 {
    out.status.code().unwrap_or(-1)
}

fn text(out: &Output) -> String {
    format!("stdout: {}\nstderr: {}", stdout(out), stderr(out))
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Help is asked for in each of these ways; it goes to stdout with status 0.
#[test]
fn help_is_on_stdout_with_status_0() -> Result {
    for args in [
        &[][..],
        &["-h"],
        &["--help"],
        &["help"],
        &["help", "run"],
        &["run", "--help"],
        &["status", "-h"],
        &["migrate", "--help"],
    ] {
        let out = leasehold(args);
        if code(&out) != 0 || !stdout(&out).contains("Usage: leasehold") || !out.stderr.is_empty() {
            return Err(format!("{args:?}: {}", text(&out)));
        }
    }
    // What today's help says, which docs/cli.md and scripts rely on: the URL schemes, the
    // default authority, the command's environment, the exit statuses.
    let help = stdout(&leasehold(&["--help"]));
    for part in [
        "sqlite:///path/to/locks.db",
        "etcds://",
        "$XDG_STATE_HOME/leasehold/locks.db",
        "LEASEHOLD_FENCE",
        "the lock is held by someone else",
        "leasehold completions bash",
    ] {
        if !help.contains(part) {
            return Err(format!("no `{part}` in the help:\n{help}"));
        }
    }
    if help.contains("__watch-group") {
        return Err(format!("the internal watcher shows in the help:\n{help}"));
    }
    let run = stdout(&leasehold(&["run", "--help"]));
    for part in [
        "LEASEHOLD_FENCE",
        "--busy-exit-code",
        "[default: 10s]",
        "SIGKILL",
        "after `--`",
        "the lease was lost",
    ] {
        if !run.contains(part) {
            return Err(format!("no `{part}` in run's help:\n{run}"));
        }
    }
    Ok(())
}

/// Usage errors exit 64 (EX_USAGE, as docs/cli.md says; clap's own status would be 2), with
/// clap's message on stderr and nothing on stdout.
#[test]
fn usage_errors_exit_64_and_say_why() -> Result {
    for (args, says) in [
        (&["walk"][..], "unrecognized subcommand"),
        (&["run", "--key", "k", "true"], "unexpected argument 'true'"),
        (&["run", "--key", "k"], "<COMMAND>"),
        (&["run", "--", "true"], "--key <KEY>"),
        (&["run", "--key", "k", "--bogus", "--", "true"], "--bogus"),
        (
            &["run", "--key", "k", "--ttl", "10", "--", "true"],
            "needs a unit",
        ),
        (
            &["run", "--key", "k", "--wait", "2w", "--", "true"],
            "unknown unit `w`",
        ),
        (
            &["run", "--key", "k", "-E", "300", "--", "true"],
            "not an exit status",
        ),
        (&["status"], "--key <KEY>|--prefix <P>"),
        (&["status", "--key", "k", "--limit", "3"], "--limit"),
        (&["migrate"], "LEASEHOLD_URL"),
        (&["completions", "tcsh"], "possible values"),
        (&["man", "nope"], "possible values"),
    ] {
        let out = leasehold(args);
        if code(&out) != 64 || !stderr(&out).contains(says) || !out.stdout.is_empty() {
            return Err(format!("{args:?} (want 64 and `{says}`): {}", text(&out)));
        }
    }
    Ok(())
}

/// Everything after the first `--` goes to the command as it is: leasehold's own options, a
/// second `--`, `--help`.
#[test]
fn after_the_separator_everything_is_the_commands() -> Result {
    let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
    let url = format!("sqlite://{}", dir.path().join("locks.db").display());
    let out = leasehold(&[
        "run",
        "--url",
        &url,
        "--key",
        "sep",
        "--",
        "sh",
        "-c",
        "printf '%s|' \"$@\"",
        "sh",
        "--ttl",
        "--",
        "--help",
        "-V",
    ]);
    if code(&out) != 0 || stdout(&out) != "--ttl|--|--help|-V|" {
        return Err(text(&out));
    }
    Ok(())
}

/// `leasehold completions SHELL` prints a script for each shell clap_complete knows; bash's is
/// valid bash (`bash -n`) and completes the subcommands.
#[test]
fn completions_are_printed_for_each_shell() -> Result {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let out = leasehold(&["completions", shell]);
        let script = stdout(&out);
        if code(&out) != 0 || !script.contains("run") || !script.contains("busy-exit-code") {
            return Err(format!("{shell}: {}", text(&out)));
        }
        if script.contains("__watch-group") {
            return Err(format!("{shell}: offers the internal watcher"));
        }
    }
    let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
    let file = dir.path().join("leasehold.bash");
    std::fs::write(&file, leasehold(&["completions", "bash"]).stdout)
        .map_err(|e| format!("write: {e}"))?;
    let checked = Command::new("bash")
        .arg("-n")
        .arg(&file)
        .output()
        .map_err(|e| format!("bash: {e}"))?;
    if !checked.status.success() {
        return Err(format!("bash -n: {}", text(&checked)));
    }
    let script = std::fs::read_to_string(&file).map_err(|e| format!("read: {e}"))?;
    for word in ["run", "status", "migrate", "complete -F"] {
        if !script.contains(word) {
            return Err(format!("no `{word}` in bash's completion"));
        }
    }
    Ok(())
}

/// `leasehold man [SUBCOMMAND]` prints a roff page: after roff's preamble, `.TH`.
#[test]
fn man_pages_are_roff() -> Result {
    for (args, title) in [
        (&["man"][..], ".TH leasehold 1"),
        (&["man", "run"], ".TH leasehold-run 1"),
        (&["man", "status"], ".TH leasehold-status 1"),
        (&["man", "migrate"], ".TH leasehold-migrate 1"),
        (&["man", "completions"], ".TH leasehold-completions 1"),
        (&["man", "man"], ".TH leasehold-man 1"),
    ] {
        let out = leasehold(args);
        let page = stdout(&out);
        let first = page
            .lines()
            .find(|l| !l.starts_with(".ie") && !l.starts_with(".el"));
        if code(&out) != 0 || !first.is_some_and(|l| l.starts_with(title)) {
            return Err(format!("{args:?}: {}", text(&out)));
        }
        if !page.contains(".SH SYNOPSIS") || !page.contains(".SH DESCRIPTION") {
            return Err(format!("{args:?}: sections missing:\n{page}"));
        }
        // The text after the options belongs to the description; `help` has no page.
        if page.contains(".SH EXTRA") || page.contains("leasehold\\-help") {
            return Err(format!(
                "{args:?}: an EXTRA section or a help page:\n{page}"
            ));
        }
    }
    let run = stdout(&leasehold(&["man", "run"]));
    for part in ["busy\\-exit\\-code", "LEASEHOLD_FENCE", "Exit status"] {
        if !run.contains(part) {
            return Err(format!("no `{part}` in run's page:\n{run}"));
        }
    }
    Ok(())
}

/// `leasehold completions bash | head -1` and friends: a reader that went away is not a panic.
#[test]
fn generated_text_survives_a_closed_pipe() -> Result {
    for args in [
        &["completions", "bash"][..],
        &["man"],
        &["run", "--help"],
        &[],
    ] {
        let (reader, writer) = std::io::pipe().map_err(|e| format!("pipe: {e}"))?;
        drop(reader);
        let out = Command::new(env!("CARGO_BIN_EXE_leasehold"))
            .args(args)
            .stdout(writer)
            .stderr(Stdio::piped())
            .output()
            .map_err(|e| format!("run: {e}"))?;
        if code(&out) != 0 || stderr(&out).contains("panicked") {
            return Err(format!("{args:?}: {}", text(&out)));
        }
    }
    Ok(())
}
