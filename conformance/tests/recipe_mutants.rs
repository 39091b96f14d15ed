//! The recipe scenarios have teeth: each deliberately broken recipe fails the scenario aimed at
//! it, on the reference authority, while the recipe itself passes it. Runs on tokio's paused
//! clock, so it takes milliseconds.

use std::sync::Arc;
use std::time::Duration;

use leasehold_conformance::memory::{MemoryConnector, MemoryFaults, MemoryResidue, Replication};
use leasehold_conformance::recipe_mutants::RecipeMutant;
use leasehold_conformance::scenarios::{all, run_selected};
use leasehold_conformance::{Context, Verdict};
use leasehold_core::{acquire_all, Authority, ClientOptions, LeaseOptions, LockKey, RwLock};
use leasehold_memory::MemoryServer;

async fn reference() -> Result<(Context, MemoryServer), String> {
    let server = MemoryServer::new();
    let connector = Arc::new(MemoryConnector::new(
        server.clone(),
        ClientOptions::default(),
    ));
    let ctx = Context::new(connector)
        .await
        .map_err(|e| format!("a context: {e}"))?
        .with_residue(Arc::new(MemoryResidue::new(server.clone())))
        .with_faults(Arc::new(MemoryFaults::new(
            server.clone(),
            Replication::Synchronous,
        )));
    Ok((ctx, server))
}

#[tokio::test(start_paused = true)]
async fn every_recipe_mutant_fails_its_scenario_and_the_recipe_passes_it() -> Result<(), String> {
    let mut survivors = Vec::new();
    for mutant in RecipeMutant::ALL {
        let scenario = all()
            .into_iter()
            .find(|s| s.name == mutant.aimed_at())
            .ok_or_else(|| {
                format!(
                    "{mutant} is aimed at {}, which is not in all()",
                    mutant.aimed_at()
                )
            })?;
        let (ctx, _server) = reference().await?;
        let report = run_selected("memory", &ctx, &[scenario]).await;
        if !report
            .lines
            .iter()
            .all(|l| l.outcome == Ok(Verdict::Passed))
        {
            return Err(format!("the recipe fails {}:\n{report}", scenario.name));
        }
        let (ctx, _server) = reference().await?;
        let outcome = mutant.run(&ctx).await;
        println!("mutant {mutant:<24} on {}: {outcome:?}", scenario.name);
        if outcome.is_ok() {
            survivors.push(format!("{mutant} passed {}", scenario.name));
        }
    }
    if survivors.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "recipe mutants their scenarios did not catch: {survivors:?}"
        ))
    }
}

/// A reader-writer write and an `acquire_all`, each dropped half way with leases that are not
/// released on drop, give back what they took at once: the keys are free a moment later, long
/// before their TTL would free them.
#[tokio::test(start_paused = true)]
async fn dropped_acquisitions_give_back_partial_keys_at_once() -> Result<(), String> {
    let server = MemoryServer::new();
    let a: Arc<dyn Authority> = Arc::new(server.authority(ClientOptions::default()));
    let b: Arc<dyn Authority> = Arc::new(server.authority(ClientOptions::default()));
    let ttl = Duration::from_secs(10);
    let kept = LeaseOptions::default().with_release_on_drop(false);
    let name = LockKey::new("dropped").map_err(|e| e.to_string())?;
    let reader = RwLock::new(b.clone(), &name).map_err(|e| e.to_string())?;
    let writer = RwLock::new(a.clone(), &name)
        .map_err(|e| e.to_string())?
        .with_lease_options(kept.clone());
    let read = reader.read(ttl, ttl).await.map_err(|e| e.to_string())?;
    let cut = tokio::time::timeout(Duration::from_secs(1), writer.write(ttl, ttl * 10)).await;
    if cut.is_ok() {
        return Err("the writer did not wait for the reader".into());
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    for key in [writer.gate(), writer.upgrade_key()] {
        let seen = b.inspect(key).await.map_err(|e| e.to_string())?;
        if seen.held {
            return Err(format!(
                "{key} is still held 50 ms after the writer was dropped"
            ));
        }
    }
    let _ = read.release().await.map_err(|e| e.to_string())?;

    let keys: Vec<LockKey> = (0..3)
        .map(|i| LockKey::new(format!("dropped-{i}")))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let blocker = b
        .try_acquire(&keys[2], ttl)
        .await
        .map_err(|e| e.to_string())?;
    let cut = tokio::time::timeout(
        Duration::from_secs(1),
        acquire_all(a.clone(), &keys, ttl, ttl * 10, kept),
    )
    .await;
    if cut.is_ok() {
        return Err("acquire_all did not wait for the held key".into());
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    for key in &keys[..2] {
        let seen = b.inspect(key).await.map_err(|e| e.to_string())?;
        if seen.held {
            return Err(format!(
                "{key} is still held 50 ms after acquire_all was dropped"
            ));
        }
    }
    if let Some(grant) = blocker {
        let _ = b.release(&grant).await.map_err(|e| e.to_string())?;
    }
    Ok(())
}
