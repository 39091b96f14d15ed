//! Redis under Sentinel: a primary, a replica and three sentinels (quorum 2) that promote the
//! replica when the primary stops answering; clients find the primary through the sentinels
//! (`redis+sentinel://`). Two faults: the sentinels' own failover (the primary they name is
//! killed), and the sentinels re-provisioned, which numbers the primary's configuration from
//! epoch 0 again.

use std::time::Duration;

use leasehold_conformance::workload::FaultKind;
use leasehold_servers::{RedisSentinel, RedisServer, SentinelDeployment};

use super::{blocking, boxed, not_a_fault_of, wait_until, DeploymentError, Form, Heal, Injected};

/// How long the sentinels may take to find each other and the replica again.
const AGREE_WITHIN: Duration = Duration::from_secs(30);

/// A Sentinel deployment.
pub(super) struct Sentinel {
    deployment: SentinelDeployment,
}

impl Sentinel {
    pub(super) async fn start() -> Result<Sentinel, DeploymentError> {
        let deployment = blocking(|| SentinelDeployment::start().map_err(boxed)).await?;
        Ok(Sentinel { deployment })
    }

    fn server(&self, i: usize) -> &RedisServer {
        self.deployment.servers()[i]
    }

    /// The index of the data server the sentinels name as the primary.
    fn primary(&self) -> Result<usize, DeploymentError> {
        let port = self.deployment.named_primary_port().map_err(boxed)?;
        let named = (0..2)
            .find(|&i| self.server(i).port() == port)
            .ok_or_else(|| format!("the sentinels name an unknown port {port}"))?;
        // A fault aimed by a stale sentinel's view would hit a replica (or re-provision every
        // sentinel onto one): the servers' own roles must agree with what is named.
        let masters: Vec<u16> = (0..2)
            .filter(|&i| self.server(i).role().is_ok_and(|r| r == "master"))
            .map(|i| self.server(i).port())
            .collect();
        if masters != [port] {
            return Err(format!(
                "the sentinels name port {port} as the primary, but the servers saying they are \
                 the primary are {masters:?}"
            )
            .into());
        }
        Ok(named)
    }

    /// Whether `sentinel` lists the server on `port` as a replica that is up and linked.
    fn knows_replica(sentinel: &RedisSentinel, master: &str, port: u16) -> bool {
        let Ok(answer) = sentinel.command(&["SENTINEL", "replicas", master]) else {
            return false;
        };
        let name = format!("127.0.0.1:{port}");
        let lines: Vec<&str> = answer.lines().collect();
        let mut current = false;
        let (mut flags_ok, mut link_ok) = (false, false);
        for pair in lines.chunks(2) {
            let [field, value] = pair else { break };
            match *field {
                "name" => current = *value == name,
                "flags" if current => flags_ok = *value == "slave",
                "master-link-status" if current => link_ok = *value == "ok",
                _ => {}
            }
        }
        flags_ok && link_ok
    }

    /// Every sentinel names `primary`, knows the other sentinels and `replica` (up and linked),
    /// and could authorize a failover.
    fn agreed(&self, primary: usize) -> Result<bool, DeploymentError> {
        let (port, replica) = (self.server(primary).port(), self.server(1 - primary).port());
        Ok(self
            .deployment
            .sentinels()
            .iter()
            .all(|sentinel| self.sentinel_agrees(sentinel, port, replica)))
    }

    /// Points `sentinel` at the primary on `port` from scratch, as an operator re-provisions
    /// one: forget the master, monitor it again, the deployment's timings.
    fn reprovision(&self, sentinel: &RedisSentinel, port: u16) -> Result<(), DeploymentError> {
        let options = self.deployment.options();
        let master = self.deployment.master_name();
        let primary = port.to_string();
        let quorum = options.quorum.to_string();
        let down = options.down_after.as_millis().max(1).to_string();
        let failover = options.failover_timeout.as_millis().max(1).to_string();
        for args in [
            vec!["SENTINEL", "REMOVE", master],
            vec![
                "SENTINEL",
                "MONITOR",
                master,
                "127.0.0.1",
                &primary,
                &quorum,
            ],
            vec!["SENTINEL", "SET", master, "down-after-milliseconds", &down],
            vec!["SENTINEL", "SET", master, "failover-timeout", &failover],
        ] {
            sentinel.command(&args).map_err(boxed)?;
        }
        Ok(())
    }

    /// Whether `sentinel` names the server on `port`, knows the other sentinels and
    /// `replica_port` (up and linked), and could authorize a failover.
    fn sentinel_agrees(&self, sentinel: &RedisSentinel, port: u16, replica_port: u16) -> bool {
        let master = self.deployment.master_name();
        let names = sentinel.primary_port(master).ok() == Some(port);
        let quorum = sentinel
            .command(&["SENTINEL", "CKQUORUM", master])
            .is_ok_and(|q| q.starts_with("OK"));
        let others = sentinel
            .command(&["SENTINEL", "sentinels", master])
            .map(|known| known.lines().filter(|l| *l == "runid").count() + 1)
            .unwrap_or(0);
        names
            && quorum
            && others >= self.deployment.sentinels().len()
            && Sentinel::knows_replica(sentinel, master, replica_port)
    }

    /// Re-provisions every running sentinel that does not agree (names another primary, misses
    /// the others, the replica or a quorum); returns their ports.
    fn reprovision_stragglers(&self, port: u16) -> Result<Vec<u16>, DeploymentError> {
        let replica = (0..2)
            .map(|i| self.server(i).port())
            .find(|&p| p != port)
            .unwrap_or(port);
        let mut fixed = Vec::new();
        for sentinel in self.deployment.sentinels() {
            if sentinel.pid().is_some() && !self.sentinel_agrees(sentinel, port, replica) {
                self.reprovision(sentinel, port)?;
                fixed.push(sentinel.port());
            }
        }
        Ok(fixed)
    }

