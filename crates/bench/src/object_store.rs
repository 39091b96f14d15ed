//! An object store (Azurite, the Azure Blob API): leasehold against the raw fenced pair on a
//! client of its own: read the key's object (its version and fence), a conditional put over
//! that version that raises the fence and marks it held, and a conditional put over the new
//! version that marks it free. Three requests: the least that still orders fences, since a put
//! that does not name the version it replaces could overwrite a holder's. No clock probe (the
//! raw pair never meets a held key), no peer (no lock library on object stores is in this
//! workspace's dependencies).

use std::sync::Arc;

use async_trait::async_trait;
use object_store::azure::MicrosoftAzureBuilder;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutPayload, UpdateVersion};

use crate::{Baseline, BoxError, RawPair, Subject};

/// Where the raw pair keeps its objects, apart from leasehold's.
const RAW_PREFIX: &str = "bench-raw";

#[derive(Debug)]
struct RawObjects(Arc<dyn ObjectStore>);

#[async_trait]
impl RawPair for RawObjects {
    fn name(&self) -> &'static str {
        "raw read + conditional put + conditional put"
    }

    fn baseline(&self) -> Baseline {
        Baseline::Raw { fenced: true }
    }

    async fn pair(&self, key: &str) -> Result<(), BoxError> {
        let path = Path::from(format!("{RAW_PREFIX}/{key}"));
        let (fence, over) = match self.0.get(&path).await {
            Ok(got) => {
                let version = UpdateVersion {
                    e_tag: got.meta.e_tag.clone(),
                    version: got.meta.version.clone(),
                };
                let body = got.bytes().await?;
                let text = std::str::from_utf8(&body)?;
                let fence: u64 = match text.split_once(' ') {
                    Some(("free", n)) => n.parse()?,
                    _ => return Err("raw key held".into()),
                };
                (fence, Some(version))
            }
            Err(object_store::Error::NotFound { .. }) => (0, None),
            Err(e) => return Err(e.into()),
        };
        let fence = fence + 1;
        let mode = over.map_or(PutMode::Create, PutMode::Update);
        let held = PutPayload::from(format!("held {fence}"));
        let taken = self.0.put_opts(&path, held, mode.into()).await?;
        let version = UpdateVersion {
            e_tag: taken.e_tag,
            version: taken.version,
        };
        let free = PutPayload::from(format!("free {fence}"));
        self.0
            .put_opts(&path, free, PutMode::Update(version).into())
            .await?;
        Ok(())
    }
}

/// `url` names Azurite (`az://container/prefix?account_name=...&endpoint=...`); the key is in
/// the environment, as leasehold's client reads it.
pub async fn subject(url: &str, endpoint: &str) -> Result<Subject, BoxError> {
    use leasehold_servers::object_stores::{AZURITE_ACCOUNT, BUCKET};
    let raw = MicrosoftAzureBuilder::from_env()
        .with_endpoint(endpoint.to_string())
        .with_allow_http(true)
        .with_account(AZURITE_ACCOUNT)
        .with_container_name(BUCKET)
        .build()?;
    Ok(Subject {
        authority: leasehold::connect(url).await?,
        raw: vec![Box::new(RawObjects(Arc::new(raw)))],
        concurrent_raw: None,
        server_ops: None,
        targets: true,
        raw_handoff: None,
    })
}
