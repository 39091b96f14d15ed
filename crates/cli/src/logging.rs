//! Logging to stderr, filtered by `LEASEHOLD_LOG` (or else `RUST_LOG`).

use std::io::IsTerminal;

use tracing_subscriber::filter::{filter_fn, FilterExt, LevelFilter};
use tracing_subscriber::fmt::format::FmtSpan;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// Where the acquire, renew and release spans come from (`leasehold_core::Instrumented`).
const SPANS_TARGET: &str = "leasehold_core::instrument";

/// Starts logging. The filter is `LEASEHOLD_LOG`, else `RUST_LOG`, else `warn`.
///
/// * Spans are printed when they close, with their fields (key, TTL, fence, outcome) and time:
///   the acquire, renew and release spans carry no events of their own, so without this a filter
///   of `info` would show nothing of them.
/// * The renew span is a DEBUG span (it fires every third of the TTL, for every lease of a
///   library user). For the command, one lease, it is what shows the lease is alive: whenever
///   the filter lets the INFO acquire and release spans through, it lets the renew span through
///   too.
/// * No colour codes unless stderr is a terminal (and `NO_COLOR` is unset).
pub fn init() {
    let (text, from) = match std::env::var("LEASEHOLD_LOG") {
        Ok(t) if !t.trim().is_empty() => (t, "LEASEHOLD_LOG"),
        _ => match std::env::var("RUST_LOG") {
            Ok(t) if !t.trim().is_empty() => (t, "RUST_LOG"),
            _ => ("warn".to_string(), ""),
        },
    };
    let filter = match EnvFilter::builder().parse(&text) {
        Ok(f) => f,
        Err(e) => {
            say!("leasehold: ignoring {from}=`{text}`: {e}");
            EnvFilter::new("warn")
        }
    };
    // Exactly the renew span, not the events in it: a span directive in the `EnvFilter` would
    // let every DEBUG event inside the span through too (a backend's own debug messages).
    let show_renew = shows_info_spans(&filter);
    let renew = filter_fn(move |m| {
        show_renew && m.is_span() && m.name() == "leasehold.renew" && m.target() == SPANS_TARGET
    })
    .with_max_level_hint(if show_renew {
        LevelFilter::DEBUG
    } else {
        LevelFilter::OFF
    });
    let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let layer = tracing_subscriber::fmt::layer()
        .with_span_events(FmtSpan::CLOSE)
        .with_ansi(ansi)
        .with_writer(std::io::stderr)
        .with_filter(filter.or(renew));
    let _ = tracing_subscriber::registry().with(layer).try_init();
}

/// Whether `filter` lets the INFO spans of [`SPANS_TARGET`] through, asked of the filter itself
/// (in a subscriber of its own, before it becomes the global one).
fn shows_info_spans(filter: &EnvFilter) -> bool {
    let probe = tracing_subscriber::registry().with(EnvFilter::new(filter.to_string()));
    tracing::subscriber::with_default(
        probe,
        || tracing::enabled!(target: "leasehold_core::instrument", tracing::Level::INFO),
    )
}
