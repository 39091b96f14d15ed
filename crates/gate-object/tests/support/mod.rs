//! What the gate's tests share: a proxy whose connections the test can cut, the objects the
//! resource suite writes, and the store faults it injects.
#![allow(dead_code)]

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use leasehold_conformance::gate::{GateContext, GateFactory, GateFaults, HeldWrites, Probed};
use leasehold_conformance::kit::{OrFail, TestResult};
use leasehold_conformance::{harness_call, Failure};
use leasehold_core::OwnerToken;
use leasehold_gate_object::FencedObject;
use object_store::path::Path;
use object_store::ObjectStore;
use object_store::{ObjectStoreExt, PutMode, PutOptions, PutPayload, UpdateVersion};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::AbortHandle;

/// A TCP proxy on a free loopback port in front of a server's port: the store's client talks
/// to the proxy, and [`CutProxy::cut`] drops every connection at once, requests in flight
/// included, as a network failure does. New connections are forwarded again right away.
///
/// [`CutProxy::hold_writes`] makes it stop forwarding a connection's bytes to the server from
/// the first chunk that starts a write (`PUT`, `POST`, `PATCH`, `DELETE`) until the hold ends:
/// the request waits in the proxy, never seen by the server, while reads pass.
pub struct CutProxy {
    port: u16,
    connections: Arc<Mutex<Vec<AbortHandle>>>,
    accept: AbortHandle,
    hold: Arc<Hold>,
}

/// Whether writes are held, and how many connections wait on it now.
struct Hold {
    on: watch::Sender<bool>,
    waiting: AtomicUsize,
}

/// Counts a connection as waiting on the hold while it lives: a cut (which aborts the
/// connection's task) uncounts it too.
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    fn new(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::SeqCst);
        Waiting(count)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The methods of HTTP requests that change a store.
const WRITES: [&[u8]; 4] = [b"PUT ", b"POST ", b"PATCH ", b"DELETE "];

/// Copies the client's bytes to the server, holding back a chunk that starts a write while
/// writes are held. A chunk starts a request only on a connection between requests; an HTTP/1
/// client sends its next request after the last answer, so the first chunk of each request
/// starts with its method.
async fn forward_requests(
    mut client: OwnedReadHalf,
    mut server: OwnedWriteHalf,
    hold: Arc<Hold>,
) -> std::io::Result<()> {
    let mut held = hold.on.subscribe();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = client.read(&mut buf).await?;
        if n == 0 {
            return server.shutdown().await;
        }
        let chunk = &buf[..n];
        if *held.borrow_and_update() && WRITES.iter().any(|m| chunk.starts_with(m)) {
            let _waiting = Waiting::new(&hold.waiting);
            // A closed sender is a dropped proxy: the task is aborted with it.
            let _ = held.wait_for(|on| !*on).await;
        }
        server.write_all(chunk).await?;
    }
}

impl CutProxy {
    /// Listens on 127.0.0.1 and forwards to `127.0.0.1:target`.
    pub async fn start(target: u16) -> std::io::Result<CutProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let connections: Arc<Mutex<Vec<AbortHandle>>> = Arc::default();
        let hold = Arc::new(Hold {
            on: watch::channel(false).0,
            waiting: AtomicUsize::new(0),
        });
        let accept = {
            let connections = connections.clone();
            let hold = hold.clone();
            tokio::spawn(async move {
                while let Ok((client, _)) = listener.accept().await {
                    let hold = hold.clone();
                    let task = tokio::spawn(async move {
                        if let Ok(server) = TcpStream::connect(("127.0.0.1", target)).await {
                            let (client_read, mut client_write) = client.into_split();
                            let (mut server_read, server_write) = server.into_split();
                            let answers = async {
                                let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
                                let _ = client_write.shutdown().await;
                            };
                            let requests = forward_requests(client_read, server_write, hold);
                            let _ = tokio::join!(requests, answers);
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
            hold,
        })
    }

    /// `http://127.0.0.1:<proxy port>`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Drops every forwarded connection (both sockets closed, whatever was in flight or held).
    pub fn cut(&self) {
        let live = std::mem::take(&mut *self.connections.lock().unwrap_or_else(|e| e.into_inner()));
        for task in live {
            task.abort();
        }
    }

    /// Holds every write request from now on (on new connections too) until the returned
    /// handle is released or dropped.
    pub fn hold_writes(&self) -> HeldAtProxy {
        self.hold.on.send_replace(true);
        HeldAtProxy(self.hold.clone())
    }
}

/// Write requests held in a [`CutProxy`]. The store's client retries a request whose
/// connection was cut, on a new connection: a held write dropped by the cut may still land
/// after the release.
pub struct HeldAtProxy(Arc<Hold>);

impl Drop for HeldAtProxy {
    fn drop(&mut self) {
        self.0.on.send_replace(false);
    }
}

#[async_trait]
impl HeldWrites for HeldAtProxy {
    async fn waiting(&self) -> leasehold_core::Result<Option<usize>> {
        Ok(Some(self.0.waiting.load(Ordering::SeqCst)))
    }

    fn cut_loses_held_writes(&self) -> bool {
        false
    }

    async fn release(self: Box<Self>) -> leasehold_core::Result<()> {
        // Dropping it forwards the held requests still connected, and every one after them.
        Ok(())
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

/// The resource suite's context for a store reached through `client` at a [`CutProxy`] in front
/// of `server` (listening on `port`): the objects are fresh paths in that store, the cut is the
/// proxy's, and the restart is `restart` of the server.
#[cfg(any(feature = "aws", feature = "azure"))]
pub async fn behind_proxy<S: Send + Sync + 'static>(
    server: Arc<S>,
    port: u16,
    client: impl FnOnce(&str) -> TestResult<Arc<dyn ObjectStore>>,
    restart: fn(&S) -> leasehold_servers::Result<()>,
) -> TestResult<GateContext> {
    let proxy = CutProxy::start(port)
        .await
        .or_fail("a proxy in front of the server")?;
    let store = client(&proxy.url())?;
    let objects = Arc::new(Objects::new(store).with_faults(proxy, move || {
        let server = server.clone();
        harness_call(move || restart(&server))
    }));
    Ok(GateContext::new(objects.clone()).with_faults(objects))
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

    async fn hold_writes(&self) -> leasehold_core::Result<Box<dyn HeldWrites>> {
        match &self.proxy {
            Some(proxy) => Ok(Box::new(proxy.hold_writes())),
            None => Err(leasehold_core::Error::Unsupported {
                backend: "object store harness",
                operation: "holding writes without a proxy".into(),
            }),
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
