//! What the Redis test binaries share: starting servers, clients plain and leasehold's, the
//! bridge to the blocking harness, the server's command counters and release-channel
//! subscribers, a collector of warnings, replication helpers for any Redis process the harness
//! runs (a plain server, a Sentinel deployment's, a cluster node), and timed hand-offs to a
//! parked waiter.

// Each test binary uses part of this module.
#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_conformance::harness_call;
use leasehold_conformance::kit::{self, OrFail, TestResult, UrlConnector};
use leasehold_conformance::Failure;
use leasehold_core::{Authority, Grant, Instant, LockKey, Released};
use leasehold_redis::RedisAuthority;
use leasehold_servers::{ClusterNode, HarnessError, RedisServer};
use redis::aio::MultiplexedConnection;

/// A Redis process the harness sends commands to.
pub trait Node {
    fn command(&self, args: &[&str]) -> Result<String, HarnessError>;
}

impl Node for RedisServer {
    fn command(&self, args: &[&str]) -> Result<String, HarnessError> {
        RedisServer::command(self, args)
    }
}

impl Node for ClusterNode {
    fn command(&self, args: &[&str]) -> Result<String, HarnessError> {
        ClusterNode::command(self, args)
    }
}

/// Runs a blocking harness call off the runtime's threads; a panic in it goes on in the caller.
pub async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    match tokio::task::spawn_blocking(f).await {
        Ok(value) => value,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}

/// Requests give up after one second, so an unresponsive server is noticed within a TTL.
pub fn url(server: &RedisServer) -> String {
    format!("{}?timeout_ms=1000", server.url())
}

/// A plain server of the test's own.
pub async fn start() -> TestResult<Arc<RedisServer>> {
    kit::start("Redis", RedisServer::start).await
}

/// A primary and its replica, in sync.
pub async fn start_pair() -> TestResult<(Arc<RedisServer>, Arc<RedisServer>)> {
    let primary = start().await?;
    let p = primary.clone();
    let replica = kit::start("the Redis replica", move || {
        RedisServer::start_replica_of(&p)
    })
    .await?;
    Ok((primary, replica))
}

/// Clients of the authority at `url`, for the suite.
pub fn clients(url: &str) -> UrlConnector {
    UrlConnector::new(
        url,
        |url| async move { RedisAuthority::connect(&url).await },
    )
}

/// A plain client of the same library, for what an operator or another application does.
pub async fn raw(server: &RedisServer) -> TestResult<MultiplexedConnection> {
    redis::Client::open(server.url())
        .or_fail("a plain client")?
        .get_multiplexed_async_connection()
        .await
        .or_fail("a plain connection")
}

/// A command through the harness, off the runtime's threads.
pub async fn command(server: &Arc<RedisServer>, args: &[&str]) -> TestResult<String> {
    let what = args.join(" ");
    let (server, args) = (
        server.clone(),
        args.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
    );
    harness_call(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        server.command(&args)
    })
    .await
    .or_fail(&what)
}

/// `field:value` from an `INFO` reply.
pub fn info_field(info: &str, field: &str) -> Option<String> {
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .map(|v| v.trim().to_string())
}

