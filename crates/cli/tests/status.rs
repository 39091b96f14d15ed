//! `leasehold status`: what it says of a key and of a prefix, on SQLite, the per-user default,
//! Redis and PostgreSQL, as runs take and release keys; its usage and exit statuses.

use std::process::Command;

mod common;

use common::{
    code, hold_script, leasehold, read_fence, redis, text, url, wait_for_file, OrFail, Result,
};

/// The value of `"field":` in a flat JSON object, as written (`null`, a number, `true`, a string
/// with its quotes).
fn json_field(json: &str, field: &str) -> Result<String> {
    let at = json
        .find(&format!("\"{field}\":"))
        .or_fail(format!("no {field} in {json}"))?;
    let rest = &json[at + field.len() + 3..];
    let end = if let Some(quoted) = rest.strip_prefix('"') {
        quoted
            .find('"')
            .or_fail(format!("the end of {field}'s string in {json}"))?
            + 2
    } else {
        rest.find([',', '}'])
            .or_fail(format!("the end of {field} in {json}"))?
    };
    Ok(rest[..end].to_string())
}

/// `leasehold status` with `--json` and without, as one check: returns (the code, the human
/// line, the JSON line).
fn status(
    url: Option<&str>,
    key: &str,
    env: &[(&str, &std::path::Path)],
) -> Result<(i32, String, String)> {
    let mut args = vec!["status", "--key", key];
    if let Some(url) = url {
        args.extend(["--url", url]);
    }
    let run = |json: bool| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_leasehold"));
        command.args(&args).env_remove("LEASEHOLD_URL");
        if json {
            command.arg("--json");
        }
        for (k, v) in env {
            command.env(k, v);
        }
        command.output().or_fail("run leasehold status")
    };
    let (human, json) = (run(false)?, run(true)?);
    assert_eq!(
        code(&human),
        code(&json),
        "{}\n{}",
        text(&human),
        text(&json)
    );
    assert_eq!(
        String::from_utf8_lossy(&human.stdout).lines().count(),
        1,
        "{}",
        text(&human)
    );
    assert_eq!(
        String::from_utf8_lossy(&json.stdout).lines().count(),
        1,
        "{}",
        text(&json)
    );
    Ok((
        code(&human),
        String::from_utf8_lossy(&human.stdout).trim().to_string(),
        String::from_utf8_lossy(&json.stdout).trim().to_string(),
    ))
}

/// `leasehold status` on a free key, while a `leasehold run` holds it, and after: free (0), held
/// (1) with the holder's fence (what the child got in `$LEASEHOLD_FENCE`), free with a last fence
/// at least that. `secret` must never be printed.
fn status_follows_a_run(
    url: Option<&str>,
    env: &[(&str, &std::path::Path)],
    backend: &str,
    secret: &str,
) -> Result {
    let dir =
        leasehold_servers::process::server_dir("cli-status").or_fail("a scratch directory")?;
    let key = "job:status";
    let (c, human, json) = status(url, key, env)?;
    assert_eq!(c, 0, "{human}\n{json}");
    assert!(human.contains("free") && human.contains(backend), "{human}");
    assert_eq!(json_field(&json, "held")?, "false", "{json}");
    assert_eq!(
        json_field(&json, "backend")?,
        format!("\"{backend}\""),
        "{json}"
    );
    assert_eq!(json_field(&json, "key")?, format!("\"{key}\""), "{json}");
    assert_eq!(json_field(&json, "owner")?, "null", "{json}");

    let (fence_file, done) = (dir.path().join("fence"), dir.path().join("done"));
    let mut run = Command::new(env!("CARGO_BIN_EXE_leasehold"));
    run.args(["run", "--key", key, "--ttl", "30s"]);
    if let Some(url) = url {
        run.args(["--url", url]);
    }
    for (k, v) in env {
        run.env(k, v);
    }
    let mut holder = run
        .env_remove("LEASEHOLD_URL")
        .args(["--", "sh", "-c", &hold_script(&fence_file, &done)])
        .spawn()
        .or_fail("start the holder")?;
    wait_for_file(&fence_file, &mut holder)?;
    let fence = read_fence(&fence_file)?;
    let (c, human, json) = status(url, key, env)?;
    assert_eq!(c, 1, "{human}\n{json}");
    assert!(human.contains("held"), "{human}");
    assert!(human.contains(&format!("fence {fence}")), "{human}");
    assert_eq!(json_field(&json, "held")?, "true", "{json}");
    assert_eq!(json_field(&json, "fence")?, fence.to_string(), "{json}");
    let owner = json_field(&json, "owner")?;
    let owner = owner.trim_matches('"');
    assert_eq!(owner.len(), 8, "{json}");
    assert!(owner.chars().all(|c| c.is_ascii_hexdigit()), "{json}");
    assert!(human.contains(owner), "{human}");
    let remaining: u64 = json_field(&json, "remaining_ms")?
        .parse()
        .or_fail(format!("remaining_ms in {json}"))?;
    assert!(remaining > 0 && remaining <= 30_000, "{json}");
    for printed in [&human, &json] {
        assert!(!printed.contains(secret), "{printed}");
    }
    std::fs::write(&done, b"done").or_fail("let the holder finish")?;
    assert!(holder.wait().or_fail("wait for the holder")?.success());

    let (c, human, json) = status(url, key, env)?;
    assert_eq!(c, 0, "{human}\n{json}");
    assert!(human.contains("free"), "{human}");
    assert_eq!(json_field(&json, "held")?, "false", "{json}");
    assert_eq!(json_field(&json, "remaining_ms")?, "null", "{json}");
    let last = json_field(&json, "last_fence")?;
    if last != "null" {
        assert!(
            last.parse::<u64>()
                .or_fail(format!("last_fence in {json}"))?
                >= fence,
            "{json}"
        );
        assert!(human.contains(&format!("last fence {last}")), "{human}");
    }
    Ok(())
}

