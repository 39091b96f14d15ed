//! A set of keys in one script: every lock key checked, then all taken, each with its own
//! fence counter, or none (see [`crate::scripts::ACQUIRE_ALL`]).

use redis::cluster_routing::Slot;

use super::*;

impl RedisAuthority {
    /// One `ACQUIRE_ALL` script for the whole set, then `WAIT` for replicas if configured. On
    /// a Redis Cluster the set must lie in one slot (keys that share a hash tag), which one
    /// script can touch; any other set is `Unsupported` before anything is sent.
    pub(super) async fn try_acquire_set(
        &self,
        keys: &[LockKey],
        ttl: Duration,
    ) -> Result<Option<Vec<Grant>>> {
        TTL.check(ttl)?;
        leasehold_core::backend::check_canonical(keys)?;
        let layout = &self.inner.config.layout;
        let lock_keys: Vec<String> = keys.iter().map(|k| layout.lock_key(k)).collect();
        if self.inner.config.is_cluster() {
            one_slot(&lock_keys)?;
        }
        let tokens = keys
            .iter()
            .map(|_| OwnerToken::generate())
            .collect::<Result<Vec<_>>>()?;
        let hexes: Vec<String> = tokens.iter().map(hex).collect();
        let fence_keys: Vec<String> = lock_keys
            .iter()
            .map(|k| KeyLayout::fence_key_of(k))
            .collect();
        let script_keys: Vec<&str> = lock_keys
            .iter()
            .zip(&fence_keys)
            .flat_map(|(lock, fence)| [lock.as_str(), fence.as_str()])
            .collect();
        let ttl_ms = ttl.as_millis().to_string();
        let args: Vec<&str> = std::iter::once(ttl_ms.as_str())
            .chain(hexes.iter().map(String::as_str))
            .collect();
        let sent = Instant::now();
        let give_up = saturating_add(sent, self.timeout());
        let what = "acquire (set)";
        let Conn { id, con, .. } = self.connection(what, give_up).await?;
        // From here until the outcome is known, a timeout or a cancellation may leave leases at
        // the server that nobody was told about: the guard then releases every one.
        let mut pending = PendingSet {
            inner: &self.inner,
            con,
            lock_keys: &lock_keys,
            tokens: &hexes,
            ttl,
            armed: true,
        };
        let cluster = matches!(pending.con, Connection::Cluster(_));
        let run =
            self.inner
                .scripts
                .acquire_all
                .run::<Ints, _, _>(&mut pending.con, &script_keys, &args);
        let fences = match tokio::time::timeout_at(give_up, run).await {
            Err(_) => {
                self.inner.link.discard(id);
                return Err(errors::timed_out(what, self.timeout()));
            }
            Ok(Err(e)) => {
                if breaks_connection(&e) {
                    self.inner.link.discard(id);
                } else {
                    // The server answered with an error: the script took nothing.
                    pending.armed = false;
                    if not_the_primary(&e) || (cluster && is_redirect(&e)) {
                        self.inner.link.discard(id);
                    }
                }
                return Err(errors::map_on(e, what, cluster));
            }
            Ok(Ok(Ints(fences))) => fences,
        };
        if fences.is_empty() {
            pending.armed = false;
            return Ok(None);
        }
        // From here an early return (a reply of the wrong length, a fence out of range, a
        // failed WAIT) drops the armed guard, which releases every key.
        if fences.len() != keys.len() {
            return Err(Error::Backend {
                backend: BACKEND,
                message: format!(
                    "{what}: the script answered {} fences for {} keys",
                    fences.len(),
                    keys.len()
                ),
                retryable: true,
                source: None,
            });
        }
        let epoch = self.inner.config.client.epoch;
        let fences = fences
            .into_iter()
            .map(|reply| RedisFence::from_reply(reply)?.to_fence(BACKEND, epoch))
            .collect::<Result<Vec<_>>>()?;
        self.wait_for_replicas(&mut pending.con, id, give_up)
            .await?;
        pending.armed = false;
        let deadline = self.inner.config.client.safety_margin.deadline(sent, ttl);
        let grants = keys
            .iter()
            .zip(tokens)
            .zip(fences)
            .map(|((key, owner), fence)| {
                leasehold_core::backend::grant(key.clone(), owner, fence, ttl, deadline)
            });
        Ok(Some(grants.collect()))
    }
}

/// `Ok` when every lock key hashes to one Redis Cluster slot (their hash tags agree), which one
/// script may touch; `Unsupported` otherwise.
fn one_slot(lock_keys: &[String]) -> Result<()> {
    let mut slots = lock_keys.iter().map(Slot::for_key);
    let first = slots.next();
    if slots.all(|slot| Some(slot) == first) {
        return Ok(());
    }
    Err(Error::Unsupported {
        backend: BACKEND,
        operation: "taking keys on different Redis Cluster slots in one script (keys that \
                    share a hash tag, such as `a}1` and `a}2`, share a slot)"
            .to_string(),
    })
}

/// [`Pending`] for a set: dropped while armed, it sends one compare-and-delete per key, each
/// for its own owner token, on the same connection, so that Redis runs them right after the
/// acquisition if that ever runs. Bounded by the TTL: after it, the leases are gone anyway.
struct PendingSet<'a> {
    inner: &'a Inner,
    con: Connection,
    lock_keys: &'a [String],
    tokens: &'a [String],
    ttl: Duration,
    armed: bool,
}

impl Drop for PendingSet<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let script = self.inner.scripts.release.clone();
        let taken: Vec<(String, String, String)> = self
            .lock_keys
            .iter()
            .zip(self.tokens)
            .map(|(lock_key, token)| {
                let channel = self.inner.channel_of(lock_key);
                (lock_key.clone(), token.clone(), channel)
            })
            .collect();
        let (mut con, ttl) = (self.con.clone(), self.ttl);
        let waiters = self.inner.subscription.waiters().clone();
        runtime.spawn(async move {
            let release_all = async {
                for (lock_key, token, channel) in &taken {
                    let value_key = KeyLayout::value_key_of(lock_key);
                    let waiters_key = KeyLayout::waiters_key_of(lock_key);
                    let (keys, args) = (
                        [lock_key.as_str(), &value_key, &waiters_key],
                        [token.as_str(), channel, waiters.me()],
                    );
                    let released = script.run::<i64, _, _>(&mut con, &keys, &args).await;
                    if let Ok(released::ANNOUNCED | released::UNANNOUNCED) = released {
                        tracing::debug!(%lock_key, "released a lease whose set acquisition had no answer");
                        waiters.wake(lock_key);
                    }
                }
            };
            if tokio::time::timeout(ttl, release_all).await.is_err() {
                tracing::trace!("the releases after an unanswered set acquisition ran out of time");
            }
        });
    }
}
