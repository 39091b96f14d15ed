//! Misbehaving servers: a small fake server per protocol accepts connections and then
//! answers garbage, half a reply and stalls, closes mid-reply, never answers, or answers slowly
//! (just under and just over the request timeout), plus what is peculiar to each protocol: wrong
//! types from the Redis scripts, an HTTP/1 server on etcd's port, a ZooKeeper server that never
//! finishes the handshake, a PostgreSQL server that stops mid-startup or answers the lease
//! statements with rows of the wrong type.
//!
//! For every call: it ends within the time its backend's configuration allows (so many requests,
//! each bounded by the request timeout, plus slack for a loaded machine), it ends with a typed
//! [`leasehold::Error`] and not a panic (each call runs in a task of its own), and a `Grant` (or
//! a renewal) is returned only when the fake really granted it. A reply just under the timeout
//! is read and acted on; just over, the call is a retryable timeout. None of these tests is
//! ignored: a defect a fake finds is fixed, and its test runs in `./scripts/test`.
//!
//! These fakes are hostile peers, not models of a backend: they implement only as much of each
//! protocol as it takes to get the client to the place where they misbehave.
#![cfg(all(
    feature = "postgres",
    feature = "redis",
    feature = "etcd",
    feature = "zookeeper"
))]

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use leasehold::{Authority, Error, Grant, Lease, LeaseOptions, LockKey, Released};

mod fake {
    //! The fake servers: a listener on `127.0.0.1:0`, one task per connection, all stopped when
    //! the [`Server`] is dropped.

    use std::future::Future;
    use std::net::SocketAddr;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};
    use tokio::task::{JoinHandle, JoinSet};

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
    pub async fn deliver(
        stream: &mut TcpStream,
        reply: &[u8],
        how: Behaviour,
    ) -> std::io::Result<Go> {
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
        pub async fn start<F, Fut>(handle: F) -> Server
        where
            F: Fn(TcpStream) -> Fut + Send + Sync + 'static,
            Fut: Future<Output = std::io::Result<()>> + Send + 'static,
        {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
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
            Server {
                addr,
                accepted,
                task,
            }
        }

        pub fn port(&self) -> u16 {
            self.addr.port()
        }

        pub fn accepted(&self) -> usize {
            self.accepted.load(Ordering::SeqCst)
        }
    }
}

mod resp {
    //! Just enough RESP (Redis's protocol) for a fake: commands in, replies out.

    use std::sync::{Arc, Mutex};

    use tokio::net::TcpStream;

    use super::fake::{deliver, read_more, Behaviour, Server};

    /// One command: its words (`EVALSHA`, the SHA, the number of keys, keys, arguments).
    pub type Command = Vec<Vec<u8>>;

    /// Parses one command from the front of `buf`: `Ok(None)` if it is not all there yet.
    fn parse(buf: &[u8]) -> Result<Option<(Command, usize)>, ()> {
        fn line(buf: &[u8], at: usize) -> Option<(&[u8], usize)> {
            let end = buf[at..].windows(2).position(|w| w == b"\r\n")? + at;
            Some((&buf[at..end], end + 2))
        }
        fn number(text: &[u8]) -> Result<usize, ()> {
            std::str::from_utf8(text)
                .map_err(|_| ())?
                .parse()
                .map_err(|_| ())
        }
        if buf.is_empty() {
            return Ok(None);
        }
        if buf[0] != b'*' {
            return Err(());
        }
        let Some((count, mut at)) = line(buf, 1) else {
            return Ok(None);
        };
        let count = number(count)?;
        let mut words = Vec::with_capacity(count);
        for _ in 0..count {
            if at >= buf.len() {
                return Ok(None);
            }
            if buf[at] != b'$' {
                return Err(());
            }
            let Some((len, start)) = line(buf, at + 1) else {
                return Ok(None);
            };
            let len = number(len)?;
            if buf.len() < start + len + 2 {
                return Ok(None);
            }
            words.push(buf[start..start + len].to_vec());
            at = start + len + 2;
        }
        Ok(Some((words, at)))
    }

    pub fn name(command: &Command) -> String {
        command
            .first()
            .map(|w| String::from_utf8_lossy(w).to_ascii_uppercase())
            .unwrap_or_default()
    }

    /// Which of leasehold's scripts an `EVALSHA`/`EVAL` runs, told apart by its keys and
    /// arguments (the SHAs are the crate's business).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Script {
        /// 2 keys; the owner token and the TTL in ms.
        Acquire,
        /// 1 key; the owner token and the TTL: `renew`, or `renew_many` of one grant (the
        /// same shape; only the SHA differs).
        Renew,
        /// 2 keys; the owner token and the channel.
        Release,
        /// Any other shape (renew_many with several keys, proclaim).
        Other,
    }

    pub fn script(command: &Command) -> Option<Script> {
        if !matches!(name(command).as_str(), "EVALSHA" | "EVAL") {
            return None;
        }
        let keys = command
            .get(2)
            .map(|k| String::from_utf8_lossy(k).to_string());
        let args = command
            .len()
            .saturating_sub(3 + keys.as_deref().map_or(0, |k| k.parse().unwrap_or(0)));
        let last_is_number = command
            .last()
            .is_some_and(|w| !w.is_empty() && w.iter().all(u8::is_ascii_digit));
        Some(match (keys.as_deref(), args) {
            (Some("2"), 2) if last_is_number => Script::Acquire,
            (Some("2"), 2) => Script::Release,
            (Some("1"), 2) => Script::Renew,
            _ => Script::Other,
        })
    }

    /// The owner token a script names (its first argument).
    pub fn token(command: &Command) -> Option<String> {
        let keys: usize = std::str::from_utf8(command.get(2)?).ok()?.parse().ok()?;
        command
            .get(3 + keys)
            .map(|t| String::from_utf8_lossy(t).to_string())
    }

    pub fn bulk(text: &str) -> Vec<u8> {
        format!("${}\r\n{text}\r\n", text.len()).into_bytes()
    }

    /// What a Redis server with noeviction and fsync-always persistence answers to the
    /// handshake and to `PING`, `CONFIG GET`; `None` for the scripts and anything else.
    pub fn handshake_reply(command: &Command) -> Option<Vec<u8>> {
        Some(match name(command).as_str() {
            "CLIENT" => b"+OK\r\n".to_vec(),
            "PING" => b"+PONG\r\n".to_vec(),
            // RESP3 is what the subscription asks for: refuse, as Redis 5 does (it then works by
            // retries alone, which the authority allows).
            "HELLO" => b"-ERR unknown command 'HELLO'\r\n".to_vec(),
            "CONFIG" => {
                let parameter = command
                    .get(2)
                    .map(|p| String::from_utf8_lossy(p).to_string())
                    .unwrap_or_default();
                let value = match parameter.as_str() {
                    "maxmemory-policy" => "noeviction",
                    "appendonly" => "yes",
                    "appendfsync" => "always",
                    _ => "",
                };
                let mut out = b"*2\r\n".to_vec();
                out.extend(bulk(&parameter));
                out.extend(bulk(value));
                out
            }
            _ => return None,
        })
    }

    /// What the fake was asked, in order (command names and, for scripts, their kind and token).
    #[derive(Clone, Debug, Default)]
    pub struct Seen(pub Arc<Mutex<Vec<Asked>>>);

    /// One command the fake was sent: its name, and for a script its kind and owner token.
    pub type Asked = (String, Option<Script>, Option<String>);

    impl Seen {
        pub fn scripts(&self, kind: Script) -> Vec<String> {
            self.0
                .lock()
                .unwrap()
                .iter()
                .filter(|(_, s, _)| *s == Some(kind))
                .filter_map(|(_, _, t)| t.clone())
                .collect()
        }
    }

    /// A fake Redis whose every command gets what `respond` says: the reply and how to deliver
    /// it.
    pub async fn server<F>(respond: F) -> (Server, Seen)
    where
        F: Fn(&Command) -> (Vec<u8>, Behaviour) + Send + Sync + 'static,
    {
        let respond = Arc::new(respond);
        let seen = Seen::default();
        let log = seen.clone();
        let server = Server::start(move |stream| {
            let (respond, log) = (respond.clone(), log.clone());
            serve(stream, respond, log)
        })
        .await;
        (server, seen)
    }

    async fn serve<F>(mut stream: TcpStream, respond: Arc<F>, seen: Seen) -> std::io::Result<()>
    where
        F: Fn(&Command) -> (Vec<u8>, Behaviour) + Send + Sync + 'static,
    {
        let mut buf = Vec::new();
        loop {
            match parse(&buf) {
                Err(()) => return Ok(()),
                Ok(None) => {
                    if !read_more(&mut stream, &mut buf).await? {
                        return Ok(());
                    }
                }
                Ok(Some((command, used))) => {
                    buf.drain(..used);
                    seen.0.lock().unwrap().push((
                        name(&command),
                        script(&command),
                        script(&command).and_then(|_| token(&command)),
                    ));
                    let (reply, how) = respond(&command);
                    if !deliver(&mut stream, &reply, how).await? {
                        return Ok(());
                    }
                }
            }
        }
    }
}

