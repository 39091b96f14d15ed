//! `leasehold status (--key K | --prefix P [--limit N]) [--url URL] [--json]`: what the
//! authority says about one key, or about each key under a prefix.

use std::future::Future;
use std::time::Duration;

use leasehold::{redact_url, Authority, Inspection, KeyPrefix, LockKey};
use leasehold_core::backend::UrlParams;

use crate::args::{StatusArgs, StatusTarget};
use crate::duration::human;
use crate::survey::Survey;
use crate::{authority_url, code, failed};

/// The authority a one-shot command (`status`, `revoke`) asks: its URL (given or the default),
/// the URL's request timeout, and a client; an error is said and becomes the exit status.
pub(crate) async fn open(
    given: Option<&str>,
) -> Result<(String, Duration, std::sync::Arc<dyn Authority>), u8> {
    let url = authority_url(given)?;
    let timeout = match UrlParams::parse(&url).and_then(|mut p| p.take_client_options()) {
        Ok(options) => options.request_timeout,
        Err(e) => return Err(failed(&e, &url, code::USAGE)),
    };
    match leasehold::connect(&url).await {
        Ok(authority) => Ok((url, timeout, authority)),
        Err(e) => Err(failed(&e, &url, code::UNAVAILABLE)),
    }
}

/// What to inspect, checked before anything connects.
enum Target {
    Key(LockKey),
    Prefix(KeyPrefix, usize),
}

