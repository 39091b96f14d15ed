//! The nemesis's server faults as tasks of their own: one fault of the authority or of the
//! resource, injected, held and healed while the runner goes on tending the workers.

use std::sync::Arc;
use std::time::Duration;

use leasehold_conformance::workload::{FaultKind, What};
use leasehold_servers::PostgresServer;
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::deployment::Deployment;
use crate::resource_faults;
use crate::worker::Log;

/// One fault of the resource server, recorded from its start: a connection kill from before the
/// nemesis holds the table until it terminates what it caught; a restart from before the kill
/// until the server accepts connections again.
pub(crate) async fn resource_fault_task(
    server: Arc<PostgresServer>,
    kind: FaultKind,
    log: Log,
    fault: u64,
) -> Result<(), String> {
    let node = format!("resource 127.0.0.1:{}", server.port());
    match kind {
        FaultKind::KillResourceConnection => {
            // Recorded from before the table lock is taken: while the nemesis waits for a write,
            // every write and claim at the resource stalls, and the history must show why.
            log.record(What::FaultStart {
                fault,
                kind,
                worker: None,
                node: Some(node.clone()),
            });
            let hit = resource_faults::kill_worker_connections(&server.url())
                .await
                .map_err(|e| format!("nemesis: {kind:?} could not be injected: {e}"))?;
            let hit = hit.unwrap_or_else(|| "no worker connection to terminate".to_string());
            log.record(What::FaultEnd {
                fault,
                kind,
                worker: None,
                node: Some(format!("{node}: {hit}")),
            });
        }
        _ => {
            log.record(What::FaultStart {
                fault,
                kind,
                worker: None,
                node: Some(node.clone()),
            });
            let mut last = String::new();
            for _ in 0..5 {
                match resource_faults::restart(server.clone()).await {
                    Ok(()) => {
                        log.record(What::FaultEnd {
                            fault,
                            kind,
                            worker: None,
                            node: Some(node),
                        });
                        return Ok(());
                    }
                    Err(e) => last = e.to_string(),
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            return Err(format!("nemesis: the resource did not restart: {last}"));
        }
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
