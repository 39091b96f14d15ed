//! The resource suite against Redis as the protected store: fenced hashes written by one
//! script, on one server (its clients killed and the server restarted by the harness) and on a
//! Redis Cluster; and the `fenced_hash` example's story.

#[path = "../examples/fenced_hash.rs"]
mod example;

use std::sync::Arc;

use async_trait::async_trait;
use leasehold_conformance::gate::{run_all, GateContext, GateFactory, GateFaults, Probed};
use leasehold_conformance::kit::{self, OrFail, TestResult};
use leasehold_conformance::servers::{RedisCluster, RedisServer};
use leasehold_conformance::{harness_call, Failure, Verdict};
use leasehold_core::{Fence, FenceSafety, Guarded, OwnerToken};
use leasehold_redis::gate::{RedisGate, FENCE_FIELD};
use leasehold_redis::RedisAuthority;
use leasehold_servers::external;

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
    report.passed()?;
    let restart = report
        .lines
        .iter()
        .find(|l| l.scenario == "fence_survives_restart")
        .or_fail("the restart scenario's line")?;
    // Without persistence the fence is gone after a restart: the suite must see it.
    if !matches!(restart.outcome, Ok(Verdict::Declared(_))) {
        return Err(Failure::new(format!(
            "a Redis without persistence kept its fences across a restart?\n{report}"
        )));
    }
    Ok(())
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
    report.passed()
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
    let (url, _server) = match external::redis_url() {
        Some(url) => (url, None),
        None => {
            let server = kit::start("Redis", RedisServer::start).await?;
            (server.url(), Some(server))
        }
    };
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
