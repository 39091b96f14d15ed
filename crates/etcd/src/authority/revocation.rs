//! An operator's revoke: the holder's own contender key is deleted, compared by its create
//! revision, so its session lives on and nobody else's key is touched.

use super::*;

impl EtcdAuthority {
    /// Reads the holder (the oldest key under the lock's prefix, as inspect does), then deletes
    /// that key in a transaction that compares its create revision: a key created since under
    /// the same name (the holder's session acquiring again) is another grant and is spared,
    /// as release spares it (etcd #22082). The holder's watch on its key sees the delete and
    /// fires its loss signal; the next contender's key was created later, so its fence is
    /// greater.
    pub(super) async fn revoke_holder(&self, key: &LockKey) -> Result<Revoked> {
        let timeout = self.timeout();
        let prefix = self.inner.space.prefix(key);
        let found = errors::read_with_retry("revoke", timeout, || {
            let (mut kv, prefix) = (self.inner.client.kv_client(), prefix.clone());
            async move { kv.get(prefix, Some(oldest())).await }
        })
        .await?;
        let Some(holder) = found.kvs().first() else {
            return Ok(Revoked::WasFree);
        };
        let name = holder.key_str().map_err(|e| Error::Backend {
            backend: BACKEND,
            message: format!("a contender key under {prefix} is not UTF-8: {e}"),
            retryable: false,
            source: None,
        })?;
        let revision = holder.create_revision();
        let fence = EtcdRevision::from_revision(revision)?
            .to_fence(BACKEND, self.inner.config.client.epoch)?;
        let guard = Compare::create_revision(name, CompareOp::Equal, revision);
        if delete_contender(&self.inner.client, name, guard, timeout).await? {
            Ok(Revoked::Revoked { fence })
        } else {
            // The holder it read went meanwhile (released, or its session ended).
            Ok(Revoked::WasFree)
        }
    }
}