mod zk {
    //! Just enough of ZooKeeper's protocol for a fake: length-prefixed frames, the connect
    //! handshake, and replies by xid.

    use std::sync::atomic::{AtomicI64, Ordering};
    use std::sync::Arc;

    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpStream;

    use super::fake::{deliver, read_more, stall, Behaviour, Server};

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

    async fn next_frame(
        stream: &mut TcpStream,
        buf: &mut Vec<u8>,
    ) -> std::io::Result<Option<Vec<u8>>> {
        loop {
            if let Some(body) = take_frame(buf) {
                return Ok(Some(body));
            }
            if !read_more(stream, buf).await? {
                return Ok(None);
            }
        }
    }

    pub async fn server(mode: Mode) -> Server {
        let sessions = Arc::new(AtomicI64::new(0x1000));
        Server::start(move |stream| serve(stream, mode, sessions.clone())).await
    }

    async fn serve(
        mut stream: TcpStream,
        mode: Mode,
        sessions: Arc<AtomicI64>,
    ) -> std::io::Result<()> {
        let mut buf = Vec::new();
        let Some(request) = next_frame(&mut stream, &mut buf).await? else {
            return Ok(());
        };
        // ConnectRequest: protocolVersion i32, lastZxidSeen i64, timeOut i32, sessionId i64,
        // passwd buffer, readOnly bool. The fake grants the timeout asked for.
        let timeout = request
            .get(12..16)
            .map_or(0, |t| i32::from_be_bytes(t.try_into().unwrap()));
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
            let xid = request
                .get(..4)
                .map_or(0, |x| i32::from_be_bytes(x.try_into().unwrap()));
            let op = request
                .get(4..8)
                .map_or(0, |x| i32::from_be_bytes(x.try_into().unwrap()));
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
}

mod pg {
    //! Just enough of PostgreSQL's startup for a fake: the SSLRequest refused, the
    //! StartupMessage read, then a reply delivered as told.

    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpStream;

    use super::fake::{deliver, read_more, stall, Behaviour, Server};

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
                let len = i32::from_be_bytes(buf[..4].try_into().unwrap());
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

    pub async fn server(mode: Mode) -> Server {
        Server::start(move |stream| serve(stream, mode)).await
    }

