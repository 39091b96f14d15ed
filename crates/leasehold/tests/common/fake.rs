//! The fake servers: a listener on `127.0.0.1:0`, one task per connection, all stopped when
//! the [`Server`] is dropped.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

use super::{OrFail, Result};

/// How a fake delivers the reply it would owe a correct client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Behaviour {
    /// The reply, at once.
    Correct,
    /// Bytes that are no reply of this protocol, instead of the reply; the connection stays
    /// open.
    Garbage,
    /// The first half of the reply, then nothing more (the connection stays open).
    HalfThenStall,
    /// The first half of the reply, then the connection is closed.
    CloseMidReply,
    /// The reply, after this delay.
    Slow(Duration),
    /// No reply at all; the connection stays open.
    Silent,
}

/// What no protocol here takes for a reply: no RESP type marker, no HTTP status line, a
/// ZooKeeper length that is not followed by its bytes, no PostgreSQL message type.
pub const GARBAGE: &[u8] = b"\x00\x07\xff\xfe garbage \x01\x02\x03\r\n\xc3\x28 not a reply\r\n";

/// Whether the connection goes on after a delivery.
pub type Go = bool;

/// Delivers `reply` to `stream` the way `how` says; `false` once the connection is done.
pub async fn deliver(stream: &mut TcpStream, reply: &[u8], how: Behaviour) -> std::io::Result<Go> {
    let half = &reply[..reply.len() / 2];
    match how {
        Behaviour::Correct => stream.write_all(reply).await?,
        Behaviour::Garbage => stream.write_all(GARBAGE).await?,
        Behaviour::Slow(delay) => {
            tokio::time::sleep(delay).await;
            stream.write_all(reply).await?;
        }
        Behaviour::HalfThenStall => {
            stream.write_all(half).await?;
            stream.flush().await?;
            stall(stream).await;
            return Ok(false);
        }
        Behaviour::CloseMidReply => {
            stream.write_all(half).await?;
            stream.flush().await?;
            stream.shutdown().await?;
            return Ok(false);
        }
        Behaviour::Silent => {
            stall(stream).await;
            return Ok(false);
        }
    }
    stream.flush().await?;
    Ok(true)
}

/// Keeps the connection open and answers nothing, reading (and dropping) whatever comes,
/// until the client closes it or the server is dropped.
pub async fn stall(stream: &mut TcpStream) {
    let mut sink = [0u8; 4096];
    while let Ok(n) = stream.read(&mut sink).await {
        if n == 0 {
            // The client closed its side: hold ours open a little, like a server that
            // hangs, then let go.
            tokio::time::sleep(Duration::from_secs(30)).await;
            return;
        }
    }
}

/// Reads what has arrived (at least one byte) onto `buf`; `false` at the end of the stream.
pub async fn read_more(stream: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<bool> {
    let mut chunk = [0u8; 4096];
    let n = stream.read(&mut chunk).await?;
    buf.extend_from_slice(&chunk[..n]);
    Ok(n > 0)
}

/// A running fake; dropping it stops the listener and every connection.
#[derive(Debug)]
pub struct Server {
    pub addr: SocketAddr,
    /// Connections accepted so far.
    pub accepted: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Server {
    /// Starts a fake whose every connection `handle` serves.
    pub async fn start<F, Fut>(handle: F) -> Result<Server>
    where
        F: Fn(TcpStream) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::io::Result<()>> + Send + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .or_fail("bind the fake's listener")?;
        let addr = listener.local_addr().or_fail("the fake's address")?;
        let accepted = Arc::new(AtomicUsize::new(0));
        let counter = accepted.clone();
        let task = tokio::spawn(async move {
            // Aborting this task drops the set, which aborts every connection's task.
            let mut connections = JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let Ok((stream, _)) = accepted else { continue };
                        counter.fetch_add(1, Ordering::SeqCst);
                        let _ = stream.set_nodelay(true);
                        connections.spawn(handle(stream));
                    }
                    Some(_) = connections.join_next(), if !connections.is_empty() => {}
                }
            }
        });
        Ok(Server {
            addr,
            accepted,
            task,
        })
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

/// The big-endian `i32` in the first four bytes of `bytes` (callers pass at least four).
pub fn be_i32(bytes: &[u8]) -> i32 {
    i32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
}

/// What a fake logged, readable even after a thread that held the log panicked.
pub fn lock<T>(log: &Mutex<T>) -> MutexGuard<'_, T> {
    log.lock().unwrap_or_else(PoisonError::into_inner)
}
