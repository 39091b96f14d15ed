//! `leasehold status --watch`: the keys looked at again every interval until interrupted.
//!
//! On a terminal the screen is redrawn at each look: a table of the keys, then the latest
//! changes (hand-offs, losses, releases) scrolled below it. Elsewhere (a pipe, a file) the keys
//! are printed once as `status` prints them, then one line per change as it is seen. With
//! `--json`: one object per key at the start (`"event":"seen"`), then one per change.

use std::collections::VecDeque;
use std::time::{Duration, Instant, SystemTime};

use leasehold::{redact_url, Fence, Inspection, OwnerId};

use crate::code;
use crate::duration::human;
use crate::status::{json_fields, line, millis, string};
use crate::stop::StopSignals;
use crate::survey::{Change, ChangeKind, Look, Survey};

/// How many changes a redrawn screen keeps below the table.
const SCROLLBACK: usize = 20;

/// How the looks are shown.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Form {
    /// A table redrawn in place, the changes below it.
    Screen,
    /// The keys once, then a line per change.
    Lines,
    /// JSON objects, one per line.
    Json,
}

/// Looks every `interval` until a stop signal, printing as `json` and the terminal decide; 0
/// when stopped (or when the reader of stdout went away). A failed look is said on stderr and
/// the next look tries again: a watch outlives an outage of the authority.
pub(crate) async fn watch(mut survey: Survey, url: &str, json: bool, interval: Duration) -> u8 {
    let Some(mut signals) = StopSignals::watch() else {
        say!("leasehold: cannot watch for signals");
        return code::UNAVAILABLE;
    };
    let form = if json {
        Form::Json
    } else if rustix::termios::isatty(std::io::stdout()) {
        Form::Screen
    } else {
        Form::Lines
    };
    let shown = redact_url(url);
    let mut scrollback = VecDeque::with_capacity(SCROLLBACK);
    let mut first = true;
    loop {
        let began = Instant::now();
        let looked = tokio::select! {
            looked = survey.look() => looked,
            () = signals.stopped() => break,
        };
        let text = match looked {
            Ok(look) => {
                let text = match form {
                    Form::Json => json_lines(&look, first, url),
                    Form::Lines => plain_lines(&look, first, url),
                    Form::Screen => {
                        for change in &look.changes {
                            if scrollback.len() == SCROLLBACK {
                                scrollback.pop_front();
                            }
                            scrollback.push_back(format!(
                                "{} {}",
                                clock(change.at),
                                change.describe()
                            ));
                        }
                        screen(&look, &shown, &scrollback)
                    }
                };
                first = false;
                text
            }
            Err(e) => {
                say!("leasehold: {}: {}", shown, crate::chain(&e));
                String::new()
            }
        };
        if !text.is_empty() && !written(&text) {
            break;
        }
        let next = began.checked_add(interval);
        tokio::select! {
            () = sleep_until(next) => {}
            () = signals.stopped() => break,
        }
    }
    let _ = survey.authority().close().await;
    0
}

