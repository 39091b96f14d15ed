//! `leasehold console`: a web page of the keys under a prefix, kept current by a survey of the
//! authority every `--interval`, with revoke buttons behind `--allow-revoke`.
//!
//! One task looks at the authority and records what it saw in the [`history::History`]; the
//! HTTP server renders pages from it, and its event streams push a fresh fragment after each
//! look. Every request to the authority is bounded, and the browsers never hold the survey back.

mod auth;
mod events;
mod history;
mod pages;
mod routes;

use std::future::IntoFuture;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use leasehold::{redact_url, KeyPrefix};
use leasehold_core::backend::url_secrets;
use metrics_exporter_prometheus::PrometheusBuilder;
use tokio::sync::watch;

use crate::args::ConsoleArgs;
use crate::stop::StopSignals;
use crate::survey::Survey;
use crate::{code, failed};
use routes::Shared;

/// How long the server has, once asked to stop, to finish the requests under way.
const DRAIN: Duration = Duration::from_secs(2);

/// Serves the console until SIGINT, SIGTERM or SIGHUP; 0 then, or the status of what kept it from
/// starting.
pub async fn console(args: ConsoleArgs) -> u8 {
    let prefix = match KeyPrefix::new(&args.prefix) {
        Ok(p) => p,
        Err(e) => return failed(&e, "", code::USAGE),
    };
    let token = auth::access_token(
        args.token_file.as_deref(),
        std::env::var(auth::TOKEN_ENV).ok(),
    )
    .and_then(|token| auth::check_listen(args.listen, token.as_ref()).map(|()| token));
    let token = match token {
        Ok(token) => token,
        Err(e) => {
            say!("leasehold: {e}");
            return code::USAGE;
        }
    };
    if args.interval < Duration::from_millis(10) {
        say!("leasehold: --interval must be at least 10ms");
        return code::USAGE;
    }
    let csrf = match auth::Secret::generate() {
        Ok(csrf) => csrf,
        Err(e) => {
            say!("leasehold: {e}");
            return code::UNAVAILABLE;
        }
    };
    let metrics = match PrometheusBuilder::new().install_recorder() {
        Ok(handle) => handle,
        Err(e) => {
            say!("leasehold: cannot record metrics: {e}");
            return code::UNAVAILABLE;
        }
    };
    leasehold::telemetry::describe();
    describe_metrics();
    // Before anything is served, so that a stop asked as soon as the address is printed counts.
    let Some(mut signals) = StopSignals::watch() else {
        say!("leasehold: cannot watch for signals");
        return code::UNAVAILABLE;
    };
    let (url, timeout, authority) = match crate::status::open(args.url.as_deref()).await {
        Ok(opened) => opened,
        Err(code) => return code,
    };
    // The backend bounds each request by the URL's timeout; this is a backstop.
    let backstop = timeout
        .saturating_mul(2)
        .saturating_add(Duration::from_secs(1));
    let listener = match tokio::net::TcpListener::bind(args.listen).await {
        Ok(listener) => listener,
        Err(e) => {
            say!("leasehold: cannot listen on {}: {e}", args.listen);
            let _ = tokio::time::timeout(backstop, authority.close()).await;
            return code::UNAVAILABLE;
        }
    };
    let addr = match listener.local_addr() {
        Ok(addr) => addr,
        Err(e) => {
            say!("leasehold: cannot listen on {}: {e}", args.listen);
            let _ = tokio::time::timeout(backstop, authority.close()).await;
            return code::UNAVAILABLE;
        }
    };
    let (stop, stopping) = watch::channel(false);
    let (updates, _) = watch::channel(0u64);
    let shared = Arc::new(Shared {
        history: Mutex::new(history::History::default()),
        updates,
        stopping: stopping.clone(),
        authority: authority.clone(),
        url: url.clone(),
        prefix: prefix.clone(),
        allow_revoke: args.allow_revoke,
        csrf,
        hosts: auth::allowed_hosts(addr),
        token,
        metrics,
        backstop,
    });
    let survey = Survey::new(authority.clone(), prefix, args.limit, backstop);
    let looking = tokio::spawn(keep_looking(
        shared.clone(),
        survey,
        args.limit,
        args.interval,
    ));
    let mut until_stopped = stopping.clone();
    let server = axum::serve(listener, routes::router(shared))
        .with_graceful_shutdown(async move {
            let _ = until_stopped.wait_for(|stop| *stop).await;
        })
        .into_future();
    let serving = tokio::spawn(server);
    let _ = crate::print_out(&format!("leasehold console: http://{addr}/"));
    signals.stopped().await;
    let _ = stop.send(true);
    looking.abort();
    match tokio::time::timeout(DRAIN, serving).await {
        Ok(Ok(Err(e))) => say!("leasehold: the console's server failed: {e}"),
        Err(_) => say!("leasehold: requests still open after {DRAIN:?} were dropped"),
        _ => {}
    }
    match tokio::time::timeout(backstop, authority.close()).await {
        Ok(Err(e)) => say!(
            "leasehold: closing the authority failed: {}",
            redacted(&crate::chain(&e), &url)
        ),
        Err(_) => say!(
            "leasehold: closing the authority took longer than {DRAIN:?}; what it keeps ends \
             with its TTL"
        ),
        Ok(Ok(())) => {}
    }
    0
}