    async fn serve(mut stream: TcpStream, mode: Mode) -> std::io::Result<()> {
        let mut buf = Vec::new();
        // SSLRequest / GSSENCRequest first (refused with `N`), then the StartupMessage.
        loop {
            let Some(packet) = packet(&mut stream, &mut buf).await? else {
                return Ok(());
            };
            let code = packet
                .get(..4)
                .map_or(0, |c| i32::from_be_bytes(c.try_into().unwrap()));
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
}

mod pgq {
    //! A fake PostgreSQL that completes the startup and then answers the extended query
    //! protocol (Parse, Describe, Bind, Execute, Sync) with whatever rows a test says, delivered
    //! as the test says: enough to take sqlx (and the authority) past connecting, to the
    //! statements on the lease table.

    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};

    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpStream;

    use super::fake::{deliver, read_more, Behaviour, Server};

    pub const BOOL: i32 = 16;
    pub const INT8: i32 = 20;
    pub const INT4: i32 = 23;
    pub const TEXT: i32 = 25;

    /// What a statement returns: its columns (name, type OID), its rows (binary values, `None`
    /// for NULL), and how the reply to its execution is delivered.
    #[derive(Clone, Debug)]
    pub struct Answer {
        pub columns: Vec<(&'static str, i32)>,
        pub rows: Vec<Vec<Option<Vec<u8>>>>,
        pub how: Behaviour,
        /// An ErrorResponse (SQLSTATE, message) instead of the rows.
        pub error: Option<(&'static str, &'static str)>,
        /// The CommandComplete tag (default `SELECT <rows>`).
        pub tag: Option<String>,
    }

    impl Answer {
        pub fn rows(columns: Vec<(&'static str, i32)>, rows: Vec<Vec<Option<Vec<u8>>>>) -> Self {
            Answer {
                columns,
                rows,
                how: Behaviour::Correct,
                error: None,
                tag: None,
            }
        }

        /// An UPDATE without RETURNING that changed `n` rows.
        pub fn updated(n: u64) -> Self {
            let mut answer = Answer::rows(Vec::new(), Vec::new());
            answer.tag = Some(format!("UPDATE {n}"));
            answer
        }

        /// An ErrorResponse instead of rows.
        pub fn error(code: &'static str, text: &'static str) -> Self {
            let mut answer = Answer::rows(vec![("fence", INT8)], Vec::new());
            answer.error = Some((code, text));
            answer
        }

        pub fn delivered(mut self, how: Behaviour) -> Self {
            self.how = how;
            self
        }

        /// One BIGINT column, one row.
        pub fn fence(raw: i64) -> Self {
            Answer::rows(
                vec![("fence", INT8)],
                vec![vec![Some(raw.to_be_bytes().to_vec())]],
            )
        }

        /// What `SELECT current_setting('synchronous_commit'), current_setting(...)` gives.
        pub fn settings() -> Self {
            Answer::rows(
                vec![("a", TEXT), ("b", TEXT)],
                vec![vec![Some(b"on".to_vec()), Some(Vec::new())]],
            )
        }
    }

    /// The statements the fake was asked to execute, in order.
    #[derive(Clone, Debug, Default)]
    pub struct Executed(pub Arc<Mutex<Vec<String>>>);

    impl Executed {
        /// How many releases were executed.
        pub fn releases(&self) -> usize {
            self.0
                .lock()
                .unwrap()
                .iter()
                .filter(|q| super::is_pg_release(q))
                .count()
        }

        /// Waits until more than `before` releases were executed, failing at `by`: a lease the
        /// fake made that nobody was told about must be given back.
        pub async fn await_release(&self, before: usize, by: std::time::Instant, what: &str) {
            while self.releases() <= before {
                assert!(
                    std::time::Instant::now() < by,
                    "{what}: a lease the fake made was never given back: {:?}",
                    self.0.lock().unwrap()
                );
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        }
    }

    fn message(kind: u8, body: &[u8]) -> Vec<u8> {
        let mut out = vec![kind];
        out.extend_from_slice(&(body.len() as i32 + 4).to_be_bytes());
        out.extend_from_slice(body);
        out
    }

    fn cstring(body: &[u8], at: &mut usize) -> String {
        let end = body[*at..]
            .iter()
            .position(|b| *b == 0)
            .map_or(body.len(), |p| *at + p);
        let text = String::from_utf8_lossy(&body[*at..end]).to_string();
        *at = (end + 1).min(body.len());
        text
    }

    fn row_description(columns: &[(&str, i32)]) -> Vec<u8> {
        let mut body = (columns.len() as i16).to_be_bytes().to_vec();
        for (name, oid) in columns {
            body.extend_from_slice(name.as_bytes());
            body.push(0);
            body.extend_from_slice(&0i32.to_be_bytes());
            body.extend_from_slice(&0i16.to_be_bytes());
            body.extend_from_slice(&oid.to_be_bytes());
            let len: i16 = match *oid {
                INT8 => 8,
                INT4 => 4,
                _ => -1,
            };
            body.extend_from_slice(&len.to_be_bytes());
            body.extend_from_slice(&(-1i32).to_be_bytes());
            body.extend_from_slice(&0i16.to_be_bytes());
        }
        message(b'T', &body)
    }

    fn error_response(code: &str, text: &str) -> Vec<u8> {
        let mut body = Vec::new();
        for (field, value) in [(b'S', "ERROR"), (b'V', "ERROR"), (b'C', code), (b'M', text)] {
            body.push(field);
            body.extend_from_slice(value.as_bytes());
            body.push(0);
        }
        body.push(0);
        message(b'E', &body)
    }

    pub async fn server<F>(answer: F) -> (Server, Executed)
    where
        F: Fn(&str) -> Answer + Send + Sync + 'static,
    {
        let answer = Arc::new(answer);
        let executed = Executed::default();
        let log = executed.clone();
        let server = Server::start(move |stream| serve(stream, answer.clone(), log.clone())).await;
        (server, executed)
    }

    async fn serve<F>(
        mut stream: TcpStream,
        answer: Arc<F>,
        executed: Executed,
    ) -> std::io::Result<()>
    where
        F: Fn(&str) -> Answer + Send + Sync + 'static,
    {
        let mut buf = Vec::new();
        // The startup: SSLRequest (refused), then the StartupMessage; both untyped.
        loop {
            while buf.len() < 4 {
                if !read_more(&mut stream, &mut buf).await? {
                    return Ok(());
                }
            }
            let len = usize::try_from(i32::from_be_bytes(buf[..4].try_into().unwrap()))
                .unwrap_or(4)
                .max(8);
            while buf.len() < len {
                if !read_more(&mut stream, &mut buf).await? {
                    return Ok(());
                }
            }
            let code = i32::from_be_bytes(buf[4..8].try_into().unwrap());
            buf.drain(..len);
            if code == 80877103 || code == 80877104 {
                stream.write_all(b"N").await?;
                continue;
            }
            break;
        }
        let mut hello = message(b'R', &0i32.to_be_bytes());
        hello.extend(message(b'S', b"server_version\x0016.0\x00"));
        hello.extend(message(b'S', b"client_encoding\x00UTF8\x00"));
        hello.extend(message(b'S', b"integer_datetimes\x00on\x00"));
        hello.extend(message(b'K', &[0, 0, 0, 42, 0, 0, 0, 7]));
        hello.extend(message(b'Z', b"I"));
        stream.write_all(&hello).await?;

        let mut statements: HashMap<String, (String, Vec<u8>)> = HashMap::new();
        let mut portals: HashMap<String, String> = HashMap::new();
        let mut out = Vec::new();
        let mut how = Behaviour::Correct;
        loop {
            while buf.len() < 5 {
                if !read_more(&mut stream, &mut buf).await? {
                    return Ok(());
                }
            }
            let len = usize::try_from(i32::from_be_bytes(buf[1..5].try_into().unwrap()))
                .unwrap_or(4)
                .max(4);
            while buf.len() < 1 + len {
                if !read_more(&mut stream, &mut buf).await? {
                    return Ok(());
                }
            }
            let kind = buf[0];
            let body = buf[5..1 + len].to_vec();
            buf.drain(..1 + len);
            let mut at = 0;
            match kind {
                b'P' => {
                    let name = cstring(&body, &mut at);
                    let query = cstring(&body, &mut at);
                    // The parameter types, as ParameterDescription repeats them.
                    let params = body[at..].to_vec();
                    statements.insert(name, (query, params));
                    out.extend(message(b'1', &[]));
                }
                b'D' => {
                    let what = body.first().copied().unwrap_or(b'S');
                    at = 1;
                    let name = cstring(&body, &mut at);
                    let statement = if what == b'P' {
                        portals.get(&name).cloned().unwrap_or_default()
                    } else {
                        name
                    };
                    let (query, params) = statements.get(&statement).cloned().unwrap_or_default();
                    if what == b'S' {
                        out.extend(message(
                            b't',
                            if params.is_empty() { &[0, 0] } else { &params },
                        ));
                    }
                    let columns = answer(&query).columns;
                    if columns.is_empty() {
                        out.extend(message(b'n', &[]));
                    } else {
                        out.extend(row_description(&columns));
                    }
                }
                b'B' => {
                    let portal = cstring(&body, &mut at);
                    let statement = cstring(&body, &mut at);
                    portals.insert(portal, statement);
                    out.extend(message(b'2', &[]));
                }
                b'E' => {
                    let portal = cstring(&body, &mut at);
                    let statement = portals.get(&portal).cloned().unwrap_or_default();
                    let query = statements
                        .get(&statement)
                        .map(|(q, _)| q.clone())
                        .unwrap_or_default();
                    executed.0.lock().unwrap().push(query.clone());
                    let reply = answer(&query);
                    how = reply.how;
                    if let Some((code, text)) = reply.error {
                        out.extend(error_response(code, text));
                    } else {
                        for row in &reply.rows {
                            let mut body = (row.len() as i16).to_be_bytes().to_vec();
                            for value in row {
                                match value {
                                    None => body.extend_from_slice(&(-1i32).to_be_bytes()),
                                    Some(v) => {
                                        body.extend_from_slice(&(v.len() as i32).to_be_bytes());
                                        body.extend_from_slice(v);
                                    }
                                }
                            }
                            out.extend(message(b'D', &body));
                        }
                        let tag = reply
                            .tag
                            .clone()
                            .unwrap_or_else(|| format!("SELECT {}", reply.rows.len()));
                        out.extend(message(b'C', format!("{tag}\0").as_bytes()));
                    }
                }
                b'C' => out.extend(message(b'3', &[])),
                b'Q' => {
                    out.extend(message(b'I', &[]));
                    out.extend(message(b'Z', b"I"));
                }
                b'S' => {
                    out.extend(message(b'Z', b"I"));
                    let reply = std::mem::take(&mut out);
                    if !deliver(
                        &mut stream,
                        &reply,
                        std::mem::replace(&mut how, Behaviour::Correct),
                    )
                    .await?
                    {
                        return Ok(());
                    }
                }
                b'H' => {
                    let reply = std::mem::take(&mut out);
                    stream.write_all(&reply).await?;
                }
                b'X' => return Ok(()),
                _ => {}
            }
        }
    }
}

mod etcd {
    //! An HTTP/1 server on etcd's port: it reads the HTTP/2 preface and answers as HTTP/1.1.

    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpStream;

    use super::fake::{deliver, read_more, stall, Behaviour, Server};

    /// What an HTTP/1.1 server that does not check the method answers.
    pub const HTTP1_OK: &[u8] =
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 12\r\n\r\nnot grpc :-)";
    /// What an HTTP/1.1 server that does check it answers, before closing.
    pub const HTTP1_BAD_REQUEST: &[u8] =
        b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";

    pub async fn server(reply: &'static [u8], how: Behaviour, close_after: bool) -> Server {
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
}

// ---------------------------------------------------------------------------------------------
// The checks every call goes through.

/// The request timeout every URL here configures (`timeout_ms`).
const T: Duration = Duration::from_millis(300);
/// The request timeout of the slow tests, where a reply must make it in half of it.
const SLOW_T: Duration = Duration::from_millis(600);

/// What a loaded 2-core machine may add to a call on top of its requests' timeouts: the
/// timeout itself once more (a timer that fires late, a task scheduled late), and half a second.
fn slack(timeout: Duration) -> Duration {
    timeout + Duration::from_millis(500)
}

/// How long a hang is given before the test stops waiting for it (then it fails).
const HANG: Duration = Duration::from_secs(20);

/// Panics on threads that are not a test's own (tokio's workers, where the clients' tasks
/// run): a client library that panics in a background task would otherwise go unseen, the
/// caller only meeting a closed channel.
static STRAY_PANICS: AtomicUsize = AtomicUsize::new(0);

/// Counts stray panics from now on (once per process; the default hook still prints them).
fn watch_for_stray_panics() {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let thread = std::thread::current();
            let name = thread.name().unwrap_or("");
            if name.starts_with("tokio-runtime-worker") || name.is_empty() {
                STRAY_PANICS.fetch_add(1, Ordering::SeqCst);
            }
            default(info);
        }));
    });
}

/// Fails if any background task panicked so far (in any test of this binary: the count is
/// per process, and the panic message printed above names the place).
fn no_stray_panics() {
    let n = STRAY_PANICS.load(Ordering::SeqCst);
    assert_eq!(
        n, 0,
        "{n} panics in background tasks (see the messages above)"
    );
}

