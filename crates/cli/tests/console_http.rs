//! `leasehold console` over plain HTTP, without a browser: the token (header, cookie from
//! `?token=`), the cross-site checks that stand before a revoke, the loopback default, and that
//! neither the URL's password nor a key's markup reaches a page unescaped.

use std::time::Duration;

mod common;
mod console_support;

use common::{leasehold, text, OrFail, Result};
use console_support::{csrf_of, encoded, eventually, http, sqlite_url, Console, Holder};

fn scratch(name: &str) -> Result<tempfile::TempDir> {
    leasehold_servers::process::server_dir(name).or_fail("a scratch directory")
}

/// With a token, every route answers 401 without it or with a wrong one; `Authorization:
/// Bearer` lets a request in; `?token=` sets an HttpOnly, SameSite=Strict cookie and redirects
/// to the same path without the token, and the cookie lets the next request in. SIGTERM stops
/// the console with status 0.
#[test]
fn a_token_guards_every_route_and_a_query_token_becomes_a_cookie() -> Result {
    let dir = scratch("console-token")?;
    let url = sqlite_url(dir.path());
    let token = "t0ken-for-the-console";
    let console = Console::start(
        &url,
        &["--prefix", "job:"],
        &[("LEASEHOLD_CONSOLE_TOKEN", token)],
    )?;
    for path in ["/", "/key/job%3Aa", "/events", "/metrics", "/console.js"] {
        let answer = console.get(path, &[])?;
        assert_eq!(answer.status, 401, "{path} without the token: {answer:?}");
        let wrong = console.get(path, &[("Authorization", "Bearer t0ken-for-the-consolf")])?;
        assert_eq!(wrong.status, 401, "{path} with a wrong token: {wrong:?}");
    }
    let wrong = console.get("/?token=nope", &[])?;
    assert_eq!(wrong.status, 401, "a wrong query token: {wrong:?}");
    let bearer = console.get("/", &[("Authorization", &format!("Bearer {token}"))])?;
    assert_eq!(bearer.status, 200, "{bearer:?}");
    assert!(bearer.body.contains("leasehold console"), "{}", bearer.body);

    let redirect = console.get(&format!("/key/job%3Aa?x=1&token={token}"), &[])?;
    assert_eq!(redirect.status, 303, "{redirect:?}");
    assert_eq!(redirect.header("location"), Some("/key/job%3Aa?x=1"));
    let cookie = redirect.header("set-cookie").or_fail("a cookie")?;
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    let pair = cookie.split(';').next().or_fail("the cookie's pair")?;
    let with_cookie = console.get("/key/job%3Aa?x=1", &[("Cookie", pair)])?;
    assert_eq!(with_cookie.status, 200, "{with_cookie:?}");
    assert_eq!(console.stop()?, Some(0), "SIGTERM stops the console with 0");

    // The token from a file works the same.
    let file = dir.path().join("token");
    std::fs::write(&file, format!("{token}\n")).or_fail("write the token file")?;
    let file = file.display().to_string();
    let console = Console::start(&url, &["--token-file", &file], &[])?;
    assert_eq!(console.get("/", &[])?.status, 401);
    let bearer = console.get("/", &[("Authorization", &format!("Bearer {token}"))])?;
    assert_eq!(bearer.status, 200, "{bearer:?}");
    Ok(())
}

/// Beyond loopback the console refuses to start without a token, and says so; with one it
/// starts.
#[test]
fn a_non_loopback_listen_needs_a_token() -> Result {
    let dir = scratch("console-listen")?;
    let url = sqlite_url(dir.path());
    let out = leasehold(&["console", "--url", &url, "--listen", "0.0.0.0:0"])?;
    assert_eq!(common::code(&out), 64, "{}", text(&out));
    assert!(
        common::stderr(&out).contains("token"),
        "the refusal names the token: {}",
        text(&out)
    );
    let console = Console::start(
        &url,
        &["--listen", "0.0.0.0:0"],
        &[("LEASEHOLD_CONSOLE_TOKEN", "tok")],
    )?;
    assert!(console.addr.starts_with("0.0.0.0:"), "{}", console.addr);
    assert_eq!(console.stop()?, Some(0));
    Ok(())
}

