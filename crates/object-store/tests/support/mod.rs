//! What the object-store authority's tests share: store clients for the harness's servers,
//! authorities on them (each its own client, as a separate process would have), and the
//! faults the harness offers.
#![allow(dead_code)]

pub mod suite;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold_conformance::kit::{OrFail, TestResult};
use leasehold_conformance::{harness_error, Connector, Faults};
use leasehold_core::{Authority, ClientOptions, LockKey};
use leasehold_object_store::{ObjectStoreAuthority, ObjectStoreConfig};
use object_store::path::{Path, PathPart};
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

/// The prefix every test writes its lease objects under.
pub const PREFIX: &str = "leasehold-tests";

/// The store's own retries: few and short, so a paused or restarted server comes back to the
/// authority as an error within its request timeout.
pub fn quick_retry() -> object_store::RetryConfig {
    object_store::RetryConfig {
        max_retries: 2,
        retry_timeout: Duration::from_secs(2),
        ..Default::default()
    }
}

/// An S3 client of moto at `endpoint`.
#[cfg(feature = "aws")]
pub fn s3(endpoint: &str) -> TestResult<Arc<dyn ObjectStore>> {
    use leasehold_servers::object_stores::BUCKET;
    use object_store::aws::{AmazonS3Builder, S3ConditionalPut};
    let store = AmazonS3Builder::new()
        .with_endpoint(endpoint)
        .with_allow_http(true)
        .with_bucket_name(BUCKET)
        .with_region("us-east-1")
        .with_access_key_id("leasehold")
        .with_secret_access_key("leasehold")
        .with_conditional_put(S3ConditionalPut::ETagMatch)
        .with_retry(quick_retry())
        .build()
        .or_fail("an S3 client for moto")?;
    Ok(Arc::new(store))
}

/// An Azure Blob client of Azurite on `port`.
#[cfg(feature = "azure")]
pub fn azure(port: u16) -> TestResult<Arc<dyn ObjectStore>> {
    use leasehold_servers::object_stores::{AZURITE_ACCOUNT, AZURITE_KEY, BUCKET};
    use object_store::azure::MicrosoftAzureBuilder;
    let store = MicrosoftAzureBuilder::new()
        .with_endpoint(format!("http://127.0.0.1:{port}/{AZURITE_ACCOUNT}"))
        .with_allow_http(true)
        .with_account(AZURITE_ACCOUNT)
        .with_access_key(AZURITE_KEY)
        .with_container_name(BUCKET)
        .with_retry(quick_retry())
        .build()
        .or_fail("an Azure client for Azurite")?;
    Ok(Arc::new(store))
}

/// One moto for every test of a binary that only reads and writes its own keys (none pauses
/// or restarts it): starting one takes longer than most of these tests. Started off the
/// runtime's workers; it lives until the test process ends.
#[cfg(feature = "aws")]
pub async fn shared_moto() -> TestResult<&'static leasehold_servers::MotoServer> {
    use std::sync::OnceLock;
    static MOTO: OnceLock<Result<leasehold_servers::MotoServer, String>> = OnceLock::new();
    tokio::task::spawn_blocking(|| {
        MOTO.get_or_init(|| leasehold_servers::MotoServer::start().map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|e| leasehold_conformance::Failure::new(format!("moto must start: {e}")))
    })
    .await
    .or_fail("start the shared moto")?
}

/// One Azurite for every test of a binary, as [`shared_moto`].
#[cfg(feature = "azure")]
pub async fn shared_azurite() -> TestResult<&'static leasehold_servers::AzuriteServer> {
    use std::sync::OnceLock;
    static AZURITE: OnceLock<Result<leasehold_servers::AzuriteServer, String>> = OnceLock::new();
    tokio::task::spawn_blocking(|| {
        AZURITE
            .get_or_init(|| leasehold_servers::AzuriteServer::start().map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|e| leasehold_conformance::Failure::new(format!("Azurite must start: {e}")))
    })
    .await
    .or_fail("start the shared Azurite")?
}

type MakeStore = dyn Fn() -> TestResult<Arc<dyn ObjectStore>> + Send + Sync;

/// New authorities, each on a new store client.
pub struct Clients {
    make: Box<MakeStore>,
    config: ObjectStoreConfig,
}

impl Clients {
    /// Authorities on stores from `make`, configured with `config`.
    pub fn new(
        make: impl Fn() -> TestResult<Arc<dyn ObjectStore>> + Send + Sync + 'static,
        config: ObjectStoreConfig,
    ) -> Self {
        Clients {
            make: Box::new(make),
            config,
        }
    }

