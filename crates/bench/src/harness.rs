//! Without `--url`, the bench starts the server itself with the test harness (same packages,
//! loopback, temp dir), so one command measures a backend on a fresh machine.

use std::any::Any;

use leasehold_servers::{EtcdServer, PostgresServer, RedisServer, ZkServer};

use crate::BoxError;

/// Starts `backend`'s server; returns a guard that stops it when dropped, and its URL.
pub fn start(backend: &str) -> Result<(Box<dyn Any>, String), BoxError> {
    Ok(match backend {
        "postgres" => {
            let s = PostgresServer::start()?;
            let url = s.url();
            (Box::new(s), url)
        }
        "redis" => {
            let s = RedisServer::start()?;
            let url = s.url();
            (Box::new(s), url)
        }
        "etcd" => {
            let s = EtcdServer::start()?;
            let url = format!("etcd://{}", s.endpoint());
            (Box::new(s), url)
        }
        "zookeeper" => {
            let s = ZkServer::start()?;
            let url = format!("zk://{}", s.connect_string());
            (Box::new(s), url)
        }
        other => return Err(format!("no harness server for {other}").into()),
    })
}
