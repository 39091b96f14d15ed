//! Who may revoke, on Azure Blob as Azurite serves it (Azurite checks a SAS token's
//! permissions; moto accepts any credentials): a client whose SAS may only read and list gets
//! the store's permission error, and the holder keeps its lease; a client whose SAS may also
//! write revokes it.
#![cfg(feature = "azure")]

mod support;

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use leasehold_conformance::kit::{self, OrFail, TestResult};
use leasehold_conformance::Failure;
use leasehold_core::{Authority, LockKey};
use leasehold_object_store::ObjectStoreAuthority;
use leasehold_servers::object_stores::{AZURITE_ACCOUNT, AZURITE_KEY, BUCKET};
use leasehold_servers::AzuriteServer;
use object_store::azure::MicrosoftAzureBuilder;

/// Prints the query pairs (JSON) of an account SAS for the blob service (`sv=2021-08-06`, an hour long) with permissions
/// `perms`: `node -e SCRIPT <account> <key> <perms>`. Node's crypto, which every Azurite
/// install has.
const ACCOUNT_SAS_JS: &str = r#"
const [account, key, perms] = process.argv.slice(1);
const crypto = require('crypto');
const sv = '2021-08-06', ss = 'b', srt = 'sco';
const se = new Date(Date.now() + 3600e3).toISOString().replace(/\.\d+Z$/, 'Z');
const toSign = [account, perms, ss, srt, '', se, '', '', sv, ''].join('\n') + '\n';
const sig = crypto.createHmac('sha256', Buffer.from(key, 'base64')).update(toSign, 'utf8').digest('base64');
console.log(JSON.stringify(Object.entries({ sv, ss, srt, sp: perms, se, sig })));
"#;

/// The query pairs of an account SAS with permissions `perms`.
fn account_sas(perms: &str) -> TestResult<Vec<(String, String)>> {
    let out = Command::new("node")
        .args(["-e", ACCOUNT_SAS_JS, AZURITE_ACCOUNT, AZURITE_KEY, perms])
        .output()
        .or_fail("run node to sign a SAS")?;
    if !out.status.success() {
        return Err(Failure::new(format!(
            "node could not sign a SAS: {}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    serde_json::from_slice(&out.stdout).or_fail("the SAS's query pairs")
}

/// An authority on Azurite at `port` that signs with the SAS of `perms`.
fn with_sas(port: u16, perms: &str) -> TestResult<ObjectStoreAuthority> {
    let store = MicrosoftAzureBuilder::new()
        .with_endpoint(format!("http://127.0.0.1:{port}/{AZURITE_ACCOUNT}"))
        .with_allow_http(true)
        .with_account(AZURITE_ACCOUNT)
        .with_sas_authorization(account_sas(perms)?)
        .with_container_name(BUCKET)
        .with_retry(support::quick_retry())
        .build()
        .or_fail("an Azure client with a SAS")?;
    Ok(ObjectStoreAuthority::new(
        Arc::new(store),
        support::config(),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_sas_cannot_revoke_and_the_holder_keeps_its_lease() -> TestResult {
    let azurite = kit::start("Azurite", AzuriteServer::start).await?;
    let port = azurite.port();
    let holder = ObjectStoreAuthority::new(support::azure(port)?, support::config());
    let reader = with_sas(port, "rl")?;
    let k = LockKey::new("revoke-denied").or_fail("key")?;
    let ttl = Duration::from_secs(10);
    let grant = holder
        .try_acquire(&k, ttl)
        .await
        .or_fail("the holder acquires")?
        .or_fail("the key is free")?;

    kit::revoke_is_refused_and_the_holder_keeps_its_lease(
        &holder,
        &grant,
        ttl,
        &reader,
        "",
        &["sig="],
    )
    .await?;

    let writer = with_sas(port, "racwdl")?;
    kit::revoke_ends_the_holder(&holder, &grant, ttl, &writer).await?;
    Ok(())
}
