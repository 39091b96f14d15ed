//! The `fenced_object` example's story on each store with a server here, through the example's
//! own clients, against the harness's servers (or, with `LEASEHOLD_S3_ENDPOINT` /
//! `LEASEHOLD_AZURITE_ENDPOINT` set, against those, e.g. docker compose's): the paused holder's
//! late write is refused with the new holder's fence, and the object ends under that fence.
#![cfg(any(feature = "aws", feature = "azure"))]

#[path = "../examples/fenced_object.rs"]
mod example;

use std::sync::Arc;

use leasehold_conformance::kit::{self, OrFail, TestResult};
use leasehold_conformance::Failure;
use leasehold_memory::MemoryAuthority;
use leasehold_servers::external;
use object_store::ObjectStore;

use example::Outcome;

/// Runs the story on `store` and checks what it reports, beyond its own verdict.
async fn refuses_the_paused_holder(store: Arc<dyn ObjectStore>) -> TestResult {
    let outcome = example::run(&MemoryAuthority::standalone(), store)
        .await
        .or_fail("the example's story")?;
    let Outcome {
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

#[cfg(feature = "aws")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_object_example_refuses_the_paused_holder_on_moto() -> TestResult {
    use leasehold_servers::MotoServer;
    let (endpoint, _server) = kit::external_or_start(
        external::s3_endpoint(),
        "moto",
        MotoServer::start,
        MotoServer::url,
    )
    .await?;
    refuses_the_paused_holder(example::s3(&endpoint).or_fail("the example's client")?).await
}

#[cfg(feature = "azure")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_object_example_refuses_the_paused_holder_on_azurite() -> TestResult {
    use leasehold_servers::AzuriteServer;
    let (endpoint, _server) = kit::external_or_start(
        external::azurite_endpoint(),
        "Azurite",
        AzuriteServer::start,
        AzuriteServer::url,
    )
    .await?;
    refuses_the_paused_holder(example::azure(&endpoint).or_fail("the example's client")?).await
}
