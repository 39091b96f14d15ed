//! A fake PostgreSQL that completes the startup and then answers the extended query
//! protocol (Parse, Describe, Bind, Execute, Sync) with whatever rows a test says, delivered
//! as the test says: enough to take sqlx (and the authority) past connecting, to the
//! statements on the lease table.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::fake::{be_i32, deliver, lock, read_more, Behaviour, Server};
use super::Result;

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

/// The release: the one `UPDATE` that may notify in its `RETURNING` clause.
pub fn is_pg_release(query: &str) -> bool {
    query.starts_with("UPDATE") && query.contains("pg_notify")
}

/// The statements the fake was asked to execute, in order.
#[derive(Clone, Debug, Default)]
pub struct Executed(pub Arc<Mutex<Vec<String>>>);

impl Executed {
    /// How many releases were executed.
    pub fn releases(&self) -> usize {
        lock(&self.0).iter().filter(|q| is_pg_release(q)).count()
    }

    /// Waits until more than `before` releases were executed, failing at `by`: a lease the
    /// fake made that nobody was told about must be given back.
    pub async fn await_release(&self, before: usize, by: std::time::Instant, what: &str) {
        while self.releases() <= before {
            assert!(
                std::time::Instant::now() < by,
                "{what}: a lease the fake made was never given back: {:?}",
                lock(&self.0)
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

pub async fn server<F>(answer: F) -> Result<(Server, Executed)>
where
    F: Fn(&str) -> Answer + Send + Sync + 'static,
{
    let answer = Arc::new(answer);
    let executed = Executed::default();
    let log = executed.clone();
    let server = Server::start(move |stream| serve(stream, answer.clone(), log.clone())).await?;
    Ok((server, executed))
}

async fn serve<F>(mut stream: TcpStream, answer: Arc<F>, executed: Executed) -> std::io::Result<()>
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
        let len = usize::try_from(be_i32(&buf[..4])).unwrap_or(4).max(8);
        while buf.len() < len {
            if !read_more(&mut stream, &mut buf).await? {
                return Ok(());
            }
        }
        let code = be_i32(&buf[4..8]);
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
        let len = usize::try_from(be_i32(&buf[1..5])).unwrap_or(4).max(4);
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
                lock(&executed.0).push(query.clone());
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
