//! One contender in one key's queue: create my node (protected), see where it stands, wait on
//! the node just ahead of it, and leave nothing behind when giving up.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use leasehold_core::time::saturating_add;
use leasehold_core::{Error, Grant, Instant, LockKey, OwnerToken};
use zookeeper_client::{CreateMode, Error as ZkError, EventType};

use crate::cleanup::{self, Leftovers, PendingCreate};
use crate::config::ZkConfig;
use crate::errors::{self, is_definite, is_session_end, BACKEND};
use crate::held::Held;
use crate::names::{self, Position};
use crate::node_watch;
use crate::session::{self, Active, Session};
use crate::tenure::Tenures;
use crate::token::Czxid;

/// How often a create is retried when the parent vanished under it (a container removed by
/// the server between our creating it and our create) or its reply was lost.
const CREATE_TRIES: usize = 5;

/// Why an attempt did not end in a grant, when that is not an error for the caller.
#[derive(Debug)]
pub(crate) enum Failed {
    /// The session ended (or my node vanished with it): start again on a fresh session.
    SessionGone,
    /// An error for the caller.
    Error(Error),
}

impl From<Error> for Failed {
    fn from(e: Error) -> Self {
        Failed::Error(e)
    }
}

/// Maps a client error from a request on `session`.
fn failed(error: ZkError, what: &str) -> Failed {
    if is_session_end(&error) && !matches!(error, ZkError::AuthFailed) {
        Failed::SessionGone
    } else {
        Failed::Error(errors::map(error, what))
    }
}

/// A listing of the parent's children, and when the requests that produced it were sent.
struct Listing {
    children: Vec<String>,
    sent: Instant,
    /// My node, if a write of mine on it (its create, or [`session::confirm`]) went out with the
    /// listing and succeeded: then the leader knew my session alive after `sent`, and the
    /// listing comes from a state at least as new as that write. A listing without it may come
    /// from a follower's stale copy.
    confirmed: Option<String>,
}

struct Node {
    name: String,
    czxid: Option<Czxid>,
}

/// Polls `future` once: sends a client request without waiting for its reply.
async fn poll_once<F: Future + Unpin>(future: &mut F) -> Option<F::Output> {
    std::future::poll_fn(|cx| {
        Poll::Ready(match Pin::new(&mut *future).poll(cx) {
            Poll::Ready(output) => Some(output),
            Poll::Pending => None,
        })
    })
    .await
}

/// One contender: owner, session, and (once created) its node.
pub(crate) struct Contender {
    config: Arc<ZkConfig>,
    session: Arc<Session>,
    _active: Active,
    key: LockKey,
    owner: OwnerToken,
    parent: String,
    prefix: String,
    node: Option<Node>,
    /// A create's outcome was unknown at some point: more than one node may carry my prefix.
    uncertain: bool,
    /// Whether dropping this contender must remove what it created (until it becomes a grant or
    /// is deliberately removed).
    armed: bool,
}

impl Drop for Contender {
    fn drop(&mut self) {
        if self.armed {
            self.leftovers().spawn_removal();
        }
    }
}

impl Contender {
    pub fn new(
        config: Arc<ZkConfig>,
        session: Arc<Session>,
        key: &LockKey,
        parent: String,
        owner: OwnerToken,
    ) -> Self {
        Contender {
            _active: session.enter(),
            config,
            session,
            key: key.clone(),
            owner,
            prefix: names::contender_prefix(owner),
            parent,
            node: None,
            uncertain: false,
            armed: true,
        }
    }

    fn leftovers(&self) -> Leftovers {
        Leftovers {
            session: self.session.clone(),
            config: self.config.clone(),
            parent: self.parent.clone(),
            prefix: self.prefix.clone(),
            node: self.node.as_ref().map(|n| n.name.clone()),
            uncertain: self.uncertain,
        }
    }

    fn path(&self, name: &str) -> String {
        format!("{}/{name}", self.parent)
    }

