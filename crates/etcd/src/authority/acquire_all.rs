//! A set of keys in one transaction: every key's contender written only if every key's prefix
//! is empty, exactly as exclusive as one try-acquire per key, all or none.

use super::*;

impl EtcdAuthority {
    /// One transaction for the whole set. Its compares say that no key at all lies under any
    /// of the set's prefixes (the compare of `try_acquire`, once per key), so a holder or a
    /// waiter on any one key, leasehold's or an `etcdctl lock` peer's, makes the set held. Its
    /// success branch writes one contender per key on the same session lease, so every key's
    /// fence is the transaction's revision, greater than any earlier revision of its key. Its
    /// failure branch reads the oldest key of each prefix, to find orphans of our own session
    /// (which `try_acquire` deletes before it answers "held").
    pub(super) async fn try_acquire_set(
        &self,
        keys: &[LockKey],
        ttl: Duration,
    ) -> Result<Option<Vec<Grant>>> {
        self.check_ttl(ttl)?;
        leasehold_core::backend::check_canonical(keys)?;
        if keys.len() > MAX_TXN_OPS {
            // etcd refuses a transaction with more compares (or puts) than `--max-txn-ops`.
            return Err(Error::Unsupported {
                backend: BACKEND,
                operation: format!(
                    "taking {} keys in one transaction (etcd's default limit is {MAX_TXN_OPS} \
                     operations per transaction)",
                    keys.len()
                ),
            });
        }
        let prefixes: Vec<String> = keys.iter().map(|k| self.inner.space.prefix(k)).collect();
        let timeout = self.timeout();
        let mut last_error = None;
        for _ in 0..SESSION_RETRIES {
            let session = self.session(ttl).await?;
            let Some(mut entries) = reserve_all(&session, &prefixes)? else {
                // The session ended between the lookup and the reservations.
                tokio::task::yield_now().await;
                continue;
            };
            let txn = Txn::new()
                .when(
                    prefixes
                        .iter()
                        .map(|prefix| {
                            Compare::create_revision(prefix.as_str(), CompareOp::Equal, 0)
                                .with_prefix()
                        })
                        .collect::<Vec<_>>(),
                )
                .and_then(
                    entries
                        .iter()
                        .map(|entry| {
                            TxnOp::put(
                                entry.name.as_str(),
                                stored::encode(entry.owner, None),
                                Some(on_lease(&session)),
                            )
                        })
                        .collect::<Vec<_>>(),
                )
                .or_else(
                    prefixes
                        .iter()
                        .map(|prefix| TxnOp::get(prefix.as_str(), Some(oldest())))
                        .collect::<Vec<_>>(),
                );
            let sent = Instant::now();
            let response = match write_all(&mut entries, &self.inner.client, timeout, txn).await {
                Ok(r) => r,
                Err(e) if errors::is_lease_gone(&e) => {
                    // The session's lease expired or was revoked under us: nothing was
                    // written; start a new session.
                    session.end();
                    entries.into_iter().for_each(Booked::forget);
                    last_error = Some(e);
                    continue;
                }
                Err(e) => return Err(e),
            };
            if response.succeeded() {
                let revision = response.header().map_or(0, |h| h.revision());
                // One revision for every key: checked once, before any grant is made, so a
                // fence out of range gives back the whole set (dropping `entries` withdraws
                // every key) rather than part of it.
                EtcdRevision::from_revision(revision)?
                    .to_fence(BACKEND, self.inner.config.client.epoch)?;
                return keys
                    .iter()
                    .zip(entries)
                    .map(|(key, entry)| self.grant(key, entry.won(revision), ttl, sent))
                    .collect::<Result<Vec<_>>>()
                    .map(Some);
            }
            entries.into_iter().for_each(Booked::forget);
            let mut orphans = Vec::new();
            for (op, prefix) in prefixes.iter().enumerate() {
                if let Some(header) = response.header() {
                    self.inner.seen.record(prefix, header.revision());
                }
                let holder = kvs(&response, op).into_iter().next();
                orphans.extend(holder.filter(|kv| is_orphan(&session, kv)));
            }
            if orphans.is_empty() {
                return Ok(None);
            }
            // The oldest key of some prefix is our own orphan: delete it and try again rather
            // than call the set held by ourselves.
            for kv in &orphans {
                Box::pin(delete_orphan(&self.inner.client, kv, timeout)).await?;
            }
        }
        Err(last_error.unwrap_or_else(|| Error::Backend {
            backend: BACKEND,
            message: "acquire (set): the session kept ending; try again".into(),
            retryable: true,
            source: None,
        }))
    }
}

