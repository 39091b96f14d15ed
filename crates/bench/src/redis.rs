//! Redis: leasehold against, on the same server with the same client library, each on a
//! connection of its own:
//! * the raw **fenced** minimum: one script that does `SET key token NX PX` and `INCR` of the
//!   fence counter (what a fence costs the protocol), + a compare-and-delete script, by
//!   `EVALSHA`;
//! * the raw unfenced minimum: `SET NX PX` + the compare-and-delete script by `EVALSHA`;
//! * the fenced minimum again with the release announced (`PUBLISH` in the compare-and-delete
//!   script), as leasehold's release does so that a waiter holds within a round trip: for
//!   reference, what the announcement costs;
//! * the `rslock` crate with one instance (Redlock's single-server case), which hands out no
//!   fence.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use leasehold::Instrumented;
use leasehold_redis::RedisAuthority;
use redis::aio::MultiplexedConnection;

use crate::{Baseline, BoxError, RawPair, ServerOps, Subject, TTL};

const COMPARE_AND_DELETE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

/// Compare-and-delete, then the announcement waiters listen for.
const COMPARE_DELETE_AND_ANNOUNCE: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
     redis.call('DEL', KEYS[1]) redis.call('PUBLISH', ARGV[2], KEYS[1]) return 1 end return 0";

/// Takes the lock and bumps its fence counter in one step; returns the fence, or 0 when held.
const SET_AND_FENCE: &str = "if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then \
     return redis.call('INCR', KEYS[2]) end return 0";

struct Raw {
    con: MultiplexedConnection,
    fenced: bool,
    /// The release publishes on a channel, as leasehold's does.
    announce: bool,
    take: redis::Script,
    release: redis::Script,
    next: AtomicU64,
}

impl std::fmt::Debug for Raw {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Raw").field("fenced", &self.fenced).finish()
    }
}

#[async_trait]
impl RawPair for Raw {
    fn name(&self) -> &'static str {
        if self.announce {
            "raw fenced, release announced by PUBLISH"
        } else if self.fenced {
            "raw SET NX PX+INCR script + del-if-eq"
        } else {
            "raw SET NX PX + EVALSHA del-if-eq"
        }
    }

    fn baseline(&self) -> Baseline {
        if self.announce {
            return Baseline::Reference;
        }
        Baseline::Raw {
            fenced: self.fenced,
        }
    }

    async fn pair(&self, key: &str) -> Result<(), BoxError> {
        let mut con = self.con.clone();
        // A token as long as leasehold's (32 hex digits), different every time.
        let token = format!("{:032x}", self.next.fetch_add(1, Ordering::Relaxed));
        let ttl_ms = TTL.as_millis() as u64;
        if self.fenced {
            let fence: i64 = self
                .take
                .key(format!("{{{key}}}"))
                .key(format!("{{{key}}}:fence"))
                .arg(&token)
                .arg(ttl_ms)
                .invoke_async(&mut con)
                .await?;
            if fence == 0 {
                return Err("raw key held".into());
            }
        } else {
            let set: Option<String> = redis::cmd("SET")
                .arg(format!("{{{key}}}"))
                .arg(&token)
                .arg("NX")
                .arg("PX")
                .arg(ttl_ms)
                .query_async(&mut con)
                .await?;
            set.ok_or("raw key held")?;
        }
        let mut release = self.release.key(format!("{{{key}}}"));
        release.arg(&token);
        if self.announce {
            release.arg("bench:released");
        }
        let deleted: i64 = release.invoke_async(&mut con).await?;
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

    fn baseline(&self) -> Baseline {
        Baseline::Peer
    }
}

/// `total_commands_processed` from `INFO stats` (the count itself adds one).
struct Commands(MultiplexedConnection);

#[async_trait]
impl ServerOps for Commands {
    fn unit(&self) -> &'static str {
        "commands"
    }

    async fn count(&self) -> Result<u64, BoxError> {
        let info: String = redis::cmd("INFO")
            .arg("stats")
            .query_async(&mut self.0.clone())
            .await?;
        info.lines()
            .find_map(|l| l.strip_prefix("total_commands_processed:"))
            .and_then(|n| n.trim().parse().ok())
            .ok_or_else(|| "no total_commands_processed in INFO".into())
    }
}

pub async fn subject(url: &str) -> Result<Subject, BoxError> {
    let authority = RedisAuthority::connect(url).await?;
    // The raw pairs use the same server, without leasehold's parameters in the URL, each on a
    // connection of its own.
    let base = url.split('?').next().unwrap_or(url);
    let client = redis::Client::open(base)?;
    let mut raw = Vec::new();
    for (fenced, announce) in [(true, false), (false, false), (true, true)] {
        raw.push(Raw {
            con: client.get_multiplexed_async_connection().await?,
            fenced,
            announce,
            take: redis::Script::new(SET_AND_FENCE),
            release: redis::Script::new(if announce {
                COMPARE_DELETE_AND_ANNOUNCE
            } else {
                COMPARE_AND_DELETE
            }),
            next: AtomicU64::new(0),
        });
    }
    let concurrent = Raw {
        con: client.get_multiplexed_async_connection().await?,
        fenced: true,
        announce: false,
        take: redis::Script::new(SET_AND_FENCE),
        release: redis::Script::new(COMPARE_AND_DELETE),
        next: AtomicU64::new(1 << 40),
    };
    let mut raw: Vec<Box<dyn RawPair>> = raw
        .into_iter()
        .map(|r| Box::new(r) as Box<dyn RawPair>)
        .collect();
    raw.push(Box::new(RsLock(rslock::LockManager::new(vec![
        base.to_string()
    ]))));
    Ok(Subject {
        // As `leasehold::connect` would hand it out.
        authority: Arc::new(Instrumented::new(Arc::new(authority))),
        raw,
        concurrent_raw: Some(Arc::new(concurrent)),
        server_ops: Some(Box::new(Commands(
            client.get_multiplexed_async_connection().await?,
        ))),
        targets: true,
        raw_handoff: None,
    })
}
