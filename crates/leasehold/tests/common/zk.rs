//! Just enough of ZooKeeper's protocol for a fake: length-prefixed frames, the connect
//! handshake, and replies by xid.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::fake::{be_i32, deliver, read_more, stall, Behaviour, Server};
use super::Result;

/// ZooKeeper's error code for a missing node.
pub const NO_NODE: i32 = -101;
/// ZooKeeper's error code for a request the server could not read.
pub const MARSHALLING: i32 = -5;
const PING_XID: i32 = -2;
const CLOSE_SESSION: i32 = -11;

/// How the fake behaves.
#[derive(Clone, Copy, Debug)]
pub enum Mode {
    /// The ConnectResponse delivered this way; then pings are answered and every other
    /// request is delivered as `requests` says, carrying `error` (a ZooKeeper error code).
    Handshake {
        connect: Behaviour,
        requests: Behaviour,
        error: i32,
    },
    /// A frame length of `i32::MAX` (2 GiB that never come) instead of the ConnectResponse.
    HugeLength,
    /// A negative frame length instead of the ConnectResponse.
    NegativeLength,
    /// A ConnectResponse of 4 bytes, well framed but far too short to hold one.
    TruncatedResponse,
    /// A well-formed ConnectResponse granting this session timeout (in ms, whatever was
    /// asked), then every request but pings answered with [`MARSHALLING`].
    GrantTimeout(i32),
}

fn frame(body: &[u8]) -> Vec<u8> {
    let mut out = (body.len() as i32).to_be_bytes().to_vec();
    out.extend_from_slice(body);
    out
}

/// Takes one frame's body from the front of `buf`, if it is all there.
fn take_frame(buf: &mut Vec<u8>) -> Option<Vec<u8>> {
    let len = i32::from_be_bytes(buf.get(..4)?.try_into().ok()?);
    let len = usize::try_from(len).ok()?;
    if buf.len() < 4 + len {
        return None;
    }
    let body = buf[4..4 + len].to_vec();
    buf.drain(..4 + len);
    Some(body)
}

async fn next_frame(stream: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<Option<Vec<u8>>> {
    loop {
        if let Some(body) = take_frame(buf) {
            return Ok(Some(body));
        }
        if !read_more(stream, buf).await? {
            return Ok(None);
        }
    }
}

pub async fn server(mode: Mode) -> Result<Server> {
    let sessions = Arc::new(AtomicI64::new(0x1000));
    Server::start(move |stream| serve(stream, mode, sessions.clone())).await
}

async fn serve(mut stream: TcpStream, mode: Mode, sessions: Arc<AtomicI64>) -> std::io::Result<()> {
    let mut buf = Vec::new();
    let Some(request) = next_frame(&mut stream, &mut buf).await? else {
        return Ok(());
    };
    // ConnectRequest: protocolVersion i32, lastZxidSeen i64, timeOut i32, sessionId i64,
    // passwd buffer, readOnly bool. The fake grants the timeout asked for.
    let timeout = request.get(12..16).map_or(0, be_i32);
    let (timeout, connect, requests, error) = match mode {
        Mode::Handshake {
            connect,
            requests,
            error,
        } => (timeout, connect, requests, error),
        Mode::GrantTimeout(granted) => {
            (granted, Behaviour::Correct, Behaviour::Correct, MARSHALLING)
        }
        Mode::HugeLength => {
            stream.write_all(&i32::MAX.to_be_bytes()).await?;
            stream.write_all(b"\0\0\0\0").await?;
            stall(&mut stream).await;
            return Ok(());
        }
        Mode::NegativeLength => {
            stream.write_all(&(-16i32).to_be_bytes()).await?;
            stream.write_all(&[0u8; 16]).await?;
            stall(&mut stream).await;
            return Ok(());
        }
        Mode::TruncatedResponse => {
            stream.write_all(&frame(&0i32.to_be_bytes())).await?;
            stall(&mut stream).await;
            return Ok(());
        }
    };
    let mut response = 0i32.to_be_bytes().to_vec();
    response.extend_from_slice(&timeout.to_be_bytes());
    response.extend_from_slice(&sessions.fetch_add(1, Ordering::SeqCst).to_be_bytes());
    response.extend_from_slice(&16i32.to_be_bytes());
    response.extend_from_slice(&[7u8; 16]);
    response.push(0);
    if !deliver(&mut stream, &frame(&response), connect).await? {
        return Ok(());
    }
    let mut zxid = 1i64;
    while let Some(request) = next_frame(&mut stream, &mut buf).await? {
        let xid = request.get(..4).map_or(0, be_i32);
        let op = request.get(4..8).map_or(0, be_i32);
        zxid += 1;
        let mut reply = xid.to_be_bytes().to_vec();
        reply.extend_from_slice(&zxid.to_be_bytes());
        if xid == PING_XID || op == CLOSE_SESSION {
            reply.extend_from_slice(&0i32.to_be_bytes());
            stream.write_all(&frame(&reply)).await?;
            if op == CLOSE_SESSION {
                return Ok(());
            }
            continue;
        }
        reply.extend_from_slice(&error.to_be_bytes());
        if !deliver(&mut stream, &frame(&reply), requests).await? {
            return Ok(());
        }
    }
    Ok(())
}
