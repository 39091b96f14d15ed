//! `leasehold console` in a real browser: headless Chromium (Debian's `chromium` and
//! `chromium-driver`) driven through chromedriver, against SQLite files and Redis, with real
//! `leasehold run` holders. The page shows a key taken by another process within a second
//! without a reload, a hand-off, a revoke the holder sees as lost, and no revoke without
//! `--allow-revoke`.
//!
//! With `LEASEHOLD_CONSOLE_SCREENSHOTS=DIR`, the tests save the screenshots of docs/console.md
//! there.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::json;

mod common;
mod console_support;

use common::{OrFail, Result};
use console_support::{encoded, http, sqlite_url, Console, Holder};

/// chromedriver and a headless Chromium session, ended when dropped.
struct Browser {
    runtime: tokio::runtime::Runtime,
    client: Option<Client>,
    driver: Child,
}

impl Browser {
    /// A headless Chromium session. A missing Chromium or chromedriver fails the test, on a
    /// developer's machine as in CI: a browser test that passed without a browser would prove
    /// nothing.
    fn open() -> Result<Browser> {
        let missing: Vec<&str> = ["chromium", "chromedriver"]
            .into_iter()
            .filter(|tool| !installed(tool))
            .collect();
        if !missing.is_empty() {
            let said = format!(
                "{} not installed: the console's browser tests need Debian's packages \
                 `chromium` and `chromium-driver` (scripts/test installs them)",
                missing.join(" and ")
            );
            return Err(said.into());
        }
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .or_fail("a free port for chromedriver")?
            .port();
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .or_fail("start chromedriver")?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .or_fail("a runtime for the WebDriver client")?;
        let mut browser = Browser {
            runtime,
            client: None,
            driver,
        };
        let mut capabilities = serde_json::Map::new();
        capabilities.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": "/usr/bin/chromium",
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1000,700",
                         "--hide-scrollbars"],
            }),
        );
        let webdriver = format!("http://127.0.0.1:{port}");
        let started = Instant::now();
        let client = loop {
            let mut builder = ClientBuilder::new(HttpConnector::new());
            builder.capabilities(capabilities.clone());
            match browser.runtime.block_on(builder.connect(&webdriver)) {
                Ok(client) => break client,
                Err(e) if started.elapsed() > Duration::from_secs(20) => {
                    return Err(format!("no Chromium session through chromedriver: {e}").into())
                }
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        };
        browser.client = Some(client);
        Ok(browser)
    }

    fn client(&self) -> Result<&Client> {
        self.client.as_ref().or_fail("the browser session")
    }

    fn goto(&self, url: &str) -> Result {
        let client = self.client()?;
        self.runtime
            .block_on(client.goto(url))
            .or_fail(format!("open {url}"))
    }

    /// The text of the first element that `css` selects, if there is one: read in one
    /// script, as the event stream may replace the element between two WebDriver commands.
    fn text(&self, css: &str) -> Result<Option<String>> {
        let client = self.client()?;
        let found = self
            .runtime
            .block_on(client.execute(
                "const e = document.querySelector(arguments[0]); return e ? e.innerText : null;",
                vec![json!(css)],
            ))
            .or_fail(format!("read {css}"))?;
        Ok(found.as_str().map(str::to_string))
    }

    /// How many elements `css` selects.
    fn count(&self, css: &str) -> Result<usize> {
        let client = self.client()?;
        let found = self
            .runtime
            .block_on(client.execute(
                "return document.querySelectorAll(arguments[0]).length;",
                vec![json!(css)],
            ))
            .or_fail(format!("count {css}"))?;
        found
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .or_fail(format!("a count of {css}: {found}"))
    }

    /// Clicks the first element `css` selects; again if the event stream replaced it
    /// between the find and the click.
    fn click(&self, css: &str) -> Result {
        let client = self.client()?;
        let mut tries = 0;
        loop {
            let clicked = self
                .runtime
                .block_on(async { client.find(Locator::Css(css)).await?.click().await });
            match clicked {
                Ok(()) => return Ok(()),
                // The page replaces a row whenever the key changes, so an element found a moment
                // ago may be gone; on a loaded machine that moment can span several updates.
                Err(e) if tries < 40 && e.to_string().contains("stale") => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(25));
                }
                Err(e) => return Err(format!("click {css}: {e}").into()),
            }
        }
    }

    fn source(&self) -> Result<String> {
        let client = self.client()?;
        self.runtime
            .block_on(client.source())
            .or_fail("the page's source")
    }

    /// Waits until `css` selects an element whose text satisfies `ok`, for at most `within`;
    /// the text.
    fn wait_for(&self, css: &str, within: Duration, ok: impl Fn(&str) -> bool) -> Result<String> {
        let started = Instant::now();
        loop {
            if let Some(text) = self.text(css)? {
                if ok(&text) {
                    return Ok(text);
                }
            }
            if started.elapsed() > within {
                return Err(format!(
                    "{css} did not show what was awaited within {within:?}; the page: {}",
                    self.source()?
                )
                .into());
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// Saves a PNG of the window as `name` in `$LEASEHOLD_CONSOLE_SCREENSHOTS`, if set and
    /// `shoot` (one backend's run makes the pictures).
    fn screenshot(&self, shoot: bool, name: &str) -> Result {
        let Some(dir) = std::env::var_os("LEASEHOLD_CONSOLE_SCREENSHOTS").filter(|_| shoot) else {
            return Ok(());
        };
        let client = self.client()?;
        let png = self
            .runtime
            .block_on(client.screenshot())
            .or_fail("a screenshot")?;
        let path = PathBuf::from(dir).join(name);
        std::fs::write(&path, png).or_fail(format!("write {}", path.display()))
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if let Some(client) = self.client.take() {
            let _ = self.runtime.block_on(async {
                tokio::time::timeout(Duration::from_secs(5), client.close()).await
            });
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

fn installed(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn scratch(name: &str) -> Result<tempfile::TempDir> {
    leasehold_servers::process::server_dir(name).or_fail("a scratch directory")
}

/// The row of `key` on the index, and a cell of it.
fn cell(key: &str, class: &str) -> String {
    format!("tr[data-key='{key}'] td.{class}")
}

/// (a) and (b): the page, open before anything holds the key, shows the holder's fence within
/// a second of its command starting, without a reload; when the holder exits and a waiting
/// second one takes the key, the row shows the greater fence and the log the hand-off; the
/// key's page lists both fences.
fn shows_a_take_and_a_hand_off(url: &str, name: &str, shoot: bool) -> Result {
    let browser = Browser::open()?;
    let dir = scratch(name)?;
    let key = "job:nightly";
    let console = Console::start(url, &["--prefix", "job:"], &[])?;
    browser.goto(&console.base())?;
    browser.wait_for("#live", Duration::from_secs(5), |t| t.contains("No keys"))?;

    let mut first = Holder::spawn(url, key, "5s", &[], dir.path(), "first", &[])?;
    let fence = first.ready()?;
    let seen_from = Instant::now();
    browser.wait_for(&cell(key, "fence"), Duration::from_secs(1), |t| {
        t == fence.to_string()
    })?;
    let took = seen_from.elapsed();
    assert!(took <= Duration::from_secs(1), "shown after {took:?}");
    let holder = browser.text(&cell(key, "holder"))?.unwrap_or_default();
    assert!(
        !holder.is_empty() && holder != "free",
        "a holder: {holder:?}"
    );

    let mut second = Holder::spawn(
        url,
        key,
        "5s",
        &["--wait", "30s"],
        dir.path(),
        "second",
        &[],
    )?;
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(first.finish()?, Some(0), "the first holder ends well");
    let next = second.ready()?;
    assert!(next > fence, "the second fence {next} exceeds {fence}");
    browser.wait_for(&cell(key, "fence"), Duration::from_secs(2), |t| {
        t == next.to_string()
    })?;
    let log = browser.wait_for("ol.log", Duration::from_secs(2), |t| {
        t.contains(&next.to_string())
    })?;
    let handed = log.lines().any(|l| l.contains("handed off"))
        || (log.lines().any(|l| l.contains(&fence.to_string()))
            && log.lines().any(|l| l.contains(&next.to_string())));
    assert!(
        handed,
        "a hand-off from fence {fence} to {next} in the log: {log}"
    );
    browser.screenshot(shoot, "index.png")?;

    browser.goto(&format!("{}/key/{}", console.base(), encoded(key)))?;
    let history = browser.wait_for("table.history", Duration::from_secs(2), |t| {
        t.contains(&next.to_string())
    })?;
    for f in [fence, next] {
        assert!(
            history.lines().any(|l| l.contains(&f.to_string())),
            "fence {f} in the key's history: {history}"
        );
    }
    browser.screenshot(shoot, "key.png")?;
    assert_eq!(second.finish()?, Some(0));
    Ok(())
}

#[test]
fn a_take_and_a_hand_off_show_on_sqlite() -> Result {
    let dir = scratch("console-browser-sqlite")?;
    shows_a_take_and_a_hand_off(
        &sqlite_url(dir.path()),
        "console-browser-handoff-sqlite",
        false,
    )
}

#[test]
fn a_take_and_a_hand_off_show_on_redis() -> Result {
    let server = common::redis()?;
    shows_a_take_and_a_hand_off(&common::url(&server), "console-browser-handoff-redis", true)
}

/// (c): with `--allow-revoke`, Revoke leads to a confirmation with the holder's fence; once
/// confirmed, the run exits with the lost status (76), and the next holder's fence is greater.
fn revokes_through_the_page(url: &str, name: &str, shoot: bool) -> Result {
    let browser = Browser::open()?;
    let dir = scratch(name)?;
    let key = "job:stuck";
    let mut holder = Holder::start(url, key, "5s", &[], dir.path(), "stuck", &[])?;
    let console = Console::start(url, &["--prefix", "job:", "--allow-revoke"], &[])?;
    browser.goto(&console.base())?;
    browser.wait_for(&cell(key, "fence"), Duration::from_secs(2), |t| {
        t == holder.fence.to_string()
    })?;
    browser.click(&format!("tr[data-key='{key}'] a.button"))?;
    let asked = browser.wait_for("main", Duration::from_secs(5), |t| t.contains("Held by"))?;
    assert!(
        asked.contains(&format!("fence {}", holder.fence)),
        "the confirmation shows fence {}: {asked}",
        holder.fence
    );
    browser.screenshot(shoot, "revoke.png")?;
    browser.click("#confirm-revoke")?;
    browser.wait_for("main", Duration::from_secs(10), |t| {
        t.contains(&format!("Revoked the lease with fence {}", holder.fence))
    })?;
    assert_eq!(
        holder.exit_within(Duration::from_secs(6))?,
        Some(76),
        "the revoked run exits with the lost status"
    );
    let next = Holder::start(url, key, "5s", &[], dir.path(), "next", &[])?;
    assert!(
        next.fence > holder.fence,
        "{} after {}",
        next.fence,
        holder.fence
    );
    browser.goto(&console.base())?;
    browser.wait_for(&cell(key, "fence"), Duration::from_secs(2), |t| {
        t == next.fence.to_string()
    })?;
    next.finish()?;
    Ok(())
}

#[test]
fn a_revoke_through_the_page_ends_the_run_on_sqlite() -> Result {
    let dir = scratch("console-browser-revoke-sqlite")?;
    revokes_through_the_page(
        &sqlite_url(dir.path()),
        "console-browser-revoke-sqlite-run",
        false,
    )
}

#[test]
fn a_revoke_through_the_page_ends_the_run_on_redis() -> Result {
    let server = common::redis()?;
    revokes_through_the_page(&common::url(&server), "console-browser-revoke-redis", true)
}

/// (d): without `--allow-revoke` the page has no revoke button and says revocation is off;
/// the confirmation route and a POST (through the browser's form and from an HTTP client)
/// answer 403; the holder keeps its lease.
#[test]
fn without_allow_revoke_nothing_is_revoked() -> Result {
    let browser = Browser::open()?;
    let dir = scratch("console-browser-norevoke")?;
    let url = sqlite_url(dir.path());
    let key = "job:kept";
    let mut holder = Holder::start(&url, key, "3s", &[], dir.path(), "kept", &[])?;
    let console = Console::start(&url, &["--prefix", "job:"], &[])?;
    browser.goto(&console.base())?;
    browser.wait_for(&cell(key, "fence"), Duration::from_secs(2), |t| {
        t == holder.fence.to_string()
    })?;
    assert_eq!(browser.count("a.button")?, 0, "no revoke button");
    let header = browser.text("header")?.unwrap_or_default();
    assert!(header.contains("revocation is off"), "{header}");
    browser.goto(&format!("{}/revoke?key={}", console.base(), encoded(key)))?;
    let said = browser.text("main")?.unwrap_or_default();
    assert!(said.contains("Revocation is off"), "{said}");
    // A form posted from the console's own page, as a browser would.
    let client = browser.client()?;
    let posted = browser.runtime.block_on(client.execute(
        "const f = document.createElement('form'); f.method = 'post'; f.action = '/revoke'; \
         for (const [n, v] of [['key', arguments[0]], ['fence', arguments[1]], ['csrf', 'x']]) { \
           const i = document.createElement('input'); i.type = 'hidden'; i.name = n; i.value = v; \
           f.appendChild(i); } \
         document.body.appendChild(f); f.submit(); return true;",
        vec![json!(key), json!(holder.fence.to_string())],
    ));
    posted.or_fail("post the form")?;
    browser.wait_for("main", Duration::from_secs(5), |t| {
        t.contains("Revocation is off")
    })?;
    let answer = http(
        &console.addr,
        "POST",
        "/revoke",
        &[("Origin", &console.base())],
        &format!("key={}&fence={}&csrf=x", encoded(key), holder.fence),
    )?;
    assert_eq!(answer.status, 403, "{answer:?}");
    std::thread::sleep(Duration::from_secs(1));
    assert!(holder.running()?, "the holder keeps its lease");
    let status = common::leasehold(&["status", "--key", key, "--url", &url])?;
    assert!(
        String::from_utf8_lossy(&status.stdout).contains(&format!("fence {}", holder.fence)),
        "{}",
        common::text(&status)
    );
    Ok(())
}
