//! The two sides of every comparison on one backend: leasehold as a user holds it, and the
//! backend's best-known peer recipe, behind one interface so that the same driver (in this
//! process or in a worker process) measures both alike.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold::{Authority, Grant, Instrumented, LockKey};
use sqlx::{Connection, PgConnection};
use tokio::sync::Mutex;

use crate::BoxError;

/// Which side of a comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Side {
    Leasehold,
    Peer,
}

impl Side {
    pub fn as_str(self) -> &'static str {
        match self {
            Side::Leasehold => "leasehold",
            Side::Peer => "peer",
        }
    }

    pub fn parse(s: &str) -> Result<Side, BoxError> {
        match s {
            "leasehold" => Ok(Side::Leasehold),
            "peer" => Ok(Side::Peer),
            other => Err(format!("unknown side {other}").into()),
        }
    }
}

/// The peer recipe on `backend`, as the tables and plots name it.
pub fn peer_name(backend: &str) -> &'static str {
    match backend {
        "redis" => "rslock (no fence)",
        "zookeeper" => "zookeeper-client lock recipe",
        "etcd" => "etcd Lock RPC (no fence)",
        "postgres" => "advisory lock (unfenced, no lease)",
        _ => "peer",
    }
}

/// The name of `side` on `backend`.
pub fn side_name(backend: &str, side: Side) -> &'static str {
    match side {
        Side::Leasehold => "leasehold",
        Side::Peer => peer_name(backend),
    }
}

/// What a holder has: enough to release it, and the fence when the side hands one out.
pub enum Held {
    Grant(Grant),
    Rslock(rslock::Lock),
    /// A node path (ZooKeeper) or key (etcd) to delete, with its sequence as a fence when the
    /// recipe's node name carries one.
    Path(String, Option<u64>),
    EtcdKey(Vec<u8>),
    Advisory(String),
}

impl Held {
    /// The fence this grant carries, when the side hands one out.
    pub fn fence(&self) -> Option<u64> {
        match self {
            Held::Grant(g) => Some(g.fence().value()),
            Held::Path(_, sequence) => *sequence,
            _ => None,
        }
    }
}

/// One side on one backend, on one connection (or session, or client) of its own.
#[async_trait]
pub trait Locker: Send + Sync {
    /// Holds `key`, waiting up to `wait` for another holder to let go.
    async fn acquire(&self, key: &str, wait: Duration) -> Result<Held, BoxError>;
    /// Lets go of what `acquire` returned.
    async fn release(&self, held: Held) -> Result<(), BoxError>;
    /// One uncontended take + free, the cheapest way the side offers (no waiting set up).
    async fn pair(&self, key: &str) -> Result<(), BoxError> {
        let held = self.acquire(key, Duration::from_secs(5)).await?;
        self.release(held).await
    }
}

/// How long each side's hold lasts when its holder stops: the lease TTL (or session timeout),
/// or `None` for the peer's own default.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Setting {
    pub ttl: Option<Duration>,
}

/// The lease a throughput or hand-off holder asks for: long enough never to run out mid-run.
pub const WORK_TTL: Duration = Duration::from_secs(10);