#[test]
fn status_follows_a_run_on_sqlite_and_on_the_default() -> Result {
    let dir = leasehold_servers::process::server_dir("cli-status-sqlite")
        .or_fail("a scratch directory")?;
    let url = format!("sqlite://{}", dir.path().join("locks.db").display());
    status_follows_a_run(Some(&url), &[], "sqlite", "no secret here")?;
    let state = dir.path().join("state");
    status_follows_a_run(
        None,
        &[("XDG_STATE_HOME", &state)],
        "sqlite",
        "no secret here",
    )?;
    assert!(state.join("leasehold/locks.db").is_file());
    Ok(())
}

#[test]
fn status_follows_a_run_on_redis() -> Result {
    let server = redis()?;
    status_follows_a_run(Some(&url(&server)), &[], "redis", "no secret here")
}

#[test]
fn status_follows_a_run_on_postgres_and_never_prints_the_password() -> Result {
    let server = leasehold_servers::PostgresServer::start_with_password("hunter2-status")
        .or_fail("PostgreSQL with a password must start")?;
    let url = format!("{}?timeout_ms=3000", server.url());
    assert!(url.contains("hunter2-status"));
    let out = leasehold(&["migrate", "--url", &url])?;
    assert_eq!(code(&out), 0, "{}", text(&out));
    status_follows_a_run(Some(&url), &[], "postgres", "hunter2-status")?;
    let (_, human, json) = status(Some(&url), "job:status", &[])?;
    assert!(json.contains("\"url\":\"postgres://"), "{json}");
    assert!(
        !human.contains("hunter2") && !json.contains("hunter2"),
        "{human}\n{json}"
    );
    Ok(())
}

