//! The resource as objects in an object store, each written through the object gate: one
//! object per run and key, its content the set, its fence in the gate's header line.
//!
//! The workload then proves the gate the way it proves the PostgreSQL table: a holder paused
//! past its lease writes late, and the store's own conditional put must refuse it. The store
//! is Azurite (Azure Blob's emulator, started by the runner) addressed as
//! `azurite://127.0.0.1:<port>/<container>` with Azurite's published development account.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::TryStreamExt;
use leasehold_core::{Fence, FenceSafety, Guarded};
use leasehold_gate_object::ObjectGate;
use leasehold_servers::object_stores::{AZURITE_ACCOUNT, AZURITE_KEY};
use object_store::azure::MicrosoftAzureBuilder;
use object_store::path::Path;
use object_store::{ClientOptions, ObjectStore, RetryConfig};

use super::{Outcome, ResourceError, Rows, SetResource};

/// The URL scheme of a resource on Azurite.
pub const SCHEME: &str = "azurite";

/// How long one request to the store may take. A request the store has not answered by then
/// fails at the client, and its outcome is unknown: the store may still apply it.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(1);

/// How many times the control's plain write reads and writes again when another writer raised
/// the fence in between.
const CONTROL_ATTEMPTS: u32 = 32;

/// Sets kept as objects under `<run>/`, every write and claim through an [`ObjectGate`].
#[derive(Debug, Clone)]
pub struct ObjectSets {
    gate: ObjectGate,
    run: String,
}

impl ObjectSets {
    /// Connects to the store `url` names (`azurite://host:port/container`). No request is made:
    /// the container must exist (Azurite's harness creates it).
    pub fn connect(url: &str, run: &str) -> Result<Self, ResourceError> {
        let parsed = url::Url::parse(url)?;
        if parsed.scheme() != SCHEME {
            return Err(format!("{url}: not an {SCHEME}:// resource").into());
        }
        let host = parsed.host_str().ok_or("the resource URL has no host")?;
        let port = parsed.port().ok_or("the resource URL has no port")?;
        let container = parsed.path().trim_matches('/');
        if container.is_empty() {
            return Err("the resource URL names no container".into());
        }
        let store = MicrosoftAzureBuilder::new()
            .with_endpoint(format!("http://{host}:{port}/{AZURITE_ACCOUNT}"))
            .with_account(AZURITE_ACCOUNT)
            .with_access_key(AZURITE_KEY)
            .with_container_name(container)
            // The client options replace any set before, `allow_http` among them.
            .with_client_options(
                ClientOptions::new()
                    .with_allow_http(true)
                    .with_timeout(REQUEST_TIMEOUT)
                    .with_connect_timeout(REQUEST_TIMEOUT),
            )
            // No retries by the store's client: a request that timed out is reported as such,
            // never resent behind the worker's back, so the history says what was sent.
            .with_retry(RetryConfig {
                max_retries: 0,
                ..RetryConfig::default()
            })
            .build()?;
        Ok(ObjectSets {
            gate: ObjectGate::new(Arc::new(store)),
            run: run.to_string(),
        })
    }

    fn path(&self, key: &str) -> Path {
        Path::from(format!("{}/{key}", self.run))
    }

    /// The set and fence of `key`'s object; `None` when there is none.
    async fn current(&self, key: &str) -> Result<Option<(Vec<u64>, u64)>, ResourceError> {
        match self.gate.read(&self.path(key)).await? {
            Some(object) => Ok(Some((decode(&object.content)?, object.fence))),
            None => Ok(None),
        }
    }
}

/// A fence the worker got from the authority, as the gate takes it (the gate compares values
/// only; the safety is the backend's business and plays no part here).
fn as_fence(value: u64) -> Result<Fence, ResourceError> {
    Ok(Fence::from_value(value, FenceSafety::Linearizable)?)
}

/// A set as the object's content: decimal numbers separated by commas.
fn encode(elements: &[u64]) -> Vec<u8> {
    elements
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(",")
        .into_bytes()
}

