//! What a `mysql://` or `mariadb://` URL configures.

use std::fmt;

use leasehold_core::{ClientOptions, Result};
use leasehold_sql_common::{parse_url, FenceSafetyOption};
use sqlx::mysql::MySqlConnectOptions;

use crate::dialect::Mysql;
use crate::table::TableName;

/// Settings of a MySQL/MariaDB authority.
///
/// From a URL: `mysql://user:password@host:3306/db?table=leases&pool_size=8&ssl-mode=required`
/// (or `mariadb://`), plus the common parameters (`epoch`, `safety_margin_ms`,
/// `clock_drift_per_mille`, `timeout_ms`). The password (in the user info or as `?password=`)
/// is kept only inside the driver's options and never printed.
#[derive(Clone)]
pub struct MysqlConfig {
    pub(crate) connect: MySqlConnectOptions,
    pub(crate) redacted_url: String,
    pub(crate) table: TableName,
    pub(crate) pool_size: u32,
    pub(crate) fence_safety: FenceSafetyOption,
    pub(crate) client: ClientOptions,
}

impl fmt::Debug for MysqlConfig {
    // The driver's options print the password in their Debug; never show them.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MysqlConfig")
            .field("url", &self.redacted_url)
            .field("table", &self.table)
            .field("pool_size", &self.pool_size)
            .field("fence_safety", &self.fence_safety)
            .field("client", &self.client)
            .finish()
    }
}

impl MysqlConfig {
    /// Parses a `mysql://` or `mariadb://` URL (the parameters every SQL backend reads; see
    /// [`leasehold_sql_common::parse_url`]).
    pub fn from_url(url: &str) -> Result<Self> {
        let table = |t: Option<&str>| t.map_or_else(|| Ok(TableName::default()), TableName::new);
        let url = parse_url::<Mysql, _, ()>(url, table, |_| Ok(()))?;
        Ok(MysqlConfig {
            connect: url.connect,
            redacted_url: url.redacted_url,
            table: url.table,
            pool_size: url.pool_size,
            fence_safety: url.fence_safety,
            client: url.client,
        })
    }

    /// Uses another lease table.
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

    /// What fences are declared to promise (see [`FenceSafetyOption`]).
    pub fn with_fence_safety(mut self, option: FenceSafetyOption) -> Self {
        self.fence_safety = option;
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
    fn both_schemes_parse_and_secrets_stay_hidden() -> Result<()> {
        for url in [
            "mysql://app:s3cret@db:3306/app?table=locks&pool_size=3&timeout_ms=1500",
            "mariadb://app@db/app?password=s3cret&table=locks&pool_size=3&timeout_ms=1500",
        ] {
            let config = MysqlConfig::from_url(url)?;
            assert_eq!(config.table.plain(), "locks");
            assert_eq!(config.pool_size, 3);
            assert_eq!(config.connect.get_host(), "db");
            assert_eq!(config.connect.get_database(), Some("app"));
            let shown = format!("{config:?}");
            assert!(!shown.contains("s3cret"), "{shown}");
        }
        Ok(())
    }

    #[test]
    fn bad_urls_are_refused_without_their_secrets() {
        for url in [
            "postgres://app:s3cret@db/app",
            "mysql://app:s3cret@db/app?table=a;b",
            "mysql://app:s3cret@db/app?pool_size=0",
            "mysql://app:s3cret@db/app?fence_safety=maybe",
            "mysql://app:s3cret@db/app?unknown=1",
            "mysql://app:s3cret@db/app?password=x",
        ] {
            match MysqlConfig::from_url(url) {
                Ok(_) => panic!("{url} was accepted"),
                Err(e) => assert!(!e.to_string().contains("s3cret"), "{e}"),
            }
        }
    }
}
