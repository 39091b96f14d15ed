//! The authority under test as the runner starts it, and the server faults it can suffer.
//!
//! Each deployment *form* lives in a file of its own and answers the same questions (its URL,
//! its faults, how to inject and heal each): etcd and ZooKeeper as 3-member clusters or single
//! servers ([`consensus`]), PostgreSQL alone ([`one_server`]), with an asynchronous standby that a
//! failover promotes ([`postgres_standby`]) or behind PgBouncer in transaction mode
//! ([`pgbouncer`]), Redis as a primary and a replica behind a forwarder that a failover
//! switches ([`redis_pair`]), under Sentinel ([`sentinel`]) or as a Cluster
//! ([`redis_cluster`]), SQLite, one file that every worker process opens ([`sqlite`]), MariaDB
//! alone ([`one_server`] too), and an object store, Azurite ([`object_store`]).
//! Every server is a plain process from Debian's packages (`leasehold-servers`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use leasehold_conformance::workload::FaultKind;
use leasehold_servers::{MariaDbServer, PostgresServer};
use rand::rngs::StdRng;
use rand::Rng;

mod consensus;
pub mod object_store;
mod one_server;
mod pgbouncer;
mod postgres_standby;
mod redis_cluster;
mod redis_pair;
mod sentinel;
pub mod sqlite;

/// The backends (and deployment forms of them) the workload runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// etcd.
    Etcd,
    /// ZooKeeper.
    Zookeeper,
    /// PostgreSQL.
    Postgres,
    /// Redis, a primary and a replica promoted by hand.
    Redis,
    /// PostgreSQL through PgBouncer in transaction pooling mode.
    PostgresPgbouncer,
    /// PostgreSQL with an asynchronous streaming standby, promoted by a failover.
    PostgresStandby,
    /// Redis under Sentinel: a primary, a replica and three sentinels.
    RedisSentinel,
    /// Redis Cluster: three primaries with a replica each.
    RedisCluster,
    /// SQLite: one file in the run's directory, opened by every worker process.
    Sqlite,
    /// MySQL/MariaDB: one MariaDB server.
    MySql,
    /// An object store: Azurite (Azure Blob), the leases objects in one container.
    ObjectStore,
}

impl Backend {
    /// Every backend, in the report's order.
    pub const ALL: [Backend; 11] = [
        Backend::Etcd,
        Backend::Zookeeper,
        Backend::Postgres,
        Backend::PostgresStandby,
        Backend::PostgresPgbouncer,
        Backend::MySql,
        Backend::Redis,
        Backend::RedisSentinel,
        Backend::RedisCluster,
        Backend::Sqlite,
        Backend::ObjectStore,
    ];

    /// The name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Etcd => "etcd",
            Backend::Zookeeper => "zookeeper",
            Backend::Postgres => "postgres",
            Backend::Redis => "redis",
            Backend::PostgresPgbouncer => "postgres-pgbouncer",
            Backend::PostgresStandby => "postgres-standby",
            Backend::RedisSentinel => "redis-sentinel",
            Backend::RedisCluster => "redis-cluster",
            Backend::Sqlite => "sqlite",
            Backend::MySql => "mysql",
            Backend::ObjectStore => "object-store",
        }
    }

    /// The backend named `name`.
    pub fn parse(name: &str) -> Option<Backend> {
        Backend::ALL
            .into_iter()
            .find(|b| b.name() == name || (name == "zk" && *b == Backend::Zookeeper))
    }

    /// How many servers by default: clusters where the backend has them.
    pub fn default_nodes(self) -> usize {
        match self {
            Backend::Etcd | Backend::Zookeeper => 3,
            _ => 1,
        }
    }
}

/// Errors starting or faulting servers.
pub type DeploymentError = Box<dyn std::error::Error + Send + Sync>;