/// A request that must be refused: what it is, its headers, its form, and the status awaited.
type Refused<'a> = (&'a str, Vec<(&'a str, &'a str)>, String, u16);

/// A revoke POST with a wrong CSRF token, a foreign `Origin`, `Sec-Fetch-Site: cross-site` or
/// a foreign `Host` is refused and the holder keeps its lease; one whose fence is not the
/// holder's is refused as a changed holder; every page carries the anti-framing headers. The
/// right request revokes, and the run exits as lost (76).
#[test]
fn cross_site_and_stale_revokes_are_refused_and_the_holder_keeps_its_lease() -> Result {
    let dir = scratch("console-csrf")?;
    let url = sqlite_url(dir.path());
    let key = "job:csrf";
    let mut holder = Holder::start(&url, key, "3s", &[], dir.path(), "first", &[])?;
    let console = Console::start(&url, &["--prefix", "job:", "--allow-revoke"], &[])?;
    let confirm = console.get(&format!("/revoke?key={}", encoded(key)), &[])?;
    assert_eq!(confirm.status, 200, "{confirm:?}");
    assert!(
        confirm
            .body
            .contains(&format!("Revoke fence {}", holder.fence)),
        "the confirmation shows the holder's fence {}: {}",
        holder.fence,
        confirm.body
    );
    for (name, value) in [
        ("x-frame-options", "DENY"),
        ("referrer-policy", "no-referrer"),
    ] {
        assert_eq!(confirm.header(name), Some(value), "{name}: {confirm:?}");
    }
    let policy = confirm.header("content-security-policy").or_fail("a CSP")?;
    assert!(
        policy.contains("frame-ancestors 'none'") && policy.contains("script-src 'self'"),
        "{policy}"
    );
    let csrf = csrf_of(&confirm.body)?;
    let form = |csrf: &str, fence: u64| format!("key={}&fence={fence}&csrf={csrf}", encoded(key));
    let own = console.base();
    let refused: [Refused; 5] = [
        (
            "a wrong CSRF token",
            vec![("Origin", &own)],
            form("00", holder.fence),
            403,
        ),
        (
            "no CSRF token",
            vec![],
            format!("key={}&fence={}", encoded(key), holder.fence),
            400,
        ),
        (
            "a foreign Origin",
            vec![("Origin", "http://evil.example")],
            form(&csrf, holder.fence),
            403,
        ),
        (
            "Sec-Fetch-Site: cross-site",
            vec![("Sec-Fetch-Site", "cross-site")],
            form(&csrf, holder.fence),
            403,
        ),
        (
            "a foreign Host",
            vec![("Host", "evil.example")],
            form(&csrf, holder.fence),
            421,
        ),
    ];
    for (what, headers, body, status) in refused {
        let answer = http(&console.addr, "POST", "/revoke", &headers, &body)?;
        assert_eq!(answer.status, status, "{what}: {answer:?}");
        assert!(
            !answer.body.contains("Revoked the lease"),
            "{what}: {answer:?}"
        );
    }
    let stale = http(
        &console.addr,
        "POST",
        "/revoke",
        &[("Origin", &own)],
        &form(&csrf, holder.fence + 1),
    )?;
    assert_eq!(stale.status, 409, "{stale:?}");
    assert!(
        stale.body.contains("the holder changed since you looked")
            || stale.body.contains("The holder changed since you looked"),
        "{}",
        stale.body
    );
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        holder.running()?,
        "the refused revokes must leave the holder running"
    );
    let status = leasehold(&["status", "--key", key, "--url", &url])?;
    assert!(
        String::from_utf8_lossy(&status.stdout).contains(&format!("fence {}", holder.fence)),
        "the holder keeps its lease: {}",
        text(&status)
    );

    let done = http(
        &console.addr,
        "POST",
        "/revoke",
        &[("Origin", &own), ("Sec-Fetch-Site", "same-origin")],
        &form(&csrf, holder.fence),
    )?;
    assert_eq!(done.status, 200, "{done:?}");
    assert!(
        done.body
            .contains(&format!("Revoked the lease with fence {}", holder.fence)),
        "{}",
        done.body
    );
    assert_eq!(
        holder.exit_within(Duration::from_secs(6))?,
        Some(76),
        "the revoked run exits as lost"
    );
    Ok(())
}