/// Prints the inspection of the key (or of each key under the prefix); 0 when free (none
/// held), [`code::HELD`] when held (any held).
pub async fn status(args: StatusArgs) -> u8 {
    let target = match &args.target {
        StatusTarget::Key(key) => LockKey::new(key).map(Target::Key),
        StatusTarget::Prefix { prefix, limit } => {
            KeyPrefix::new(prefix).map(|p| Target::Prefix(p, *limit))
        }
    };
    let target = match target {
        Ok(t) => t,
        Err(e) => return failed(&e, "", code::USAGE),
    };
    let (url, timeout, authority) = match open(args.url.as_deref()).await {
        Ok(opened) => opened,
        Err(code) => return code,
    };
    // The backend bounds each request by the URL's timeout; this is a backstop.
    let backstop = timeout
        .saturating_mul(2)
        .saturating_add(Duration::from_secs(1));
    if let Some(interval) = args.watch {
        let survey = match target {
            Target::Key(key) => Survey::one(authority, key, backstop),
            Target::Prefix(prefix, limit) => Survey::new(authority, prefix, limit, backstop),
        };
        return crate::status_watch::watch(survey, &url, args.json, interval).await;
    }
    let asked = match &target {
        Target::Key(key) => bounded(backstop, &url, authority.inspect(key))
            .await
            .map(|seen| (vec![seen], false)),
        Target::Prefix(prefix, limit) => {
            inspect_all(&*authority, prefix, *limit, backstop, &url).await
        }
    };
    let _ = authority.close().await;
    let (seen, more) = match asked {
        Ok(found) => found,
        Err(code) => return code,
    };
    let mut text = seen
        .iter()
        .map(|s| {
            if args.json {
                json(s, &url)
            } else {
                line(s, &url)
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    if let (Target::Prefix(prefix, limit), false) = (&target, args.json) {
        if seen.is_empty() {
            text = format!("no keys under `{prefix}` ({})", redact_url(&url));
        } else if more {
            text.push_str(&format!(
                "\n(more keys under `{prefix}` than the {limit} shown: raise --limit)"
            ));
        }
    }
    // A reader that went away early is not an error of ours; the status still answers.
    if !text.is_empty() {
        let _ = crate::print_out(&text);
    }
    if more && args.json {
        say!(
            "leasehold: more keys than the {} listed: raise --limit",
            seen.len()
        );
    }
    if seen.iter().any(|s| s.held) {
        code::HELD
    } else {
        0
    }
}

/// Lists the first `limit` keys under `prefix` (asking for one more, to know whether there are
/// more), then inspects each; keys freed and forgotten in between are shown as free.
async fn inspect_all(
    authority: &dyn Authority,
    prefix: &KeyPrefix,
    limit: usize,
    backstop: Duration,
    url: &str,
) -> Result<(Vec<Inspection>, bool), u8> {
    let mut keys = bounded(
        backstop,
        url,
        authority.list_keys(prefix, limit.saturating_add(1)),
    )
    .await?;
    let more = keys.len() > limit;
    keys.truncate(limit);
    let mut seen = Vec::with_capacity(keys.len());
    for key in &keys {
        seen.push(bounded(backstop, url, authority.inspect(key)).await?);
    }
    Ok((seen, more))
}

/// Awaits one request within `backstop`; a failure is printed and becomes the exit status.
pub(crate) async fn bounded<T>(
    backstop: Duration,
    url: &str,
    request: impl Future<Output = leasehold::Result<T>>,
) -> Result<T, u8> {
    match tokio::time::timeout(backstop, request).await {
        Ok(Ok(found)) => Ok(found),
        Ok(Err(e)) => Err(failed(&e, url, code::UNAVAILABLE)),
        Err(_) => {
            say!(
                "leasehold: {} did not answer within {}",
                redact_url(url),
                human(backstop)
            );
            Err(code::UNAVAILABLE)
        }
    }
}

/// To the millisecond: the authority's microseconds are noise.
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `nightly: held by 1a2b3c4d, fence 7, 8.2s left, 2 waiting, last fence 7 (sqlite at ...)`.
pub(crate) fn line(seen: &Inspection, url: &str) -> String {
    let mut parts = Vec::new();
    if seen.held {
        parts.push(match &seen.owner {
            Some(owner) => format!("held by {owner}"),
            None => "held".to_string(),
        });
        if let Some(fence) = seen.fence {
            parts.push(format!("fence {}", fence.value()));
        }
        if let Some(left) = seen.remaining {
            parts.push(format!(
                "{} left",
                human(Duration::from_millis(millis(left)))
            ));
        }
    } else {
        parts.push("free".to_string());
    }
    if let Some(waiters) = seen.waiters {
        parts.push(format!("{waiters} waiting"));
    }
    if let Some(last) = seen.last_fence {
        parts.push(format!("last fence {}", last.value()));
    }
    format!(
        "{}: {} ({} at {})",
        seen.key,
        parts.join(", "),
        seen.backend,
        redact_url(url)
    )
}

/// One JSON object; the field names are documented in docs/cli.md and do not change.
fn json(seen: &Inspection, url: &str) -> String {
    format!("{{{}}}", json_fields(seen, url))
}

/// The fields of [`json`], without the braces, for objects that add their own.
pub(crate) fn json_fields(seen: &Inspection, url: &str) -> String {
    let number = |n: Option<u64>| n.map_or_else(|| "null".to_string(), |n| n.to_string());
    let owner = seen
        .owner
        .as_ref()
        .map_or_else(|| "null".to_string(), |o| string(o.as_str()));
    format!(
        "\"key\":{},\"held\":{},\"owner\":{},\"fence\":{},\"last_fence\":{},\"remaining_ms\":{},\"waiters\":{},\"backend\":{},\"url\":{}",
        string(seen.key.as_str()),
        seen.held,
        owner,
        number(seen.fence.map(|f| f.value())),
        number(seen.last_fence.map(|f| f.value())),
        number(seen.remaining.map(millis)),
        number(seen.waiters.map(u64::from)),
        string(seen.backend),
        string(&redact_url(url)),
    )
}

/// A JSON string literal.
pub(crate) fn string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold::{Epoch, Fence, FenceSafety, OwnerId};
    use leasehold_conformance::kit::{OrFail, TestResult};

    #[test]
    fn says_held_and_free_in_a_line_and_in_json() -> TestResult {
        let key = LockKey::new("job:\"1\"").or_fail("the key with a quote")?;
        let fence =
            Fence::compose("t", Epoch::ZERO, 7, FenceSafety::Linearizable).or_fail("fence 7")?;
        let held = Inspection::held("redis", key.clone(), OwnerId::peer("kazoo"))
            .with_fence(Some(fence))
            .with_remaining(Some(Duration::from_micros(8_200_400)))
            .with_last_fence(Some(fence));
        let url = "redis://:hunter2@h";
        assert_eq!(
            line(&held, url),
            format!(
                "job:\"1\": held by peer:kazoo, fence 7, 8.2s left, last fence 7 (redis at {})",
                redact_url(url)
            )
        );
        let j = json(&held, url);
        assert!(j.starts_with(r#"{"key":"job:\"1\"","held":true,"owner":"peer:kazoo","fence":7,"last_fence":7,"remaining_ms":8200,"waiters":null,"backend":"redis","url":""#), "{j}");
        assert!(!j.contains("hunter2"), "{j}");
        let free = Inspection::free("sqlite", key);
        assert_eq!(
            json(&free, "sqlite:///x"),
            r#"{"key":"job:\"1\"","held":false,"owner":null,"fence":null,"last_fence":null,"remaining_ms":null,"waiters":null,"backend":"sqlite","url":"sqlite:///x"}"#
        );
        assert_eq!(
            line(&free, "sqlite:///x"),
            "job:\"1\": free (sqlite at sqlite:///x)"
        );
        assert_eq!(string("a\\b\n\u{1}"), r#""a\\b\n\u0001""#);
        Ok(())
    }
}
