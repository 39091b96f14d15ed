//! The resource suite against Redis as the protected store: fenced hashes written by one
//! script, on one server (its clients killed and the server restarted by the harness) and on a
//! Redis Cluster; and the `fenced_hash` example's story.

#[path = "../examples/fenced_hash.rs"]
mod example;

use std::sync::Arc;

use async_trait::async_trait;
use leasehold_conformance::gate::{
    run_all, GateContext, GateFactory, GateFaults, HeldWrites, Probed, NEEDS_FAULTS,
};
use leasehold_conformance::kit::{self, OrFail, TestResult};
use leasehold_conformance::servers::{RedisCluster, RedisServer};
use leasehold_conformance::{harness_call, Failure};
use leasehold_core::{Fence, FenceSafety, Guarded, OwnerToken};
use leasehold_redis::gate::{RedisGate, FENCE_FIELD};
use leasehold_redis::RedisAuthority;
use leasehold_servers::external;

/// How long a hold pauses writes at most: the scenario releases it long before, and a hold
/// dropped without release ends with it at the latest.
const PAUSE_MS: &str = "30000";

/// Writes held by `CLIENT PAUSE ... WRITE`: the server keeps reading, answers reads, and parks
/// every client that sends a script (the gate's `EVALSHA`) without running it. The harness's
/// commands each use a connection of their own, which `CLIENT KILL TYPE normal` (sent from
/// another) does not touch, and a killed client's parked script never runs. The gate's
/// connection manager reconnects but never sends a command again: a held write is lost for
/// good.
struct Paused {
    server: Arc<RedisServer>,
    released: bool,
}

impl Paused {
    fn unpause(server: &RedisServer) -> leasehold_conformance::servers::Result<()> {
        server.command(&["CLIENT", "UNPAUSE"]).map(|_| ())
    }
}

#[async_trait]
impl HeldWrites for Paused {
    async fn waiting(&self) -> leasehold_core::Result<Option<usize>> {
        let server = self.server.clone();
        let clients = harness_call(move || server.command(&["CLIENT", "LIST"])).await?;
        // A parked client is flagged `b` (blocked); the gate's clients block on nothing else.
        let parked = clients
            .lines()
            .filter(|client| {
                client.split(' ').any(|field| {
                    field
                        .strip_prefix("flags=")
                        .is_some_and(|f| f.contains('b'))
                })
            })
            .count();
        Ok(Some(parked))
    }

    fn cut_loses_held_writes(&self) -> bool {
        true
    }

    async fn release(mut self: Box<Self>) -> leasehold_core::Result<()> {
        let server = self.server.clone();
        harness_call(move || Paused::unpause(&server)).await?;
        self.released = true;
        Ok(())
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        if !self.released {
            let server = self.server.clone();
            std::thread::spawn(move || Paused::unpause(&server));
        }
    }
}

struct Hashes {
    gate: RedisGate,
    server: Option<Arc<RedisServer>>,
}

#[async_trait]
impl GateFactory for Hashes {
    async fn resource(&self) -> leasehold_core::Result<Probed> {
        let key = format!("gate:{}", OwnerToken::generate()?.to_hex());
        let hash = Arc::new(self.gate.hash(&key, "value"));
        let read = hash.clone();
        Ok(Probed {
            resource: hash,
            value: Arc::new(move || {
                let read = read.clone();
                Box::pin(async move { read.value().await })
            }),
        })
    }
}

#[async_trait]
impl GateFaults for Hashes {
    async fn cut_connections(&self) -> leasehold_core::Result<()> {
        let server = self.server.clone();
        harness_call(move || match server {
            Some(server) => server
                .command(&["CLIENT", "KILL", "TYPE", "normal"])
                .map(|_| ()),
            None => Ok(()),
        })
        .await
    }

    async fn restart(&self) -> leasehold_core::Result<()> {
        let server = self.server.clone();
        harness_call(move || match server {
            Some(server) => server.restart(),
            None => Ok(()),
        })
        .await
    }

