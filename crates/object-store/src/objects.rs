//! The store requests the authority makes: read a lease object, write it conditionally, read
//! the store's clock, list. Each is bounded by the request timeout.

use std::future::Future;
use std::sync::Arc;

use leasehold_core::{Error, Instant, LockKey, Result};
use leasehold_gate_object::map_error_for;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, UpdateVersion};

use crate::names::Names;
use crate::record::Record;
use crate::store_clock::ClockCache;
use crate::BACKEND;

/// A lease object as read: its record, the version a conditional write compares, and its
/// last-modified second by the store's clock.
#[derive(Clone, Debug)]
pub(crate) struct Seen {
    pub(crate) record: Record,
    pub(crate) version: UpdateVersion,
    pub(crate) last_modified: i64,
}

/// What a conditional write found.
#[derive(Debug)]
pub(crate) enum Put {
    /// Written; the object's new version.
    Done(UpdateVersion),
    /// Someone wrote (or created) the object since the version given: nothing was written by
    /// this request. (A write of ours that the store's client sent again after a lost answer
    /// also ends here; the caller reads and recognises it.)
    Conflict,
}

/// The store and the names in it.
#[derive(Debug)]
pub(crate) struct Objects {
    pub(crate) store: Arc<dyn ObjectStore>,
    pub(crate) names: Names,
    pub(crate) timeout: std::time::Duration,
    pub(crate) clock: ClockCache,
}

impl Objects {
    /// `request` bounded by the request timeout: past it, [`Error::Unavailable`].
    pub(crate) async fn bounded<T>(
        &self,
        operation: &str,
        request: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        match tokio::time::timeout(self.timeout, request).await {
            Ok(answer) => answer,
            Err(_) => Err(Error::request_timeout(BACKEND, operation, self.timeout)),
        }
    }

    /// The lease object of `key`, if there is one.
    pub(crate) async fn read(&self, key: &LockKey) -> Result<Option<Seen>> {
        let path = self.names.lease(key);
        self.bounded("read", async {
            let got = match self.store.get(&path).await {
                Ok(got) => got,
                Err(object_store::Error::NotFound { .. }) => return Ok(None),
                Err(e) => return Err(map_error_for(BACKEND, e, "read", path.as_ref())),
            };
            let version = UpdateVersion {
                e_tag: got.meta.e_tag.clone(),
                version: got.meta.version.clone(),
            };
            let last_modified = got.meta.last_modified.timestamp();
            let body = got
                .bytes()
                .await
                .map_err(|e| map_error_for(BACKEND, e, "read", path.as_ref()))?;
            Ok(Some(Seen {
                record: Record::decode(path.as_ref(), &body)?,
                version,
                last_modified,
            }))
        })
        .await
    }

    /// Writes `record` as `key`'s lease object: created if `over` is `None`, else only over that
    /// version.
    pub(crate) async fn put(
        &self,
        key: &LockKey,
        record: &Record,
        over: Option<&UpdateVersion>,
    ) -> Result<Put> {
        let path = self.names.lease(key);
        let mode = match over {
            None => PutMode::Create,
            Some(version) => PutMode::Update(version.clone()),
        };
        let body = PutPayload::from(record.encode()?);
        let options = PutOptions {
            mode,
            ..PutOptions::default()
        };
        self.bounded("conditional write", async {
            match self.store.put_opts(&path, body, options).await {
                Ok(put) => Ok(Put::Done(UpdateVersion::from(put))),
                Err(
                    object_store::Error::Precondition { .. }
                    | object_store::Error::AlreadyExists { .. },
                ) => Ok(Put::Conflict),
                // An update of an object that is gone (a store that forgot it): not ours.
                Err(object_store::Error::NotFound { .. }) if over.is_some() => Ok(Put::Conflict),
                Err(object_store::Error::NotImplemented { .. }) => Err(Error::Backend {
                    backend: BACKEND,
                    message: format!(
                        "the store {} cannot write {path} conditionally (no \
                         PutMode::Create/Update), so it cannot be an authority",
                        leasehold_gate_object::redact(&self.store.to_string())
                    ),
                    retryable: false,
                    source: None,
                }),
                Err(e) => Err(map_error_for(
                    BACKEND,
                    e,
                    "conditional write of",
                    path.as_ref(),
                )),
            }
        })
        .await
    }

    /// The store's now, at least: the last-modified second of a fresh write of `key`'s clock
    /// object (see `store_clock`).
    pub(crate) async fn store_now(&self, key: &LockKey) -> Result<i64> {
        let path = self.names.clock(key);
        let second = self
            .bounded("clock probe", async {
                self.store
                    .put(&path, PutPayload::from_static(b"leasehold clock probe"))
                    .await
                    .map_err(|e| {
                        map_error_for(BACKEND, e, "clock probe write of", path.as_ref())
                    })?;
                let meta =
                    self.store.head(&path).await.map_err(|e| {
                        map_error_for(BACKEND, e, "clock probe read of", path.as_ref())
                    })?;
                Ok(meta.last_modified.timestamp())
            })
            .await?;
        self.clock.record(second, Instant::now());
        Ok(second)
    }

    /// The lease objects directly under the prefix.
    pub(crate) async fn list(&self) -> Result<Vec<Path>> {
        let prefix = self.names.prefix();
        let listed = self
            .bounded("list", async {
                let at = (!prefix.as_ref().is_empty()).then_some(prefix);
                self.store
                    .list_with_delimiter(at)
                    .await
                    .map_err(|e| map_error_for(BACKEND, e, "list", prefix.as_ref()))
            })
            .await?;
        Ok(listed.objects.into_iter().map(|o| o.location).collect())
    }
}
