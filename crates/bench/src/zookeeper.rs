//! ZooKeeper: leasehold against the raw create-ephemeral-sequential + getChildren + delete
//! triple, and against zookeeper-client's own Curator-compatible lock recipe (`Client::lock`),
//! all on the same server, each client with its own session.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold::Instrumented;
use leasehold_zookeeper::{ZkAuthority, ZkConfig};
use zookeeper_client::{Acls, Client, CreateMode, LockOptions, LockPrefix};

use crate::{BoxError, RawPair, Subject};

/// The raw protocol: what every ZooKeeper lock recipe does at least, one request at a time.
#[derive(Debug)]
struct RawTriple {
    client: Client,
    dir: String,
}

#[async_trait]
impl RawPair for RawTriple {
    fn name(&self) -> &'static str {
        "raw create-seq + getChildren + delete"
    }

    async fn pair(&self, _key: &str) -> Result<(), BoxError> {
        let prefix = format!("{}/n-", self.dir);
        let options = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
        let (_, sequence) = self.client.create(&prefix, &[], &options).await?;
        let children = self.client.list_children(&self.dir).await?;
        if children.len() != 1 {
            return Err("the raw bench dir is shared".into());
        }
        self.client
            .delete(&format!("{prefix}{sequence}"), None)
            .await?;
        Ok(())
    }
}

/// zookeeper-client's own lock recipe with Curator's node names, released by deleting its node.
#[derive(Debug)]
struct Recipe {
    client: Client,
    dir: String,
}

#[async_trait]
impl RawPair for Recipe {
    fn name(&self) -> &'static str {
        "zookeeper-client lock recipe"
    }

    /// Another lock implementation: leasehold, fence included, must be faster.
    fn target(&self) -> f64 {
        1.0
    }

    async fn pair(&self, _key: &str) -> Result<(), BoxError> {
        let prefix = LockPrefix::new_curator(&self.dir, "lock-")?;
        let lock = self
            .client
            .lock(prefix, b"", LockOptions::new(Acls::anyone_all()))
            .await?;
        self.client.delete(lock.lock_path(), None).await?;
        // Dropping the guard would delete the node again in the background (and interfere with
        // the next measurement); it was deleted above, so only its path string is leaked.
        std::mem::forget(lock);
        Ok(())
    }
}

pub async fn subject(url: &str) -> Result<Subject, BoxError> {
    let config = ZkConfig::from_url(url)?;
    let authority = ZkAuthority::with_config(config.clone()).await?;
    let connect = || {
        Client::connector()
            .with_session_timeout(Duration::from_secs(10))
            .connect(config.hosts())
    };
    let root = match config.chroot() {
        "/" => String::new(),
        chroot => chroot.to_string(),
    };
    let pid = std::process::id();
    let dirs = [
        format!("{root}/bench-raw-{pid}"),
        format!("{root}/bench-recipe-{pid}"),
    ];
    let (raw_client, recipe_client) = (connect().await?, connect().await?);
    let persistent = CreateMode::Persistent.with_acls(Acls::anyone_all());
    for dir in &dirs {
        raw_client.mkdir(dir, &persistent).await?;
    }
    let [raw_dir, recipe_dir] = dirs;
    Ok(Subject {
        authority: Arc::new(Instrumented::new(Arc::new(authority))),
        raw: vec![
            Box::new(RawTriple {
                client: raw_client,
                dir: raw_dir,
            }),
            Box::new(Recipe {
                client: recipe_client,
                dir: recipe_dir,
            }),
        ],
        targets: true,
    })
}