/// Sleeps until `next`; `None` (past what the clock can count) is forever.
async fn sleep_until(next: Option<Instant>) {
    match next {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// Writes `text` on stdout; false when the reader went away (stop quietly, as `ls | head` does).
fn written(text: &str) -> bool {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .is_ok()
}

/// `10:42:01` in UTC, for people: the moment this machine's clock saw it.
fn clock(at: SystemTime) -> String {
    let stamp = humantime::format_rfc3339_seconds(at).to_string();
    stamp.get(11..19).unwrap_or(&stamp).to_string()
}

/// The keys (at the first look) and a line per change.
fn plain_lines(look: &Look, first: bool, url: &str) -> String {
    let mut text = String::new();
    if first {
        for seen in &look.keys {
            text.push_str(&line(seen, url));
            text.push('\n');
        }
    }
    for change in &look.changes {
        text.push_str(&format!("{} {}\n", clock(change.at), change.describe()));
    }
    text
}

/// The keys as `"event":"seen"` objects (at the first look) and an object per change.
fn json_lines(look: &Look, first: bool, url: &str) -> String {
    let mut text = String::new();
    let at = humantime::format_rfc3339_millis(look.at).to_string();
    if first {
        for seen in &look.keys {
            text.push_str(&format!(
                "{{\"event\":\"seen\",\"at\":{},{}}}\n",
                string(&at),
                json_fields(seen, url)
            ));
        }
    }
    for change in &look.changes {
        text.push_str(&change_json(change));
        text.push('\n');
    }
    text
}

/// One change as a JSON object; the field names are documented in docs/cli.md.
fn change_json(change: &Change) -> String {
    let owner = |o: &Option<OwnerId>| o.as_ref().map_or("null".into(), |o| string(o.as_str()));
    let fence = |f: &Option<Fence>| f.map_or("null".into(), |f| f.value().to_string());
    let (from, from_fence, to, to_fence) = match &change.kind {
        ChangeKind::Taken { owner: o, fence: f } => (&None, &None, o, f),
        ChangeKind::HandedOff {
            from,
            from_fence,
            to,
            fence,
        } => (from, from_fence, to, fence),
        ChangeKind::Expired { owner: o, fence: f } | ChangeKind::Ended { owner: o, fence: f } => {
            (o, f, &None, &None)
        }
    };
    format!(
        "{{\"event\":{},\"at\":{},\"key\":{},\"from\":{},\"from_fence\":{},\"to\":{},\"fence\":{}}}",
        string(change.kind.name()),
        string(&humantime::format_rfc3339_millis(change.at).to_string()),
        string(change.key.as_str()),
        owner(from),
        fence(from_fence),
        owner(to),
        fence(to_fence),
    )
}

/// The whole screen: a header, the table of keys, the latest changes.
fn screen(look: &Look, shown: &str, scrollback: &VecDeque<String>) -> String {
    // Home the cursor and clear the screen, then draw.
    let mut text = String::from("\x1b[H\x1b[2J");
    text.push_str(&format!(
        "{} keys at {} ({}), {} UTC{}\n\n",
        look.keys.len(),
        shown,
        look.keys.first().map_or("no keys", |k| k.backend),
        clock(look.at),
        if look.more {
            ", more than shown: raise --limit"
        } else {
            ""
        }
    ));
    text.push_str(&row([
        "KEY",
        "HOLDER",
        "FENCE",
        "LEFT",
        "WAITING",
        "LAST FENCE",
    ]));
    for seen in &look.keys {
        text.push_str(&table_row(seen));
    }
    text.push_str("\nlatest changes:\n");
    for line in scrollback {
        text.push_str(line);
        text.push('\n');
    }
    text
}

/// One key's row.
fn table_row(seen: &Inspection) -> String {
    let number = |n: Option<u64>| n.map_or_else(|| "-".to_string(), |n| n.to_string());
    let holder = match (&seen.owner, seen.held) {
        (Some(owner), true) => owner.to_string(),
        (None, true) => "held".to_string(),
        (_, false) => "free".to_string(),
    };
    let left = seen
        .remaining
        .filter(|_| seen.held)
        .map_or_else(|| "-".into(), |r| human(Duration::from_millis(millis(r))));
    row([
        seen.key.as_str(),
        &holder,
        &number(seen.fence.map(|f| f.value())),
        &left,
        &number(seen.waiters.map(u64::from)),
        &number(seen.last_fence.map(|f| f.value())),
    ])
}

/// Columns padded to fixed widths (a longer value pushes the rest right rather than being cut).
fn row(cells: [&str; 6]) -> String {
    let widths = [24, 12, 8, 8, 8, 10];
    let mut text = String::new();
    for (cell, width) in cells.iter().zip(widths) {
        text.push_str(&format!("{cell:<width$} "));
    }
    text.truncate(text.trim_end().len());
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold::{Epoch, FenceSafety, LockKey};

    #[test]
    fn a_change_is_one_json_object_with_its_holders() -> Result<(), String> {
        let fence = |n| Fence::compose("t", Epoch::ZERO, n, FenceSafety::Linearizable).ok();
        let change = Change {
            at: SystemTime::UNIX_EPOCH,
            key: LockKey::new("job:\"a\"").map_err(|e| e.to_string())?,
            kind: ChangeKind::HandedOff {
                from: Some(OwnerId::peer("x")),
                from_fence: fence(7),
                to: None,
                fence: fence(8),
            },
        };
        assert_eq!(
            change_json(&change),
            r#"{"event":"handed_off","at":"1970-01-01T00:00:00.000Z","key":"job:\"a\"","from":"peer:x","from_fence":7,"to":null,"fence":8}"#
        );
        assert_eq!(clock(SystemTime::UNIX_EPOCH), "00:00:00");
        Ok(())
    }

    #[test]
    fn the_screen_shows_each_key_in_a_row_and_the_latest_changes_below() -> Result<(), String> {
        let key = LockKey::new("job:a").map_err(|e| e.to_string())?;
        let fence = Fence::compose("t", Epoch::ZERO, 7, FenceSafety::Linearizable).ok();
        let look = Look {
            at: SystemTime::UNIX_EPOCH,
            keys: vec![
                Inspection::held("etcd", key.clone(), OwnerId::peer("x"))
                    .with_fence(fence)
                    .with_remaining(Some(Duration::from_micros(2_500_900)))
                    .with_waiters(Some(2))
                    .with_last_fence(fence),
                Inspection::free("etcd", LockKey::new("job:b").map_err(|e| e.to_string())?),
            ],
            more: true,
            changes: Vec::new(),
        };
        let scrollback = VecDeque::from(["00:00:00 job:a taken by peer:x (fence 7)".to_string()]);
        let text = screen(&look, "etcd://h:2379", &scrollback);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines,
            [
                "\x1b[H\x1b[2J2 keys at etcd://h:2379 (etcd), 00:00:00 UTC, more than shown: raise --limit",
                "",
                "KEY                      HOLDER       FENCE    LEFT     WAITING  LAST FENCE",
                "job:a                    peer:x       7        2.5s     2        7",
                "job:b                    free         -        -        -        -",
                "",
                "latest changes:",
                "00:00:00 job:a taken by peer:x (fence 7)",
            ]
        );
        Ok(())
    }
}