    /// Creates my node and lists the parent in one round trip: both requests go out together,
    /// and ZooKeeper answers one session's requests in order, so the listing includes the node.
    async fn enqueue(&mut self) -> std::result::Result<Listing, Failed> {
        let client = self.session.client.clone();
        let prefix_path = self.path(&self.prefix);
        for _ in 0..CREATE_TRIES {
            let sent = self.session.note_send();
            let mut create: PendingCreate = {
                let (client, path) = (client.clone(), prefix_path.clone());
                let options =
                    CreateMode::EphemeralSequential.with_acls(session::acls(&self.config));
                Box::pin(async move { client.create(&path, &[], &options).await })
            };
            let early = poll_once(&mut create).await;
            let listing = client.list_children(&self.parent);
            let both = async {
                let created = match early {
                    Some(result) => result,
                    None => create.as_mut().await,
                };
                (created, listing.await)
            };
            let timeout = self.config.client.request_timeout;
            let Ok((created, listed)) = tokio::time::timeout(timeout, both).await else {
                // The create may still be applied: whatever it makes is removed once it answers.
                let leftovers = Leftovers {
                    node: None,
                    uncertain: true,
                    ..self.leftovers()
                };
                self.armed = self.node.is_some() || self.uncertain;
                leftovers.spawn_after(create);
                return Err(Failed::Error(errors::timed_out(
                    "create a contender node",
                    timeout,
                )));
            };
            match created {
                Ok((stat, sequence)) => {
                    let name = format!("{}{sequence}", self.prefix);
                    let czxid = Czxid::from_create_stat(&stat, self.session.id);
                    self.node = Some(Node {
                        name: name.clone(),
                        czxid,
                    });
                    let children = match listed {
                        Ok(children) => children,
                        // The node exists; only the listing was lost.
                        Err(_) => return self.list().await,
                    };
                    return Ok(Listing {
                        children,
                        sent,
                        confirmed: Some(name),
                    });
                }
                Err(ZkError::NoNode) => self.create_parent().await?,
                Err(e) if is_session_end(&e) || is_definite(&e) => {
                    // Refused (or the session is gone): this create made nothing.
                    if self.node.is_none() && !self.uncertain {
                        self.armed = false;
                    }
                    return Err(failed(e, "create a contender node"));
                }
                Err(e) => {
                    // Protected mode: the server may have applied the create although its reply
                    // was lost. Look for my node by its UUID before creating another one.
                    tracing::debug!(error = %e, parent = %self.parent, "a create's reply was lost; looking for the node by its UUID");
                    self.uncertain = true;
                    match self.list().await {
                        Ok(listing)
                            if listing.children.iter().any(|c| c.starts_with(&self.prefix)) =>
                        {
                            return Ok(listing)
                        }
                        Ok(_) => {}
                        Err(f) => return Err(f),
                    }
                }
            }
        }
        Err(Failed::Error(Error::Backend {
            backend: BACKEND,
            message: format!(
                "could not create a contender node under {} in {CREATE_TRIES} attempts",
                self.parent
            ),
            retryable: true,
            source: None,
        }))
    }

    /// Creates the key's parent (a container), and the chroot if someone removed it.
    async fn create_parent(&self) -> std::result::Result<(), Failed> {
        let client = &self.session.client;
        let options = session::parent_options(&self.config);
        match bounded_raw(&self.config, client.create(&self.parent, &[], &options)).await? {
            Ok(_) | Err(ZkError::NodeExists) => Ok(()),
            Err(ZkError::NoNode) => {
                let chroot = CreateMode::Persistent.with_acls(session::acls(&self.config));
                match bounded_raw(&self.config, client.mkdir(&self.config.chroot, &chroot)).await? {
                    Ok(()) => Ok(()),
                    Err(e) => Err(failed(e, "create the chroot")),
                }
            }
            Err(e) => Err(failed(e, "create the lock's parent node")),
        }
    }

