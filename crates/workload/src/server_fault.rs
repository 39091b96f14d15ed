//! The nemesis's server faults as tasks of their own: one fault of the authority or of the
//! resource, injected, held and healed while the runner goes on tending the workers.

use std::sync::Arc;
use std::time::Duration;

use leasehold_conformance::workload::{FaultKind, What};
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::deployment::Deployment;
use crate::resource::ResourceError;
use crate::resource_faults;
use crate::resource_server::ResourceServer;
use crate::worker::Log;

/// One fault of the resource server, recorded from its start: a connection kill from before the
/// nemesis holds the table until it terminates what it caught; a stall from before the store
/// stops; a restart from before the kill until the server accepts connections again.
pub(crate) async fn resource_fault_task(
    server: ResourceServer,
    kind: FaultKind,
    log: Log,
    fault: u64,
) -> Result<(), String> {
    let node = server.node();
    let start = What::FaultStart {
        fault,
        kind,
        worker: None,
        node: Some(node.clone()),
    };
    let end = |node| What::FaultEnd {
        fault,
        kind,
        worker: None,
        node: Some(node),
    };
    let not_injected = |e: ResourceError| format!("nemesis: {kind:?} could not be injected: {e}");
    match (kind, &server) {
        (FaultKind::KillResourceConnection, ResourceServer::Postgres(pg)) => {
            // Recorded from before the table lock is taken: while the nemesis waits for a write,
            // every write and claim at the resource stalls, and the history must show why.
            log.record(start);
            let hit = resource_faults::kill_worker_connections(&pg.url())
                .await
                .map_err(not_injected)?;
            let hit = hit.unwrap_or_else(|| "no worker connection to terminate".to_string());
            log.record(end(format!("{node}: {hit}")));
        }
        (FaultKind::StallResource, _) => {
            log.record(start);
            let said = server.stall().await.map_err(not_injected)?;
            log.record(end(format!("{node}: {said}")));
        }
        (FaultKind::RestartResource, _) => {
            log.record(start);
            let mut last = String::new();
            for _ in 0..5 {
                match server.restart().await {
                    Ok(()) => {
                        log.record(end(node));
                        return Ok(());
                    }
                    Err(e) => last = e.to_string(),
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            return Err(format!("nemesis: the resource did not restart: {last}"));
        }
        (kind, _) => return Err(format!("nemesis: {kind:?} is not a fault of {node}")),
    }
    Ok(())
}

/// One server fault: inject, hold, heal (waiting until the servers serve again).
pub(crate) async fn server_fault_task(
    deployment: Arc<Deployment>,
    kind: FaultKind,
    hold: Duration,
    seed: u64,
    log: Log,
    fault: u64,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let injected = match deployment.inject(kind, &mut rng).await {
        Ok(injected) => injected,
        Err(e) => {
            eprintln!("nemesis: {kind:?} could not be injected: {e}");
            return;
        }
    };
    hold_and_heal(&deployment, &injected, kind, hold, &log, fault).await;
}

/// Records a server fault that is in place, holds it for `hold`, then heals it, retrying: a
/// fault must never outlive the run. One that cannot be healed has no end in the history, and
/// the checker fails the run for it.
pub(crate) async fn hold_and_heal(
    deployment: &Arc<Deployment>,
    injected: &crate::deployment::Injected,
    kind: FaultKind,
    hold: Duration,
    log: &Log,
    fault: u64,
) {
    let node = injected.node.clone();
    log.record(What::FaultStart {
        fault,
        kind,
        worker: None,
        node: node.clone(),
    });
    tokio::time::sleep(hold).await;
    for attempt in 1..=5 {
        match deployment.heal(injected).await {
            Ok(()) => {
                log.record(What::FaultEnd {
                    fault,
                    kind,
                    worker: None,
                    node,
                });
                return;
            }
            Err(e) => {
                eprintln!("nemesis: healing {kind:?} failed (attempt {attempt}): {e}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}