/// `(calls, failed_calls)` of a command from `INFO commandstats`.
pub async fn calls(server: &Arc<RedisServer>, command_name: &str) -> TestResult<(u64, u64)> {
    let info = command(server, &["INFO", "commandstats"]).await?;
    let Some(stats) = info_field(&info, &format!("cmdstat_{command_name}")) else {
        return Ok((0, 0));
    };
    let get = |name: &str| {
        stats
            .split(',')
            .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    Ok((get("calls"), get("failed_calls")))
}

/// How many authorities' subscriptions are up: each subscribes to its own channel,
/// `leasehold:released:<its waiter id>` (`PUBSUB CHANNELS`), whether or not it also reads the
/// release channel.
pub async fn subscribers(con: &mut MultiplexedConnection) -> TestResult<Option<redis::Value>> {
    let own: Vec<String> = redis::cmd("PUBSUB")
        .arg("CHANNELS")
        .arg("leasehold:released:*")
        .query_async(con)
        .await
        .or_fail("PUBSUB CHANNELS")?;
    Ok(Some(redis::Value::Int(own.len() as i64)))
}

/// How many subscribers the release channel itself has (`PUBSUB NUMSUB`): the authorities with
/// observers (`wait_for_change`).
pub async fn release_channel_readers(con: &mut MultiplexedConnection) -> TestResult<i64> {
    let numsub: (String, i64) = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg("leasehold:released")
        .query_async(con)
        .await
        .or_fail("PUBSUB NUMSUB")?;
    Ok(numsub.1)
}

/// Waits until `count` authorities' subscriptions are up ([`subscribers`]).
pub async fn wait_subscribed(con: &mut MultiplexedConnection, count: i64) -> TestResult {
    let since = Instant::now();
    loop {
        let numsub = subscribers(con).await?;
        if numsub == Some(redis::Value::Int(count)) {
            return Ok(());
        }
        assert!(
            since.elapsed() < Duration::from_secs(5),
            "no subscription: {numsub:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Collects the warnings logged on this thread (a minimal `tracing` subscriber, so the tests
/// need no logging crate).
#[derive(Clone, Default)]
pub struct Warnings(Arc<Mutex<Vec<String>>>);

impl Warnings {
    pub fn taken(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

struct Message(String);

impl tracing::field::Visit for Message {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!(" {}={value:?}", field.name()));
    }
}

impl tracing::Subscriber for Warnings {
    fn enabled(&self, metadata: &tracing::Metadata<'_>) -> bool {
        *metadata.level() <= tracing::Level::WARN
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut message = Message(String::new());
        event.record(&mut message);
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(message.0);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

fn text(e: HarnessError) -> String {
    e.to_string()
}

/// Waits until `replica` has applied everything `primary` has written.
pub fn wait_in_sync(primary: &impl Node, replica: &impl Node) -> Result<(), String> {
    let started = std::time::Instant::now();
    loop {
        let p = primary.command(&["INFO", "replication"]).map_err(text)?;
        let r = replica.command(&["INFO", "replication"]).map_err(text)?;
        let written = info_field(&p, "master_repl_offset").and_then(|v| v.parse::<u64>().ok());
        let applied = info_field(&r, "slave_repl_offset").and_then(|v| v.parse::<u64>().ok());
        let up = info_field(&r, "master_link_status").as_deref() == Some("up");
        if up && written.is_some() && applied >= written {
            return Ok(());
        }
        if started.elapsed() > Duration::from_secs(20) {
            return Err(format!(
                "the replica did not catch up: primary {written:?}, replica {applied:?}, link up {up}"
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Cuts `replica` off from `primary`: the primary refuses `PSYNC`/`SYNC` from now on (an ACL
/// change; clients never send those) and its replica connection is killed. The primary keeps
/// serving clients; what they write now never reaches the replica.
pub fn cut_replication(primary: &impl Node, replica: &impl Node) -> Result<(), String> {
    primary
        .command(&["ACL", "SETUSER", "default", "-psync", "-sync"])
        .map_err(text)?;
    primary
        .command(&["CLIENT", "KILL", "TYPE", "replica"])
        .map_err(text)?;
    let started = std::time::Instant::now();
    loop {
        let r = replica.command(&["INFO", "replication"]).map_err(text)?;
        let p = primary.command(&["INFO", "replication"]).map_err(text)?;
        let down = info_field(&r, "master_link_status").as_deref() == Some("down");
        let none = info_field(&p, "connected_slaves").as_deref() == Some("0");
        if down && none {
            return Ok(());
        }
        if started.elapsed() > Duration::from_secs(10) {
            return Err("the replica's link did not go down".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Hands `key` from `holder` to a waiter parked in `acquire`, `rounds` times, and returns how
/// long after each hold ended the waiter held the key, sorted. `ready` returns once the waiter
/// waits the way the test means (subscribed where it should be); `end` ends the holder's grant
/// (its release, or an operator's revoke). The waiter has waited 700 ms by then, so its backoff
/// has reached its cap (retries 150 to 300 ms apart): a hand-off well under that was announced.
pub async fn hand_off_rounds(
    holder: &RedisAuthority,
    waiter: &Arc<RedisAuthority>,
    key: &LockKey,
    rounds: usize,
    mut ready: impl AsyncFnMut() -> TestResult,
    mut end: impl AsyncFnMut(Grant) -> TestResult,
) -> TestResult<Vec<Duration>> {
    let ttl = Duration::from_secs(10);
    let mut latencies = Vec::new();
    for round in 0..rounds {
        let held = holder
            .try_acquire(key, ttl)
            .await
            .or_fail("the holder acquires")?
            .ok_or_else(|| Failure::new(format!("round {round}: the key is not free")))?;
        let task = {
            let (waiter, key) = (waiter.clone(), key.clone());
            tokio::spawn(async move {
                let grant = waiter.acquire(&key, ttl, ttl).await;
                (grant, Instant::now())
            })
        };
        ready().await?;
        tokio::time::sleep(Duration::from_millis(700)).await;
        let ended_at = Instant::now();
        end(held).await?;
        let (grant, at) = task.await.or_fail("the waiting task")?;
        let grant = grant.or_fail("the waiter acquires")?;
        latencies.push(at.saturating_duration_since(ended_at));
        match waiter
            .release(&grant)
            .await
            .or_fail("the waiter releases")?
        {
            Released::Released => {}
            other => {
                return Err(Failure::new(format!(
                    "round {round}: the release: {other:?}"
                )))
            }
        }
    }
    latencies.sort();
    Ok(latencies)
}

/// Fails unless the median of `sorted` is under `bound`: `what` says whose hand-offs they were.
pub fn median_under(sorted: &[Duration], bound: Duration, what: &str) -> TestResult {
    let median = sorted
        .get(sorted.len() / 2)
        .copied()
        .unwrap_or(Duration::MAX);
    if median >= bound {
        return Err(Failure::new(format!(
            "median hand-off {median:?} {what}: the waiter's timer, not an announcement \
             ({sorted:?})"
        )));
    }
    Ok(())
}
