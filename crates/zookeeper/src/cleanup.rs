//! Deleting contender nodes nobody wants any more, until they are really gone.
//!
//! A contender node left behind blocks every later contender for as long as its session lives,
//! which with heartbeats is forever: the orphan-node bug that kazoo (#282, PR #760) and
//! go-zookeeper (#229) users hit. So a node that must go is deleted in the background and the
//! delete is retried, with backoff, until it succeeds, the node is already gone, or the session
//! ended (which removes the node anyway). A create whose reply was lost is swept by its UUID
//! prefix twice: once the session answers again, and once more a session timeout later, in case
//! the server applied the create late.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::backend::Backoff;
use zookeeper_client::{CreateSequence, Error as ZkError, Stat};

use crate::config::ZkConfig;
use crate::errors::{is_definite, is_session_end};
use crate::session::Session;

/// A create sent but not answered yet.
pub(crate) type PendingCreate =
    std::pin::Pin<Box<dyn Future<Output = Result<(Stat, CreateSequence), ZkError>> + Send>>;

fn backoff() -> Backoff {
    Backoff::new(Duration::from_millis(20), Duration::from_secs(1))
}

/// Runs `work` on the current runtime, if there is one. Without a runtime nothing can be done
/// here, and the session's end removes the nodes.
fn spawn(work: impl Future<Output = ()> + Send + 'static) {
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(work);
    }
}

/// Deletes `path` until it is gone or the session is.
pub(crate) async fn delete_until_gone(session: &Session, config: &ZkConfig, path: &str) {
    let mut backoff = backoff();
    while session.is_alive() {
        let attempt = tokio::time::timeout(
            config.client.request_timeout,
            session.client.delete(path, None),
        )
        .await;
        match attempt {
            Ok(Ok(())) | Ok(Err(ZkError::NoNode)) => return,
            Ok(Err(e)) if is_session_end(&e) => return,
            Ok(Err(e)) if is_definite(&e) => {
                // NoAuth, NotEmpty, ...: retrying cannot help; the session's end will.
                tracing::warn!(%path, error = %e, "cannot delete an abandoned contender node");
                return;
            }
            Ok(Err(e)) => {
                tracing::debug!(%path, error = %e, "deleting a contender node failed; retrying")
            }
            Err(_) => tracing::debug!(%path, "deleting a contender node timed out; retrying"),
        }
        tokio::time::sleep(backoff.next_delay()).await;
    }
}

/// Deletes `path` in the background (see [`delete_until_gone`]).
pub(crate) fn spawn_delete(session: Arc<Session>, config: Arc<ZkConfig>, path: String) {
    spawn(async move { delete_until_gone(&session, &config, &path).await });
}

/// Deletes every child of `parent` whose name starts with `prefix`; `false` if the listing
/// failed (and the session is still alive).
async fn sweep_once(session: &Session, config: &ZkConfig, parent: &str, prefix: &str) -> bool {
    let listed = tokio::time::timeout(
        config.client.request_timeout,
        session.client.list_children(parent),
    )
    .await;
    let children = match listed {
        Ok(Ok(children)) => children,
        // Gone with the session or the parent, or not ours to list (NoAuth): nothing to do.
        Ok(Err(e)) if is_session_end(&e) || is_definite(&e) => return true,
        _ => return !session.is_alive(),
    };
    for child in children.iter().filter(|c| c.starts_with(prefix)) {
        delete_until_gone(session, config, &format!("{parent}/{child}")).await;
    }
    true
}

/// Sweeps `parent` for nodes named `prefix...` now (retrying until the session answers) and
/// once more a session timeout later.
async fn sweep(session: &Session, config: &ZkConfig, parent: &str, prefix: &str) {
    let mut backoff = backoff();
    while !sweep_once(session, config, parent, prefix).await {
        tokio::time::sleep(backoff.next_delay()).await;
    }
    if session.is_alive() {
        tokio::time::sleep(session.ttl).await;
        let _ = sweep_once(session, config, parent, prefix).await;
    }
}

/// What must go when a contender gives up: its node if known, and if a create's outcome was
/// ever unknown, anything else carrying its prefix.
#[derive(Debug)]
pub(crate) struct Leftovers {
    pub session: Arc<Session>,
    pub config: Arc<ZkConfig>,
    pub parent: String,
    pub prefix: String,
    pub node: Option<String>,
    pub uncertain: bool,
}

impl Leftovers {
    /// Removes them in the background.
    pub fn spawn_removal(self) {
        spawn(async move {
            if let Some(node) = &self.node {
                let path = format!("{}/{node}", self.parent);
                delete_until_gone(&self.session, &self.config, &path).await;
            }
            if self.uncertain || self.node.is_none() {
                sweep(&self.session, &self.config, &self.parent, &self.prefix).await;
            }
        });
    }

    /// Waits in the background for a create that was abandoned before its reply, then removes
    /// what it made.
    pub fn spawn_after(self, create: PendingCreate) {
        spawn(async move {
            match create.await {
                Ok((_, sequence)) => {
                    let path = format!("{}/{}{sequence}", self.parent, self.prefix);
                    delete_until_gone(&self.session, &self.config, &path).await;
                }
                Err(e) if is_definite(&e) || is_session_end(&e) => {}
                Err(_) => sweep(&self.session, &self.config, &self.parent, &self.prefix).await,
            }
        });
    }
}