/// Runs `call` in a task of its own, and checks that it ended within `requests` request
/// timeouts of `timeout` plus [`slack`], and did not panic. Returns its result and duration.
async fn bounded<T, F>(
    what: &str,
    timeout: Duration,
    requests: u32,
    call: F,
) -> (leasehold::Result<T>, Duration)
where
    T: Send + 'static,
    F: Future<Output = leasehold::Result<T>> + Send + 'static,
{
    watch_for_stray_panics();
    let budget = timeout
        .saturating_mul(requests)
        .saturating_add(slack(timeout));
    let started = Instant::now();
    let task = tokio::spawn(call);
    let abort = task.abort_handle();
    let joined = match tokio::time::timeout(budget.saturating_add(HANG), task).await {
        Ok(joined) => joined,
        Err(_) => {
            abort.abort();
            panic!(
                "{what}: hung for more than {:?}",
                budget.saturating_add(HANG)
            );
        }
    };
    let took = started.elapsed();
    let result = match joined {
        Ok(result) => result,
        Err(e) if e.is_panic() => panic!("{what}: the call panicked: {e}"),
        Err(e) => panic!("{what}: the call's task failed: {e}"),
    };
    no_stray_panics();
    println!(
        "{what}: {:?} in {took:?} (budget {budget:?})",
        result.as_ref().map(|_| "ok").map_err(|e| e.to_string())
    );
    assert!(
        took <= budget,
        "{what}: took {took:?}, more than {requests} x {timeout:?} + {:?}",
        slack(timeout)
    );
    (result, took)
}

/// The error of a call that must fail, with its type checked: one of the kinds a server can
/// cause (never a configuration or input error, which would mean the fake was not reached).
fn failed<T: std::fmt::Debug>(what: &str, result: leasehold::Result<T>) -> Error {
    let error = match result {
        Ok(v) => panic!("{what}: succeeded against a misbehaving server: {v:?}"),
        Err(e) => e,
    };
    assert!(
        matches!(
            error,
            Error::Unavailable { .. }
                | Error::Backend { .. }
                | Error::Unauthorized { .. }
                | Error::FenceOutOfRange { .. }
                | Error::LeaseLost { .. }
        ),
        "{what}: not an error a server causes: {error:?}"
    );
    error
}

/// Waits for every run, passing on the first panic (an assertion that failed in it).
async fn join_all(mut runs: tokio::task::JoinSet<()>) {
    while let Some(run) = runs.join_next().await {
        if let Err(e) = run {
            if e.is_panic() {
                std::panic::resume_unwind(e.into_panic());
            }
            panic!("a run failed: {e}");
        }
    }
    no_stray_panics();
}

/// The error of a call that must fail, of any kind.
fn failed_any<T: std::fmt::Debug>(what: &str, result: leasehold::Result<T>) -> Error {
    match result {
        Ok(v) => panic!("{what}: succeeded against a misbehaving server: {v:?}"),
        Err(e) => e,
    }
}

/// A timeout: retryable and unavailable.
fn timed_out(what: &str, error: &Error) {
    assert!(
        matches!(error, Error::Unavailable { .. }) && error.is_retryable(),
        "{what}: not a retryable unavailability: {error:?}"
    );
}

async fn connect(url: String) -> leasehold::Result<Arc<dyn Authority>> {
    watch_for_stray_panics();
    leasehold::connect(&url).await
}

fn key() -> LockKey {
    LockKey::new("hostile/inv_72").unwrap()
}

const TTL: Duration = Duration::from_secs(5);

// ---------------------------------------------------------------------------------------------
// Redis

/// Redis: connect makes one request (PING, which also opens the connection and runs the
/// handshake) and reads the configuration (one more); each is bounded by the timeout.
const REDIS_CONNECT: u32 = 2;

fn redis_url(server: &fake::Server, timeout: Duration) -> String {
    format!(
        "redis://127.0.0.1:{}/?timeout_ms={}",
        server.port(),
        timeout.as_millis()
    )
}

/// A fake Redis that answers the handshake correctly and every script as `script` says.
async fn redis_with_scripts<F>(script: F) -> (fake::Server, resp::Seen)
where
    F: Fn(resp::Script, &resp::Command) -> (Vec<u8>, fake::Behaviour) + Send + Sync + 'static,
{
    resp::server(move |command| {
        if let Some(reply) = resp::handshake_reply(command) {
            return (reply, fake::Behaviour::Correct);
        }
        match resp::script(command) {
            Some(kind) => script(kind, command),
            None => (
                b"-ERR unknown command\r\n".to_vec(),
                fake::Behaviour::Correct,
            ),
        }
    })
    .await
}

/// Every way the handshake can go wrong ends connect with a typed error within its requests'
/// time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_misbehaving_handshake_fails_connect_in_time() {
    use fake::Behaviour::*;
    for how in [
        Garbage,
        HalfThenStall,
        CloseMidReply,
        Silent,
        Slow(T * 3 / 2),
    ] {
        let (server, _) = resp::server(move |command| {
            let reply = resp::handshake_reply(command).unwrap_or_else(|| b"-ERR no\r\n".to_vec());
            (reply, how)
        })
        .await;
        let what = format!("redis connect, handshake {how:?}");
        let (result, _) = bounded(&what, T, REDIS_CONNECT, connect(redis_url(&server, T))).await;
        let error = failed(&what, result);
        if matches!(how, HalfThenStall | Silent | Slow(_)) {
            timed_out(&what, &error);
        }
        assert!(server.accepted() >= 1, "{what}: the fake was never reached");
    }
}

/// PING answered just under the timeout: connect succeeds; just over: a retryable timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_slow_ping_under_succeeds_over_times_out() {
    for (delay, succeeds) in [(SLOW_T / 2, true), (SLOW_T * 3 / 2, false)] {
        let (server, _) = resp::server(move |command| {
            let reply = resp::handshake_reply(command).unwrap_or_else(|| b"-ERR no\r\n".to_vec());
            let how = if resp::name(command) == "PING" {
                fake::Behaviour::Slow(delay)
            } else {
                fake::Behaviour::Correct
            };
            (reply, how)
        })
        .await;
        let what = format!("redis connect, PING after {delay:?}");
        let (result, _) = bounded(
            &what,
            SLOW_T,
            REDIS_CONNECT,
            connect(redis_url(&server, SLOW_T)),
        )
        .await;
        if succeeds {
            let authority = result.unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(authority.capabilities().backend, "redis");
            let _ = authority.close().await;
        } else {
            timed_out(&what, &failed(&what, result));
        }
    }
}

/// The ways the transport can spoil a well-formed `reply`: garbage instead, half of it and then
/// nothing or a close, nothing at all, or the reply after the timeout.
fn transport_faults(reply: &[u8]) -> Vec<(&'static str, Vec<u8>, fake::Behaviour)> {
    use fake::Behaviour::*;
    vec![
        ("bytes that are no RESP", reply.to_vec(), Garbage),
        ("half a reply, then nothing", reply.to_vec(), HalfThenStall),
        ("half a reply, then close", reply.to_vec(), CloseMidReply),
        ("no reply", reply.to_vec(), Silent),
        ("a reply after the timeout", reply.to_vec(), Slow(T * 3 / 2)),
    ]
}