    /// Lists the parent's children; when my node is known, behind a [`session::confirm`] of it
    /// in the same round trip, so that the listing is not a cut-off follower's stale copy.
    async fn list(&self) -> std::result::Result<Listing, Failed> {
        let sent = self.session.note_send();
        let client = &self.session.client;
        let mine = self
            .node
            .as_ref()
            .map(|n| (n.name.clone(), self.path(&n.name)));
        let listed = session::read(&self.config, "list the contenders", || {
            let confirmed = mine
                .as_ref()
                .map(|(_, path)| session::confirm(client, path));
            let listed = client.list_children(&self.parent);
            async move {
                let confirmed = match confirmed {
                    None => false,
                    Some(confirmed) => match confirmed.await {
                        Ok(()) => true,
                        // My node is gone from the ensemble's current state.
                        Err(ZkError::NoNode) => return Ok((Vec::new(), false)),
                        Err(e) => return Err(e),
                    },
                };
                listed.await.map(|children| (children, confirmed))
            }
        });
        match listed.await? {
            Ok((children, confirmed)) => Ok(Listing {
                children,
                sent,
                confirmed: mine.filter(|_| confirmed).map(|(name, _)| name),
            }),
            // The parent is gone, so my node is too.
            Err(ZkError::NoNode) => Ok(Listing {
                children: Vec::new(),
                sent,
                confirmed: None,
            }),
            Err(e) => Err(failed(e, "list the contenders")),
        }
    }

    /// When the grant may count from: `sent` if `listing` confirmed the node I hold, else after
    /// a [`session::confirm`] of it now (a watch event or a listing from a follower proves
    /// nothing about the leader's view of my session).
    async fn confirmed_since(
        &self,
        listing: Option<&Listing>,
        sent: Instant,
    ) -> std::result::Result<Instant, Failed> {
        let Some(node) = &self.node else {
            return Err(Failed::SessionGone);
        };
        if listing.is_some_and(|l| l.confirmed.as_deref() == Some(node.name.as_str())) {
            return Ok(sent);
        }
        let path = self.path(&node.name);
        let client = &self.session.client;
        let sent = self.session.note_send();
        match session::read(&self.config, "confirm the contender node", || {
            session::confirm(client, &path)
        })
        .await?
        {
            Ok(()) => Ok(sent),
            Err(ZkError::NoNode) => Err(Failed::SessionGone),
            Err(e) => Err(failed(e, "confirm the contender node")),
        }
    }

    /// Where my node stands; adopts the lowest node carrying my prefix and deletes the others.
    fn place(&mut self, listing: &Listing) -> Position {
        let position = names::position(&listing.children, &self.prefix);
        let (mine, extras) = match &position {
            Position::First { mine, extras } | Position::Behind { mine, extras, .. } => {
                (mine, extras)
            }
            Position::Gone => return position,
        };
        if self.node.as_ref().is_none_or(|n| n.name != mine.name) {
            self.node = Some(Node {
                name: mine.name.clone(),
                czxid: None,
            });
        }
        for extra in extras {
            tracing::debug!(node = %extra.name, "deleting a duplicate of my contender node");
            cleanup::spawn_delete(
                self.session.clone(),
                self.config.clone(),
                self.path(&extra.name),
            );
        }
        position
    }

    /// My node's czxid: from the create's reply when it is trustworthy, else read back.
    async fn czxid(&mut self) -> std::result::Result<Czxid, Failed> {
        let Some(node) = &self.node else {
            return Err(Failed::SessionGone);
        };
        if let Some(czxid) = node.czxid {
            return Ok(czxid);
        }
        let path = self.path(&node.name);
        let client = &self.session.client;
        let stat = match session::read(&self.config, "read back the contender node", || {
            client.check_stat(&path)
        })
        .await?
        {
            Ok(stat) => stat,
            Err(e) => return Err(failed(e, "read back the contender node")),
        };
        match stat {
            Some(stat) if stat.ephemeral_owner == self.session.id => {
                let czxid = Czxid::new(stat.czxid)?;
                if let Some(node) = &mut self.node {
                    node.czxid = Some(czxid);
                }
                Ok(czxid)
            }
            _ => Err(Failed::SessionGone),
        }
    }