    async fn hold_writes(&self) -> leasehold_core::Result<Box<dyn HeldWrites>> {
        let Some(server) = self.server.clone() else {
            return Err(leasehold_core::Error::Unsupported {
                backend: "redis cluster harness",
                operation: "holding writes".into(),
            });
        };
        let pause = server.clone();
        harness_call(move || pause.command(&["CLIENT", "PAUSE", PAUSE_MS, "WRITE"])).await?;
        Ok(Box::new(Paused {
            server,
            released: false,
        }))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_hash_passes_the_resource_suite_with_faults() -> TestResult {
    let server = kit::start("Redis", RedisServer::start).await?;
    let gate = RedisGate::connect(&server.url())
        .await
        .or_fail("connect the gate")?;
    let hashes = Arc::new(Hashes {
        gate,
        server: Some(server),
    });
    let ctx = GateContext::new(hashes.clone())
        .with_faults(hashes)
        .forgets_on_restart("the harness runs Redis without persistence (no appendonly)");
    let report = run_all("redis hash", &ctx).await;
    println!("{report}");
    // Without persistence the fence is gone after a restart: the suite must see it.
    report.passed_except(&["fence_survives_restart"])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_cluster_hash_passes_the_resource_suite() -> TestResult {
    let cluster = kit::start("Redis Cluster", || RedisCluster::start(3, 0)).await?;
    let nodes: Vec<String> = cluster.nodes().iter().map(|n| n.url()).collect();
    let nodes: Vec<&str> = nodes.iter().map(String::as_str).collect();
    let gate = RedisGate::connect_cluster(&nodes)
        .await
        .or_fail("connect the gate to the cluster")?;
    let ctx = GateContext::new(Arc::new(Hashes { gate, server: None }));
    let report = run_all("redis cluster hash", &ctx).await;
    println!("{report}");
    // The harness has no faults for the Cluster.
    report.passed_except(&NEEDS_FAULTS)
}

/// Fences compare as numbers even above 2^53, where Lua's doubles would round them, and the
/// fence's own field cannot be written around the gate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_above_two_to_the_53_compare_exactly() -> TestResult {
    let server = kit::start("Redis", RedisServer::start).await?;
    let gate = RedisGate::connect(&server.url())
        .await
        .or_fail("connect the gate")?;
    let big = (1u64 << 60) + 2;
    let fence = |n: u64| Fence::from_value(n, FenceSafety::Linearizable).or_fail("a fence");
    let first = gate
        .hset("big", fence(big)?, &[("v", "a")])
        .await
        .or_fail("write with a large fence")?;
    if first != Guarded::Accepted {
        return Err(Failure::new(format!(
            "the first large fence was refused: {first:?}"
        )));
    }
    let one_below = gate
        .hset("big", fence(big - 1)?, &[("v", "b")])
        .await
        .or_fail("write one below")?;
    if one_below != (Guarded::Stale { newest: big }) {
        return Err(Failure::new(format!(
            "fence {} after {big} was not refused: {one_below:?}",
            big - 1
        )));
    }
    let around = gate.hset("big", fence(big)?, &[(FENCE_FIELD, "0")]).await;
    if around.is_ok() {
        return Err(Failure::new(
            "a write of the fence field itself was accepted",
        ));
    }
    Ok(())
}

/// The `fenced_hash` example against the harness's Redis (or `LEASEHOLD_REDIS_URL`'s, e.g.
/// docker compose's), its leases from the same server: the paused holder's late write is
/// refused with the new holder's fence, and the hash keeps the new holder's balance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hash_example_refuses_the_paused_holder() -> TestResult {
    let (url, _server) = kit::external_or_start(
        external::redis_url(),
        "Redis",
        RedisServer::start,
        RedisServer::url,
    )
    .await?;
    let authority = RedisAuthority::connect(&url)
        .await
        .or_fail("connect the authority")?;
    let gate = RedisGate::connect(&url).await.or_fail("connect the gate")?;
    let outcome = example::run(&authority, &gate)
        .await
        .or_fail("the example's story")?;
    let example::Outcome {
        stale_fence,
        fence,
        refused_by,
        balance,
    } = outcome;
    if stale_fence >= fence || refused_by != fence || balance != "120" {
        return Err(Failure::new(format!(
            "fence {stale_fence} should be refused by {fence} (the hash named {refused_by}), \
             and the balance be holder-2's 120 (it is {balance:?})"
        )));
    }
    Ok(())
}