    /// One authority.
    pub fn authority(&self) -> TestResult<ObjectStoreAuthority> {
        Ok(ObjectStoreAuthority::new(
            (self.make)()?,
            self.config.clone(),
        ))
    }

    /// A store client for the test's own reads and writes.
    pub fn store(&self) -> TestResult<Arc<dyn ObjectStore>> {
        (self.make)()
    }
}

/// The configuration the tests use: a request timeout short enough that outages show within
/// seconds, and long enough for Azurite (one Node process) or moto (Python) to answer while
/// both cores are busy: at 2 s, a loaded run saw reads of an unpaused Azurite time out.
pub fn config() -> ObjectStoreConfig {
    let client = ClientOptions {
        request_timeout: Duration::from_secs(4),
        ..ClientOptions::default()
    };
    ObjectStoreConfig::new(PREFIX).with_client(client)
}

#[async_trait]
impl Connector for Clients {
    async fn connect(&self) -> leasehold_core::Result<Arc<dyn Authority>> {
        let authority = self.authority().map_err(harness_error)?;
        Ok(Arc::new(authority))
    }
}

/// The lease object of `key` under [`PREFIX`], as the authority names it.
pub fn lease_path(key: &LockKey) -> Path {
    Path::from(PREFIX).join(PathPart::from(key.as_str()))
}

type Call =
    Box<dyn Fn() -> Pin<Box<dyn Future<Output = leasehold_core::Result<()>> + Send>> + Send + Sync>;

/// A server's faults: restart, pause (SIGSTOP) and resume through the harness, and revoke:
/// an operator's unconditional write that frees the key and keeps its fence.
pub struct StoreFaults {
    pub restart: Call,
    pub pause: Call,
    pub resume: Call,
    pub store: Arc<dyn ObjectStore>,
}

fn call<F, Fut>(f: F) -> Call
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = leasehold_core::Result<()>> + Send + 'static,
{
    Box::new(move || Box::pin(f()))
}

/// The faults of a harness server `S` (moto or Azurite).
#[macro_export]
macro_rules! store_faults {
    ($server:expr, $store:expr) => {{
        let (a, b, c) = ($server.clone(), $server.clone(), $server.clone());
        support::StoreFaults::new(
            move || {
                let s = a.clone();
                leasehold_conformance::harness_call(move || s.restart())
            },
            move || {
                let s = b.clone();
                leasehold_conformance::harness_call(move || s.pause())
            },
            move || {
                let s = c.clone();
                leasehold_conformance::harness_call(move || s.resume())
            },
            $store,
        )
    }};
}

impl StoreFaults {
    pub fn new<R, RF, P, PF, U, UF>(
        restart: R,
        pause: P,
        resume: U,
        store: Arc<dyn ObjectStore>,
    ) -> Self
    where
        R: Fn() -> RF + Send + Sync + 'static,
        RF: Future<Output = leasehold_core::Result<()>> + Send + 'static,
        P: Fn() -> PF + Send + Sync + 'static,
        PF: Future<Output = leasehold_core::Result<()>> + Send + 'static,
        U: Fn() -> UF + Send + Sync + 'static,
        UF: Future<Output = leasehold_core::Result<()>> + Send + 'static,
    {
        StoreFaults {
            restart: call(restart),
            pause: call(pause),
            resume: call(resume),
            store,
        }
    }
}

#[async_trait]
impl Faults for StoreFaults {
    async fn restart(&self) -> leasehold_core::Result<()> {
        (self.restart)().await
    }

    async fn pause(&self) -> leasehold_core::Result<()> {
        (self.pause)().await
    }

    async fn resume(&self) -> leasehold_core::Result<()> {
        (self.resume)().await
    }

    /// Rewrites the object free, unconditionally, keeping its fence and raising its sequence
    /// number far past the holder's: the holder's next conditional write is refused.
    async fn revoke(&self, key: &LockKey) -> leasehold_core::Result<()> {
        let path = lease_path(key);
        let got = self.store.get(&path).await.map_err(harness_error)?;
        let body = got.bytes().await.map_err(harness_error)?;
        let mut record: serde_json::Value = serde_json::from_slice(&body).map_err(harness_error)?;
        let seq = record["seq"].as_u64().unwrap_or(0) + 1000;
        record["state"] = "free".into();
        record["owner"] = "".into();
        record["seq"] = seq.into();
        let body = serde_json::to_vec(&record).map_err(harness_error)?;
        self.store
            .put(&path, PutPayload::from(body))
            .await
            .map_err(harness_error)?;
        Ok(())
    }
}
