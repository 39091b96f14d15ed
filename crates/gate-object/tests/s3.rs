//! The gate on S3, against moto's server mode (`pip install 'moto[server]'`) started by the
//! harness: moto refuses stale conditional writes itself, and the resource suite passes with the
//! client's connections cut at a proxy and the server restarted (moto keeps no data across a
//! restart: declared).
#![cfg(feature = "aws")]

mod support;

use std::sync::Arc;

use leasehold_conformance::gate::run_all;
use leasehold_conformance::kit::{self, OrFail, TestResult};
use leasehold_servers::object_stores::BUCKET;
use leasehold_servers::MotoServer;
use object_store::aws::{AmazonS3Builder, S3ConditionalPut};
use object_store::ObjectStore;

fn s3(endpoint: &str) -> TestResult<Arc<dyn ObjectStore>> {
    let store = AmazonS3Builder::new()
        .with_endpoint(endpoint)
        .with_allow_http(true)
        .with_bucket_name(BUCKET)
        .with_region("us-east-1")
        .with_access_key_id("leasehold")
        .with_secret_access_key("leasehold")
        .with_conditional_put(S3ConditionalPut::ETagMatch)
        .with_retry(support::quick_retry())
        .build()
        .or_fail("an S3 client for moto")?;
    Ok(Arc::new(store))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moto_refuses_a_put_on_a_stale_etag() -> TestResult {
    let moto = kit::start("moto", MotoServer::start).await?;
    support::server_refuses_stale_versions(&*s3(&moto.url())?, "moto (S3)").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_on_moto_passes_the_resource_suite_with_faults() -> TestResult {
    let moto = kit::start("moto", MotoServer::start).await?;
    let ctx = support::behind_proxy(moto.clone(), moto.port(), s3, MotoServer::restart)
        .await?
        .forgets_on_restart("moto keeps its buckets and objects in memory only");
    let report = run_all("s3 on moto (object gate)", &ctx).await;
    println!("{report}");
    report.passed_except(&["fence_survives_restart"])
}