/// `status --prefix` on `url`: every key held under the prefix, in order, one line (or JSON
/// object) each, exit 1 while any is held; `--limit` cuts the list and says there is more; a key
/// beside the prefix never shows; after the holders end, no key under it is held (exit 0).
fn status_lists_a_prefix(url: &str, backend: &str) -> Result {
    let dir = leasehold_servers::process::server_dir("cli-status-prefix")
        .or_fail("a scratch directory")?;
    let mut holders = Vec::new();
    let done = dir.path().join("done");
    for key in ["batch:2", "batch:1", "batchx"] {
        let fence_file = dir.path().join(key.replace(':', "-"));
        let mut holder = Command::new(env!("CARGO_BIN_EXE_leasehold"))
            .args(["run", "--url", url, "--key", key, "--ttl", "30s", "--"])
            .args(["sh", "-c", &hold_script(&fence_file, &done)])
            .env_remove("LEASEHOLD_URL")
            .spawn()
            .or_fail(format!("start the holder of {key}"))?;
        wait_for_file(&fence_file, &mut holder)?;
        holders.push(holder);
    }
    let list = |extra: &[&str]| -> Result<(i32, String, String)> {
        let mut args = vec!["status", "--url", url, "--prefix", "batch:"];
        args.extend(extra);
        let out = leasehold(&args)?;
        Ok((
            code(&out),
            String::from_utf8_lossy(&out.stdout).to_string(),
            text(&out),
        ))
    };
    let (c, out, all) = list(&[])?;
    assert_eq!(c, 1, "{all}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{all}");
    assert!(lines[0].starts_with("batch:1: held by "), "{all}");
    assert!(lines[1].starts_with("batch:2: held by "), "{all}");
    assert!(lines.iter().all(|l| l.contains(backend)), "{all}");

    let (c, out, all) = list(&["--json"])?;
    assert_eq!(c, 1, "{all}");
    let objects: Vec<&str> = out.lines().collect();
    assert_eq!(objects.len(), 2, "{all}");
    assert_eq!(json_field(objects[0], "key")?, "\"batch:1\"", "{all}");
    assert_eq!(json_field(objects[1], "key")?, "\"batch:2\"", "{all}");
    let held = objects
        .iter()
        .map(|o| json_field(o, "held"))
        .collect::<Result<Vec<_>>>()?;
    assert!(held.iter().all(|h| h == "true"), "{all}");

    let (c, out, all) = list(&["--limit", "1"])?;
    assert_eq!(c, 1, "{all}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{all}");
    assert!(lines[0].starts_with("batch:1: held"), "{all}");
    assert!(lines[1].contains("raise --limit"), "{all}");

    std::fs::write(&done, b"done").or_fail("let the holders finish")?;
    for mut holder in holders {
        assert!(holder.wait().or_fail("wait for a holder")?.success());
    }
    let (c, out, all) = list(&[])?;
    assert_eq!(c, 0, "{all}");
    assert!(!out.contains("held"), "{all}");
    let (c, out, all) = list(&["--json", "--limit", "0"])?;
    assert_eq!((c, out.as_str()), (0, ""), "{all}");
    let out = leasehold(&["status", "--url", url, "--prefix", "nothing-here:"])?;
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert!(
        text(&out).contains("no keys under `nothing-here:`"),
        "{}",
        text(&out)
    );
    let out = leasehold(&["status", "--url", url, "--prefix", "has space"])?;
    assert_eq!(code(&out), 64, "{}", text(&out));
    assert!(text(&out).contains("prefix"), "{}", text(&out));
    Ok(())
}

#[test]
fn status_lists_a_prefix_on_sqlite_and_redis() -> Result {
    let dir = leasehold_servers::process::server_dir("cli-status-prefix-sqlite")
        .or_fail("a scratch directory")?;
    let file = format!("sqlite://{}", dir.path().join("locks.db").display());
    status_lists_a_prefix(&file, "sqlite")?;
    let server = redis()?;
    status_lists_a_prefix(&url(&server), "redis")
}

/// `status`'s errors: 64 for usage (no key, an unknown option, memory://), 69 for an authority
/// that does not answer, and the URL's password never printed.
#[test]
fn status_usage_and_unreachable_authorities_have_their_exit_codes() -> Result {
    for (args, want) in [
        (&["status", "--url", "redis://127.0.0.1:1"][..], 64),
        (
            &[
                "status",
                "--url",
                "redis://127.0.0.1:1",
                "--key",
                "k",
                "--ttl",
                "1s",
            ],
            64,
        ),
        (&["status", "--url", "memory://x", "--key", "k"], 64),
        (
            &[
                "status",
                "--url",
                "redis://127.0.0.1:1",
                "--key",
                "has space",
            ],
            64,
        ),
        (
            &[
                "status",
                "--url",
                "redis://:hunter2@127.0.0.1:1?timeout_ms=300",
                "--key",
                "k",
            ],
            69,
        ),
        (
            &[
                "status",
                "--url",
                "redis://:hunter2@127.0.0.1:1?timeout_ms=300",
                "--key",
                "k",
                "--json",
            ],
            69,
        ),
    ] {
        let out = leasehold(args)?;
        assert_eq!(code(&out), want, "{args:?}: {}", text(&out));
        assert!(!text(&out).contains("hunter2"), "{args:?}: {}", text(&out));
        assert_eq!(String::from_utf8_lossy(&out.stdout), "", "{args:?}");
    }
    Ok(())
}