/// Replies of the wrong type, or broken, to the acquire script: never a grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_acquire_script_garbage_is_never_a_grant() {
    use fake::Behaviour::*;
    let fence_too_big = format!(":{}\r\n", 1u64 << 50).into_bytes();
    let replies: Vec<(&str, Vec<u8>, fake::Behaviour)> = vec![
        (
            "a bulk string of garbage",
            resp::bulk("garbage\u{1}"),
            Correct,
        ),
        ("a status reply", b"+OK\r\n".to_vec(), Correct),
        (
            "an array of integers",
            b"*2\r\n:7\r\n:8\r\n".to_vec(),
            Correct,
        ),
        ("a one-element array", b"*1\r\n:7\r\n".to_vec(), Correct),
        ("a nil bulk string", b"$-1\r\n".to_vec(), Correct),
        ("a nil array", b"*-1\r\n".to_vec(), Correct),
        ("an error", b"-ERR something broke\r\n".to_vec(), Correct),
        (
            "a script error",
            b"-NOSCRIPT No matching script\r\n".to_vec(),
            Correct,
        ),
        ("a fence out of range", fence_too_big, Correct),
        ("an integer that is not one", b":12x\r\n".to_vec(), Correct),
    ]
    .into_iter()
    .chain(transport_faults(b":7\r\n"))
    .collect();
    for (label, reply, how) in replies {
        let answer = reply.clone();
        let (server, seen) = redis_with_scripts(move |kind, _| match kind {
            resp::Script::Release => (b":1\r\n".to_vec(), Correct),
            _ => (answer.clone(), how),
        })
        .await;
        let authority = connect(redis_url(&server, T)).await.unwrap();
        let what = format!("redis try_acquire, script answers {label}");
        let a = authority.clone();
        let (result, _) =
            bounded(&what, T, 1, async move { a.try_acquire(&key(), TTL).await }).await;
        match result {
            // A negative integer means "held": a correct `None`. Nothing here is one, but an
            // Ok(None) grants nothing either.
            Ok(None) => {}
            other => {
                failed(&what, other);
            }
        }
        let what = format!("redis acquire, script answers {label}");
        let a = authority.clone();
        // acquire waits up to one timeout for the subscription to settle, then attempts.
        let (result, _) =
            bounded(&what, T, 2, async move { a.acquire(&key(), TTL, T).await }).await;
        let error = failed(&what, result);
        if matches!(how, HalfThenStall | Silent | Slow(_)) {
            timed_out(&what, &error);
        }
        // A well-formed reply that does not say what the script did (anything but a server
        // error), or one that came too late, may hide a lease the server made: the client
        // takes it back with a release for the same owner token, on the same connection. A
        // reply that is not RESP at all (or half of one, or none) leaves that connection
        // unusable, and the lease runs out its TTL, as one made by any request in flight may;
        // nobody believes it held.
        let server_error = reply.starts_with(b"-");
        let not_resp = label == "an integer that is not one";
        if !server_error && !not_resp && matches!(how, Correct | Slow(_)) {
            let acquired = seen.scripts(resp::Script::Acquire);
            assert!(
                !acquired.is_empty(),
                "{label}: no acquisition reached the fake"
            );
            let by = Instant::now() + T * 3 / 2 + slack(T);
            while !acquired
                .iter()
                .all(|t| seen.scripts(resp::Script::Release).contains(t))
            {
                assert!(
                    Instant::now() < by,
                    "{label}: an acquisition whose outcome is unknown was not released: {:?}",
                    seen.0.lock().unwrap()
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        let _ = authority.close().await;
    }
}

/// Replies of the wrong type, or broken, to renew, renew_many and release of a grant the fake
/// really made: a renewal is never believed, and nothing panics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_renew_and_release_garbage_is_never_a_renewal() {
    use fake::Behaviour::*;
    let replies: Vec<(&str, Vec<u8>, fake::Behaviour)> = vec![
        ("a bulk string of garbage", resp::bulk("garbage"), Correct),
        ("a status reply", b"+OK\r\n".to_vec(), Correct),
        ("an integer other than 1", b":7\r\n".to_vec(), Correct),
        (
            "an array of two integers, the first not 1",
            b"*2\r\n:0\r\n:1\r\n".to_vec(),
            Correct,
        ),
        ("an empty array", b"*0\r\n".to_vec(), Correct),
        ("a nil bulk string", b"$-1\r\n".to_vec(), Correct),
        ("an error", b"-ERR something broke\r\n".to_vec(), Correct),
    ]
    .into_iter()
    .chain(transport_faults(b":1\r\n"))
    .collect();
    for (label, reply, how) in replies {
        let answer = reply.clone();
        let (server, _) = redis_with_scripts(move |kind, _| match kind {
            resp::Script::Acquire => (b":7\r\n".to_vec(), Correct),
            _ => (answer.clone(), how),
        })
        .await;
        let authority = connect(redis_url(&server, T)).await.unwrap();
        let grant: Grant = authority
            .try_acquire(&key(), TTL)
            .await
            .unwrap()
            .expect("the fake grants the first acquisition");
        assert_eq!(grant.fence().raw(), 7);

        let what = format!("redis renew, script answers {label}");
        let (a, g) = (authority.clone(), grant.clone());
        let (result, _) = bounded(&what, T, 1, async move { a.renew(&g, TTL).await }).await;
        let error = failed(&what, result);
        if matches!(how, HalfThenStall | Silent | Slow(_)) {
            timed_out(&what, &error);
        }

        let what = format!("redis renew_many, script answers {label}");
        let (a, g) = (authority.clone(), grant.clone());
        let (results, _) = bounded(&what, T, 1, async move {
            Ok(a.renew_many(std::slice::from_ref(&g)).await)
        })
        .await;
        let results = results.unwrap();
        assert_eq!(results.len(), 1, "{what}");
        for result in results {
            failed(&what, result);
        }

        let what = format!("redis release, script answers {label}");
        let (a, g) = (authority.clone(), grant.clone());
        let (result, _) = bounded(&what, T, 1, async move { a.release(&g).await }).await;
        match result {
            // An integer other than 1 or 2 reads as "not ours any more": nothing is held.
            Ok(Released::AlreadyGone) if label == "an integer other than 1" => {}
            other => {
                failed(&what, other);
            }
        }
        let _ = authority.close().await;
    }
}

/// A fake Redis that grants the first acquisition (fence 7) and answers every other script
/// with `reply`; connected, with that grant.
async fn redis_granted_then(reply: Vec<u8>) -> (fake::Server, Arc<dyn Authority>, Grant) {
    let (server, _) = redis_with_scripts(move |kind, _| match kind {
        resp::Script::Acquire => (b":7\r\n".to_vec(), fake::Behaviour::Correct),
        _ => (reply.clone(), fake::Behaviour::Correct),
    })
    .await;
    let authority = connect(redis_url(&server, T)).await.unwrap();
    let grant = authority
        .try_acquire(&key(), TTL)
        .await
        .unwrap()
        .expect("the fake grants the first acquisition");
    (server, authority, grant)
}

/// `renew_many` expects an array with one integer per grant: an integer alone (what `renew`
/// gets), or nothing at all, renews nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_renew_many_wrong_types_renew_nothing() {
    for (label, reply) in [
        ("an integer where an array is expected", b":1\r\n".to_vec()),
        ("a status reply", b"+OK\r\n".to_vec()),
        ("a nil array", b"*-1\r\n".to_vec()),
        ("an array of arrays", b"*1\r\n*1\r\n:1\r\n".to_vec()),
    ] {
        let (_server, authority, grant) = redis_granted_then(reply).await;
        let what = format!("redis renew_many, script answers {label}");
        let (a, g) = (authority.clone(), grant.clone());
        let (results, _) = bounded(&what, T, 1, async move {
            Ok(a.renew_many(std::slice::from_ref(&g)).await)
        })
        .await;
        let results = results.unwrap();
        assert_eq!(results.len(), 1, "{what}");
        for result in results {
            failed(&what, result);
        }
        let _ = authority.close().await;
    }
}

/// Defect: `renew_many` takes any reply that converts to a vector of integers, so a bulk
/// string `"1"` (the client library makes it `[1]`) or an array longer than the batch renews
/// the grant. Only an array of exactly one integer per grant is an answer to the request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_renew_many_reply_of_the_wrong_shape_is_no_renewal() {
    for (label, reply) in [
        ("a bulk string where an array is expected", resp::bulk("1")),
        (
            "an array longer than the batch",
            b"*2\r\n:1\r\n:1\r\n".to_vec(),
        ),
    ] {
        let (_server, authority, grant) = redis_granted_then(reply).await;
        let what = format!("redis renew_many, script answers {label}");
        let (a, g) = (authority.clone(), grant.clone());
        let (results, _) = bounded(&what, T, 1, async move {
            Ok(a.renew_many(std::slice::from_ref(&g)).await)
        })
        .await;
        for result in results.unwrap() {
            failed(&what, result);
        }
        let _ = authority.close().await;
    }
}

/// Defect: the scripts return Lua numbers, which Redis sends as RESP integers only; the client
/// library converts text that reads as a number (a bulk or status string `7`) to an integer,
/// so such a reply to the acquire script becomes a grant with that fence, and to renew a
/// renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_numeric_text_from_a_script_is_no_grant_and_no_renewal() {
    for (label, text) in [
        ("a bulk string", resp::bulk("7")),
        ("a status reply", b"+7\r\n".to_vec()),
    ] {
        let reply = text.clone();
        let (server, _) =
            redis_with_scripts(move |_, _| (reply.clone(), fake::Behaviour::Correct)).await;
        let authority = connect(redis_url(&server, T)).await.unwrap();
        let what = format!("redis try_acquire, script answers {label} `7`");
        let a = authority.clone();
        let (result, _) =
            bounded(&what, T, 1, async move { a.try_acquire(&key(), TTL).await }).await;
        failed(&what, result);
        let _ = authority.close().await;

        let one = if label == "a bulk string" {
            resp::bulk("1")
        } else {
            b"+1\r\n".to_vec()
        };
        let (_server, authority, grant) = redis_granted_then(one).await;
        let what = format!("redis renew, script answers {label} `1`");
        let (a, g) = (authority.clone(), grant.clone());
        let (result, _) = bounded(&what, T, 1, async move { a.renew(&g, TTL).await }).await;
        failed(&what, result);
        let _ = authority.close().await;
    }
}

