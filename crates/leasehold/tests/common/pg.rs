//! Just enough of PostgreSQL's startup for a fake: the SSLRequest refused, the
//! StartupMessage read, then a reply delivered as told.

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::fake::{be_i32, deliver, read_more, stall, Behaviour, Server};
use super::Result;

const SSL_REQUEST: i32 = 80877103;
const GSS_REQUEST: i32 = 80877104;

/// What the fake answers to the StartupMessage.
#[derive(Clone, Copy, Debug)]
pub enum Mode {
    /// AuthenticationOk, delivered this way.
    AuthOk(Behaviour),
    /// AuthenticationOk and a ParameterStatus, then nothing: a server that stops
    /// mid-startup.
    AuthOkThenStall,
    /// A FATAL ErrorResponse (password authentication failed), delivered this way.
    Refuse(Behaviour),
    /// A byte that is neither `S` nor `N` to the SSLRequest.
    GarbageToSslRequest,
}

fn message(kind: u8, body: &[u8]) -> Vec<u8> {
    let mut out = vec![kind];
    out.extend_from_slice(&(body.len() as i32 + 4).to_be_bytes());
    out.extend_from_slice(body);
    out
}

pub fn auth_ok() -> Vec<u8> {
    message(b'R', &0i32.to_be_bytes())
}

pub fn refusal() -> Vec<u8> {
    let mut body = Vec::new();
    for (field, value) in [
        (b'S', "FATAL"),
        (b'V', "FATAL"),
        (b'C', "28P01"),
        (b'M', "password authentication failed for user \"u\""),
    ] {
        body.push(field);
        body.extend_from_slice(value.as_bytes());
        body.push(0);
    }
    body.push(0);
    message(b'E', &body)
}

/// Reads one untyped startup-phase packet (length first, the length counting itself).
async fn packet(stream: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<Option<Vec<u8>>> {
    loop {
        if buf.len() >= 4 {
            let len = be_i32(&buf[..4]);
            let len = usize::try_from(len).unwrap_or(0).max(4);
            if buf.len() >= len {
                let packet = buf[4..len].to_vec();
                buf.drain(..len);
                return Ok(Some(packet));
            }
        }
        if !read_more(stream, buf).await? {
            return Ok(None);
        }
    }
}

pub async fn server(mode: Mode) -> Result<Server> {
    Server::start(move |stream| serve(stream, mode)).await
}

async fn serve(mut stream: TcpStream, mode: Mode) -> std::io::Result<()> {
    let mut buf = Vec::new();
    // SSLRequest / GSSENCRequest first (refused with `N`), then the StartupMessage.
    loop {
        let Some(packet) = packet(&mut stream, &mut buf).await? else {
            return Ok(());
        };
        let code = packet.get(..4).map_or(0, be_i32);
        if code == SSL_REQUEST || code == GSS_REQUEST {
            if let Mode::GarbageToSslRequest = mode {
                stream.write_all(b"X").await?;
                stall(&mut stream).await;
                return Ok(());
            }
            stream.write_all(b"N").await?;
            continue;
        }
        break;
    }
    match mode {
        Mode::AuthOk(how) => {
            if deliver(&mut stream, &auth_ok(), how).await? {
                stall(&mut stream).await;
            }
        }
        Mode::AuthOkThenStall => {
            let mut reply = auth_ok();
            reply.extend(message(b'S', b"server_version\x0016.0\x00"));
            stream.write_all(&reply).await?;
            stall(&mut stream).await;
        }
        Mode::Refuse(how) => {
            if deliver(&mut stream, &refusal(), how).await? {
                stall(&mut stream).await;
            }
        }
        Mode::GarbageToSslRequest => stall(&mut stream).await,
    }
    Ok(())
}
