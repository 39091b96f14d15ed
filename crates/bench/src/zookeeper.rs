//! ZooKeeper: leasehold against the raw create-ephemeral-sequential + getChildren + delete
//! triple, and against zookeeper-client's own Curator-compatible lock recipe (`Client::lock`),
//! all on the same server, each client with its own session.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold::Instrumented;
use leasehold_zookeeper::{ZkAuthority, ZkConfig};
use zookeeper_client::{Acls, Client, CreateMode, LockOptions, LockPrefix};

use crate::{Baseline, BoxError, RawPair, ServerOps, Subject};

/// The raw protocol: what every ZooKeeper lock recipe does at least, one request at a time;
/// or, `pipelined`, with the create and the listing sent together as leasehold sends them (for
/// reference: what that costs the server, which saves a round trip on a real network).
#[derive(Debug)]
struct RawTriple {
    client: Client,
    dir: String,
    pipelined: bool,
}

#[async_trait]
impl RawPair for RawTriple {
    fn name(&self) -> &'static str {
        if self.pipelined {
            "raw triple, create and getChildren pipelined"
        } else {
            "raw create-seq + getChildren + delete"
        }
    }

    fn baseline(&self) -> Baseline {
        if self.pipelined {
            return Baseline::Reference;
        }
        // The sequence number is the fence: it costs the protocol nothing more.
        Baseline::Raw { fenced: true }
    }

    async fn pair(&self, _key: &str) -> Result<(), BoxError> {
        let prefix = format!("{}/n-", self.dir);
        let options = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
        let (sequence, children) = if self.pipelined {
            // Both requests are queued when the calls return; the session answers in order.
            let create = self.client.create(&prefix, &[], &options);
            let listing = self.client.list_children(&self.dir);
            let (_, sequence) = create.await?;
            (sequence, listing.await?)
        } else {
            let (_, sequence) = self.client.create(&prefix, &[], &options).await?;
            (sequence, self.client.list_children(&self.dir).await?)
        };
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

    fn baseline(&self) -> Baseline {
        Baseline::Peer
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

/// The raw triple for many tasks at once on one session (ZooKeeper pipelines a session's
/// requests): each key is a parent node of its own, made before the run.
#[derive(Debug)]
struct Keyed {
    client: Client,
    dir: String,
}

#[async_trait]
impl RawPair for Keyed {
    fn name(&self) -> &'static str {
        "raw triple, one session, node per key"
    }

    fn baseline(&self) -> Baseline {
        Baseline::Raw { fenced: true }
    }

    async fn pair(&self, key: &str) -> Result<(), BoxError> {
        let leaf = key.rsplit('/').next().unwrap_or(key);
        let parent = format!("{}/{leaf}", self.dir);
        let prefix = format!("{parent}/n-");
        let options = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
        let (_, sequence) = self.client.create(&prefix, &[], &options).await?;
        let children = self.client.list_children(&parent).await?;
        let ours = format!("n-{sequence}");
        if children.iter().any(|c| c.as_str() < ours.as_str()) {
            self.client
                .delete(&format!("{prefix}{sequence}"), None)
                .await?;
            return Err("raw key held".into());
        }
        self.client
            .delete(&format!("{prefix}{sequence}"), None)
            .await?;
        Ok(())
    }
}

/// Packets the server received, from the `mntr` four-letter word.
struct Packets(String);

#[async_trait]
impl ServerOps for Packets {
    fn unit(&self) -> &'static str {
        "packets received"
    }

    async fn count(&self) -> Result<u64, BoxError> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(&self.0).await?;
        stream.write_all(b"mntr").await?;
        let mut page = String::new();
        stream.read_to_string(&mut page).await?;
        page.lines()
            .find_map(|l| l.strip_prefix("zk_packets_received"))
            .and_then(|n| n.trim().parse().ok())
            .ok_or_else(|| "no zk_packets_received in mntr".into())
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
        format!("{root}/bench-tp-{pid}"),
        format!("{root}/bench-pipelined-{pid}"),
    ];
    let (raw_client, recipe_client, keyed_client, pipelined_client) = (
        connect().await?,
        connect().await?,
        connect().await?,
        connect().await?,
    );
    let persistent = CreateMode::Persistent.with_acls(Acls::anyone_all());
    for dir in &dirs {
        raw_client.mkdir(dir, &persistent).await?;
    }
    let [raw_dir, recipe_dir, keyed_dir, pipelined_dir] = dirs;
    // One parent per throughput key (the throughput run uses at most a few thousand keys).
    for k in 0..1000 {
        raw_client
            .create(&format!("{keyed_dir}/{k}"), &[], &persistent)
            .await?;
    }
    let first_host = config
        .hosts()
        .split(',')
        .next()
        .ok_or("no ZooKeeper host")?
        .to_string();
    Ok(Subject {
        authority: Arc::new(Instrumented::new(Arc::new(authority))),
        raw: vec![
            Box::new(RawTriple {
                client: raw_client,
                dir: raw_dir,
                pipelined: false,
            }),
            Box::new(RawTriple {
                client: pipelined_client,
                dir: pipelined_dir,
                pipelined: true,
            }),
            Box::new(Recipe {
                client: recipe_client,
                dir: recipe_dir,
            }),
        ],
        concurrent_raw: Some(Arc::new(Keyed {
            client: keyed_client,
            dir: keyed_dir,
        })),
        server_ops: Some(Box::new(Packets(first_host))),
        targets: true,
        raw_handoff: None,
    })
}
