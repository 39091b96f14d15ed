//! Just enough RESP (Redis's protocol) for a fake: commands in, replies out.

use std::sync::{Arc, Mutex};

use tokio::net::TcpStream;

use super::fake::{deliver, lock, read_more, Behaviour, Server};
use super::Result;

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
    /// 2 or 3 keys; the owner token, the channel and (since releases name the next waiter on
    /// its own channel) the releasing authority's waiter id.
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
        // A waiter's acquisition names the key's waiter queue too, and its id and place.
        (Some("2"), 2) | (Some("3"), 4) if last_is_number => Script::Acquire,
        (Some("2" | "3"), 2 | 3) => Script::Release,
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
        lock(&self.0)
            .iter()
            .filter(|(_, s, _)| *s == Some(kind))
            .filter_map(|(_, _, t)| t.clone())
            .collect()
    }
}

/// A fake Redis whose every command gets what `respond` says: the reply and how to deliver
/// it.
pub async fn server<F>(respond: F) -> Result<(Server, Seen)>
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
    .await?;
    Ok((server, seen))
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
                lock(&seen.0).push((
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

/// Redis: connect makes one request (PING, which also opens the connection and runs the
/// handshake) and reads the configuration (one more); each is bounded by the timeout.
pub const REDIS_CONNECT: u32 = 2;

pub fn redis_url(server: &Server, timeout: std::time::Duration) -> String {
    format!(
        "redis://127.0.0.1:{}/?timeout_ms={}",
        server.port(),
        timeout.as_millis()
    )
}

/// A fake Redis that answers the handshake correctly and every script as `answer` says.
pub async fn redis_with_scripts<F>(answer: F) -> Result<(Server, Seen)>
where
    F: Fn(Script, &Command) -> (Vec<u8>, Behaviour) + Send + Sync + 'static,
{
    server(move |command| {
        if let Some(reply) = handshake_reply(command) {
            return (reply, Behaviour::Correct);
        }
        match script(command) {
            Some(kind) => answer(kind, command),
            None => (b"-ERR unknown command\r\n".to_vec(), Behaviour::Correct),
        }
    })
    .await
}