fn decode(content: &[u8]) -> Result<Vec<u64>, ResourceError> {
    let text = std::str::from_utf8(content)?;
    if text.is_empty() {
        return Ok(Vec::new());
    }
    text.split(',')
        .map(|n| {
            n.parse::<u64>()
                .map_err(|e| format!("`{n}` in a set: {e}").into())
        })
        .collect()
}

#[async_trait]
impl SetResource for ObjectSets {
    async fn read(
        &self,
        key: &str,
        fence: Option<u64>,
    ) -> Result<Outcome<Vec<u64>>, ResourceError> {
        let Some(fence) = fence else {
            return Ok(Outcome::Done(
                self.current(key)
                    .await?
                    .map(|(set, _)| set)
                    .unwrap_or_default(),
            ));
        };
        if let Guarded::Stale { newest } =
            self.gate.claim(&self.path(key), as_fence(fence)?).await?
        {
            return Ok(Outcome::Stale { newest });
        }
        // The claim and the read are two requests, but the object's fence only grows: a read
        // that still finds this fence finds what the claim kept (nobody else may write under
        // it), and one that finds a greater fence means a newer holder claimed in between.
        match self.current(key).await? {
            Some((set, at)) if at == fence => Ok(Outcome::Done(set)),
            Some((_, newest)) if newest > fence => Ok(Outcome::Stale { newest }),
            Some((_, at)) => Err(format!(
                "{key}: claimed at fence {fence}, then read fence {at}: the store went back"
            )
            .into()),
            None => Err(format!("{key}: claimed at fence {fence}, then found no object").into()),
        }
    }

    async fn write(
        &self,
        key: &str,
        elements: &[u64],
        fence: u64,
        fenced: bool,
    ) -> Result<Outcome<Option<u64>>, ResourceError> {
        let path = self.path(key);
        let content = encode(elements);
        if fenced {
            // The fence held before is not reported: the gate decides on the version it read
            // and says only whether it wrote, so the checker judges by the fences it saw
            // accepted before this write began.
            return Ok(
                match self.gate.write(&path, as_fence(fence)?, &content).await? {
                    Guarded::Accepted => Outcome::Done(None),
                    Guarded::Stale { newest } => Outcome::Stale { newest },
                },
            );
        }
        // The control writes whatever the fences say: under the greater of its fence and the
        // object's, so the gate never refuses it (the fence kept is only there for the final
        // state to show the newest fence that wrote).
        for _ in 0..CONTROL_ATTEMPTS {
            let over = self
                .current(key)
                .await?
                .map_or(fence, |(_, f)| f.max(fence));
            if self.gate.write(&path, as_fence(over)?, &content).await? == Guarded::Accepted {
                return Ok(Outcome::Done(None));
            }
        }
        Err(format!("{key}: the control's write lost {CONTROL_ATTEMPTS} races in a row").into())
    }

    async fn final_state(&self) -> Result<Rows, ResourceError> {
        let prefix = Path::from(self.run.as_str());
        let listed: Vec<_> = self.gate.store().list(Some(&prefix)).try_collect().await?;
        let mut rows = Rows::new();
        for meta in listed {
            let Some(key) = meta
                .location
                .as_ref()
                .strip_prefix(&format!("{}/", self.run))
                .map(str::to_string)
            else {
                continue;
            };
            if let Some((set, fence)) = self.current(&key).await? {
                rows.insert(key, (set, Some(fence)));
            }
        }
        Ok(rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_set_round_trips_through_the_content() -> Result<(), ResourceError> {
        for set in [vec![], vec![0], vec![1, 22, u64::MAX]] {
            assert_eq!(decode(&encode(&set))?, set);
        }
        assert!(decode(b"1,,2").is_err());
        Ok(())
    }

    #[test]
    fn only_an_azurite_url_with_a_container_connects() {
        for bad in [
            "postgres://127.0.0.1:5432/x",
            "azurite://127.0.0.1/leasehold",
            "azurite://127.0.0.1:10000/",
        ] {
            assert!(ObjectSets::connect(bad, "r").is_err(), "{bad}");
        }
        assert!(ObjectSets::connect("azurite://127.0.0.1:10000/leasehold", "r").is_ok());
    }
}
