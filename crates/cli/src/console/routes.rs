//! The console's routes: the pages, the metrics, the script and stylesheet, and the revoke
//! confirmation and request.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use axum::extract::rejection::FormRejection;
use axum::extract::{Path, Query, State};
use axum::http::header::{self, HeaderValue};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Form, Router};
use leasehold::{redact_url, Authority, Inspection, KeyPrefix, LockKey, Revoked};
use maud::Markup;
use metrics_exporter_prometheus::PrometheusHandle;
use serde::Deserialize;
use tokio::sync::watch;

use super::auth::{self, Secret};
use super::history::History;
use super::pages::{self, Frame};

/// What every request handler shares.
pub(crate) struct Shared {
    pub history: Mutex<History>,
    /// Bumped after each look: the event streams wait on it. A watch keeps only the newest
    /// value, so a slow browser never holds the survey back and, when it reads again, skips
    /// to the newest state.
    pub updates: watch::Sender<u64>,
    /// Set when the console is asked to stop: the event streams end.
    pub stopping: watch::Receiver<bool>,
    pub authority: Arc<dyn Authority>,
    /// The authority's URL; shown only through [`redact_url`].
    pub url: String,
    pub prefix: KeyPrefix,
    pub allow_revoke: bool,
    pub csrf: Secret,
    pub token: Option<Secret>,
    /// The `Host` values answered to; `None`: any (beyond loopback, where a token is required).
    pub hosts: Option<Vec<String>>,
    pub metrics: PrometheusHandle,
    /// The bound of one request to the authority.
    pub backstop: Duration,
}

impl Shared {
    /// The history, also after a panic elsewhere (it holds plain data, always consistent).
    pub fn history(&self) -> MutexGuard<'_, History> {
        self.history.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn page(&self, title: &str, body: Markup) -> Response {
        let url = redact_url(&self.url);
        let frame = Frame {
            url: &url,
            prefix: self.prefix.as_str(),
            allow_revoke: self.allow_revoke,
        };
        html(pages::page(&frame, title, body))
    }

    /// `key`, inspected now within the backstop; the error's text (redacted) if that failed.
    async fn inspect(&self, key: &LockKey) -> Result<Inspection, String> {
        match tokio::time::timeout(self.backstop, self.authority.inspect(key)).await {
            Ok(Ok(seen)) => Ok(seen),
            Ok(Err(e)) => Err(super::redacted(&crate::chain(&e), &self.url)),
            Err(_) => Err(format!(
                "the authority did not answer within {}",
                crate::duration::human(self.backstop)
            )),
        }
    }
}

/// The console's router.
pub(crate) fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/", get(index))
        .route("/key/{*key}", get(key_page))
        .route("/events", get(super::events::events))
        .route("/metrics", get(metrics))
        .route("/console.js", get(script))
        .route("/console.css", get(style))
        .route("/revoke", get(confirm).post(revoke))
        .layer(axum::middleware::from_fn_with_state(
            shared.clone(),
            auth::guard,
        ))
        .with_state(shared)
}

fn html(markup: Markup) -> Response {
    (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        pages::text(markup),
    )
        .into_response()
}

async fn index(State(shared): State<Arc<Shared>>) -> Response {
    let live = pages::index_live(&shared.history(), shared.allow_revoke);
    shared.page("Keys", pages::live("/events", live))
}

async fn key_page(State(shared): State<Arc<Shared>>, Path(key): Path<String>) -> Response {
    let key = match LockKey::new(&key) {
        Ok(key) => key,
        Err(e) => return (StatusCode::NOT_FOUND, e.to_string()).into_response(),
    };
    let events = format!("/events?key={}", &pages::key_path(&key)["/key/".len()..]);
    let listed = shared.history().key(&key).cloned();
    // A key the survey does not list (past --limit, or free and forgotten) is asked about now.
    let now = match listed {
        Some(seen) => Some(seen),
        None => shared.inspect(&key).await.ok(),
    };
    let live = pages::key_live(&shared.history(), &key, now.as_ref(), shared.allow_revoke);
    shared.page(key.as_str(), pages::live(&events, live))
}

async fn metrics(State(shared): State<Arc<Shared>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        shared.metrics.render(),
    )
        .into_response()
}

async fn script() -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/javascript; charset=utf-8"),
        )],
        pages::SCRIPT,
    )
        .into_response()
}

async fn style() -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/css; charset=utf-8"),
        )],
        pages::STYLE,
    )
        .into_response()
}

/// The answer to a revoke without `--allow-revoke`.
fn revocation_off(shared: &Shared) -> Response {
    let mut response = shared.page(
        "Revocation is off",
        pages::outcome(
            "Revocation is off",
            "This console was started without --allow-revoke: it shows the keys but ends no \
             lease.",
            None,
        ),
    );
    *response.status_mut() = StatusCode::FORBIDDEN;
    response
}