/// Books one contender key per prefix, each with a fresh owner token; `None` if the session
/// ended part way (the keys booked so far are forgotten: nothing was written).
fn reserve_all(session: &Arc<Session>, prefixes: &[String]) -> Result<Option<Vec<Booked>>> {
    let mut entries = Vec::with_capacity(prefixes.len());
    for prefix in prefixes {
        let owner = OwnerToken::generate()?;
        match Booked::reserve(session, prefix, owner) {
            Some(entry) => entries.push(entry),
            None => {
                entries.into_iter().for_each(Booked::forget);
                return Ok(None);
            }
        }
    }
    Ok(Some(entries))
}

/// [`Booked::write`] for a whole set: the transaction runs in a task of its own, and if the
/// caller is gone when its answer comes, the task settles every key knowing the outcome (all
/// written, so all withdrawn; or none written, so all forgotten).
async fn write_all(
    entries: &mut [Booked],
    client: &Arc<Client>,
    timeout: Duration,
    txn: Txn,
) -> Result<TxnResponse> {
    let Some(first) = entries.first() else {
        return Err(Error::InvalidConfig {
            reason: "an empty set of keys".to_string(),
        });
    };
    let session = first.session.clone();
    let names: Arc<[(String, OwnerToken)]> =
        entries.iter().map(|e| (e.name.clone(), e.owner)).collect();
    let (tx, rx) = oneshot::channel();
    for entry in entries.iter_mut() {
        entry.in_flight = true;
    }
    let (task_client, task_session, task_names) = (client.clone(), session.clone(), names.clone());
    tokio::spawn(async move {
        let result = errors::txn(&task_client, "acquire (set)", timeout, txn).await;
        if let Err(result) = tx.send(result) {
            settle_abandoned_set(&task_session, &task_names, result);
        }
    });
    let mut answer = SetAnswer {
        rx,
        taken: false,
        session,
        names,
    };
    let result = (&mut answer.rx).await;
    answer.taken = true;
    for entry in entries.iter_mut() {
        entry.in_flight = false;
    }
    result.unwrap_or_else(|_| {
        Err(Error::Backend {
            backend: BACKEND,
            message: "acquire (set): the request's task ended without an answer".to_string(),
            retryable: true,
            source: None,
        })
    })
}

/// [`settle_abandoned`] for every key of a set: one transaction wrote all of them or none.
fn settle_abandoned_set(
    session: &Session,
    names: &[(String, OwnerToken)],
    result: Result<TxnResponse>,
) {
    match result {
        Ok(written) if written.succeeded() => {
            let revision = written.header().map(|h| h.revision());
            for (name, owner) in names {
                session.withdraw_later(name, *owner, revision);
            }
        }
        // The compares failed (nothing was written), or the lease is gone with its keys.
        Ok(_) => forget_all(session, names),
        Err(e) if errors::is_lease_gone(&e) => forget_all(session, names),
        // Unknown outcome, a whole request timeout after it was sent: delete by owner token.
        Err(_) => {
            for (name, owner) in names {
                session.withdraw_later(name, *owner, None);
            }
        }
    }
}

fn forget_all(session: &Session, names: &[(String, OwnerToken)]) {
    for (name, owner) in names {
        session.contenders.forget(name, *owner);
    }
}

/// [`Answer`] for a set: dropped before its answer was taken, it settles an answer already
/// sent; one sent later fails to arrive and the task settles it.
struct SetAnswer {
    rx: oneshot::Receiver<Result<TxnResponse>>,
    /// The caller read the answer: nothing left to settle here.
    taken: bool,
    session: Arc<Session>,
    names: Arc<[(String, OwnerToken)]>,
}

impl Drop for SetAnswer {
    fn drop(&mut self) {
        if self.taken {
            return;
        }
        self.rx.close();
        if let Ok(result) = self.rx.try_recv() {
            settle_abandoned_set(&self.session, &self.names, result);
        }
    }
}