    /// Turns my node into a grant whose tenure and deadline count from `sent`.
    async fn grant(
        &mut self,
        tenures: &Tenures,
        ttl: Duration,
        sent: Instant,
    ) -> std::result::Result<Grant, Failed> {
        let czxid = self.czxid().await?;
        let fence =
            leasehold_core::FencingToken::to_fence(&czxid, BACKEND, self.config.client.epoch)?;
        let Some(node) = &self.node else {
            return Err(Failed::SessionGone);
        };
        let held = Held::new(
            self.path(&node.name),
            czxid,
            &self.session,
            self.config.clone(),
            saturating_add(sent, ttl),
        );
        tenures.watch(&held, saturating_add(sent, ttl));
        let loss = node_watch::watch(held.clone(), &self.session, ttl);
        self.armed = false;
        if self.uncertain {
            // A late duplicate may still appear: sweep for it, keeping my node.
            self.sweep_duplicates(node.name.clone());
        }
        let deadline = self
            .config
            .deadline(sent, ttl, self.session.quiet_before(sent));
        Ok(
            leasehold_core::backend::grant(self.key.clone(), self.owner, fence, ttl, deadline)
                .with_backend_state(held)
                .with_loss_signal(loss),
        )
    }

    fn sweep_duplicates(&self, keep: String) {
        let (session, config, parent, prefix) = (
            self.session.clone(),
            self.config.clone(),
            self.parent.clone(),
            self.prefix.clone(),
        );
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                tokio::time::sleep(session.ttl).await;
                if let Ok(Ok(children)) = tokio::time::timeout(
                    config.client.request_timeout,
                    session.client.list_children(&parent),
                )
                .await
                {
                    for child in children
                        .iter()
                        .filter(|c| c.starts_with(&prefix) && **c != keep)
                    {
                        cleanup::delete_until_gone(&session, &config, &format!("{parent}/{child}"))
                            .await;
                    }
                }
            });
        }
    }

    /// Deletes my node now (someone else holds the key and I do not wait).
    async fn withdraw(&mut self) {
        let Some(node) = &self.node else { return };
        let path = self.path(&node.name);
        let deleted = bounded_raw(&self.config, self.session.client.delete(&path, None)).await;
        if matches!(deleted, Ok(Ok(()) | Err(ZkError::NoNode))) && !self.uncertain {
            self.armed = false;
        }
    }

    /// One attempt without waiting: `None` when someone else holds the key.
    ///
    /// The grant counts from `started`, when the caller asked, not from the create: opening the
    /// TTL's session first may take a while, and the caller's view of "before the request" is
    /// the safe one.
    pub async fn try_once(
        mut self,
        tenures: &Tenures,
        ttl: Duration,
        started: Instant,
    ) -> std::result::Result<Option<Grant>, Failed> {
        let listing = self.enqueue().await?;
        match self.place(&listing) {
            Position::First { .. } => {
                let sent = self
                    .confirmed_since(Some(&listing), started.min(listing.sent))
                    .await?;
                self.grant(tenures, ttl, sent).await.map(Some)
            }
            Position::Behind { .. } => {
                self.withdraw().await;
                Ok(None)
            }
            Position::Gone => Err(Failed::SessionGone),
        }
    }

    /// Queues and waits, watching only the node just ahead of mine, until my node is first or
    /// `give_up` passes.
    pub async fn wait(
        mut self,
        tenures: &Tenures,
        ttl: Duration,
        started: Instant,
        give_up: Instant,
    ) -> std::result::Result<Grant, Failed> {
        let mut listing = self.enqueue().await?;
        // Granted at once, the grant counts from the call (as in `try_once`); after a wait, from
        // the listing that found my node first.
        listing.sent = listing.sent.min(started);
        loop {
            let (mine, predecessor, ahead) = match self.place(&listing) {
                Position::First { .. } => {
                    let sent = self.confirmed_since(Some(&listing), listing.sent).await?;
                    return self.grant(tenures, ttl, sent).await;
                }
                Position::Gone => return Err(Failed::SessionGone),
                Position::Behind {
                    mine,
                    predecessor,
                    ahead,
                    ..
                } => (mine, predecessor, ahead),
            };
            if Instant::now() >= give_up {
                return Err(self.time_out(started).await);
            }
            let client = self.session.client.clone();
            let sent = self.session.note_send();
            // With only the predecessor ahead, also watch my own node, in the same round trip
            // (sent first). ZooKeeper delivers one session's events in transaction order, so
            // if the predecessor's deletion arrives while my own watch has not fired, my node
            // outlived every contender ahead of it: it is first, and no listing is needed.
            let my_path = self.path(&mine.name);
            let own = (ahead == 1).then(|| client.get_and_watch_data(&my_path));
            // A data watch on the predecessor alone, so a release wakes one waiter, not the
            // herd. It fires on the node's deletion, on a data change, and on the session's end;
            // any of them means "look again". A data watch rather than an exists watch (as
            // Curator does): it is set only if the node exists, and it fails visibly for a node
            // this client may not read, whose events ZooKeeper would silently not deliver.
            let path = self.path(&predecessor.name);
            let watched = session::read(&self.config, "watch the contender ahead", || {
                client.get_and_watch_data(&path)
            })
            .await?;
            let own = match own {
                None => None,
                Some(own) => match bounded_raw(&self.config, own).await? {
                    Ok((_, _, watcher)) => Some(Box::pin(watcher.changed())),
                    Err(ZkError::NoNode) => return Err(Failed::SessionGone),
                    Err(_) => None,
                },
            };
            let watcher = match watched {
                Ok((_, _, watcher)) => Some(watcher),
                Err(ZkError::NoNode) => None,
                Err(ZkError::NoAuth) => {
                    // Another principal's node: watch the parent's children instead.
                    let listed = session::read(&self.config, "watch the contenders", || {
                        client.list_and_watch_children(&self.parent)
                    })
                    .await?;
                    match listed {
                        Ok((children, watcher)) if children.contains(&predecessor.name) => {
                            Some(watcher)
                        }
                        Ok(_) | Err(ZkError::NoNode) => None,
                        Err(e) => return Err(failed(e, "watch the contenders")),
                    }
                }
                Err(e) => return Err(failed(e, "watch the contender ahead")),
            };
            if let Some(watcher) = watcher {
                let event = tokio::select! {
                    event = watcher.changed() => event,
                    _ = tokio::time::sleep_until(give_up) => {
                        return Err(self.time_out(started).await);
                    }
                };
                if let Some(mut own) = own {
                    let mine_untouched = poll_once(&mut own).await.is_none();
                    // The answers to the watch requests proved the session alive after `sent`;
                    // granted from that, the deadline would be short after a long wait, so
                    // only a quick hand-off takes this path.
                    if event.event_type == EventType::NodeDeleted
                        && mine_untouched
                        && Instant::now() < saturating_add(sent, ttl / 4)
                    {
                        let sent = self.confirmed_since(None, sent).await?;
                        return self.grant(tenures, ttl, sent).await;
                    }
                }
            }
            listing = self.list().await?;
        }
    }

    /// Gives up waiting: deletes my node now, and reports the timeout.
    async fn time_out(&mut self, started: Instant) -> Failed {
        self.withdraw().await;
        Failed::Error(Error::Timeout {
            key: self.key.to_string(),
            waited: started.elapsed(),
        })
    }
}

