//! The console's HTML, rendered on the server with maud, which escapes every value: keys,
//! owner ids and error texts may hold `<`, `"` or `&`. The live parts are fragments that the
//! page's script swaps in as server-sent events bring them; without the script, the page shows
//! the state as of its loading.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use leasehold::{Inspection, LockKey};
use maud::{html, Markup, PreEscaped, DOCTYPE};
use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};

use super::history::History;
use crate::duration::human;

/// What every page says in its header.
pub(crate) struct Frame<'a> {
    /// The authority's URL, its secrets redacted.
    pub url: &'a str,
    pub prefix: &'a str,
    pub allow_revoke: bool,
}

/// A whole page: the header, `body`, and the script that keeps `#live` current.
pub(crate) fn page(frame: &Frame<'_>, title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · leasehold console" }
                link rel="stylesheet" href="/console.css";
                script src="/console.js" defer {}
            }
            body {
                header {
                    a.brand href="/" { "leasehold console" }
                    span.where {
                        "keys under " code { "\"" (frame.prefix) "\"" } " at " code { (frame.url) }
                    }
                    @if frame.allow_revoke {
                        span.revoke-on { "revocation on" }
                    } @else {
                        span.revoke-off { "revocation is off (start with --allow-revoke to allow it)" }
                    }
                }
                main { (body) }
                footer { a href="/metrics" { "metrics" } }
            }
        }
    }
}

/// The path of `key`'s page.
pub(crate) fn key_path(key: &LockKey) -> String {
    format!(
        "/key/{}",
        utf8_percent_encode(key.as_str(), NON_ALPHANUMERIC)
    )
}

/// The path of `key`'s revoke confirmation.
fn revoke_path(key: &LockKey) -> String {
    format!(
        "/revoke?key={}",
        utf8_percent_encode(key.as_str(), NON_ALPHANUMERIC)
    )
}

/// The index's live part: the error banner, the keys, and the changes seen, newest first.
pub(crate) fn index_live(history: &History, allow_revoke: bool) -> Markup {
    html! {
        (banner(history))
        h2 { "Keys" }
        @if history.keys.is_empty() {
            p.empty { @if history.at.is_some() { "No keys under the prefix." } @else { "No look yet." } }
        } @else {
            table.keys {
                thead { tr {
                    th { "key" } th { "holder" } th { "fence" } th { "time left" }
                    th { "waiters" } th { "last fence" }
                    @if allow_revoke { th {} }
                } }
                tbody {
                    @for seen in &history.keys {
                        (key_row(history, seen, allow_revoke))
                    }
                }
            }
            @if history.more {
                p.more { "More keys than the limit: raise --limit to see them." }
            }
        }
        h2 { "Hand-offs and losses" }
        @if history.log.is_empty() {
            p.empty { "None seen since the console started." }
        } @else {
            ol.log {
                @for seen in &history.log {
                    li class=(if seen.is_loss() { "loss" } else { "change" }) {
                        time { (clock(seen.at)) } " " (seen.line)
                    }
                }
            }
        }
    }
}

/// One key's row in the index.
fn key_row(history: &History, seen: &Inspection, allow_revoke: bool) -> Markup {
    html! {
        tr.held[seen.held] data-key=(seen.key.as_str()) {
            td.key { a href=(key_path(&seen.key)) { (seen.key.as_str()) } }
            td.holder { @if seen.held { (holder(seen)) } @else { span.free { "free" } } }
            td.fence { (fence(seen.fence.map(|f| f.value()))) }
            td.left { (time_left(history, seen)) }
            td.waiters { @if let Some(w) = seen.waiters { (w) } }
            td.last { (fence(seen.last_fence.map(|f| f.value()))) }
            @if allow_revoke {
                td { @if seen.held { a.button href=(revoke_path(&seen.key)) { "Revoke…" } } }
            }
        }
    }
}

fn holder(seen: &Inspection) -> Markup {
    match &seen.owner {
        Some(owner) => html! { code { (owner.as_str()) } },
        None => html! { "held" },
    }
}

fn fence(fence: Option<u64>) -> Markup {
    match fence {
        Some(f) => html! { (f) },
        None => html! { span.none { "–" } },
    }
}

/// The time-left bar: what is left of the longest time left seen for this holder.
fn time_left(history: &History, seen: &Inspection) -> Markup {
    let (Some(left), true) = (seen.remaining, seen.held) else {
        return html! {};
    };
    let full = history.bar_length(seen).unwrap_or(left).max(left);
    html! {
        meter min="0" max=(full.as_secs_f64()) value=(left.as_secs_f64()) {}
        " " span.secs { (human(to_millis(left))) }
    }
}

/// A key's live part: its state now and every change seen on it.
pub(crate) fn key_live(
    history: &History,
    key: &LockKey,
    now: Option<&Inspection>,
    allow_revoke: bool,
) -> Markup {
    html! {
        (banner(history))
        h2 { "Now" }
        @match now {
            Some(seen) => {
                table.keys {
                    thead { tr {
                        th { "key" } th { "holder" } th { "fence" } th { "time left" }
                        th { "waiters" } th { "last fence" } @if allow_revoke { th {} }
                    } }
                    tbody { (key_row(history, seen, allow_revoke)) }
                }
            }
            None => p.empty { "Not among the keys the console lists (free and forgotten, or past --limit)." }
        }
        h2 { "Fence history since the console started" }
        @let changes: Vec<_> = history.of_key(key).collect();
        @if changes.is_empty() {
            p.empty { "No change seen." }
        } @else {
            table.history {
                thead { tr { th { "time" } th { "what" } th { "fence" } th { "" } } }
                tbody {
                    @for seen in changes.iter().rev() {
                        tr class=(if seen.is_loss() { "loss" } else { "change" }) {
                            td { time { (clock(seen.at)) } }
                            td { (seen.what) }
                            td.fence { (fence(seen.fence)) }
                            td { (seen.line) }
                        }
                    }
                }
            }
        }
    }
}

