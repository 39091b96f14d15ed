//! The protected resource: per key, a set of numbers and the greatest fence it accepted.
//!
//! It stands for the database, the payment API or the file that a lease protects. It lives on its
//! own server, apart from the authority under test, so faults of the authority never touch it:
//! a PostgreSQL table ([`PgSets`]) or objects in an object store behind the object gate
//! ([`ObjectSets`], on Azurite). With fences, a read is also a *claim*: it raises the key's fence
//! to the reader's or is refused, so an older holder's write that arrives between the new
//! holder's read and write is refused too (see `docs/workload.md`, "claim before reading"). The
//! unfenced control reads and writes without looking at fences, as a lock-only application
//! would.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;

mod object;
mod postgres;

pub use object::{ObjectSets, REQUEST_TIMEOUT, SCHEME};
pub use postgres::{PgSets, WORKER_APPLICATION};

/// The store a run's resource lives in, which the runner starts unless given one by URL.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ResourceKind {
    /// A table on a PostgreSQL server (`postgres://`): guarded writes in one transaction.
    #[default]
    Postgres,
    /// Objects on Azurite, Azure Blob's emulator (`azurite://host:port/container`), through
    /// the object gate: the store's conditional put refuses stale fences.
    Azurite,
}

impl ResourceKind {
    /// Every kind, in the order the command line lists them.
    pub const ALL: [ResourceKind; 2] = [ResourceKind::Postgres, ResourceKind::Azurite];

    /// The name the command line and the report use.
    pub fn name(self) -> &'static str {
        match self {
            ResourceKind::Postgres => "postgres",
            ResourceKind::Azurite => "azurite",
        }
    }

    /// The kind named `name`.
    pub fn parse(name: &str) -> Option<ResourceKind> {
        ResourceKind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// The kind of store `url` points at.
    pub fn of_url(url: &str) -> Result<ResourceKind, ResourceError> {
        match url.split_once("://").map(|(scheme, _)| scheme) {
            Some("postgres" | "postgresql") => Ok(ResourceKind::Postgres),
            Some(object::SCHEME) => Ok(ResourceKind::Azurite),
            _ => Err(format!(
                "a resource URL starts with postgres:// or {}://",
                object::SCHEME
            )
            .into()),
        }
    }
}

/// Connects to the resource at `url`, its rows namespaced by `run`.
pub async fn connect(url: &str, run: &str) -> Result<Arc<dyn SetResource>, ResourceError> {
    Ok(match ResourceKind::of_url(url)? {
        ResourceKind::Postgres => Arc::new(PgSets::connect(url, run).await?),
        ResourceKind::Azurite => Arc::new(ObjectSets::connect(url, run)?),
    })
}

/// Makes the store ready before any worker starts (PostgreSQL: the table; an object store's
/// container is the server's to create).
pub async fn prepare(url: &str) -> Result<(), ResourceError> {
    match ResourceKind::of_url(url)? {
        ResourceKind::Postgres => PgSets::create(url, "setup").await.map(drop),
        ResourceKind::Azurite => ObjectSets::connect(url, "setup").map(drop),
    }
}

/// What a claim or a write met.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome<T> {
    /// Done: the read set, or for a write the `last_fence` just before it (when fenced).
    Done(T),
    /// Refused: the resource had accepted `newest`, greater than the fence presented.
    Stale {
        /// The resource's `last_fence`.
        newest: u64,
    },
}

/// The resource's rows: per key, the set and `last_fence`.
pub type Rows = BTreeMap<String, (Vec<u64>, Option<u64>)>;

/// Errors of the resource, displayed into the history.
pub type ResourceError = Box<dyn std::error::Error + Send + Sync>;

/// The resource as the workers and the runner use it.
#[async_trait]
pub trait SetResource: Send + Sync {
    /// Reads `key`'s set. With `fence`, first raises `last_fence` to it in the same transaction,
    /// or refuses if a greater fence was accepted.
    async fn read(&self, key: &str, fence: Option<u64>)
        -> Result<Outcome<Vec<u64>>, ResourceError>;

    /// Replaces `key`'s set with `elements`. With `fence`, only if no greater fence was accepted;
    /// returns the `last_fence` held just before. Without, writes whatever the fences say.
    async fn write(
        &self,
        key: &str,
        elements: &[u64],
        fence: u64,
        fenced: bool,
    ) -> Result<Outcome<Option<u64>>, ResourceError>;

    /// Every key's set and `last_fence`, after the run.
    async fn final_state(&self) -> Result<Rows, ResourceError>;
}

/// The resource in memory, for runs whose workers are tasks of one process (the in-process
/// reference authority and its mutants).
#[derive(Debug, Default)]
pub struct MemorySets {
    rows: Mutex<Rows>,
}

impl MemorySets {
    fn rows(&self) -> std::sync::MutexGuard<'_, Rows> {
        self.rows.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[async_trait]
impl SetResource for MemorySets {
    async fn read(
        &self,
        key: &str,
        fence: Option<u64>,
    ) -> Result<Outcome<Vec<u64>>, ResourceError> {
        let mut rows = self.rows();
        let row = rows.entry(key.to_string()).or_default();
        if let Some(fence) = fence {
            if let Some(newest) = row.1.filter(|&n| n > fence) {
                return Ok(Outcome::Stale { newest });
            }
            row.1 = Some(fence);
        }
        Ok(Outcome::Done(row.0.clone()))
    }

    async fn write(
        &self,
        key: &str,
        elements: &[u64],
        fence: u64,
        fenced: bool,
    ) -> Result<Outcome<Option<u64>>, ResourceError> {
        let mut rows = self.rows();
        let row = rows.entry(key.to_string()).or_default();
        let prior = row.1;
        if fenced {
            if let Some(newest) = prior.filter(|&p| p > fence) {
                return Ok(Outcome::Stale { newest });
            }
            row.1 = Some(fence);
        } else {
            row.1 = Some(prior.map_or(fence, |p| p.max(fence)));
        }
        row.0 = elements.to_vec();
        Ok(Outcome::Done(if fenced { prior } else { None }))
    }

    async fn final_state(&self) -> Result<Rows, ResourceError> {
        Ok(self.rows().clone())
    }
}