/// One deployment form: its servers, and the faults it can suffer.
trait Form: Send + Sync {
    /// The URL workers connect with.
    fn url(&self) -> String;
    /// The server faults this form can suffer.
    fn faults(&self) -> Vec<FaultKind>;
    /// How many members a fault may pick from.
    fn members(&self) -> usize {
        1
    }
    /// Starts a fault of `kind`; `pick` is a member drawn by the nemesis. Blocking.
    fn inject(&self, kind: FaultKind, pick: usize) -> Result<Injected, DeploymentError>;
    /// Heals what [`Form::inject`] did and waits until the servers serve again. Blocking.
    fn heal(&self, heal: Heal) -> Result<(), DeploymentError>;
    /// The file whose write lock a worker holds inside a write transaction (SQLite's
    /// `-shm`), for faults timed to land inside one.
    fn write_lock_file(&self) -> Option<PathBuf> {
        None
    }
    /// The member that leads the cluster (0 where there is one server). Blocking.
    fn leader(&self) -> Result<usize, DeploymentError> {
        Ok(0)
    }
    /// The data servers answering as primary right now, where the form can have more than one
    /// without the nemesis making it so (Sentinel fails over on its own); `None` where there
    /// is one writer by construction. A server that does not answer is left out. Blocking.
    fn primaries(&self) -> Option<Vec<String>> {
        None
    }
    /// Kills or pauses member `i` at once, without asking who leads. Blocking.
    fn strike(&self, i: usize, pause: bool) -> Result<Injected, DeploymentError> {
        let _ = (i, pause);
        Err("only cluster members are struck at a hand-off".into())
    }
}

/// A started authority.
pub struct Deployment {
    backend: Backend,
    form: Box<dyn Form>,
}

impl std::fmt::Debug for Deployment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deployment")
            .field("backend", &self.backend)
            .finish_non_exhaustive()
    }
}

/// A fault in place, and what heals it.
#[derive(Debug)]
pub struct Injected {
    /// The member or server hit, as the history names it.
    pub node: Option<String>,
    heal: Heal,
}

/// What heals an injected fault; each form reads the variants it produces.
#[derive(Clone, Copy, Debug)]
enum Heal {
    /// Restart the member at this index.
    Restart(usize),
    /// `SIGCONT` the member at this index.
    Resume(usize),
    /// Remove the partition's rules.
    Rejoin,
    /// The replica at this index was promoted; the other becomes its replica.
    Demote(usize),
    /// Start the pooler again.
    RestartPooler,
    /// The server at this index was killed under Sentinel: wait for the sentinels' failover,
    /// then bring it back as the new primary's replica.
    AfterFailover(usize),
    /// The sentinels were re-provisioned: wait until they agree again.
    Reprovisioned,
    /// The cluster node `killed` was killed: wait until `replica` took its slots over, then
    /// bring it back.
    Rejoined { killed: usize, replica: usize },
    /// This slot was moved to the primary at this index: it stays there; wait until every
    /// node agrees.
    SlotMoved { slot: u16, to: usize },
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, DeploymentError> + Send + 'static,
) -> Result<T, DeploymentError> {
    tokio::task::spawn_blocking(f).await?
}

fn boxed(e: leasehold_servers::HarnessError) -> DeploymentError {
    Box::new(e)
}

