//! The gate on S3, against moto's server mode (`pip install 'moto[server]'`) started by the
//! harness: moto refuses stale conditional writes itself, and the resource suite passes with the
//! client's connections cut at a proxy and the server restarted (moto keeps no data across a
//! restart: declared); and the `fenced_object` example's story on it.
#![cfg(feature = "aws")]

mod support;

#[path = "../examples/fenced_object.rs"]
mod example;

use std::sync::Arc;

use leasehold_conformance::gate::{run_all, GateContext};
use leasehold_conformance::kit::{self, OrFail, TestResult};
use leasehold_conformance::{harness_call, Failure, Verdict};
use leasehold_servers::external;
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
    let proxy = support::CutProxy::start(moto.port())
        .await
        .or_fail("a proxy in front of moto")?;
    let store = s3(&proxy.url())?;
    let objects = Arc::new(support::Objects::new(store).with_faults(proxy, move || {
        let moto = moto.clone();
        harness_call(move || moto.restart())
    }));
    let ctx = GateContext::new(objects.clone())
        .with_faults(objects)
        .forgets_on_restart("moto keeps its buckets and objects in memory only");
    let report = run_all("s3 on moto (object gate)", &ctx).await;
    println!("{report}");
    report.passed()?;
    let not_passed: Vec<_> = report
        .lines
        .iter()
        .filter(|l| l.outcome != Ok(Verdict::Passed))
        .map(|l| l.scenario)
        .collect();
    if not_passed != ["fence_survives_restart"] {
        return Err(Failure::new(format!(
            "every scenario but the restart (declared) must pass on moto:\n{report}"
        )));
    }
    Ok(())
}

/// The `fenced_object` example against the harness's moto (or the server `LEASEHOLD_S3_ENDPOINT`
/// names, e.g. docker compose's), through the example's own client: the paused holder's late
/// write is refused with the new holder's fence, and the object ends under that fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_object_example_refuses_the_paused_holder_on_moto() -> TestResult {
    let (endpoint, _server) = match external::s3_endpoint() {
        Some(endpoint) => (endpoint, None),
        None => {
            let server = kit::start("moto", MotoServer::start).await?;
            (server.url(), Some(server))
        }
    };
    let store = example::s3(&endpoint).or_fail("the example's client")?;
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