/// Looks at the authority every `interval` and tells the event streams. A failed look shows
/// in the banner and the next one comes all the same.
async fn keep_looking(shared: Arc<Shared>, mut survey: Survey, limit: usize, interval: Duration) {
    // One list and one inspection per key, each bounded by the backstop in the survey; this
    // bounds the whole look as well.
    let requests = u32::try_from(limit.saturating_add(1)).unwrap_or(u32::MAX);
    let whole = shared.backstop.saturating_mul(requests);
    loop {
        let started = Instant::now();
        let looked = tokio::time::timeout(whole, survey.look()).await;
        metrics::histogram!("leasehold_console_look_seconds")
            .record(started.elapsed().as_secs_f64());
        metrics::counter!("leasehold_console_looks_total").increment(1);
        match looked {
            Ok(Ok(look)) => {
                metrics::gauge!("leasehold_console_keys").set(look.keys.len() as f64);
                shared.history().seen(look);
            }
            Ok(Err(e)) => {
                metrics::counter!("leasehold_console_look_errors_total").increment(1);
                let why = redacted(&crate::chain(&e), &shared.url);
                let mut history = shared.history();
                // Logged once per outage, not at every look.
                if history.error.is_none() {
                    tracing::warn!("console: the look at the authority failed: {why}");
                }
                history.failed(why);
            }
            Err(_) => {
                metrics::counter!("leasehold_console_look_errors_total").increment(1);
                shared.history().failed(format!(
                    "the authority did not answer within {}",
                    crate::duration::human(whole)
                ));
            }
        }
        shared.updates.send_modify(|n| *n = n.wrapping_add(1));
        tokio::time::sleep(interval.saturating_sub(started.elapsed())).await;
    }
}

fn describe_metrics() {
    metrics::describe_counter!(
        "leasehold_console_looks_total",
        "Looks the console took at the authority (a list and an inspection of each key)."
    );
    metrics::describe_counter!(
        "leasehold_console_look_errors_total",
        "Looks that failed or did not finish within their bound."
    );
    metrics::describe_histogram!(
        "leasehold_console_look_seconds",
        metrics::Unit::Seconds,
        "How long one look at the authority took."
    );
    metrics::describe_gauge!(
        "leasehold_console_keys",
        "Keys the last look found under the prefix."
    );
    metrics::describe_counter!(
        "leasehold_console_revocations_total",
        "Leases the console's operators revoked."
    );
}

/// `text` with the URL's secrets taken out: the URL itself redacted, and each secret it
/// carries, decoded or not, wherever an error quoted it.
pub(crate) fn redacted(text: &str, url: &str) -> String {
    let mut text = text.replace(url, &redact_url(url));
    for secret in url_secrets(url) {
        text = text.replace(&secret, "***");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_never_shows() {
        let url = "postgres://app:hunt%40er2@db:5432/x";
        let said = redacted(
            &format!("connect {url}: bad password hunt@er2 for hunt%40er2"),
            url,
        );
        assert!(!said.contains("hunt"), "{said}");
        let query = "postgres://app@db/x?password=s3cret";
        assert!(!redacted("auth failed for s3cret", query).contains("s3cret"));
        assert_eq!(redacted("a:b@c", "redis://h/0?x=a:b@c"), "a:b@c");
        assert_eq!(redacted("plain", "sqlite:///x"), "plain");
    }
}