    fn sentinels_name(&self) -> String {
        let ports: Vec<String> = self
            .deployment
            .sentinels()
            .iter()
            .map(|s| s.port().to_string())
            .collect();
        format!("sentinels 127.0.0.1:{}", ports.join(","))
    }
}

impl Form for Sentinel {
    fn url(&self) -> String {
        format!("{}?timeout_ms=1000", self.deployment.url())
    }

    fn faults(&self) -> Vec<FaultKind> {
        vec![FaultKind::SentinelFailover, FaultKind::ReprovisionSentinels]
    }

    fn inject(&self, kind: FaultKind, _pick: usize) -> Result<Injected, DeploymentError> {
        match kind {
            FaultKind::SentinelFailover => {
                let i = self.primary()?;
                self.server(i).kill().map_err(boxed)?;
                Ok(Injected {
                    node: Some(format!(
                        "redis 127.0.0.1:{} (primary)",
                        self.server(i).port()
                    )),
                    heal: Heal::AfterFailover(i),
                })
            }
            FaultKind::ReprovisionSentinels => {
                let primary = self.server(self.primary()?).port();
                for sentinel in self.deployment.sentinels() {
                    self.reprovision(sentinel, primary)?;
                }
                Ok(Injected {
                    node: Some(self.sentinels_name()),
                    heal: Heal::Reprovisioned,
                })
            }
            other => Err(not_a_fault_of(other, "Redis under Sentinel")),
        }
    }

    fn primaries(&self) -> Option<Vec<String>> {
        Some(
            (0..2)
                .map(|i| self.server(i))
                .filter(|s| s.role().is_ok_and(|r| r == "master"))
                .map(|s| format!("redis 127.0.0.1:{}", s.port()))
                .collect(),
        )
    }

    fn heal(&self, heal: Heal) -> Result<(), DeploymentError> {
        match heal {
            Heal::AfterFailover(killed) => {
                let promoted = self.server(1 - killed);
                let port = promoted.port();
                if let Err(missed) = self
                    .deployment
                    .wait_for_primary(promoted, self.deployment.failover_bound())
                {
                    // The sentinels did not finish the failover within its bound. A sentinel
                    // re-provisioned earlier can keep naming the dead primary: its configuration
                    // starts again from epoch 0, and it may ignore the others' newer one. What
                    // an operator does then: promote the replica by hand if no sentinel did,
                    // and re-provision the sentinels that name another server.
                    if promoted.role().map_err(boxed)? != "master" {
                        promoted.promote().map_err(boxed)?;
                        eprintln!(
                            "nemesis: no failover to port {port} ({missed}); promoted it by hand"
                        );
                    }
                    let fixed = self.reprovision_stragglers(port)?;
                    if !fixed.is_empty() {
                        eprintln!(
                            "nemesis: sentinels {fixed:?} disagreed after the failover to port \
                             {port}; re-provisioned them"
                        );
                    }
                }
                // Back empty, as a crashed Redis without persistence comes back; made the
                // replica of the new primary at once, which is what the sentinels would tell
                // it once they see it again. A heal tried again does not restart it twice.
                let old = self.server(killed);
                if old.pid().is_none() {
                    old.restart().map_err(boxed)?;
                }
                old.command(&["REPLICAOF", "127.0.0.1", &port.to_string()])
                    .map_err(boxed)?;
                let agreed = || self.agreed(1 - killed);
                let what = "the old primary is back as the new primary's replica and every \
                            sentinel agrees";
                if wait_until(what, AGREE_WITHIN, agreed).is_err() {
                    let fixed = self.reprovision_stragglers(port)?;
                    if !fixed.is_empty() {
                        eprintln!(
                            "nemesis: sentinels {fixed:?} disagreed after the failover to port \
                             {port}; re-provisioned them"
                        );
                    }
                    wait_until(what, AGREE_WITHIN, agreed)?;
                }
                Ok(())
            }
            Heal::Reprovisioned => wait_until(
                "the re-provisioned sentinels agree on the primary, the replica and each other",
                AGREE_WITHIN,
                || self.agreed(self.primary()?),
            ),
            other => Err(format!("{other:?} does not heal Redis under Sentinel").into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sentinels re-provisioned with the primary just killed (an operator's script applying a
    /// stale configuration) know no replica, so none of them can fail over: the heal promotes
    /// the replica by hand once the failover's bound has passed, re-provisions the sentinels,
    /// and every sentinel names the promoted server again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sentinels_that_cannot_fail_over_are_healed_by_hand() -> Result<(), DeploymentError> {
        let form = Sentinel::start().await?;
        let killed = form.primary()?;
        let injected = form.inject(FaultKind::SentinelFailover, 0)?;
        for sentinel in form.deployment.sentinels() {
            form.reprovision(sentinel, form.server(killed).port())?;
        }
        let form = std::sync::Arc::new(form);
        let healing = form.clone();
        blocking(move || healing.heal(injected.heal)).await?;
        for sentinel in form.deployment.sentinels() {
            let named = sentinel
                .primary_port(form.deployment.master_name())
                .map_err(boxed)?;
            if named != form.server(1 - killed).port() {
                return Err(format!("sentinel {} names port {named}", sentinel.port()).into());
            }
        }
        Ok(())
    }
}