/// Polls `ready` every 50 ms for up to `within`; the error names `what` and the last answer.
fn wait_until(
    what: &str,
    within: std::time::Duration,
    mut ready: impl FnMut() -> Result<bool, DeploymentError>,
) -> Result<(), DeploymentError> {
    let give_up = std::time::Instant::now() + within;
    loop {
        let last = match ready() {
            Ok(true) => return Ok(()),
            Ok(false) => "not yet".to_string(),
            Err(e) => e.to_string(),
        };
        if std::time::Instant::now() > give_up {
            return Err(format!("{what}: not within {within:?} (last: {last})").into());
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

impl Deployment {
    /// Starts `backend` with `nodes` servers (clusters for etcd and ZooKeeper); a form that
    /// keeps its state in a file (SQLite) keeps it in `dir`, the run's directory.
    pub async fn start(
        backend: Backend,
        nodes: usize,
        dir: &Path,
    ) -> Result<Arc<Deployment>, DeploymentError> {
        let form: Box<dyn Form> = match backend {
            Backend::Etcd => Box::new(consensus::Consensus::start_etcd(nodes).await?),
            Backend::Zookeeper => Box::new(consensus::Consensus::start_zookeeper(nodes).await?),
            Backend::Postgres => Box::new(one_server::OneServer::<PostgresServer>::start().await?),
            Backend::Redis => Box::new(redis_pair::RedisPair::start().await?),
            Backend::PostgresPgbouncer => Box::new(pgbouncer::BehindPooler::start().await?),
            Backend::PostgresStandby => Box::new(postgres_standby::PostgresStandby::start().await?),
            Backend::RedisSentinel => Box::new(sentinel::Sentinel::start().await?),
            Backend::RedisCluster => Box::new(redis_cluster::Cluster::start().await?),
            Backend::Sqlite => Box::new(sqlite::SqliteFile::create(dir)?),
            Backend::MySql => Box::new(one_server::OneServer::<MariaDbServer>::start().await?),
            Backend::ObjectStore => Box::new(object_store::ObjectStoreForm::start().await?),
        };
        Ok(Arc::new(Deployment { backend, form }))
    }

    /// The backend.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The URL workers connect with: every member of a cluster, a 1 s request timeout.
    pub fn url(&self) -> String {
        self.form.url()
    }

    /// The server faults this deployment can suffer.
    pub fn faults(&self) -> Vec<FaultKind> {
        self.form.faults()
    }

    /// The file a worker holds a write lock on while inside a write transaction, where the
    /// backend has one (SQLite's `-shm`, see [`sqlite::catch_writer`]).
    pub fn write_lock_file(&self) -> Option<PathBuf> {
        self.form.write_lock_file()
    }

    /// Starts a fault of `kind` (blocking calls run off the runtime).
    pub async fn inject(
        self: &Arc<Self>,
        kind: FaultKind,
        rng: &mut StdRng,
    ) -> Result<Injected, DeploymentError> {
        let me = self.clone();
        let pick = rng.random_range(0..self.form.members().max(1));
        blocking(move || me.form.inject(kind, pick)).await
    }

    /// The cluster's leader (0 for a single server), asked off the runtime.
    pub async fn leader_member(self: &Arc<Self>) -> Result<usize, DeploymentError> {
        let me = self.clone();
        blocking(move || me.form.leader()).await
    }

    /// Kills or pauses member `i` at once, without asking who leads: for a fault that must land
    /// within milliseconds of a moment, where that question takes a round trip per member.
    pub async fn strike(
        self: &Arc<Self>,
        i: usize,
        pause: bool,
    ) -> Result<Injected, DeploymentError> {
        let me = self.clone();
        blocking(move || me.form.strike(i, pause)).await
    }

    /// The data servers answering as primary right now (see [`crate::primary_watch`]), asked
    /// off the runtime; `None` where the form has one writer by construction.
    pub async fn primaries(self: &Arc<Self>) -> Option<Vec<String>> {
        let me = self.clone();
        tokio::task::spawn_blocking(move || me.form.primaries())
            .await
            .ok()
            .flatten()
    }

    /// Heals a fault and waits until the servers it hit serve again.
    pub async fn heal(self: &Arc<Self>, injected: &Injected) -> Result<(), DeploymentError> {
        let me = self.clone();
        let heal = injected.heal;
        blocking(move || me.form.heal(heal)).await
    }
}

/// The error for a fault `kind` that `form` cannot suffer.
fn not_a_fault_of(kind: FaultKind, form: &str) -> DeploymentError {
    format!("{kind:?} is not a fault of {form}").into()
}
