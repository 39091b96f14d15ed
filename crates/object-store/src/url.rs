//! Connection URLs: `s3://bucket/prefix`, `az://container/prefix`, `gs://bucket/prefix`.
//!
//! The bucket (container) is the host, the prefix the path. Query parameters are leasehold's
//! common ones (`epoch`, `safety_margin_ms`, `clock_drift_per_mille`, `timeout_ms`), the
//! polling bounds (`poll_min_ms`, `poll_max_ms`), and any of the store builder's own
//! configuration keys (`endpoint`, `region`, `allow_http`, `skip_signature`, ...). Credentials
//! come from the environment, as `object_store`'s builders read it (`AWS_ACCESS_KEY_ID`,
//! `AZURE_STORAGE_ACCOUNT_KEY`, `GOOGLE_SERVICE_ACCOUNT`, ...), never from the URL: a parameter
//! whose name says it is a secret is refused, so a URL can be logged.

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::backend::{redact_url, ConnectionUrl, UrlParams};
use leasehold_core::{Error, Result};
use object_store::ObjectStore;

use crate::{ObjectStoreAuthority, ObjectStoreConfig};

/// The URL schemes [`ObjectStoreAuthority::connect`] serves (each needs its feature).
pub const SCHEMES: &[&str] = &["s3", "az", "gs"];

/// Names of store configuration keys that carry credentials, refused in a URL.
const CREDENTIAL_WORDS: &[&str] = &["secret", "key", "token", "password", "sas", "credential"];

/// A URL taken apart: the scheme, the bucket, the prefix, leasehold's settings, and the store
/// builder's own keys.
#[derive(Debug)]
pub(crate) struct StoreUrl {
    pub(crate) scheme: String,
    pub(crate) bucket: String,
    pub(crate) config: ObjectStoreConfig,
    pub(crate) store_keys: Vec<(String, String)>,
}

fn invalid(url: &str, reason: impl Into<String>) -> Error {
    Error::InvalidUrl {
        url: redact_url(url),
        reason: reason.into(),
    }
}

impl StoreUrl {
    pub(crate) fn parse(url: &str) -> Result<Self> {
        let mut parsed = ConnectionUrl::parse_opaque(url)?;
        let scheme = parsed.scheme().to_string();
        if !SCHEMES.contains(&scheme.as_str()) {
            return Err(invalid(
                url,
                format!("the object-store authority serves {SCHEMES:?}, not `{scheme}://`"),
            ));
        }
        let path = parsed.decoded_path()?;
        let (bucket, prefix) = path.split_once('/').unwrap_or((&path, ""));
        if bucket.is_empty() || bucket.contains('@') {
            return Err(invalid(
                url,
                "expected `scheme://bucket/prefix` (credentials come from the environment)",
            ));
        }
        let params: &mut UrlParams = parsed.params();
        let client = params.take_client_options()?;
        let poll_min = params.take_parsed::<u64>("poll_min_ms")?;
        let poll_max = params.take_parsed::<u64>("poll_max_ms")?;
        let mut config = ObjectStoreConfig::new(prefix).with_client(client);
        let (min, max) = (config.poll_min, config.poll_max);
        config = config.with_polling(
            poll_min.map_or(min, Duration::from_millis),
            poll_max.map_or(max, Duration::from_millis),
        );
        let mut store_keys = Vec::new();
        for name in parsed.params().names_left() {
            let lower = name.to_ascii_lowercase();
            if CREDENTIAL_WORDS.iter().any(|w| lower.contains(w)) {
                // Its value is not among the secrets `redact_url` knows by name: the whole
                // query is left out of the message.
                let without_query = url.split(['?', '#']).next().unwrap_or("");
                return Err(invalid(
                    &format!("{without_query}?..."),
                    format!(
                        "parameter `{name}` would put a credential in the URL; set it in the \
                         environment"
                    ),
                ));
            }
            if let Some(value) = parsed.params().take_decoded(&name)? {
                store_keys.push((name, value));
            }
        }
        parsed.finish_params()?;
        Ok(StoreUrl {
            scheme,
            bucket: bucket.to_string(),
            config,
            store_keys,
        })
    }
}

/// The store's client: its own retries stay within the request timeout, so a request that
/// keeps failing comes back as an error the lease can act on.
#[cfg(any(feature = "aws", feature = "azure", feature = "gcp"))]
fn retry(timeout: Duration) -> object_store::RetryConfig {
    object_store::RetryConfig {
        max_retries: 2,
        retry_timeout: timeout,
        ..object_store::RetryConfig::default()
    }
}

