//! What the console's test binaries share: a `leasehold console` process and the address it
//! printed, plain HTTP/1.1 requests over a TcpStream, and `leasehold run` holders.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{hold_script, read_fence, wait_for_file, OrFail, Result};

/// A running `leasehold console`, stopped by SIGTERM when dropped.
pub struct Console {
    child: Child,
    /// `127.0.0.1:PORT`.
    pub addr: String,
}

impl Console {
    /// Starts `leasehold console --url URL --interval 200ms ARGS...` and reads the address it
    /// prints; `env` is added to its environment.
    pub fn start(url: &str, args: &[&str], env: &[(&str, &str)]) -> Result<Console> {
        let mut command = Command::new(env!("CARGO_BIN_EXE_leasehold"));
        command
            .args(["console", "--url", url, "--interval", "200ms"])
            .args(args)
            .env_remove("LEASEHOLD_URL")
            .env_remove("LEASEHOLD_CONSOLE_TOKEN")
            .envs(env.iter().copied())
            .stdout(Stdio::piped());
        let mut child = command.spawn().or_fail("start leasehold console")?;
        let stdout = child.stdout.take().or_fail("the console's stdout")?;
        let (sender, receiver) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = sender.send(line);
        });
        let line = match receiver.recv_timeout(Duration::from_secs(20)) {
            Ok(line) => line,
            Err(_) => {
                let _ = child.kill();
                return Err("the console printed no address within 20 s".into());
            }
        };
        let addr = line
            .trim()
            .strip_prefix("leasehold console: http://")
            .and_then(|rest| rest.strip_suffix('/'))
            .map(str::to_string);
        match addr {
            Some(addr) => Ok(Console { child, addr }),
            None => {
                let _ = child.kill();
                let status = child.wait().ok();
                Err(format!("the console said {line:?} (exit {status:?}), not its address").into())
            }
        }
    }

    pub fn base(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// GET `path` with these extra header lines.
    pub fn get(&self, path: &str, headers: &[(&str, &str)]) -> Result<Answer> {
        http(&self.addr, "GET", path, headers, "")
    }

    /// Stops it with SIGTERM and returns its exit status.
    pub fn stop(mut self) -> Result<Option<i32>> {
        terminate(&self.child);
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().or_fail("look at the console")? {
                return Ok(status.code());
            }
            if started.elapsed() > Duration::from_secs(10) {
                let _ = self.child.kill();
                return Err("the console did not stop within 10 s of SIGTERM".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Console {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn terminate(child: &Child) {
    let pid = i32::try_from(child.id())
        .ok()
        .and_then(rustix::process::Pid::from_raw);
    if let Some(pid) = pid {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
    }
}

/// An HTTP answer.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    /// Header lines, names lowercased.
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// One HTTP/1.1 request on its own connection.
pub fn http(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Result<Answer> {
    let mut stream = TcpStream::connect(addr).or_fail(format!("connect to {addr}"))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .or_fail("a read timeout")?;
    let mut request = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    if !headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("host")) {
        request.push_str(&format!("Host: {addr}\r\n"));
    }
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    if !body.is_empty() || method == "POST" {
        request.push_str(&format!(
            "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream
        .write_all(request.as_bytes())
        .or_fail("send the request")?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).or_fail("read the answer")?;
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = raw.split_once("\r\n\r\n").or_fail("an HTTP answer")?;
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .or_fail(format!("a status line in {head}"))?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect::<Vec<_>>();
    let chunked = headers
        .iter()
        .any(|(n, v)| n == "transfer-encoding" && v.contains("chunked"));
    let body = if chunked {
        unchunk(body)
    } else {
        body.to_string()
    };
    Ok(Answer {
        status,
        headers,
        body,
    })
}

fn unchunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if size == 0 || rest.len() < size {
            break;
        }
        out.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
    out
}

/// Polls `probe` until it answers `Some`, for at most `within`.
pub fn eventually<T>(
    within: Duration,
    what: &str,
    mut probe: impl FnMut() -> Result<Option<T>>,
) -> Result<T> {
    let started = Instant::now();
    loop {
        if let Some(found) = probe()? {
            return Ok(found);
        }
        if started.elapsed() > within {
            return Err(format!("{what}: not within {within:?}").into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A `leasehold run` holding a key until told to finish.
pub struct Holder {
    pub child: Child,
    done: PathBuf,
    fence_file: PathBuf,
    pub fence: u64,
}

impl Holder {
    /// Starts `leasehold run --key KEY --ttl TTL --url URL ARGS -- hold` and waits until its
    /// command runs; `scratch` keeps the fence and done files (named after `name`).
    pub fn start(
        url: &str,
        key: &str,
        ttl: &str,
        args: &[&str],
        scratch: &Path,
        name: &str,
        env: &[(&str, &str)],
    ) -> Result<Holder> {
        let mut holder = Holder::spawn(url, key, ttl, args, scratch, name, env)?;
        holder.ready()?;
        Ok(holder)
    }

    /// Starts it without waiting for its command ([`Holder::ready`] waits; `fence` is 0 until
    /// then).
    pub fn spawn(
        url: &str,
        key: &str,
        ttl: &str,
        args: &[&str],
        scratch: &Path,
        name: &str,
        env: &[(&str, &str)],
    ) -> Result<Holder> {
        let fence_file = scratch.join(format!("{name}.fence"));
        let done = scratch.join(format!("{name}.done"));
        let child = Command::new(env!("CARGO_BIN_EXE_leasehold"))
            .args(["run", "--key", key, "--ttl", ttl, "--url", url])
            .args(args)
            .args(["--", "sh", "-c", &hold_script(&fence_file, &done)])
            .env_remove("LEASEHOLD_URL")
            .envs(env.iter().copied())
            .spawn()
            .or_fail("start a holder")?;
        Ok(Holder {
            child,
            done,
            fence_file,
            fence: 0,
        })
    }

    /// Waits until its command runs, and reads its fence.
    pub fn ready(&mut self) -> Result<u64> {
        wait_for_file(&self.fence_file, &mut self.child)?;
        self.fence = read_fence(&self.fence_file)?;
        Ok(self.fence)
    }

    /// Lets its command finish, and waits for the run to exit.
    pub fn finish(mut self) -> Result<Option<i32>> {
        std::fs::write(&self.done, b"done").or_fail("let the holder finish")?;
        self.exit_within(Duration::from_secs(15))
    }

    /// Its exit status, once it exits within `within`.
    pub fn exit_within(&mut self, within: Duration) -> Result<Option<i32>> {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().or_fail("look at the holder")? {
                return Ok(status.code());
            }
            if started.elapsed() > within {
                return Err(format!("the holder did not exit within {within:?}").into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether it still runs.
    pub fn running(&mut self) -> Result<bool> {
        Ok(self
            .child
            .try_wait()
            .or_fail("look at the holder")?
            .is_none())
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.done, b"done");
        if let Ok(None) = self.child.try_wait() {
            std::thread::sleep(Duration::from_millis(200));
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A fresh SQLite file's URL in `scratch`.
pub fn sqlite_url(scratch: &Path) -> String {
    format!(
        "sqlite://{}?timeout_ms=1000",
        scratch.join("locks.db").display()
    )
}

/// `key` as it appears in a path (`/key/...`), percent-encoded as the console links it.
pub fn encoded(key: &str) -> String {
    key.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// The CSRF token in a confirmation page's form.
pub fn csrf_of(page: &str) -> Result<String> {
    let at = page
        .find("name=\"csrf\"")
        .or_fail("a csrf field in the page")?;
    let rest = &page[at..];
    let value = rest
        .split_once("value=\"")
        .and_then(|(_, v)| v.split_once('"'))
        .map(|(v, _)| v.to_string())
        .or_fail("the csrf field's value")?;
    Ok(value)
}
