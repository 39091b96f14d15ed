//! The gate on object_store's in-process stores: `InMemory`, which has conditional writes (the
//! resource suite; no server, so no faults), and `LocalFileSystem`, which has no
//! `PutMode::Update` and which the gate must refuse to use rather than write unconditionally.

mod support;

use std::sync::Arc;

use leasehold_conformance::gate::{run_all, GateContext, NEEDS_FAULTS};
use leasehold_conformance::kit::{OrFail, TestResult};
use leasehold_conformance::Failure;
use leasehold_core::{Fence, FenceSafety, Guarded};
use leasehold_gate_object::{FencedObject, ObjectGate};
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::throttle::{ThrottleConfig, ThrottledStore};
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

/// `InMemory` answers within one poll, so concurrent writers would hardly interleave between a
/// read and a write: a millisecond per call (object_store's `ThrottledStore`) lets them, as a
/// network does, so the concurrency scenario can catch a gate that reads then writes blind.
fn slowed_in_memory() -> Arc<dyn ObjectStore> {
    let per_call = std::time::Duration::from_millis(1);
    Arc::new(ThrottledStore::new(
        InMemory::new(),
        ThrottleConfig {
            wait_get_per_call: per_call,
            wait_put_per_call: per_call,
            ..ThrottleConfig::default()
        },
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_memory_store_passes_the_resource_suite() -> TestResult {
    let ctx = GateContext::new(Arc::new(support::Objects::new(slowed_in_memory())));
    let report = run_all("in-memory object store (object gate)", &ctx).await;
    println!("{report}");
    // No server to cut or restart: the faulted scenarios do not apply, every other one runs.
    report.passed_except(&NEEDS_FAULTS)
}

#[tokio::test]
async fn in_memory_store_refuses_a_stale_version_itself() -> TestResult {
    support::server_refuses_stale_versions(&InMemory::new(), "InMemory").await
}

fn fence(n: u64) -> TestResult<Fence> {
    Fence::from_value(n, FenceSafety::Linearizable).or_fail("a fence")
}

#[tokio::test]
async fn the_object_keeps_its_content_under_a_claim_and_a_foreign_object_is_left_alone(
) -> TestResult {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let object = FencedObject::new(store.clone(), Path::from("ledger"));
    let gate = ObjectGate::new(store.clone());
    let written = gate
        .write(object.path(), fence(3)?, b"paid")
        .await
        .or_fail("write")?;
    if written != Guarded::Accepted {
        return Err(Failure::new(format!(
            "the first write was refused: {written:?}"
        )));
    }
    let claimed = gate
        .claim(object.path(), fence(7)?)
        .await
        .or_fail("claim")?;
    let read = object
        .read()
        .await
        .or_fail("read")?
        .or_fail("the object after the claim")?;
    if claimed != Guarded::Accepted || read.fence != 7 || read.content != b"paid" {
        return Err(Failure::new(format!(
            "after a claim with 7: {claimed:?}, fence {}, content {:?}",
            read.fence, read.content
        )));
    }
    let raw = store
        .get(object.path())
        .await
        .or_fail("raw get")?
        .bytes()
        .await
        .or_fail("raw bytes")?;
    if &raw[..] != b"leasehold-fence:7\npaid" {
        return Err(Failure::new(format!(
            "the stored body is not the documented header + content: {raw:?}"
        )));
    }
    let foreign = Path::from("not-gated");
    store
        .put(&foreign, PutPayload::from_static(b"someone else's"))
        .await
        .or_fail("put a foreign object")?;
    let refused = gate.write(&foreign, fence(9)?, b"mine").await;
    let kept = store
        .get(&foreign)
        .await
        .or_fail("get")?
        .bytes()
        .await
        .or_fail("bytes")?;
    match refused {
        Err(e) if !e.is_retryable() && &kept[..] == b"someone else's" => Ok(()),
        other => Err(Failure::new(format!(
            "a write over an object without a fence header: {other:?}, left {kept:?}"
        ))),
    }
}

#[tokio::test]
async fn a_local_filesystem_has_no_conditional_update_and_the_gate_refuses_to_write_blind(
) -> TestResult {
    let dir = std::env::temp_dir().join(format!("leasehold-gate-object-{}", std::process::id()));
    std::fs::create_dir_all(&dir).or_fail("a temp dir")?;
    let store: Arc<dyn ObjectStore> =
        Arc::new(LocalFileSystem::new_with_prefix(&dir).or_fail("LocalFileSystem")?);
    let gate = ObjectGate::new(store);
    let path = Path::from("ledger");
    // The first write is a create (if-absent), which LocalFileSystem does have.
    let created = gate
        .write(&path, fence(1)?, b"one")
        .await
        .or_fail("the first write")?;
    let second = gate.write(&path, fence(2)?, b"two").await;
    let _ = std::fs::remove_dir_all(&dir);
    if created != Guarded::Accepted {
        return Err(Failure::new(format!("the create was refused: {created:?}")));
    }
    match second {
        Err(e) if !e.is_retryable() && e.to_string().contains("cannot write") => Ok(()),
        other => Err(Failure::new(format!(
            "a second write on LocalFileSystem must fail as not conditional: {other:?}"
        ))),
    }
}
