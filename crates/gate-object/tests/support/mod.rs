//! What the gate's tests share: a proxy whose connections the test can cut, the objects the
//! resource suite writes, and the store faults it injects.
#![allow(dead_code)]

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use leasehold_conformance::gate::{GateFactory, GateFaults, Probed};
use leasehold_conformance::kit::TestResult;
use leasehold_conformance::Failure;
use leasehold_core::OwnerToken;
use leasehold_gate_object::FencedObject;
use object_store::path::Path;
use object_store::ObjectStore;
use object_store::{ObjectStoreExt, PutMode, PutOptions, PutPayload, UpdateVersion};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;

/// A TCP proxy on a free loopback port in front of a server's port: the store's client talks
/// to the proxy, and [`CutProxy::cut`] drops every connection at once, requests in flight
/// included, as a network failure does. New connections are forwarded again right away.
pub struct CutProxy {
    port: u16,
    connections: Arc<Mutex<Vec<AbortHandle>>>,
    accept: AbortHandle,
}

impl CutProxy {
    /// Listens on 127.0.0.1 and forwards to `127.0.0.1:target`.
    pub async fn start(target: u16) -> std::io::Result<CutProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let connections: Arc<Mutex<Vec<AbortHandle>>> = Arc::default();
        let accept = {
            let connections = connections.clone();
            tokio::spawn(async move {
                while let Ok((mut client, _)) = listener.accept().await {
                    let task = tokio::spawn(async move {
                        if let Ok(mut server) = TcpStream::connect(("127.0.0.1", target)).await {
                            let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                        }
                    });
                    let mut live = connections.lock().unwrap_or_else(|e| e.into_inner());
                    live.retain(|t| !t.is_finished());
                    live.push(task.abort_handle());
                }
            })
            .abort_handle()
        };
        Ok(CutProxy {
            port,
            connections,
            accept,
        })
    }

    /// `http://127.0.0.1:<proxy port>`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Drops every forwarded connection (both sockets closed, whatever was in flight).
    pub fn cut(&self) {
        let live = std::mem::take(&mut *self.connections.lock().unwrap_or_else(|e| e.into_inner()));
        for task in live {
            task.abort();
        }
    }
}

impl Drop for CutProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

#[cfg(any(feature = "aws", feature = "gcp", feature = "azure"))]
/// The retries of the store's own client: few and short, so a cut or a restart comes back to
/// the gate (and the scenario) as a retryable error within seconds, not minutes.
pub fn quick_retry() -> object_store::RetryConfig {
    object_store::RetryConfig {
        max_retries: 2,
        retry_timeout: std::time::Duration::from_secs(5),
        ..Default::default()
    }
}

type Restart =
    Box<dyn Fn() -> Pin<Box<dyn Future<Output = leasehold_core::Result<()>> + Send>> + Send + Sync>;

/// Fresh objects (a random path each) in one store, and the store's faults: connections cut at
/// the proxy, the server restarted by the harness.
pub struct Objects {
    pub store: Arc<dyn ObjectStore>,
    pub proxy: Option<CutProxy>,
    pub restart: Option<Restart>,
}

impl Objects {
    /// Objects in `store`, with no faults.
    pub fn new(store: Arc<dyn ObjectStore>) -> Self {
        Objects {
            store,
            proxy: None,
            restart: None,
        }
    }

    /// Faults through `proxy` (the store's client must talk to it) and `restart`.
    pub fn with_faults<F, Fut>(mut self, proxy: CutProxy, restart: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = leasehold_core::Result<()>> + Send + 'static,
    {
        self.proxy = Some(proxy);
        self.restart = Some(Box::new(move || Box::pin(restart())));
        self
    }
}

#[async_trait]
impl GateFactory for Objects {
    async fn resource(&self) -> leasehold_core::Result<Probed> {
        let path = Path::from(format!("gate-suite/{}", OwnerToken::generate()?.to_hex()));
        let object = Arc::new(FencedObject::new(self.store.clone(), path));
        let read = object.clone();
        Ok(Probed {
            resource: object,
            // A claim of a missing object creates it empty: nothing written yet.
            value: Arc::new(move || {
                let read = read.clone();
                Box::pin(async move {
                    Ok(read
                        .read()
                        .await?
                        .filter(|c| !c.content.is_empty())
                        .map(|c| String::from_utf8_lossy(&c.content).into_owned()))
                })
            }),
        })
    }
}

#[async_trait]
impl GateFaults for Objects {
    async fn cut_connections(&self) -> leasehold_core::Result<()> {
        if let Some(proxy) = &self.proxy {
            proxy.cut();
        }
        Ok(())
    }

