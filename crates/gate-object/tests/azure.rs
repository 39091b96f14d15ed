//! The gate on Azure Blob, against Azurite (`npm install -g azurite`) started by the harness:
//! Azurite refuses stale conditional writes itself, and the resource suite passes with the
//! client's connections cut at a proxy and Azurite killed and restarted on its data dir; and the
//! `fenced_object` example's story on it.
#![cfg(feature = "azure")]

mod support;

#[path = "../examples/fenced_object.rs"]
mod example;

use std::sync::Arc;

use leasehold_conformance::gate::{run_all, GateContext};
use leasehold_conformance::kit::{self, OrFail, TestResult};
use leasehold_conformance::{harness_call, Failure, Verdict};
use leasehold_servers::external;
use leasehold_servers::object_stores::{AZURITE_ACCOUNT, AZURITE_KEY, BUCKET};
use leasehold_servers::AzuriteServer;
use object_store::azure::MicrosoftAzureBuilder;
use object_store::ObjectStore;

fn azure(endpoint: &str) -> TestResult<Arc<dyn ObjectStore>> {
    let store = MicrosoftAzureBuilder::new()
        .with_endpoint(format!("{endpoint}/{AZURITE_ACCOUNT}"))
        .with_allow_http(true)
        .with_account(AZURITE_ACCOUNT)
        .with_access_key(AZURITE_KEY)
        .with_container_name(BUCKET)
        .with_retry(support::quick_retry())
        .build()
        .or_fail("an Azure client for Azurite")?;
    Ok(Arc::new(store))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn azurite_refuses_a_put_on_a_stale_etag() -> TestResult {
    let azurite = kit::start("Azurite", AzuriteServer::start).await?;
    support::server_refuses_stale_versions(
        &*azure(&format!("http://127.0.0.1:{}", azurite.port()))?,
        "Azurite",
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn azure_blob_on_azurite_passes_the_resource_suite_with_faults() -> TestResult {
    let azurite = kit::start("Azurite", AzuriteServer::start).await?;
    let proxy = support::CutProxy::start(azurite.port())
        .await
        .or_fail("a proxy in front of Azurite")?;
    let store = azure(&proxy.url())?;
    let objects = Arc::new(support::Objects::new(store).with_faults(proxy, move || {
        let azurite = azurite.clone();
        harness_call(move || azurite.restart())
    }));
    let ctx = GateContext::new(objects.clone()).with_faults(objects);
    let report = run_all("azure blob on azurite (object gate)", &ctx).await;
    println!("{report}");
    report.passed()?;
    if report
        .lines
        .iter()
        .any(|l| l.outcome != Ok(Verdict::Passed))
    {
        return Err(Failure::new(format!(
            "every scenario applies to Azurite with its data on disk:\n{report}"
        )));
    }
    Ok(())
}

/// The `fenced_object` example against the harness's Azurite (or the server `LEASEHOLD_AZURITE_ENDPOINT`
/// names, e.g. docker compose's), through the example's own client: the paused holder's late
/// write is refused with the new holder's fence, and the object ends under that fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_object_example_refuses_the_paused_holder_on_azurite() -> TestResult {
    let (endpoint, _server) = match external::azurite_endpoint() {
        Some(endpoint) => (endpoint, None),
        None => {
            let server = kit::start("Azurite", AzuriteServer::start).await?;
            (server.url(), Some(server))
        }
    };
    let store = example::azure(&endpoint).or_fail("the example's client")?;
    let outcome = example::run(&leasehold_memory::MemoryAuthority::standalone(), store)
        .await
        .or_fail("the example's story")?;
    let example::Outcome {
        stale_fence,
        fence,
        refused_by,
        final_fence,
        content,
    } = outcome;
    if stale_fence >= fence || refused_by != fence || final_fence != fence {
        return Err(Failure::new(format!(
            "fence {stale_fence} should be refused by {fence} (the object named {refused_by}) \
             and the object end under {fence} (it is under {final_fence}, holding {content})"
        )));
    }
    Ok(())
}