/// The error of the last look, if it failed.
fn banner(history: &History) -> Markup {
    html! {
        @if let Some(error) = &history.error {
            div.error role="alert" {
                strong { "The last look at the authority failed: " } (error)
                " (the console keeps trying; what is shown is from the last look that worked)"
            }
        }
        @if let Some(at) = history.at {
            p.as-of { "As of " time { (clock(at)) } " UTC." }
        }
    }
}

/// The revoke confirmation: who holds the key and with which fence, and the form that revokes
/// exactly that holder.
pub(crate) fn confirm(seen: &Inspection, csrf: &str) -> Markup {
    html! {
        h1 { "Revoke " code { (seen.key.as_str()) } "?" }
        @match (seen.held, seen.fence) {
            (true, Some(f)) => {
                p {
                    "Held by " (holder(seen)) " with fence " strong.fence { (f.value()) }
                    @if let Some(left) = seen.remaining { ", " (human(to_millis(left))) " left" }
                    "."
                }
                p {
                    "Revoking ends this lease now. The holder learns it at once or at its next \
                     renewal, and stops; the next holder's fence is greater, so a resource that \
                     checks fences refuses this holder's late writes. If the key changes hands \
                     before you confirm, nothing is revoked."
                }
                form method="post" action="/revoke" {
                    input type="hidden" name="key" value=(seen.key.as_str());
                    input type="hidden" name="fence" value=(f.value());
                    input type="hidden" name="csrf" value=(csrf);
                    button.danger type="submit" id="confirm-revoke" { "Revoke fence " (f.value()) }
                    " "
                    a href=(key_path(&seen.key)) { "Cancel" }
                }
            }
            (true, None) => p { "The key is held, but its authority shows no fence: nothing to confirm against." }
            _ => p { "The key is free: nothing to revoke." }
        }
    }
}

/// A short page that says what happened.
pub(crate) fn outcome(title: &str, message: &str, key: Option<&LockKey>) -> Markup {
    html! {
        h1 { (title) }
        p.outcome { (message) }
        @if let Some(key) = key {
            p { a href=(key_path(key)) { "Back to " (key.as_str()) } }
        }
        p { a href="/" { "All keys" } }
    }
}

/// The `#live` element whose content the script replaces from `events`.
pub(crate) fn live(events: &str, content: Markup) -> Markup {
    html! { div #live data-events=(events) { (content) } }
}

/// `HH:MM:SS.mmm` (UTC) of `at`.
pub(crate) fn clock(at: SystemTime) -> String {
    let since = at.duration_since(UNIX_EPOCH).unwrap_or_default();
    let s = since.as_secs();
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        s % 86_400 / 3_600,
        s % 3_600 / 60,
        s % 60,
        since.subsec_millis()
    )
}

/// To the millisecond: the authority's microseconds are noise.
fn to_millis(d: Duration) -> Duration {
    Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The script: opens the event stream named by `#live` and swaps in each fragment.
pub(crate) const SCRIPT: &str = r#""use strict";
(function () {
  var live = document.getElementById("live");
  if (!live || !window.EventSource) { return; }
  var source = new EventSource(live.getAttribute("data-events"));
  source.onmessage = function (event) { live.innerHTML = event.data; };
})();
"#;

/// The stylesheet (served as a file: the content security policy allows no inline style).
pub(crate) const STYLE: &str = r#"body { font: 15px/1.4 system-ui, sans-serif; margin: 0; color: #1d232a; background: #fafbfc; }
header { display: flex; gap: 1.2em; align-items: baseline; padding: .7em 1.2em; background: #1d3557; color: #fff; }
header a.brand { color: #fff; font-weight: 700; text-decoration: none; }
header code { color: #f1faee; }
.revoke-on { margin-left: auto; color: #ffb4a2; font-weight: 600; }
.revoke-off { margin-left: auto; color: #a8dadc; }
main { padding: .5em 1.2em; }
footer { padding: .5em 1.2em; color: #666; }
table { border-collapse: collapse; width: 100%; background: #fff; }
th, td { text-align: left; padding: .3em .6em; border-bottom: 1px solid #e3e6ea; }
th { font-weight: 600; color: #555; }
tr.held td.key a { font-weight: 600; }
td.fence, strong.fence { font-variant-numeric: tabular-nums; }
span.free, span.none, p.empty, p.as-of { color: #888; }
meter { width: 8em; vertical-align: middle; }
ol.log { list-style: none; padding: 0; }
ol.log li { padding: .15em 0; font-family: ui-monospace, monospace; font-size: 13px; }
li.loss, tr.loss { color: #9d0208; }
li.change, tr.change { color: #1d3557; }
time { color: #666; }
.error { background: #ffe5e5; border: 1px solid #9d0208; padding: .6em; margin: .6em 0; }
a.button, button { display: inline-block; padding: .2em .7em; border: 1px solid #9d0208; border-radius: 4px; color: #9d0208; background: #fff; text-decoration: none; cursor: pointer; font: inherit; }
button.danger { background: #9d0208; color: #fff; }
"#;

/// The raw text of `markup`, for a response or an event.
pub(crate) fn text(markup: Markup) -> String {
    let PreEscaped(text) = markup;
    text
}
