//! `ObjectStoreAuthority::connect` with an `s3://` URL, against moto started by the harness:
//! the bucket from the host, the prefix from the path, the store's own keys from the query.
#![cfg(feature = "aws")]

use std::time::Duration;

use leasehold_conformance::kit::{self, OrFail, TestResult};
use leasehold_conformance::Failure;
use leasehold_core::{Authority, KeyPrefix, LockKey};
use leasehold_object_store::ObjectStoreAuthority;
use leasehold_servers::object_stores::BUCKET;
use leasehold_servers::MotoServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_s3_url_names_the_bucket_prefix_and_endpoint() -> TestResult {
    let moto = kit::start("moto", MotoServer::start).await?;
    // Credentials come from the environment, as for any S3 client (moto accepts any). This
    // binary's only test sets them before any client reads them.
    std::env::set_var("AWS_ACCESS_KEY_ID", "leasehold");
    std::env::set_var("AWS_SECRET_ACCESS_KEY", "leasehold");
    let url = format!(
        "s3://{BUCKET}/by-url/locks?endpoint={}&region=us-east-1&allow_http=true\
         &timeout_ms=2000&epoch=3",
        moto.url()
    );
    let a = ObjectStoreAuthority::connect(&url)
        .await
        .or_fail("connect")?;
    let b = ObjectStoreAuthority::connect(&url)
        .await
        .or_fail("connect")?;
    let key = LockKey::new("url/key").or_fail("a key")?;
    let ttl = Duration::from_secs(2);
    let first = a
        .try_acquire(&key, ttl)
        .await
        .or_fail("acquire through the URL's client")?
        .or_fail("the key was free")?;
    if first.fence().epoch().get() != 3 {
        return Err(Failure::new(format!(
            "the URL's epoch is not in {:?}",
            first.fence()
        )));
    }
    if b.try_acquire(&key, ttl)
        .await
        .or_fail("a second try")?
        .is_some()
    {
        return Err(Failure::new("a second client took a held key"));
    }
    let _ = a.release(&first).await.or_fail("release")?;
    let second = b
        .try_acquire(&key, ttl)
        .await
        .or_fail("acquire after release")?
        .or_fail("the released key was not free")?;
    if second.fence() <= first.fence() {
        return Err(Failure::new("the fence did not grow across release"));
    }
    let listed = a
        .list_keys(&KeyPrefix::new("url/").or_fail("a prefix")?, 10)
        .await
        .or_fail("list")?;
    if listed != [key] {
        return Err(Failure::new(format!("listed {listed:?}")));
    }
    Ok(())
}
