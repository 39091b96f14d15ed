//! What a `mysql://` or `mariadb://` URL configures.

use std::fmt;
use std::str::FromStr;

use leasehold_core::backend::{redact_url, ConnectionUrl, Secret};
use leasehold_core::{ClientOptions, Error, Result};
use leasehold_sql_common::{redact_text, FenceSafetyOption};
use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
use sqlx::mysql::MySqlConnectOptions;

use crate::table::TableName;

/// Query parameters handed to the MySQL driver as they are (TLS, character set, ...).
const DRIVER_PARAMS: &[&str] = &[
    "sslmode",
    "ssl-mode",
    "sslca",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "charset",
    "collation",
    "statement-cache-capacity",
    "socket",
];

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
    /// Parses a `mysql://` or `mariadb://` URL.
    pub fn from_url(url: &str) -> Result<Self> {
        if !matches!(
            ConnectionUrl::scheme_of(url).as_deref(),
            Some("mysql" | "mariadb")
        ) {
            return Err(Error::InvalidUrl {
                url: redact_url(url),
                reason: "expected a mysql:// or mariadb:// URL".into(),
            });
        }
        let mut url = ConnectionUrl::parse(url)?;
        let password = url.params().take_secret("password")?;
        if password.is_some() && url.password().is_some() {
            return Err(
                url.invalid("the password is given twice: in the user info and as `password=`")
            );
        }
        let client = url.params().take_client_options()?;
        let table = match url.params().take("table") {
            Some(t) => TableName::new(&t)?,
            None => TableName::default(),
        };
        let pool_size = url.params().take_parsed::<u32>("pool_size")?.unwrap_or(10);
        if pool_size == 0 || pool_size > 1000 {
            return Err(url.invalid(format!("pool_size {pool_size} is not in 1..=1000")));
        }
        let fence_safety = match url.params().take("fence_safety") {
            None => FenceSafetyOption::Auto,
            Some(v) => v.parse().map_err(|()| {
                url.invalid(format!(
                    "fence_safety `{v}` is not one of auto, linearizable, failover-unsafe"
                ))
            })?,
        };
        let mut driver = Vec::new();
        for name in DRIVER_PARAMS {
            if let Some(v) = url.params().take(name) {
                driver.push(format!("{name}={v}"));
            }
        }
        url.finish_params()?;
        let driver_url = driver_url(&url, &driver)?;
        let secrets = [
            password.as_ref().map(Secret::expose).unwrap_or(""),
            url.password().map(Secret::expose).unwrap_or(""),
        ];
        let mut connect = MySqlConnectOptions::from_str(driver_url.expose()).map_err(|e| {
            url.invalid(format!(
                "the MySQL driver rejected it: {}",
                redact_text(&e.to_string(), &secrets)
            ))
        })?;
        if let Some(password) = &password {
            connect = connect.password(password.expose());
        }
        Ok(MysqlConfig {
            connect,
            redacted_url: url.redacted().to_string(),
            table,
            pool_size,
            fence_safety,
            client,
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

/// The URL the driver reads (always `mysql://`, which is all it knows): the user info, the
/// host, the database and the driver's own parameters, without ours. It holds the password,
/// so it is a [`Secret`].
fn driver_url(url: &ConnectionUrl, driver_params: &[String]) -> Result<Secret> {
    let encode = |s: &str| utf8_percent_encode(s, NON_ALPHANUMERIC).to_string();
    let user_info = match (url.user(), url.password()) {
        (None, _) => String::new(),
        (Some(user), None) => format!("{}@", encode(user)),
        (Some(user), Some(password)) => {
            format!("{}:{}@", encode(user), encode(password.expose()))
        }
    };
    let host = match url.hosts() {
        [] => String::new(),
        [host] => host.to_string(),
        _ => {
            return Err(
                url.invalid("MySQL is reached at one host; a list of hosts is not supported")
            )
        }
    };
    let mut text = format!("mysql://{user_info}{host}{}", url.path());
    if !driver_params.is_empty() {
        text.push('?');
        text.push_str(&driver_params.join("&"));
    }
    Ok(Secret::new(text))
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