/// The acquire script answered just under the timeout: a grant. Just over: a retryable
/// timeout, no grant, and the lease the late reply made is released by the client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_slow_scripts_under_succeed_over_time_out() {
    let delay = Arc::new(Mutex::new(Duration::ZERO));
    let granted = Arc::new(AtomicUsize::new(0));
    let (d, g) = (delay.clone(), granted.clone());
    let (server, seen) = redis_with_scripts(move |kind, _| {
        let how = fake::Behaviour::Slow(*d.lock().unwrap());
        match kind {
            resp::Script::Acquire => {
                g.fetch_add(1, Ordering::SeqCst);
                (b":7\r\n".to_vec(), how)
            }
            _ => (b":1\r\n".to_vec(), how),
        }
    })
    .await;
    let authority = connect(redis_url(&server, SLOW_T)).await.unwrap();

    // Just under.
    *delay.lock().unwrap() = SLOW_T / 2;
    let what = "redis try_acquire, answered just under the timeout";
    let a = authority.clone();
    let (result, _) = bounded(
        what,
        SLOW_T,
        1,
        async move { a.try_acquire(&key(), TTL).await },
    )
    .await;
    let grant = result.unwrap().expect("a grant made in time is a grant");
    assert_eq!(granted.load(Ordering::SeqCst), 1);
    let what = "redis renew, answered just under the timeout";
    let (a, g) = (authority.clone(), grant.clone());
    let (result, _) = bounded(what, SLOW_T, 1, async move { a.renew(&g, TTL).await }).await;
    result.unwrap();
    let what = "redis release, answered just under the timeout";
    let (a, g) = (authority.clone(), grant.clone());
    let (result, _) = bounded(what, SLOW_T, 1, async move { a.release(&g).await }).await;
    assert_eq!(result.unwrap(), Released::Released);

    // Just over.
    *delay.lock().unwrap() = SLOW_T * 3 / 2;
    let what = "redis renew, answered just over the timeout";
    let (a, g) = (authority.clone(), grant.clone());
    let (result, _) = bounded(what, SLOW_T, 1, async move { a.renew(&g, TTL).await }).await;
    timed_out(what, &failed(what, result));
    let what = "redis try_acquire, answered just over the timeout";
    let a = authority.clone();
    let (result, _) = bounded(
        what,
        SLOW_T,
        1,
        async move { a.try_acquire(&key(), TTL).await },
    )
    .await;
    timed_out(what, &failed(what, result));
    assert_eq!(
        granted.load(Ordering::SeqCst),
        2,
        "the fake saw the second acquisition"
    );
    // The fake made that lease (late); the client, told nothing in time, must take it back:
    // a release with the same owner token follows on the same connection.
    let acquired = seen.scripts(resp::Script::Acquire);
    let late_token = acquired.last().cloned().unwrap();
    let released_by = Instant::now() + SLOW_T * 4 + slack(SLOW_T);
    loop {
        if seen.scripts(resp::Script::Release).contains(&late_token) {
            break;
        }
        assert!(
            Instant::now() < released_by,
            "the lease made by the late acquisition was never released: {:?}",
            seen.0.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = authority.close().await;
}

/// A server that always answers "held" (the holder's lease ending in 0 ms, never, or at the
/// far end of an i64), while the subscription's handshake misbehaves: acquire waits out
/// `max_wait` and ends with a `Timeout` (contention), never a grant, and a subscription that
/// does not come up costs at most one request timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_acquire_from_a_server_that_always_says_held_times_out() {
    use fake::Behaviour::*;
    let max_wait = T * 2;
    for (held, hello) in [
        (":-1\r\n", Correct),
        (":0\r\n", Garbage),
        (":-9223372036854775808\r\n", HalfThenStall),
        (":-1\r\n", CloseMidReply),
        (":-2\r\n", Silent),
    ] {
        let (server, _) = resp::server(move |command| {
            if resp::script(command) == Some(resp::Script::Acquire) {
                return (held.as_bytes().to_vec(), Correct);
            }
            let reply = resp::handshake_reply(command).unwrap_or_else(|| b"-ERR no\r\n".to_vec());
            let how = if resp::name(command) == "HELLO" {
                hello
            } else {
                Correct
            };
            (reply, how)
        })
        .await;
        let authority = connect(redis_url(&server, T)).await.unwrap();
        let what = format!(
            "redis acquire, always held ({}), HELLO {hello:?}",
            held.trim()
        );
        let a = authority.clone();
        // The subscription settles (one timeout), then attempts until max_wait (two), then
        // the attempt under way (one).
        let (result, took) = bounded(&what, T, 4, async move {
            a.acquire(&key(), TTL, max_wait).await
        })
        .await;
        let error = failed_any(&what, result);
        assert!(matches!(error, Error::Timeout { .. }), "{what}: {error:?}");
        assert!(
            took >= max_wait,
            "{what}: gave up after {took:?}, before {max_wait:?}"
        );
        let what = format!("redis try_acquire, always held ({})", held.trim());
        let a = authority.clone();
        let (result, _) =
            bounded(&what, T, 1, async move { a.try_acquire(&key(), TTL).await }).await;
        assert!(result.unwrap().is_none(), "{what}: a grant from a held key");
        let _ = authority.close().await;
    }
}

/// A lease whose server stops renewing it (no answer, garbage, a reply of the wrong type, a
/// refusal, half a reply and close) is lost by its local deadline, and `ensure_valid` says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_lease_whose_renewals_go_wrong_is_lost_by_its_deadline() {
    use fake::Behaviour::*;
    let ttl = Duration::from_secs(1);
    // A lease renews with `renew_many` (one grant: the same keys and arguments as `renew`), so
    // the replies have its shape: one integer per grant.
    let cases: Vec<(&str, &'static [u8], fake::Behaviour)> = vec![
        ("no answer", b"*1\r\n:1\r\n", Silent),
        ("garbage", b"*1\r\n:1\r\n", Garbage),
        ("a status reply", b"+OK\r\n", Correct),
        ("a refusal", b"*1\r\n:0\r\n", Correct),
        ("half a reply, then close", b"*1\r\n:1\r\n", CloseMidReply),
    ];
    let mut runs = tokio::task::JoinSet::new();
    for (label, reply, how) in cases {
        runs.spawn(async move {
            let (server, _) = redis_with_scripts(move |kind, _| match kind {
                resp::Script::Acquire => (b":7\r\n".to_vec(), Correct),
                _ => (reply.to_vec(), how),
            })
            .await;
            let authority = connect(redis_url(&server, T)).await.unwrap();
            let lease = Lease::try_acquire(authority, &key(), ttl, LeaseOptions::default())
                .await
                .unwrap()
                .expect("the fake grants the acquisition");
            let deadline = lease.deadline();
            let by = deadline + slack(T);
            let reason = tokio::time::timeout_at(by, lease.lost()).await;
            let reason = reason.unwrap_or_else(|_| {
                panic!(
                    "renewals answered with {label}: the lease is not lost {:?} after its deadline",
                    slack(T)
                )
            });
            assert!(
                lease.ensure_valid().is_err(),
                "renewals answered with {label}: lost ({reason}) but still valid"
            );
            assert!(lease.is_lost(), "renewals answered with {label}");
            if label == "a refusal" {
                assert!(
                    matches!(reason, leasehold::LostReason::Refused),
                    "a refused renewal: {reason:?}"
                );
            }
            println!("redis lease, renewals answered with {label}: lost ({reason})");
            drop(lease);
            drop(server);
        });
    }
    join_all(runs).await;
}

