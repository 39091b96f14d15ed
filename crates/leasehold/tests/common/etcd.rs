//! An HTTP/1 server on etcd's port: it reads the HTTP/2 preface and answers as HTTP/1.1.

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::fake::{deliver, read_more, stall, Behaviour, Server};
use super::Result;

/// What an HTTP/1.1 server that does not check the method answers.
pub const HTTP1_OK: &[u8] =
    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 12\r\n\r\nnot grpc :-)";
/// What an HTTP/1.1 server that does check it answers, before closing.
pub const HTTP1_BAD_REQUEST: &[u8] =
    b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";

pub async fn server(reply: &'static [u8], how: Behaviour, close_after: bool) -> Result<Server> {
    Server::start(move |stream| serve(stream, reply, how, close_after)).await
}

async fn serve(
    mut stream: TcpStream,
    reply: &'static [u8],
    how: Behaviour,
    close_after: bool,
) -> std::io::Result<()> {
    let mut buf = Vec::new();
    // The client speaks first: the preface `PRI * HTTP/2.0` and its SETTINGS.
    while buf.len() < 24 {
        if !read_more(&mut stream, &mut buf).await? {
            return Ok(());
        }
    }
    if !deliver(&mut stream, reply, how).await? {
        return Ok(());
    }
    if close_after {
        stream.shutdown().await?;
        return Ok(());
    }
    stall(&mut stream).await;
    Ok(())
}
