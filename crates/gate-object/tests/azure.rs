//! The gate on Azure Blob, against Azurite (`npm install -g azurite`) started by the harness:
//! Azurite refuses stale conditional writes itself, and the resource suite passes with the
//! client's connections cut at a proxy and Azurite killed and restarted on its data dir.
#![cfg(feature = "azure")]

mod support;

use std::sync::Arc;

use leasehold_conformance::gate::run_all;
use leasehold_conformance::kit::{self, OrFail, TestResult};
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
    let ctx = support::behind_proxy(
        azurite.clone(),
        azurite.port(),
        azure,
        AzuriteServer::restart,
    )
    .await?;
    let report = run_all("azure blob on azurite (object gate)", &ctx).await;
    println!("{report}");
    // Every scenario applies to Azurite with its data on disk.
    report.passed_except(&[])
}
