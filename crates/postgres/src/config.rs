//! What a `postgres://` URL configures.

use std::fmt;
use std::str::FromStr;

use leasehold_core::{redact_url, ClientOptions, Error, Result, UrlParams};
use sqlx::postgres::PgConnectOptions;

use crate::table::TableName;

/// Query parameters handed to the PostgreSQL driver as they are (TLS, application name, ...).
const DRIVER_PARAMS: &[&str] = &[
    "sslmode",
    "ssl-mode",
    "sslrootcert",
    "ssl-root-cert",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "application_name",
    "options",
    "statement-cache-capacity",
    "host",
    "port",
    "dbname",
    "user",
];

/// Settings of a PostgreSQL authority.
///
/// From a URL: `postgres://user:password@host:5432/db?table=locks.leases&pool_size=8&sslmode=require`
/// plus the common parameters (`epoch`, `safety_margin_ms`, `clock_drift_per_mille`,
/// `timeout_ms`). The password is kept only inside the driver's options and never printed.
#[derive(Clone)]
pub struct PostgresConfig {
    pub(crate) connect: PgConnectOptions,
    pub(crate) redacted_url: String,
    pub(crate) table: TableName,
    pub(crate) pool_size: u32,
    pub(crate) client: ClientOptions,
}

impl fmt::Debug for PostgresConfig {
    // The driver's options print the password in their Debug; never show them.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresConfig")
            .field("url", &self.redacted_url)
            .field("table", &self.table)
            .field("pool_size", &self.pool_size)
            .field("client", &self.client)
            .finish()
    }
}

impl PostgresConfig {
    /// Parses a `postgres://` or `postgresql://` URL.
    pub fn from_url(url: &str) -> Result<Self> {
        let redacted_url = redact_url(url);
        let invalid = |reason: String| Error::InvalidUrl {
            url: redacted_url.clone(),
            reason,
        };
        let scheme = url.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
        if !matches!(scheme.as_deref(), Some("postgres" | "postgresql")) {
            return Err(invalid(
                "expected a postgres:// or postgresql:// URL".into(),
            ));
        }
        let mut params = UrlParams::parse(url)?;
        let client = params.take_client_options()?;
        let table = match params.take("table") {
            Some(t) => TableName::new(&t)?,
            None => TableName::default(),
        };
        let pool_size = params.take_parsed::<u32>("pool_size")?.unwrap_or(10);
        if pool_size == 0 || pool_size > 1000 {
            return Err(invalid(format!("pool_size {pool_size} is not in 1..=1000")));
        }
        let mut driver = Vec::new();
        for name in DRIVER_PARAMS {
            if let Some(v) = params.take(name) {
                driver.push(format!("{name}={v}"));
            }
        }
        params.finish()?;
        let base = url.split(['?', '#']).next().unwrap_or(url);
        let driver_url = if driver.is_empty() {
            base.to_string()
        } else {
            format!("{base}?{}", driver.join("&"))
        };
        let connect = PgConnectOptions::from_str(&driver_url).map_err(|e| {
            invalid(format!(
                "the PostgreSQL driver rejected it: {}",
                redact_url(&e.to_string())
            ))
        })?;
        Ok(PostgresConfig {
            connect,
            redacted_url,
            table,
            pool_size,
            client,
        })
    }

    /// Uses another lease table (`table` or `schema.table`).
    pub fn with_table(mut self, table: &str) -> Result<Self> {
        self.table = TableName::new(table)?;
        Ok(self)
    }

    /// The client options (epoch, safety margin, request timeout).
    pub fn client_options(&self) -> &ClientOptions {
        &self.client
    }

    /// Replaces the client options.
    pub fn with_client_options(mut self, client: ClientOptions) -> Self {
        self.client = client;
        self
    }

    /// The lease table.
    pub fn table(&self) -> &TableName {
        &self.table
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ours_and_the_drivers_and_rejects_the_rest() {
        let c = PostgresConfig::from_url(
            "postgres://u:hunter2@db:5433/app?table=locks.leases&pool_size=4&epoch=1&sslmode=disable&application_name=x",
        )
        .unwrap();
        assert_eq!(c.table.plain(), "locks.leases");
        assert_eq!(c.pool_size, 4);
        assert_eq!(c.client.epoch.get(), 1);
        let shown = format!("{c:?}");
        assert!(!shown.contains("hunter2"), "{shown}");

        for bad in [
            "postgres://u:hunter2@db/app?tabel=x",
            "postgres://u:hunter2@db/app?table=a;b",
            "postgres://u:hunter2@db/app?pool_size=0",
            "redis://u:hunter2@db",
            "postgres://u:hunter2@db/app?sslmode=sometimes",
        ] {
            let err = PostgresConfig::from_url(bad).unwrap_err();
            let shown = format!("{err} {err:?}");
            assert!(!shown.contains("hunter2"), "{shown}");
            assert!(
                matches!(err, Error::InvalidUrl { .. } | Error::InvalidConfig { .. }),
                "{bad}: {err}"
            );
        }
    }
}
