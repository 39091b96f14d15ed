//! `leasehold status --key K [--url URL] [--json]`: what the authority says about one key.

use std::time::Duration;

use leasehold::{redact_url, Inspection, LockKey, UrlParams};

use crate::args::StatusArgs;
use crate::duration::human;
use crate::{code, failed, refuse_in_process, state};

/// Prints the inspection of the key; 0 when free, [`code::HELD`] when held.
pub async fn status(args: StatusArgs) -> u8 {
    let key = match LockKey::new(&args.key) {
        Ok(k) => k,
        Err(e) => return failed(&e, "", code::USAGE),
    };
    let url = match state::url_or_default(args.url.as_deref()) {
        Ok(url) => url,
        Err(e) => {
            say!("leasehold: {e}");
            return code::USAGE;
        }
    };
    if let Err(e) = refuse_in_process(&url) {
        say!("leasehold: {e}");
        return code::USAGE;
    }
    let timeout = match UrlParams::parse(&url).and_then(|mut p| p.take_client_options()) {
        Ok(options) => options.request_timeout,
        Err(e) => return failed(&e, &url, code::USAGE),
    };
    let authority = match leasehold::connect(&url).await {
        Ok(a) => a,
        Err(e) => return failed(&e, &url, code::UNAVAILABLE),
    };
    // The backend bounds each request by the URL's timeout; this is a backstop.
    let limit = timeout
        .saturating_mul(2)
        .saturating_add(Duration::from_secs(1));
    let asked = tokio::time::timeout(limit, authority.inspect(&key)).await;
    let _ = authority.close().await;
    let seen = match asked {
        Ok(Ok(seen)) => seen,
        Ok(Err(e)) => return failed(&e, &url, code::UNAVAILABLE),
        Err(_) => {
            say!(
                "leasehold: {} did not answer within {}",
                redact_url(&url),
                human(limit)
            );
            return code::UNAVAILABLE;
        }
    };
    let text = if args.json {
        json(&seen, &url)
    } else {
        line(&seen, &url)
    };
    // A reader that went away early is not an error of ours; the status still answers.
    let _ = crate::print_out(&text);
    if seen.held {
        code::HELD
    } else {
        0
    }
}

/// To the millisecond: the authority's microseconds are noise.
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `nightly: held by 1a2b3c4d, fence 7, 8.2s left, last fence 7 (sqlite at sqlite:///...)`.
fn line(seen: &Inspection, url: &str) -> String {
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
    let number = |n: Option<u64>| n.map_or_else(|| "null".to_string(), |n| n.to_string());
    let owner = seen
        .owner
        .as_ref()
        .map_or_else(|| "null".to_string(), |o| string(o.as_str()));
    format!(
        "{{\"key\":{},\"held\":{},\"owner\":{},\"fence\":{},\"last_fence\":{},\"remaining_ms\":{},\"backend\":{},\"url\":{}}}",
        string(seen.key.as_str()),
        seen.held,
        owner,
        number(seen.fence.map(|f| f.value())),
        number(seen.last_fence.map(|f| f.value())),
        number(seen.remaining.map(millis)),
        string(seen.backend),
        string(&redact_url(url)),
    )
}

/// A JSON string literal.
fn string(text: &str) -> String {
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

    #[test]
    fn says_held_and_free_in_a_line_and_in_json() {
        let key = LockKey::new("job:\"1\"").unwrap();
        let fence = Fence::compose("t", Epoch::ZERO, 7, FenceSafety::Linearizable).unwrap();
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
        assert!(j.starts_with(r#"{"key":"job:\"1\"","held":true,"owner":"peer:kazoo","fence":7,"last_fence":7,"remaining_ms":8200,"backend":"redis","url":""#), "{j}");
        assert!(!j.contains("hunter2"), "{j}");
        let free = Inspection::free("sqlite", key);
        assert_eq!(
            json(&free, "sqlite:///x"),
            r#"{"key":"job:\"1\"","held":false,"owner":null,"fence":null,"last_fence":null,"remaining_ms":null,"backend":"sqlite","url":"sqlite:///x"}"#
        );
        assert_eq!(
            line(&free, "sqlite:///x"),
            "job:\"1\": free (sqlite at sqlite:///x)"
        );
        assert_eq!(string("a\\b\n\u{1}"), r#""a\\b\n\u0001""#);
    }
}