#[derive(Debug, Deserialize)]
struct Which {
    key: String,
}

/// The confirmation: the key inspected now, its holder and fence, and the form.
async fn confirm(State(shared): State<Arc<Shared>>, Query(which): Query<Which>) -> Response {
    if !shared.allow_revoke {
        return revocation_off(&shared);
    }
    let key = match LockKey::new(&which.key) {
        Ok(key) => key,
        Err(e) => return (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
    };
    match shared.inspect(&key).await {
        Ok(seen) => shared.page(
            &format!("Revoke {key}?"),
            pages::confirm(&seen, shared.csrf.as_str()),
        ),
        Err(why) => failure(&shared, StatusCode::BAD_GATEWAY, "Cannot look", &why, &key),
    }
}

#[derive(Deserialize)]
struct RevokeForm {
    key: String,
    fence: u64,
    csrf: String,
}

/// Revokes the holder the operator saw: refused unless the form's CSRF token is this
/// process's and the key is still held with the fence the form carries.
async fn revoke(
    State(shared): State<Arc<Shared>>,
    form: Result<Form<RevokeForm>, FormRejection>,
) -> Response {
    if !shared.allow_revoke {
        return revocation_off(&shared);
    }
    let Ok(Form(form)) = form else {
        return auth::refuse(StatusCode::BAD_REQUEST, "refused: not a revoke form");
    };
    if !shared.csrf.matches(&form.csrf) {
        return auth::refuse(
            StatusCode::FORBIDDEN,
            "refused: the form's token is not this console's (reload the page and try again)",
        );
    }
    let key = match LockKey::new(&form.key) {
        Ok(key) => key,
        Err(e) => return (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
    };
    let seen = match shared.inspect(&key).await {
        Ok(seen) => seen,
        Err(why) => {
            return failure(
                &shared,
                StatusCode::BAD_GATEWAY,
                "Nothing revoked",
                &why,
                &key,
            )
        }
    };
    let now = seen.fence.filter(|_| seen.held).map(|f| f.value());
    if now != Some(form.fence) {
        let said = match now {
            Some(f) => format!(
                "The holder changed since you looked: the key's fence is {f} now, not {}. \
                 Nothing was revoked.",
                form.fence
            ),
            None => format!(
                "The holder changed since you looked: the key is free now (you saw fence {}). \
                 Nothing was revoked.",
                form.fence
            ),
        };
        return failure(
            &shared,
            StatusCode::CONFLICT,
            "Nothing revoked",
            &said,
            &key,
        );
    }
    // A revoke may read the holder before it ends the lease: two requests.
    let backstop = shared.backstop.saturating_mul(2);
    match tokio::time::timeout(backstop, shared.authority.revoke(&key)).await {
        Ok(Ok(Revoked::Revoked { fence })) => {
            tracing::info!(key = %key, fence = fence.value(), "console: revoked");
            metrics::counter!("leasehold_console_revocations_total").increment(1);
            shared
                .history()
                .revoked(std::time::SystemTime::now(), &key, fence.value());
            // The check above and the revoke are two requests: a holder that arrived in the
            // instant between them is the one revoked, and the operator must hear of it.
            let said = if fence.value() == form.fence {
                format!(
                    "Revoked the lease with fence {} on {key}; the next holder's fence is greater.",
                    fence.value()
                )
            } else {
                format!(
                    "The key changed hands just before the revoke: revoked the lease with fence \
                     {}, not the fence {} you saw (that holder had already gone). The next \
                     holder's fence is greater.",
                    fence.value(),
                    form.fence
                )
            };
            shared.page("Revoked", pages::outcome("Revoked", &said, Some(&key)))
        }
        Ok(Ok(_)) => shared.page(
            "Nothing revoked",
            pages::outcome(
                "Nothing revoked",
                "The key was free by then: nothing was revoked.",
                Some(&key),
            ),
        ),
        Ok(Err(e)) => {
            let why = super::redacted(&crate::chain(&e), &shared.url);
            failure(
                &shared,
                StatusCode::BAD_GATEWAY,
                "Revoke failed",
                &why,
                &key,
            )
        }
        Err(_) => failure(
            &shared,
            StatusCode::GATEWAY_TIMEOUT,
            "Revoke unconfirmed",
            "The authority did not answer in time: the lease may or may not have ended; look \
             again.",
            &key,
        ),
    }
}

fn failure(shared: &Shared, status: StatusCode, title: &str, why: &str, key: &LockKey) -> Response {
    let mut response = shared.page(title, pages::outcome(title, why, Some(key)));
    *response.status_mut() = status;
    response
}
