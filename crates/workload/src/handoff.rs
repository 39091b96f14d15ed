//! The hand-off trigger: a cluster's leader killed or paused the moment a holder starts
//! releasing, so the workers waiting for that key meet a leader change mid-wait (the release
//! may never reach the old leader, the waiters' watches and sessions move to a new one).
//!
//! Workers are processes of their own, and the moment is theirs: the nemesis *arms* the fault
//! by creating a file, a worker about to release *claims* it by renaming the file (a rename is
//! atomic, so exactly one worker wins), then releases; the nemesis polls for the claim every
//! few milliseconds and strikes the leader it learnt beforehand (asking who leads takes a round
//! trip per member, longer than the release itself).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use leasehold_conformance::workload::FaultKind;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use crate::deployment::Deployment;
use crate::worker::Log;

/// The armed file's name in the run's output directory.
pub const ARMED: &str = "handoff-armed";
/// The name a worker's claim renames it to.
pub const FIRED: &str = "handoff-fired";
/// The name the nemesis renames it to when no worker claimed it in time.
const DISARMED: &str = "handoff-disarmed";

/// How often the nemesis looks for a claim: the fault lands at most this much after it.
const POLL: Duration = Duration::from_millis(2);
/// How long an armed trigger waits for a release before the nemesis gives up on it (workers
/// release several times a second, unless every one of them is paused or killed).
const ARMED_FOR: Duration = Duration::from_secs(10);
/// How often the leader is asked again while the trigger is armed (a previous fault's heal
/// may still move it).
const LEADER_REFRESH: Duration = Duration::from_millis(300);

/// The claim of a worker about to release: true if this worker won the armed trigger (the
/// nemesis then strikes the leader), false if none is armed or another worker won it.
pub fn claim(armed: &Path) -> bool {
    std::fs::rename(armed, fired_path(armed)).is_ok()
}

/// Where a claimed trigger is, beside the armed one.
pub fn fired_path(armed: &Path) -> PathBuf {
    armed.with_file_name(FIRED)
}

/// The nemesis's side of the trigger in a run's output directory.
#[derive(Clone, Debug)]
pub struct Trigger {
    armed: PathBuf,
}

impl Trigger {
    /// The trigger in a directory of its own under `dir`; nothing is armed yet (a left-over
    /// one from an earlier run in the same directory is removed). Workers run under uids of
    /// their own and claim by renaming, so that directory is writable by everyone.
    pub fn in_dir(dir: &Path) -> std::io::Result<Trigger> {
        use std::os::unix::fs::PermissionsExt;
        let dir = dir.join("handoff");
        std::fs::create_dir_all(&dir)?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777))?;
        let trigger = Trigger {
            armed: dir.join(ARMED),
        };
        trigger.clear();
        Ok(trigger)
    }

    /// The path workers claim ([`claim`]).
    pub fn armed_path(&self) -> &Path {
        &self.armed
    }

    fn clear(&self) {
        for path in [
            self.armed.clone(),
            fired_path(&self.armed),
            self.armed.with_file_name(DISARMED),
        ] {
            let _ = std::fs::remove_file(path);
        }
    }

    fn arm(&self) -> std::io::Result<()> {
        self.clear();
        std::fs::write(&self.armed, b"")
    }

    fn fired(&self) -> bool {
        fired_path(&self.armed).exists()
    }

    /// Takes the trigger back; false if a worker claimed it first (then the fault is due).
    fn disarm(&self) -> bool {
        std::fs::rename(&self.armed, self.armed.with_file_name(DISARMED)).is_ok()
    }
}

/// One hand-off leader change: learn the leader, arm, wait for a claim, kill or pause the
/// leader (drawn from `seed`), hold, heal. Logged like every server fault, the start once the
/// leader is hit.
pub async fn fault(
    deployment: Arc<Deployment>,
    trigger: Trigger,
    hold: Duration,
    seed: u64,
    log: Log,
    fault: u64,
) {
    let kind = FaultKind::HandoffLeaderChange;
    let pause = StdRng::seed_from_u64(seed).random_bool(0.5);
    let leader = match deployment.leader_member().await {
        Ok(i) => Arc::new(AtomicUsize::new(i)),
        Err(e) => {
            eprintln!("nemesis: {kind:?}: no leader to strike: {e}");
            return;
        }
    };
    let refresher = tokio::spawn({
        let (deployment, leader) = (deployment.clone(), leader.clone());
        async move {
            loop {
                tokio::time::sleep(LEADER_REFRESH).await;
                if let Ok(i) = deployment.leader_member().await {
                    leader.store(i, Ordering::SeqCst);
                }
            }
        }
    });
    let claimed = wait_for_claim(&trigger).await;
    refresher.abort();
    if !claimed {
        eprintln!("nemesis: {kind:?}: no worker released within {ARMED_FOR:?}");
        return;
    }
    let injected = match deployment
        .strike(leader.load(Ordering::SeqCst), pause)
        .await
    {
        Ok(injected) => injected,
        Err(e) => {
            eprintln!("nemesis: {kind:?} could not be injected: {e}");
            return;
        }
    };
    crate::server_fault::hold_and_heal(&deployment, &injected, kind, hold, &log, fault).await;
}

/// Arms the trigger and polls until a worker claims it (true) or [`ARMED_FOR`] passes and the
/// trigger is taken back unclaimed (false).
async fn wait_for_claim(trigger: &Trigger) -> bool {
    if let Err(e) = trigger.arm() {
        eprintln!("nemesis: cannot arm the hand-off trigger: {e}");
        return false;
    }
    let give_up = Instant::now() + ARMED_FOR;
    loop {
        if trigger.fired() {
            return true;
        }
        if Instant::now() >= give_up {
            // A worker may claim it between the look and the rename: then the fault is due.
            return !trigger.disarm();
        }
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exactly_one_of_many_racing_claims_wins_an_armed_trigger() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        let trigger = Trigger::in_dir(dir.path())?;
        assert!(!claim(trigger.armed_path()), "nothing is armed yet");
        trigger.arm()?;
        let racers: Vec<_> = (0..8)
            .map(|_| {
                let armed = trigger.armed_path().to_path_buf();
                std::thread::spawn(move || claim(&armed))
            })
            .collect();
        let mut wins = 0;
        for racer in racers {
            wins += usize::from(
                racer
                    .join()
                    .map_err(|_| std::io::Error::other("a racer panicked"))?,
            );
        }
        assert_eq!(wins, 1);
        assert!(trigger.fired());
        assert!(!trigger.disarm(), "a claimed trigger cannot be taken back");
        trigger.arm()?;
        assert!(trigger.disarm(), "an unclaimed trigger is taken back");
        assert!(
            !claim(trigger.armed_path()),
            "and no worker can claim it then"
        );
        Ok(())
    }
}
