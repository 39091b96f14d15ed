//! Without `--url`, the bench starts the server itself with the test harness (same packages,
//! loopback, temp dir), so one command measures a backend on a fresh machine.

use std::any::Any;

use leasehold_servers::{
    AzuriteServer, EtcdServer, MariaDbServer, PostgresServer, RedisServer, ZkServer,
};

use crate::BoxError;

/// A server the bench started: a guard that stops it when dropped, its URL, and its pid (whose
/// process tree's CPU time the bench reads); for an object store, its endpoint too.
pub struct Started {
    pub guard: Box<dyn Any>,
    pub url: String,
    pub pid: Option<u32>,
    pub endpoint: Option<String>,
}

/// Starts `backend`'s server.
pub fn start(backend: &str) -> Result<Started, BoxError> {
    let (guard, url, pid): (Box<dyn Any>, String, Option<u32>) = match backend {
        "postgres" => {
            let s = PostgresServer::start()?;
            let (url, pid) = (s.url(), s.pid());
            (Box::new(s), url, pid)
        }
        "redis" => {
            let s = RedisServer::start()?;
            let (url, pid) = (s.url(), s.pid());
            (Box::new(s), url, pid)
        }
        "etcd" => {
            let s = EtcdServer::start()?;
            let (url, pid) = (format!("etcd://{}", s.endpoint()), s.pid());
            (Box::new(s), url, pid)
        }
        "zookeeper" => {
            let s = ZkServer::start()?;
            let (url, pid) = (format!("zk://{}", s.connect_string()), s.pid());
            (Box::new(s), url, pid)
        }
        "mysql" => {
            let s = MariaDbServer::start()?;
            let (url, pid) = (s.url(), s.pid());
            (Box::new(s), url, pid)
        }
        "object-store" => {
            use leasehold_servers::object_stores::{AZURITE_ACCOUNT, BUCKET};
            let s = AzuriteServer::start()?;
            let endpoint = s.url();
            let encoded: String =
                url::form_urlencoded::byte_serialize(endpoint.as_bytes()).collect();
            let url = format!(
                "az://{BUCKET}/bench?account_name={AZURITE_ACCOUNT}&endpoint={encoded}\
                 &allow_http=true"
            );
            let pid = s.pid();
            return Ok(Started {
                guard: Box::new(s),
                url,
                pid,
                endpoint: Some(endpoint),
            });
        }
        other => return Err(format!("no harness server for {other}").into()),
    };
    Ok(Started {
        guard,
        url,
        pid,
        endpoint: None,
    })
}