/// `CONFIG GET` answered with the wrong types, or refused: connect either fails with a typed
/// error or goes on without believing the fences durable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_config_of_the_wrong_type_claims_no_durability() {
    let replies: Vec<(&str, Vec<u8>)> = vec![
        ("an integer", b":1\r\n".to_vec()),
        ("a bulk string", resp::bulk("noeviction")),
        (
            "a pair with an integer value",
            b"*2\r\n$16\r\nmaxmemory-policy\r\n:1\r\n".to_vec(),
        ),
        ("an empty array", b"*0\r\n".to_vec()),
        ("a refusal", b"-ERR unknown command 'CONFIG'\r\n".to_vec()),
        ("garbage", fake::GARBAGE.to_vec()),
    ];
    for (label, reply) in replies {
        let (server, _) = resp::server(move |command| {
            if resp::name(command) == "CONFIG" {
                return (reply.clone(), fake::Behaviour::Correct);
            }
            let reply = resp::handshake_reply(command).unwrap_or_else(|| b"-ERR no\r\n".to_vec());
            (reply, fake::Behaviour::Correct)
        })
        .await;
        let what = format!("redis connect, CONFIG GET answered with {label}");
        let (result, _) = bounded(&what, T, REDIS_CONNECT, connect(redis_url(&server, T))).await;
        match result {
            Ok(authority) => {
                assert!(
                    !authority.capabilities().durable_fences,
                    "{what}: fences declared durable"
                );
                let _ = authority.close().await;
            }
            Err(e) => {
                failed(&what, Err::<(), _>(e));
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// etcd

/// etcd: connect makes the client (bounded), probes the minimum TTL (a grant and a revoke) and
/// reads the namespace, each bounded by the timeout.
const ETCD_CONNECT: u32 = 4;

/// An HTTP/1 server on etcd's port, answering every way: connect fails with a typed error in
/// time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_http1_server_fails_connect_in_time() {
    use fake::Behaviour::*;
    let cases: Vec<(&str, &'static [u8], fake::Behaviour, bool)> = vec![
        ("HTTP/1.1 200 OK", etcd::HTTP1_OK, Correct, false),
        (
            "HTTP/1.1 400 and close",
            etcd::HTTP1_BAD_REQUEST,
            Correct,
            true,
        ),
        ("garbage", etcd::HTTP1_OK, Garbage, false),
        (
            "half an HTTP/1 reply, then nothing",
            etcd::HTTP1_OK,
            HalfThenStall,
            false,
        ),
        (
            "half an HTTP/1 reply, then close",
            etcd::HTTP1_OK,
            CloseMidReply,
            false,
        ),
        ("no reply", etcd::HTTP1_OK, Silent, false),
        (
            "HTTP/1 just under the timeout",
            etcd::HTTP1_OK,
            Slow(T / 2),
            false,
        ),
        (
            "HTTP/1 just over the timeout",
            etcd::HTTP1_OK,
            Slow(T * 3 / 2),
            false,
        ),
    ];
    for (label, reply, how, close_after) in cases {
        let server = etcd::server(reply, how, close_after).await;
        let url = format!(
            "etcd://127.0.0.1:{}?timeout_ms={}",
            server.port(),
            T.as_millis()
        );
        let what = format!("etcd connect, {label}");
        let (result, _) = bounded(&what, T, ETCD_CONNECT, connect(url)).await;
        let error = failed(&what, result);
        // Unreachable in time, or a protocol error (h2 refuses the HTTP/1 reply): either way
        // not a grant and not a wrong password.
        assert!(
            matches!(error, Error::Unavailable { .. } | Error::Backend { .. }),
            "{what}: {error:?}"
        );
        // Half an HTTP/1 reply is already a broken HTTP/2 frame; silence is a timeout.
        if how == Silent || how == Slow(T * 3 / 2) {
            timed_out(&what, &error);
        }
        assert!(server.accepted() >= 1, "{what}: the fake was never reached");
    }
}

// ---------------------------------------------------------------------------------------------
// ZooKeeper

/// ZooKeeper: connect opens a session with the longest timeout, two more to learn the shortest
/// (the second after the first got no answer), checks and makes the chroot, and reads the
/// ensemble's configuration: six requests, each bounded by the timeout.
const ZK_CONNECT: u32 = 6;

fn zk_url(server: &fake::Server, chroot: &str, timeout: Duration) -> String {
    format!(
        "zk://127.0.0.1:{}{chroot}?timeout_ms={}",
        server.port(),
        timeout.as_millis()
    )
}

/// A server that never finishes the handshake, every way: connect fails with a typed error in
/// time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_unfinished_handshake_fails_connect_in_time() {
    use fake::Behaviour::*;
    let handshake = |connect| zk::Mode::Handshake {
        connect,
        requests: Correct,
        error: zk::NO_NODE,
    };
    let modes = [
        handshake(Silent),
        handshake(HalfThenStall),
        handshake(CloseMidReply),
        handshake(Garbage),
        handshake(Slow(T * 3 / 2)),
        zk::Mode::HugeLength,
        zk::Mode::NegativeLength,
        zk::Mode::TruncatedResponse,
    ];
    for mode in modes {
        let server = zk::server(mode).await;
        let what = format!("zookeeper connect, {mode:?}");
        let (result, _) =
            bounded(&what, T, ZK_CONNECT, connect(zk_url(&server, "/locks", T))).await;
        let error = failed(&what, result);
        assert!(
            matches!(error, Error::Unavailable { .. } | Error::Backend { .. }),
            "{what}: {error:?}"
        );
        assert!(server.accepted() >= 1, "{what}: the fake was never reached");
    }
}

/// The handshake answered just under the timeout: connect succeeds. Then a server that answers
/// every request with an error, or misbehaves on it: no grant, a typed error in time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_slow_handshake_succeeds_and_refused_requests_grant_nothing() {
    use fake::Behaviour::*;
    // The cases run side by side: each takes a few request timeouts.
    let mut runs = tokio::task::JoinSet::new();
    for requests in [
        Correct,
        Garbage,
        HalfThenStall,
        CloseMidReply,
        Silent,
        Slow(SLOW_T * 3 / 2),
    ] {
        runs.spawn(async move {
            let server = zk::server(zk::Mode::Handshake {
                connect: Slow(SLOW_T / 2),
                requests,
                error: zk::MARSHALLING,
            })
            .await;
            let what = format!(
                "zookeeper connect, handshake after {:?}, requests {requests:?}",
                SLOW_T / 2
            );
            // With the chroot `/` connect needs no request answered: reading the ensemble's
            // configuration may fail. So every handshake answered in time connects.
            let (result, _) = bounded(
                &what,
                SLOW_T,
                ZK_CONNECT,
                connect(zk_url(&server, "/", SLOW_T)),
            )
            .await;
            let authority = result.unwrap_or_else(|e| panic!("{what}: {e:?}"));
            let what = format!("zookeeper try_acquire, requests {requests:?}");
            let a = authority.clone();
            // A new session for the TTL, then the requests of one attempt.
            let (result, _) = bounded(
                &what,
                SLOW_T,
                4,
                async move { a.try_acquire(&key(), TTL).await },
            )
            .await;
            failed(&what, result);
            let _ = tokio::time::timeout(SLOW_T, authority.close()).await;
        });
    }
    join_all(runs).await;
}

/// A server granting a session timeout no server grants (zero, negative, one millisecond, the
/// largest): connect and an acquisition end in time with a typed result, nothing panics (in
/// the caller or in the client's background task), and nothing is granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_absurd_session_timeouts_are_typed_errors_or_harmless() {
    for granted in [0, -1, i32::MIN, 1, i32::MAX] {
        let server = zk::server(zk::Mode::GrantTimeout(granted)).await;
        let what = format!("zookeeper connect, session timeout {granted} ms granted");
        let (result, _) = bounded(&what, T, ZK_CONNECT, connect(zk_url(&server, "/", T))).await;
        let authority = match result {
            Ok(authority) => authority,
            Err(e) => {
                failed_any(&what, Err::<(), _>(e));
                continue;
            }
        };
        let range = authority.capabilities().ttl;
        assert!(range.min <= range.max, "{what}: {range:?}");
        let what = format!("zookeeper try_acquire, session timeout {granted} ms granted");
        let a = authority.clone();
        let (result, _) =
            bounded(&what, T, 4, async move { a.try_acquire(&key(), TTL).await }).await;
        failed_any(&what, result);
        let _ = tokio::time::timeout(T, authority.close()).await;
    }
}

// ---------------------------------------------------------------------------------------------
// PostgreSQL

/// PostgreSQL: connect (the pool's first connection and one query) is bounded by one timeout in
/// all.
const PG_CONNECT: u32 = 1;

fn pg_url(server: &fake::Server, timeout: Duration) -> String {
    format!(
        "postgres://u@127.0.0.1:{}/db?timeout_ms={}",
        server.port(),
        timeout.as_millis()
    )
}

