//! `/events`: server-sent events, one fragment of HTML after each look (the index's live part,
//! or with `?key=K` that key's), which the page's script swaps in.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream;
use leasehold::LockKey;
use serde::Deserialize;

use super::pages;
use super::routes::Shared;

#[derive(Debug, Deserialize)]
pub(crate) struct View {
    key: Option<String>,
}

/// The stream of fragments: the state now, then one after each look. It waits on a watch,
/// which keeps only the newest value: a browser that reads slowly holds nothing back and skips
/// the states it missed. It ends when the console stops.
pub(crate) async fn events(
    State(shared): State<Arc<Shared>>,
    Query(view): Query<View>,
) -> Response {
    let key = match view.key.as_deref().map(LockKey::new).transpose() {
        Ok(key) => key,
        Err(e) => return (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
    };
    let updates = shared.updates.subscribe();
    let stopping = shared.stopping.clone();
    let start = (shared, key, updates, stopping, true);
    let fragments = stream::unfold(
        start,
        |(shared, key, mut updates, mut stopping, first)| async move {
            if !first {
                tokio::select! {
                    changed = updates.changed() => changed.ok()?,
                    _ = stopping.changed() => return None,
                }
            }
            updates.borrow_and_update();
            if *stopping.borrow() {
                return None;
            }
            let html = {
                let history = shared.history();
                match &key {
                    Some(key) => {
                        pages::key_live(&history, key, history.key(key), shared.allow_revoke)
                    }
                    None => pages::index_live(&history, shared.allow_revoke),
                }
            };
            let event = Event::default().data(pages::text(html));
            Some((
                Ok::<Event, Infallible>(event),
                (shared, key, updates, stopping, false),
            ))
        },
    );
    Sse::new(fragments)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}
