//! # leasehold-servers
//!
//! A harness that runs real etcd, ZooKeeper, Redis, PostgreSQL and MariaDB servers for tests,
//! from Debian's packages (`etcd-server etcd-client zookeeper redis-server postgresql pgbouncer
//! mariadb-server`), as plain processes on free loopback ports with their data in temp dirs, and
//! faults them.
//!
//! * Start: [`EtcdServer::start`], [`EtcdCluster::start`], [`ZkServer::start`],
//!   [`ZkEnsemble::start`], [`RedisServer::start`], [`RedisServer::start_replica_of`],
//!   [`SentinelDeployment::start`] (a primary, a replica and three sentinels),
//!   [`PostgresServer::start`] (and `start_with_password` variants), [`PgBouncer`] in
//!   transaction pooling mode in front of one, [`MariaDbServer::start`] and
//!   [`MariaDbServer::start_replica_of`] (an asynchronous GTID replica that
//!   [`MariaDbServer::promote`] turns into a primary), and object stores from the package
//!   registries (see [`object_stores`]): [`MotoServer`] (S3), [`AzuriteServer`] (Azure Blob),
//!   [`FakeGcsServer`] (GCS). Each returns once the
//!   server really serves (bounded by [`READY_TIMEOUT`]), or an error with the tail of the
//!   server's log. A server that cannot start is an error, never a skip.
//! * Fault: every server has `kill` (SIGKILL), `pause` (SIGSTOP), `resume` (SIGCONT), `stop`
//!   (polite, then SIGKILL) and `restart` (same command line, data dir and ports; waits until it
//!   serves). Clusters tell their `leader()`.
//! * Isolate: [`EtcdCluster::start_isolatable`] and [`ZkEnsemble::start_isolatable`] start each
//!   member on a loopback address and uid of its own; [`Partition::isolate`] then cuts one member
//!   off from the others with nftables while its clients still reach it (a follower that serves
//!   stale state or none), and heals on [`Partition::heal`] or drop. Needs root and `nft`; see
//!   [`partition`]. [`Cut`] silently drops what one uid's processes send to some ports (a
//!   client whose packets vanish, no reset).
//! * Clean up: dropping a server kills it and deletes its temp dir (printing its log tail if the
//!   thread is panicking). Children get `PR_SET_PDEATHSIG`, so none outlives the test process,
//!   also not a server held in a `static` for all tests of a binary:
//!
//! ```ignore
//! static ETCD: OnceLock<EtcdServer> = OnceLock::new();
//! let etcd = ETCD.get_or_init(|| EtcdServer::start().expect("etcd"));
//! ```
//!
//! The API is blocking (callers are tests). From an async test, a start or restart blocks one
//! runtime worker for its duration; use a multi-threaded runtime or `spawn_blocking` when a
//! client must make progress meanwhile.
//!
//! [`TestCerts`] makes a throwaway CA with server and client certificates at test time (with
//! rcgen, no `openssl` program and no key checked in), for TLS tests.
//!
//! [`external`] reads endpoints of servers started by someone else (e.g. docker compose).
//!
//! leasehold's conformance suite, every backend's tests, the bench and the fault workload use
//! it; an application can use it the same way to test its own locking against real servers.
#![deny(missing_docs)]

pub mod cut;
pub mod error;
pub mod etcd;
pub mod external;
pub mod mariadb;
pub mod object_stores;
pub mod partition;
pub mod pgbouncer;
pub mod ports;
pub mod postgres;
pub mod process;
pub mod redis;
pub mod redis_cluster;
pub mod tls;
pub mod zookeeper;

pub use cut::Cut;
pub use error::{HarnessError, Result};
pub use etcd::{etcdctl_command, etcdctl_path, EtcdCluster, EtcdServer};
pub use mariadb::MariaDbServer;
pub use object_stores::{AzuriteServer, FakeGcsServer, MotoServer};
pub use partition::{Isolatable, MemberIdentity, Partition};
pub use pgbouncer::PgBouncer;
pub use ports::{free_port, free_ports};
pub use postgres::PostgresServer;
pub use process::{CommandSpec, ManagedProcess, READY_TIMEOUT, STOP_GRACE};
pub use redis::{RedisSentinel, RedisServer, SentinelDeployment, SentinelOptions};
pub use redis_cluster::{ClusterNode, RedisCluster};
pub use tls::TestCerts;
pub use zookeeper::{ZkConfig, ZkEnsemble, ZkServer, ZK_CONTAINER_CHECK_INTERVAL};