impl StoreUrl {
    /// Builds the store: credentials and anything the URL leaves out from the environment.
    pub(crate) fn build(&self, url: &str) -> Result<Arc<dyn ObjectStore>> {
        let bad_key =
            |name: &str, e: object_store::Error| invalid(url, format!("parameter `{name}`: {e}"));
        let failed = |e: object_store::Error| {
            invalid(
                url,
                leasehold_gate_object::redact(&format!("the store's client: {e}")),
            )
        };
        let _ = (&bad_key, &failed);
        match self.scheme.as_str() {
            #[cfg(feature = "aws")]
            "s3" => {
                use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey, S3ConditionalPut};
                let mut builder = AmazonS3Builder::from_env()
                    .with_bucket_name(&self.bucket)
                    .with_conditional_put(S3ConditionalPut::ETagMatch)
                    .with_retry(retry(self.config.client.request_timeout));
                for (name, value) in &self.store_keys {
                    let key: AmazonS3ConfigKey = name.parse().map_err(|e| bad_key(name, e))?;
                    builder = builder.with_config(key, value);
                }
                Ok(Arc::new(builder.build().map_err(failed)?))
            }
            #[cfg(feature = "azure")]
            "az" => {
                use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
                let mut builder = MicrosoftAzureBuilder::from_env()
                    .with_container_name(&self.bucket)
                    .with_retry(retry(self.config.client.request_timeout));
                for (name, value) in &self.store_keys {
                    let key: AzureConfigKey = name.parse().map_err(|e| bad_key(name, e))?;
                    builder = builder.with_config(key, value);
                }
                Ok(Arc::new(builder.build().map_err(failed)?))
            }
            #[cfg(feature = "gcp")]
            "gs" => {
                use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
                let mut builder = GoogleCloudStorageBuilder::from_env()
                    .with_bucket_name(&self.bucket)
                    .with_retry(retry(self.config.client.request_timeout));
                for (name, value) in &self.store_keys {
                    let key: GoogleConfigKey = name.parse().map_err(|e| bad_key(name, e))?;
                    builder = builder.with_config(key, value);
                }
                Ok(Arc::new(builder.build().map_err(failed)?))
            }
            other => Err(Error::Unsupported {
                backend: crate::BACKEND,
                operation: format!(
                    "`{other}://` URLs (leasehold-object-store was built without the feature \
                     for this store: aws, azure or gcp)"
                ),
            }),
        }
    }
}

impl ObjectStoreAuthority {
    /// Connects to the bucket a URL names (see the `url` module's rules): `s3://bucket/prefix`,
    /// `az://container/prefix`, `gs://bucket/prefix`, each with its feature. No request is made;
    /// the bucket must exist.
    pub async fn connect(url: &str) -> Result<Self> {
        let parsed = StoreUrl::parse(url)?;
        let store = parsed.build(url)?;
        Ok(ObjectStoreAuthority::new(store, parsed.config))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_bucket_prefix_settings_and_store_keys() -> Result<()> {
        let parsed = StoreUrl::parse(
            "s3://bucket/locks/prod?endpoint=http%3A%2F%2F127.0.0.1%3A9000&region=us-east-1\
             &epoch=2&poll_min_ms=10&timeout_ms=800",
        )?;
        assert_eq!(parsed.scheme, "s3");
        assert_eq!(parsed.bucket, "bucket");
        assert_eq!(parsed.config.prefix(), "locks/prod");
        assert_eq!(parsed.config.client().epoch.get(), 2);
        assert_eq!(parsed.config.poll_min, crate::POLL_FLOOR);
        assert_eq!(
            parsed.config.client().request_timeout,
            Duration::from_millis(800)
        );
        assert_eq!(
            parsed.store_keys,
            vec![
                ("endpoint".to_string(), "http://127.0.0.1:9000".to_string()),
                ("region".to_string(), "us-east-1".to_string())
            ]
        );
        Ok(())
    }

    #[test]
    fn refuses_credentials_other_schemes_and_no_bucket() {
        for bad in [
            "s3://b/p?secret_access_key=hunter2",
            "az://c/p?access_key=hunter2",
            "s3://b/p?token=hunter2",
            "http://b/p",
            "s3:///p",
            "s3://user:hunter2@b/p",
            "s3://b/p?epoch=1&epoch=2",
        ] {
            match StoreUrl::parse(bad) {
                Err(e @ Error::InvalidUrl { .. }) => {
                    assert!(!format!("{e} {e:?}").contains("hunter2"), "{bad}: {e}")
                }
                other => panic!("{bad}: {other:?}"),
            }
        }
    }
}