/// A server that stops mid-startup, every way: connect fails with a typed error in time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_server_stopping_mid_startup_fails_connect_in_time() {
    use fake::Behaviour::*;
    let modes = [
        pg::Mode::AuthOk(HalfThenStall),
        pg::Mode::AuthOk(CloseMidReply),
        pg::Mode::AuthOk(Garbage),
        pg::Mode::AuthOk(Silent),
        pg::Mode::AuthOkThenStall,
        pg::Mode::GarbageToSslRequest,
        pg::Mode::Refuse(HalfThenStall),
        pg::Mode::Refuse(CloseMidReply),
    ];
    for mode in modes {
        let server = pg::server(mode).await;
        let what = format!("postgres connect, {mode:?}");
        let (result, _) = bounded(&what, T, PG_CONNECT, connect(pg_url(&server, T))).await;
        let error = failed(&what, result);
        if matches!(
            mode,
            pg::Mode::AuthOk(HalfThenStall | Silent) | pg::Mode::AuthOkThenStall
        ) {
            timed_out(&what, &error);
        }
        assert!(server.accepted() >= 1, "{what}: the fake was never reached");
    }
}

/// A refusal just under the timeout is read (the credentials were refused); just over, the
/// connect is a retryable timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_slow_refusal_under_is_read_over_times_out() {
    for (delay, read) in [(SLOW_T / 2, true), (SLOW_T * 3 / 2, false)] {
        let server = pg::server(pg::Mode::Refuse(fake::Behaviour::Slow(delay))).await;
        let what = format!("postgres connect, refused after {delay:?}");
        let (result, _) =
            bounded(&what, SLOW_T, PG_CONNECT, connect(pg_url(&server, SLOW_T))).await;
        let error = failed(&what, result);
        if read {
            assert!(
                matches!(error, Error::Unauthorized { .. }),
                "{what}: the refusal was not read: {error:?}"
            );
        } else {
            timed_out(&what, &error);
        }
    }
}

/// The release: the one `UPDATE` that may notify in its `RETURNING` clause.
fn is_pg_release(query: &str) -> bool {
    query.starts_with("UPDATE") && query.contains("pg_notify")
}

/// What the fake PostgreSQL answers to the statements the authority runs, each delivered as
/// `how`: the settings at connect, the fence 7 to an acquisition, one row renewed or released.
fn pg_statement(query: &str, how: fake::Behaviour) -> pgq::Answer {
    let answer = if query.contains("current_setting") {
        pgq::Answer::settings()
    } else if query.contains("INSERT INTO") {
        pgq::Answer::fence(7)
    } else if is_pg_release(query) {
        // One row released; its column says whether it notified.
        pgq::Answer::rows(vec![("notified", pgq::BOOL)], vec![vec![Some(vec![0])]])
    } else if query.starts_with("UPDATE") {
        pgq::Answer::updated(1)
    } else {
        pgq::Answer::rows(Vec::new(), Vec::new())
    };
    answer.delivered(how)
}

/// Statements answered just under the timeout: connect, a grant, a renewal and a release
/// succeed. Just over: retryable timeouts, no grant, and the lease the late answer made is
/// given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_slow_statements_under_succeed_over_time_out() {
    let delay = Arc::new(Mutex::new(SLOW_T / 2));
    let d = delay.clone();
    let (server, executed) =
        pgq::server(move |query| pg_statement(query, fake::Behaviour::Slow(*d.lock().unwrap())))
            .await;
    let what = "postgres connect, statements answered just under the timeout";
    let (result, _) = bounded(what, SLOW_T, PG_CONNECT, connect(pg_url(&server, SLOW_T))).await;
    let authority = result.unwrap();
    let what = "postgres try_acquire, answered just under the timeout";
    let a = authority.clone();
    let (result, _) = bounded(
        what,
        SLOW_T,
        1,
        async move { a.try_acquire(&key(), TTL).await },
    )
    .await;
    let grant = result.unwrap().expect("a grant made in time is a grant");
    assert_eq!(grant.fence().raw(), 7);
    let what = "postgres renew, answered just under the timeout";
    let (a, g) = (authority.clone(), grant.clone());
    let (result, _) = bounded(what, SLOW_T, 1, async move { a.renew(&g, TTL).await }).await;
    result.unwrap();
    let what = "postgres release, answered just under the timeout";
    let (a, g) = (authority.clone(), grant.clone());
    let (result, _) = bounded(what, SLOW_T, 1, async move { a.release(&g).await }).await;
    assert_eq!(result.unwrap(), Released::Released);

    *delay.lock().unwrap() = SLOW_T * 3 / 2;
    let what = "postgres renew, answered just over the timeout";
    let (a, g) = (authority.clone(), grant.clone());
    let (result, _) = bounded(what, SLOW_T, 1, async move { a.renew(&g, TTL).await }).await;
    timed_out(what, &failed(what, result));
    let releases = executed.releases();
    let what = "postgres try_acquire, answered just over the timeout";
    let a = authority.clone();
    let (result, _) = bounded(
        what,
        SLOW_T,
        1,
        async move { a.try_acquire(&key(), TTL).await },
    )
    .await;
    timed_out(what, &failed(what, result));
    // The late answer made a lease nobody was told about: the client gives it back.
    let by = Instant::now() + SLOW_T * 4 + slack(SLOW_T);
    executed.await_release(releases, by, what).await;
    let _ = tokio::time::timeout(SLOW_T, authority.close()).await;
}

/// An acquisition answered with a row of the wrong type or shape, a fence out of range, an
/// error, or a reply that breaks off: never a grant, a typed error in time; and where the row
/// did carry a number (so the server may have made a lease), the lease is given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_lease_rows_of_the_wrong_type_are_never_a_grant() {
    use fake::Behaviour::*;
    use pgq::{Answer, INT4, INT8, TEXT};
    let cases: Vec<(&str, Answer, bool)> = vec![
        (
            "a text fence",
            Answer::rows(vec![("fence", TEXT)], vec![vec![Some(b"7".to_vec())]]),
            false,
        ),
        (
            "an int4 fence",
            Answer::rows(
                vec![("fence", INT4)],
                vec![vec![Some(7i32.to_be_bytes().to_vec())]],
            ),
            false,
        ),
        (
            "three bytes for a bigint",
            Answer::rows(vec![("fence", INT8)], vec![vec![Some(vec![0, 0, 7])]]),
            false,
        ),
        (
            "a NULL fence",
            Answer::rows(vec![("fence", INT8)], vec![vec![None]]),
            false,
        ),
        (
            "a row without columns",
            Answer::rows(Vec::new(), vec![vec![]]),
            false,
        ),
        ("fence 0", Answer::fence(0), true),
        ("fence -1", Answer::fence(-1), true),
        ("fence i64::MIN", Answer::fence(i64::MIN), true),
        ("fence 2^50", Answer::fence(1 << 50), true),
        (
            "a serialization failure",
            Answer::error("40001", "could not serialize access"),
            false,
        ),
        (
            "an internal error",
            Answer::error("XX000", "something broke"),
            false,
        ),
        ("garbage", Answer::fence(7).delivered(Garbage), false),
        (
            "half a reply, then nothing",
            Answer::fence(7).delivered(HalfThenStall),
            false,
        ),
        (
            "half a reply, then close",
            Answer::fence(7).delivered(CloseMidReply),
            false,
        ),
        ("no reply", Answer::fence(7).delivered(Silent), false),
    ];
    let mut runs = tokio::task::JoinSet::new();
    for (label, bad, given_back) in cases {
        runs.spawn(async move {
            let (server, executed) = pgq::server(move |query| {
                if query.contains("INSERT INTO") {
                    bad.clone()
                } else {
                    pg_statement(query, Correct)
                }
            })
            .await;
            let authority = connect(pg_url(&server, T)).await.unwrap();
            let what = format!("postgres try_acquire, answered with {label}");
            let a = authority.clone();
            let (result, _) =
                bounded(&what, T, 1, async move { a.try_acquire(&key(), TTL).await }).await;
            match result {
                Ok(None) => {}
                other => {
                    failed(&what, other);
                }
            }
            if given_back {
                let by = Instant::now() + T * 2 + slack(T);
                executed.await_release(0, by, &what).await;
            }
            let _ = tokio::time::timeout(T, authority.close()).await;
        });
    }
    join_all(runs).await;
}
