//! Redis: leasehold against the plain convention done with the same client library on the same
//! server: `SET key token NX PX` + a compare-and-delete script, sent as `EVAL` (the text every
//! time, as most hand-written locks do) and as `EVALSHA`.
//! And against the `rslock` crate with one instance (Redlock's single-server case), which hands
//! out no fence: leasehold must be no slower.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use leasehold::Instrumented;
use leasehold_redis::RedisAuthority;
use redis::aio::MultiplexedConnection;

use crate::{BoxError, RawPair, Subject, TTL};

const COMPARE_AND_DELETE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

#[derive(Debug, Clone, Copy)]
enum Release {
    Eval,
    EvalSha,
}

struct Raw {
    con: MultiplexedConnection,
    release: Release,
    script: redis::Script,
    next: AtomicU64,
}

impl std::fmt::Debug for Raw {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Raw")
            .field("release", &self.release)
            .finish()
    }
}

#[async_trait]
impl RawPair for Raw {
    fn name(&self) -> &'static str {
        match self.release {
            Release::Eval => "raw SET NX PX + EVAL del-if-equal",
            Release::EvalSha => "raw SET NX PX + EVALSHA del-if-eq",
        }
    }

    async fn pair(&self, key: &str) -> Result<(), BoxError> {
        let mut con = self.con.clone();
        // A token as long as leasehold's (32 hex digits), different every time.
        let token = format!("{:032x}", self.next.fetch_add(1, Ordering::Relaxed));
        let set: Option<String> = redis::cmd("SET")
            .arg(key)
            .arg(&token)
            .arg("NX")
            .arg("PX")
            .arg(TTL.as_millis() as u64)
            .query_async(&mut con)
            .await?;
        set.ok_or("raw key held")?;
        let deleted: i64 = match self.release {
            Release::Eval => {
                redis::cmd("EVAL")
                    .arg(COMPARE_AND_DELETE)
                    .arg(1)
                    .arg(key)
                    .arg(&token)
                    .query_async(&mut con)
                    .await?
            }
            Release::EvalSha => {
                self.script
                    .key(key)
                    .arg(&token)
                    .invoke_async(&mut con)
                    .await?
            }
        };
        if deleted != 1 {
            return Err("raw release found another token".into());
        }
        Ok(())
    }
}

/// `rslock`'s `LockManager` on the same server: `lock` + `unlock`, no fence.
struct RsLock(rslock::LockManager);

impl std::fmt::Debug for RsLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RsLock")
    }
}

#[async_trait]
impl RawPair for RsLock {
    fn name(&self) -> &'static str {
        "rslock lock + unlock (no fence)"
    }

    async fn pair(&self, key: &str) -> Result<(), BoxError> {
        let lock = self
            .0
            .lock(key.as_bytes(), TTL)
            .await
            .map_err(|e| format!("rslock: {e:?}"))?;
        self.0.unlock(&lock).await;
        Ok(())
    }

    fn target(&self) -> f64 {
        1.0
    }
}

pub async fn subject(url: &str) -> Result<Subject, BoxError> {
    let authority = RedisAuthority::connect(url).await?;
    // The raw pairs use the same server, without leasehold's parameters in the URL.
    let base = url.split('?').next().unwrap_or(url);
    let con = redis::Client::open(base)?
        .get_multiplexed_async_connection()
        .await?;
    let raw = |release| {
        Box::new(Raw {
            con: con.clone(),
            release,
            script: redis::Script::new(COMPARE_AND_DELETE),
            next: AtomicU64::new(0),
        }) as Box<dyn RawPair>
    };
    Ok(Subject {
        // As `leasehold::connect` would hand it out.
        authority: Arc::new(Instrumented::new(Arc::new(authority))),
        raw: vec![
            raw(Release::Eval),
            raw(Release::EvalSha),
            Box::new(RsLock(rslock::LockManager::new(vec![base.to_string()]))),
        ],
        targets: true,
    })
}