/// Whether any contender queues under `parent`, by a listing alone (no node of mine): for a
/// key known to be held, where queueing a node only to delete it again would cost two writes
/// and wake whoever queued behind it. A `sync` goes out first in the same round trip, so the
/// listing is not older than the request (a "held" answer is not stale by more than that; a
/// "free" one is only a reason to try, and the try itself is a write).
pub(crate) async fn someone_queued(
    config: &ZkConfig,
    session: &Session,
    parent: &str,
) -> std::result::Result<bool, Failed> {
    let client = &session.client;
    let listed = session::read(config, "list the contenders", || {
        let synced = client.sync(parent);
        let listed = client.list_children(parent);
        async move {
            synced.await?;
            listed.await
        }
    });
    match listed.await? {
        Ok(children) => Ok(!names::queue(&children).is_empty()),
        Err(ZkError::NoNode) => Ok(false),
        Err(e) => Err(failed(e, "list the contenders")),
    }
}

/// Runs a client request within the request timeout; the outer error is the timeout.
async fn bounded_raw<T>(
    config: &ZkConfig,
    work: impl Future<Output = std::result::Result<T, ZkError>>,
) -> std::result::Result<std::result::Result<T, ZkError>, Failed> {
    let timeout = config.client.request_timeout;
    tokio::time::timeout(timeout, work)
        .await
        .map_err(|_| Failed::Error(errors::timed_out("a ZooKeeper request", timeout)))
}

