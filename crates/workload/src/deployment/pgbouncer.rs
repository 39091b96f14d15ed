//! PostgreSQL behind PgBouncer in transaction pooling mode: every worker reaches the authority
//! through the pooler, and declares it (`pooler=transaction`), as docs/postgres.md says a
//! deployment with a transaction pooler must. Two faults: the pooler restarted (every client
//! and server connection through it ends at once, an acquisition's `COMMIT` may go unanswered),
//! and PostgreSQL killed underneath it.

use std::time::{Duration, Instant};

use leasehold_conformance::workload::FaultKind;
use leasehold_servers::{PgBouncer, PostgresServer};

use super::{blocking, boxed, not_a_fault_of, wait_until, DeploymentError, Form, Heal, Injected};

/// Server connections in the pool: fewer than the workers, so consecutive transactions of one
/// client often run on different server connections, which is what transaction pooling means.
const POOL_SIZE: u32 = 4;

/// How long the pooler is given to log in to a restarted server by itself before it is
/// restarted too (PgBouncer may hold on to a failed login: see the pgbouncer tests).
const RELOGIN_GRACE: Duration = Duration::from_secs(3);

/// PostgreSQL with PgBouncer in front.
pub(super) struct BehindPooler {
    // The pooler first: dropped (stopped) before the server it pools.
    bouncer: PgBouncer,
    server: PostgresServer,
}

impl BehindPooler {
    /// Starts PostgreSQL, creates the lease table on a direct connection (the operator's
    /// migration does not go through the pooler), then starts PgBouncer in front of it.
    pub(super) async fn start() -> Result<BehindPooler, DeploymentError> {
        let server = blocking(|| PostgresServer::start().map_err(boxed)).await?;
        leasehold_postgres::PostgresAuthority::connect(&server.url())
            .await?
            .migrate()
            .await?;
        let (server, bouncer) = blocking(move || {
            let bouncer =
                PgBouncer::start_transaction_pooling(&server, POOL_SIZE).map_err(boxed)?;
            Ok((server, bouncer))
        })
        .await?;
        Ok(BehindPooler { bouncer, server })
    }

    fn pooler_name(&self) -> String {
        format!("pgbouncer 127.0.0.1:{}", self.bouncer.port())
    }

    fn accepts_logins_within(&self, within: Duration) -> bool {
        let until = Instant::now() + within;
        while Instant::now() < until {
            if self.bouncer.accepts_logins().is_ok() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }
}

impl Form for BehindPooler {
    fn url(&self) -> String {
        format!("{}?timeout_ms=1000&pooler=transaction", self.bouncer.url())
    }

    fn faults(&self) -> Vec<FaultKind> {
        vec![FaultKind::KillAuthority, FaultKind::RestartPooler]
    }

    fn inject(&self, kind: FaultKind, _pick: usize) -> Result<Injected, DeploymentError> {
        match kind {
            FaultKind::KillAuthority => {
                self.server.kill().map_err(boxed)?;
                Ok(Injected {
                    node: Some(format!(
                        "postgres 127.0.0.1:{} behind {}",
                        self.server.port(),
                        self.pooler_name()
                    )),
                    heal: Heal::Restart(0),
                })
            }
            FaultKind::RestartPooler => {
                self.bouncer.kill().map_err(boxed)?;
                Ok(Injected {
                    node: Some(self.pooler_name()),
                    heal: Heal::RestartPooler,
                })
            }
            other => Err(not_a_fault_of(other, "PostgreSQL behind PgBouncer")),
        }
    }

    fn heal(&self, heal: Heal) -> Result<(), DeploymentError> {
        match heal {
            Heal::Restart(_) => {
                self.server.restart().map_err(boxed)?;
                if self.accepts_logins_within(RELOGIN_GRACE) {
                    return Ok(());
                }
                // PgBouncer's behaviour, not the authority's: see RELOGIN_GRACE.
                self.bouncer.restart().map_err(boxed)
            }
            Heal::RestartPooler => {
                self.bouncer.restart().map_err(boxed)?;
                wait_until(
                    "PgBouncer accepts logins after its restart",
                    Duration::from_secs(20),
                    || Ok(self.bouncer.accepts_logins().is_ok()),
                )
            }
            other => Err(format!("{other:?} does not heal PostgreSQL behind PgBouncer").into()),
        }
    }
}