/// Connects `side` on `backend` at `url`.
pub async fn connect(
    backend: &str,
    side: Side,
    url: &str,
    setting: Setting,
) -> Result<Arc<dyn Locker>, BoxError> {
    let ttl = setting.ttl.unwrap_or(WORK_TTL);
    // The peers connect without leasehold's URL parameters.
    let base = url.split('?').next().unwrap_or(url);
    Ok(match (backend, side) {
        (_, Side::Leasehold) => Arc::new(Leasehold {
            authority: leasehold_authority(backend, url).await?,
            ttl,
        }),
        ("redis", Side::Peer) => Arc::new(Rslock {
            manager: rslock::LockManager::new(vec![base.to_string()]),
            // rslock has no default TTL: the caller always passes one.
            ttl,
        }),
        ("zookeeper", Side::Peer) => {
            let config = leasehold_zookeeper::ZkConfig::from_url(url)?;
            let mut connector = zookeeper_client::Client::connector();
            // Without a timeout, zookeeper-client asks for its default (6 s).
            if let Some(ttl) = setting.ttl {
                connector = connector.with_session_timeout(ttl);
            }
            let client = connector.connect(config.hosts()).await?;
            Arc::new(ZkRecipe { client })
        }
        ("etcd", Side::Peer) => {
            let config = leasehold_etcd::EtcdConfig::from_url(url)?;
            let client = etcd_client::Client::connect(config.endpoints(), None).await?;
            // etcd's Lock RPC holds a key under a lease the caller keeps alive; without a
            // setting, etcdctl lock's default TTL (10 s).
            let lease_ttl = setting.ttl.unwrap_or(Duration::from_secs(10));
            let secs = i64::try_from(lease_ttl.as_secs().max(1)).unwrap_or(i64::MAX);
            let lease = client.lease_client().grant(secs, None).await?.id();
            let (mut keeper, mut stream) = client.lease_client().keep_alive(lease).await?;
            let period = lease_ttl / 3;
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(period).await;
                    if keeper.keep_alive().await.is_err() {
                        return;
                    }
                    if !matches!(stream.message().await, Ok(Some(_))) {
                        return;
                    }
                }
            });
            Arc::new(EtcdLock { client, lease })
        }
        ("postgres", Side::Peer) => {
            let mut conn = PgConnection::connect(base).await?;
            sqlx::query("SET lock_timeout = '30s'")
                .execute(&mut conn)
                .await?;
            Arc::new(Advisory(Mutex::new(conn)))
        }
        (other, Side::Peer) => return Err(format!("no peer recipe for {other}").into()),
    })
}

/// leasehold's authority for `backend`, as `leasehold::connect` hands it out (instrumented).
async fn leasehold_authority(backend: &str, url: &str) -> Result<Arc<dyn Authority>, BoxError> {
    Ok(match backend {
        "redis" => Arc::new(Instrumented::new(Arc::new(
            leasehold_redis::RedisAuthority::connect(url).await?,
        ))),
        "etcd" => Arc::new(Instrumented::new(Arc::new(
            leasehold_etcd::EtcdAuthority::connect(url).await?,
        ))),
        "zookeeper" => Arc::new(Instrumented::new(Arc::new(
            leasehold_zookeeper::ZkAuthority::connect(url).await?,
        ))),
        _ => leasehold::connect(url).await?,
    })
}

struct Leasehold {
    authority: Arc<dyn Authority>,
    ttl: Duration,
}

#[async_trait]
impl Locker for Leasehold {
    async fn acquire(&self, key: &str, wait: Duration) -> Result<Held, BoxError> {
        let key = LockKey::new(key)?;
        Ok(Held::Grant(
            self.authority.acquire(&key, self.ttl, wait).await?,
        ))
    }

    async fn release(&self, held: Held) -> Result<(), BoxError> {
        match held {
            Held::Grant(grant) => match self.authority.release(&grant).await? {
                leasehold::Released::Released => Ok(()),
                // The lease ran out while held: the hold was not exclusive to its end.
                _ => Err("leasehold's release found the lease already gone".into()),
            },
            _ => Err("leasehold released another side's hold".into()),
        }
    }

    async fn pair(&self, key: &str) -> Result<(), BoxError> {
        let key = LockKey::new(key)?;
        let grant = self
            .authority
            .try_acquire(&key, self.ttl)
            .await?
            .ok_or("the pair's key is held")?;
        let _ = self.authority.release(&grant).await?;
        Ok(())
    }
}

/// rslock with one instance (Redlock's single-server case) and its default retries.
struct Rslock {
    manager: rslock::LockManager,
    ttl: Duration,
}

#[async_trait]
impl Locker for Rslock {
    async fn acquire(&self, key: &str, wait: Duration) -> Result<Held, BoxError> {
        // rslock's own waiting: it retries after a random delay of up to 200 ms.
        let lock = tokio::time::timeout(wait, self.manager.acquire_no_guard(key, self.ttl))
            .await
            .map_err(|_| "rslock: waited too long")?
            .map_err(|e| format!("rslock: {e:?}"))?;
        Ok(Held::Rslock(lock))
    }

    async fn release(&self, held: Held) -> Result<(), BoxError> {
        match held {
            Held::Rslock(lock) => {
                self.manager.unlock(&lock).await;
                Ok(())
            }
            _ => Err("rslock released another side's hold".into()),
        }
    }

    async fn pair(&self, key: &str) -> Result<(), BoxError> {
        let lock = self
            .manager
            .lock(key, self.ttl)
            .await
            .map_err(|e| format!("rslock: {e:?}"))?;
        self.manager.unlock(&lock).await;
        Ok(())
    }
}

