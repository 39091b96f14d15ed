//! The example service over real HTTP (axum on a loopback port, reqwest as the caller, SQLite as
//! the store): a current fence is accepted, the holder's own fence again too, an older one is
//! refused with the newest fence, and a request without a fence is refused.

#[path = "../examples/fenced_service.rs"]
mod fenced_service;

use leasehold_core::{Fence, FenceSafety};
use leasehold_gate_http::{newest_fence, FencedRequest, FENCE_HEADER};
use reqwest::StatusCode;

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn fence(n: u64) -> Result<Fence, leasehold_core::Error> {
    Fence::from_value(n, FenceSafety::Linearizable)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_fence_is_refused_by_the_service_and_a_current_one_accepted() -> TestResult {
    let dir = tempfile::tempdir()?;
    let accounts = fenced_service::open(&dir.path().join("accounts.db")).await?;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
    let base = format!("http://{}", listener.local_addr()?);
    let server =
        tokio::spawn(async move { axum::serve(listener, fenced_service::app(accounts)).await });
    let client = reqwest::Client::new();
    let url = format!("{base}/accounts/a1");
    let put = |n: u64, body: &'static str| {
        let request = client.put(&url).body(body);
        async move {
            let request = request.fence(&fence(n)?);
            Ok::<_, Box<dyn std::error::Error>>(request.send().await?)
        }
    };
    let first: reqwest::Response = put(7, "120")
        .await
        .map_err(|e: Box<dyn std::error::Error>| e)?;
    assert_eq!(
        first.status(),
        StatusCode::NO_CONTENT,
        "the holder's first write"
    );
    let again: reqwest::Response = put(7, "130")
        .await
        .map_err(|e: Box<dyn std::error::Error>| e)?;
    assert_eq!(
        again.status(),
        StatusCode::NO_CONTENT,
        "the holder's second write"
    );
    let stale: reqwest::Response = put(6, "999")
        .await
        .map_err(|e: Box<dyn std::error::Error>| e)?;
    assert_eq!(
        stale.status(),
        StatusCode::CONFLICT,
        "the older fence's write"
    );
    assert_eq!(
        newest_fence(stale.headers()),
        Some(7),
        "the newest fence named"
    );
    let unfenced = client
        .put(format!("{base}/accounts/a1"))
        .body("5")
        .send()
        .await?;
    assert_eq!(unfenced.status(), StatusCode::PRECONDITION_REQUIRED);
    let garbage = client
        .put(format!("{base}/accounts/a1"))
        .header(FENCE_HEADER, "seven")
        .body("5")
        .send()
        .await?;
    assert_eq!(garbage.status(), StatusCode::BAD_REQUEST);
    let read = client
        .get(format!("{base}/accounts/a1"))
        .send()
        .await?
        .text()
        .await?;
    assert_eq!(
        read, "130 (fence 7)",
        "only the current holder's writes landed"
    );
    let newer: reqwest::Response = put(8, "140")
        .await
        .map_err(|e: Box<dyn std::error::Error>| e)?;
    assert_eq!(
        newer.status(),
        StatusCode::NO_CONTENT,
        "a newer holder's write"
    );
    server.abort();
    Ok(())
}