/// The URL's password appears on no page, in no event and in no metric, also while the
/// authority is gone and the banner shows the error of the failed look.
#[test]
fn the_password_never_shows_and_a_failed_look_shows_a_banner() -> Result {
    let password = "hunter2-s3cret";
    let server = leasehold_servers::RedisServer::start_with_password(password)
        .or_fail("Redis must start")?;
    let url = format!("{}?timeout_ms=500", server.url_with_password(password));
    let dir = scratch("console-password")?;
    let _holder = Holder::start(&url, "job:pw", "5s", &[], dir.path(), "pw", &[])?;
    let console = Console::start(&url, &["--prefix", "job:", "--allow-revoke"], &[])?;
    let listed = eventually(Duration::from_secs(5), "the key on the index", || {
        let page = console.get("/", &[])?;
        Ok(page.body.contains("job:pw").then_some(page))
    })?;
    let mut pages = vec![listed];
    pages.push(console.get("/key/job%3Apw", &[])?);
    pages.push(console.get("/revoke?key=job%3Apw", &[])?);
    pages.push(console.get("/metrics", &[])?);
    drop(server);
    let banner = eventually(Duration::from_secs(10), "the error banner", || {
        let page = console.get("/", &[])?;
        Ok(page
            .body
            .contains("The last look at the authority failed")
            .then_some(page))
    })?;
    assert!(
        banner.body.contains("job:pw"),
        "the last keys stay shown: {}",
        banner.body
    );
    pages.push(banner);
    pages.push(console.get("/revoke?key=job%3Apw", &[])?);
    for page in &pages {
        assert!(
            !page.body.contains(password),
            "the password shows: {}",
            page.body
        );
    }
    assert_eq!(
        console.stop()?,
        Some(0),
        "a failing authority never stops it"
    );
    Ok(())
}

/// A key with markup in it is shown as text, on the index and on its own page.
#[test]
fn keys_with_markup_are_escaped() -> Result {
    let dir = scratch("console-escape")?;
    let url = sqlite_url(dir.path());
    let key = "job:<script>alert(\"x\")&</script>";
    let _holder = Holder::start(&url, key, "5s", &[], dir.path(), "markup", &[])?;
    let console = Console::start(&url, &["--prefix", "job:"], &[])?;
    let index = eventually(Duration::from_secs(5), "the key on the index", || {
        let page = console.get("/", &[])?;
        Ok(page.body.contains("alert").then_some(page))
    })?;
    let own = console.get(&format!("/key/{}", encoded(key)), &[])?;
    assert_eq!(own.status, 200, "{own:?}");
    for page in [&index.body, &own.body] {
        assert!(!page.contains("<script>alert"), "unescaped: {page}");
        assert!(
            page.contains("&lt;script&gt;alert(&quot;x&quot;)&amp;&lt;/script&gt;"),
            "escaped: {page}"
        );
    }
    Ok(())
}

/// A key the console does not list (another prefix, or past --limit) is inspected when its
/// page is asked for: the page shows its holder's fence.
#[test]
fn a_key_it_does_not_list_is_inspected_on_its_page() -> Result {
    let dir = scratch("console-unlisted")?;
    let url = sqlite_url(dir.path());
    let holder = Holder::start(&url, "job:x", "5s", &[], dir.path(), "x", &[])?;
    let console = Console::start(&url, &["--prefix", "other:"], &[])?;
    let page = console.get("/key/job%3Ax", &[])?;
    assert_eq!(page.status, 200, "{page:?}");
    assert!(
        page.body
            .contains(&format!("<td class=\"fence\">{}</td>", holder.fence)),
        "{}",
        page.body
    );
    let index = console.get("/", &[])?;
    assert!(!index.body.contains("job:x"), "{}", index.body);
    Ok(())
}