/// zookeeper-client's Curator-compatible lock recipe, one parent node per key (made by the
/// recipe when missing), released by deleting its node.
struct ZkRecipe {
    client: zookeeper_client::Client,
}

#[async_trait]
impl Locker for ZkRecipe {
    async fn acquire(&self, key: &str, wait: Duration) -> Result<Held, BoxError> {
        use zookeeper_client::{Acls, CreateMode, LockOptions, LockPrefix};
        let dir = format!("/leasehold-compare/{key}");
        let prefix = LockPrefix::new_curator(&dir, "lock-")?;
        let options = LockOptions::new(Acls::anyone_all())
            .with_ancestor_options(CreateMode::Persistent.with_acls(Acls::anyone_all()))?;
        let lock = tokio::time::timeout(wait, self.client.lock(prefix, b"", options))
            .await
            .map_err(|_| "zookeeper recipe: waited too long")??;
        let path = lock.lock_path().to_string();
        // Dropping the guard would delete the node in the background; `release` deletes it.
        std::mem::forget(lock);
        let sequence = path
            .rsplit(|c: char| !c.is_ascii_digit())
            .next()
            .and_then(|digits| digits.parse().ok());
        Ok(Held::Path(path, sequence))
    }

    async fn release(&self, held: Held) -> Result<(), BoxError> {
        match held {
            Held::Path(path, _) => Ok(self.client.delete(&path, None).await?),
            _ => Err("the zookeeper recipe released another side's hold".into()),
        }
    }
}

/// etcd's server-side Lock/Unlock RPC (v3lock) under a lease this process keeps alive.
struct EtcdLock {
    client: etcd_client::Client,
    lease: i64,
}

#[async_trait]
impl Locker for EtcdLock {
    async fn acquire(&self, key: &str, wait: Duration) -> Result<Held, BoxError> {
        let mut lock = self.client.lock_client();
        let options = etcd_client::LockOptions::new().with_lease(self.lease);
        let held = tokio::time::timeout(wait, lock.lock(format!("compare/{key}"), Some(options)))
            .await
            .map_err(|_| "etcd Lock RPC: waited too long")??;
        Ok(Held::EtcdKey(held.key().to_vec()))
    }

    async fn release(&self, held: Held) -> Result<(), BoxError> {
        match held {
            Held::EtcdKey(key) => {
                self.client.lock_client().unlock(key).await?;
                Ok(())
            }
            _ => Err("etcd's Lock RPC released another side's hold".into()),
        }
    }
}

/// PostgreSQL session advisory locks on a connection of their own: no fence, no lease (the
/// lock lasts as long as the connection).
struct Advisory(Mutex<PgConnection>);

#[async_trait]
impl Locker for Advisory {
    async fn acquire(&self, key: &str, wait: Duration) -> Result<Held, BoxError> {
        // The wait is bounded on the server (`lock_timeout`, set on connecting), so that a
        // timeout leaves the connection usable.
        let _ = wait;
        let mut conn = self.0.lock().await;
        sqlx::query("SELECT pg_advisory_lock(hashtext($1))")
            .bind(key)
            .execute(&mut *conn)
            .await?;
        Ok(Held::Advisory(key.to_string()))
    }

    async fn release(&self, held: Held) -> Result<(), BoxError> {
        match held {
            Held::Advisory(key) => {
                let mut conn = self.0.lock().await;
                let freed: bool = sqlx::query_scalar("SELECT pg_advisory_unlock(hashtext($1))")
                    .bind(&key)
                    .fetch_one(&mut *conn)
                    .await?;
                if freed {
                    Ok(())
                } else {
                    Err("advisory unlock found the lock not held".into())
                }
            }
            _ => Err("the advisory lock released another side's hold".into()),
        }
    }

    async fn pair(&self, key: &str) -> Result<(), BoxError> {
        let mut conn = self.0.lock().await;
        let got: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock(hashtext($1))")
            .bind(key)
            .fetch_one(&mut *conn)
            .await?;
        if !got {
            return Err("the pair's key is held".into());
        }
        sqlx::query_scalar::<_, bool>("SELECT pg_advisory_unlock(hashtext($1))")
            .bind(key)
            .fetch_one(&mut *conn)
            .await?;
        Ok(())
    }
}