#[cfg(test)]
mod tests {
    use leasehold_conformance::kit::{OrFail, TestResult};
    use leasehold_servers::ZkServer;
    use zookeeper_client::Acls;

    use super::*;
    use crate::session::{prepare, Sessions};

    /// Protected mode's lookup: nodes created under my UUID whose replies I never saw (here made
    /// on my own session behind my back) are found by the UUID; the lowest becomes mine, with
    /// its czxid read back from the server, and the other is deleted.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn finds_its_nodes_by_uuid_and_keeps_only_the_lowest() -> TestResult {
        let server = tokio::task::spawn_blocking(ZkServer::start)
            .await
            .or_fail("the ZooKeeper server's start task")?
            .or_fail("ZooKeeper must start for this test")?;
        let config = ZkConfig::from_url(&format!("zk://{}/lookup", server.connect_string()))
            .or_fail("the zk URL")?;
        prepare(&config).await.or_fail("preparing the chroot")?;
        let config = Arc::new(config);
        let sessions = Sessions::new(config.clone());
        let ttl = Duration::from_secs(2);
        let session = sessions.get(ttl).await.or_fail("the session")?;
        let owner = OwnerToken::generate().or_fail("a generated owner token")?;
        let parent = "/lookup/dup".to_string();
        let client = &session.client;
        client
            .create(
                &parent,
                &[],
                &CreateMode::Persistent.with_acls(Acls::anyone_all()),
            )
            .await
            .or_fail("creating the parent")?;
        let prefix = format!("{parent}/{}", names::contender_prefix(owner));
        let options = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
        let (first, seq) = client
            .create(&prefix, &[], &options)
            .await
            .or_fail("creating the first contender node")?;
        client
            .create(&prefix, &[], &options)
            .await
            .or_fail("creating the duplicate contender node")?;
        let lowest = format!("{}{seq}", names::contender_prefix(owner));

        let key = LockKey::new("dup").or_fail("the key dup")?;
        let mut contender = Contender::new(config, session.clone(), &key, parent.clone(), owner);
        let listing = contender
            .list()
            .await
            .map_err(|e| format!("listing the contenders: {e:?}"))?;
        assert_eq!(listing.children.len(), 2);
        match contender.place(&listing) {
            Position::First { mine, extras } => {
                assert_eq!(mine.name, lowest);
                assert_eq!(extras.len(), 1);
            }
            other => panic!("{other:?}"),
        }
        let tenures = Tenures::default();
        let grant = contender
            .grant(&tenures, ttl, listing.sent)
            .await
            .map_err(|e| format!("the grant: {e:?}"))?;
        assert_eq!(
            grant.fence().raw(),
            first.czxid as u64,
            "read back, not guessed"
        );
        let start = Instant::now();
        loop {
            let children = client
                .list_children(&parent)
                .await
                .or_fail("listing the parent's children")?;
            if children == vec![lowest.clone()] {
                break;
            }
            assert!(
                start.elapsed() < ttl,
                "the duplicate was not deleted: {children:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(())
    }
}