    async fn restart(&self) -> leasehold_core::Result<()> {
        match &self.restart {
            Some(restart) => restart().await,
            None => Ok(()),
        }
    }
}

fn put_mode(mode: PutMode) -> PutOptions {
    PutOptions {
        mode,
        ..PutOptions::default()
    }
}

/// The server itself refuses conditional writes whose precondition fails, with no gate in
/// between: a create over an existing object, an update on a version that never was, and an
/// update on the version a later write replaced (the stale ETag or generation). Each must come
/// back as the store's refusal (`AlreadyExists` / `Precondition`), and the object must keep the
/// value of the last write that was allowed.
pub async fn server_refuses_stale_versions(store: &dyn ObjectStore, name: &str) -> TestResult {
    let path = Path::from(format!(
        "probe/{}",
        OwnerToken::generate()
            .map_err(|e| Failure::new(e.to_string()))?
            .to_hex()
    ));
    let fail = |what: &str, got: String| Err(Failure::new(format!("{name}: {what}: {got}")));
    let first = match store
        .put_opts(
            &path,
            PutPayload::from_static(b"one"),
            put_mode(PutMode::Create),
        )
        .await
    {
        Ok(put) => put,
        Err(e) => return fail("the first create failed", e.to_string()),
    };
    match store
        .put_opts(
            &path,
            PutPayload::from_static(b"again"),
            put_mode(PutMode::Create),
        )
        .await
    {
        Err(object_store::Error::AlreadyExists { .. }) => {}
        other => {
            return fail(
                "a second create (If-None-Match: *) was not refused",
                format!("{other:?}"),
            )
        }
    }
    let never = UpdateVersion {
        e_tag: Some("\"0123456789abcdef0123456789abcdef\"".into()),
        version: Some("1".into()),
    };
    match store
        .put_opts(
            &path,
            PutPayload::from_static(b"bogus"),
            put_mode(PutMode::Update(never)),
        )
        .await
    {
        Err(object_store::Error::Precondition { .. }) => {}
        other => {
            return fail(
                "an update on a version that never existed was not refused",
                format!("{other:?}"),
            )
        }
    }
    let first_version = UpdateVersion::from(first);
    let second = match store
        .put_opts(
            &path,
            PutPayload::from_static(b"two"),
            put_mode(PutMode::Update(first_version.clone())),
        )
        .await
    {
        Ok(put) => put,
        Err(e) => return fail("an update on the current version failed", e.to_string()),
    };
    if second.e_tag == first_version.e_tag && second.version == first_version.version {
        return fail(
            "a write with other content kept the same version",
            format!("{second:?}"),
        );
    }
    match store
        .put_opts(
            &path,
            PutPayload::from_static(b"stale"),
            put_mode(PutMode::Update(first_version)),
        )
        .await
    {
        Err(object_store::Error::Precondition { .. }) => {}
        other => {
            return fail(
                "an update on the stale version (replaced by a later write) was not refused",
                format!("{other:?}"),
            )
        }
    }
    let body = match store.get(&path).await {
        Ok(got) => got.bytes().await.map_err(|e| Failure::new(e.to_string()))?,
        Err(e) => return fail("reading the object back failed", e.to_string()),
    };
    if &body[..] != b"two" {
        return fail(
            "the object does not hold the last allowed write",
            format!("{body:?}"),
        );
    }
    Ok(())
}
