//! What a `postgres://` URL configures.

use std::fmt;
use std::str::FromStr;

use std::time::Duration;

use leasehold_core::{ClientOptions, Result};
use leasehold_sql_common::parse_url;
use sqlx::postgres::PgConnectOptions;

use crate::dialect::Postgres;
use crate::table::TableName;
pub use leasehold_sql_common::FenceSafetyOption;

/// What stands between the authority and PostgreSQL (URL `pooler`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Pooler {
    /// Nothing, or a proxy that keeps one server connection per client connection (PgBouncer
    /// in session mode): statements are prepared once per connection and kept, and waiters are
    /// woken by `LISTEN`. The default.
    #[default]
    None,
    /// A transaction-pooling proxy (PgBouncer with `pool_mode = transaction`, and others that
    /// hand each transaction to any server connection): every lease statement runs unnamed in
    /// a transaction of its own, so that its parse and its execution reach the same server
    /// connection and nothing prepared is left behind for another client; no `LISTEN` (a
    /// notification would reach whichever client holds that server connection then): waiters
    /// poll.
    Transaction,
}

impl FromStr for Pooler {
    type Err = ();

    fn from_str(s: &str) -> std::result::Result<Self, ()> {
        match s {
            "none" | "session" => Ok(Pooler::None),
            "transaction" => Ok(Pooler::Transaction),
            _ => Err(()),
        }
    }
}

/// How often the listening connection is checked by default.
const LISTEN_CHECK: Duration = Duration::from_secs(2);

/// Settings of a PostgreSQL authority.
///
/// From a URL: `postgres://user:password@host:5432/db?table=locks.leases&pool_size=8&sslmode=require`
/// plus the common parameters (`epoch`, `safety_margin_ms`, `clock_drift_per_mille`,
/// `timeout_ms`). The password (in the user info or as `?password=`) is kept only inside the
/// driver's options and never printed.
#[derive(Clone)]
pub struct PostgresConfig {
    pub(crate) connect: PgConnectOptions,
    pub(crate) redacted_url: String,
    pub(crate) table: TableName,
    pub(crate) pool_size: u32,
    pub(crate) listen_check: Duration,
    pub(crate) fence_safety: FenceSafetyOption,
    pub(crate) pooler: Pooler,
    /// Where the listening connection goes when not where the lease statements go (URL
    /// `listen_host`, `listen_port`): the database itself, past a transaction-pooling proxy.
    pub(crate) listen_connect: Option<PgConnectOptions>,
    pub(crate) client: ClientOptions,
}

impl fmt::Debug for PostgresConfig {
    // The driver's options print the password in their Debug; never show them.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresConfig")
            .field("url", &self.redacted_url)
            .field("table", &self.table)
            .field("pool_size", &self.pool_size)
            .field("listen_check", &self.listen_check)
            .field("fence_safety", &self.fence_safety)
            .field("pooler", &self.pooler)
            .field(
                "listen_at",
                &self
                    .listen_connect
                    .as_ref()
                    .map(|c| format!("{}:{}", c.get_host(), c.get_port())),
            )
            .field("client", &self.client)
            .finish()
    }
}

impl PostgresConfig {
    /// Parses a `postgres://` or `postgresql://` URL (the parameters every SQL backend
    /// reads, see [`leasehold_sql_common::parse_url`], and `listen_check_ms`, `pooler`,
    /// `listen_host`, `listen_port`).
    pub fn from_url(url: &str) -> Result<Self> {
        let table = |t: Option<&str>| t.map_or_else(|| Ok(TableName::default()), TableName::new);
        let url = parse_url::<Postgres, _, _>(url, table, |url| {
            let listen_check = match url.params().take_parsed::<u64>("listen_check_ms")? {
                None => LISTEN_CHECK,
                Some(0) => return Err(url.invalid("listen_check_ms must be greater than zero")),
                Some(ms) => Duration::from_millis(ms),
            };
            let pooler = match url.params().take("pooler") {
                None => Pooler::None,
                Some(v) => v.parse().map_err(|()| {
                    url.invalid(format!(
                        "pooler `{v}` is not one of none, session, transaction"
                    ))
                })?,
            };
            let listen_host = url.params().take("listen_host");
            let listen_port = url.params().take_parsed::<u16>("listen_port")?;
            Ok((listen_check, pooler, listen_host, listen_port))
        })?;
        let (listen_check, pooler, listen_host, listen_port) = url.own;
        let connect = url.connect;
        // The same user, password, database and TLS settings, at another address.
        let listen_connect = match (&listen_host, listen_port) {
            (None, None) => None,
            (host, port) => {
                let mut direct = connect.clone();
                if let Some(host) = host {
                    direct = direct.host(host);
                }
                if let Some(port) = port {
                    direct = direct.port(port);
                }
                Some(direct)
            }
        };
        Ok(PostgresConfig {
            connect,
            redacted_url: url.redacted_url,
            table: url.table,
            pool_size: url.pool_size,
            listen_check,
            fence_safety: url.fence_safety,
            pooler,
            listen_connect,
            client: url.client,
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

    /// What fences are declared to promise (see [`FenceSafetyOption`]).
    pub fn with_fence_safety(mut self, option: FenceSafetyOption) -> Self {
        self.fence_safety = option;
        self
    }

    /// Declares what stands between the authority and PostgreSQL (see [`Pooler`]).
    pub fn with_pooler(mut self, pooler: Pooler) -> Self {
        self.pooler = pooler;
        self
    }

    /// How often the listening connection is checked (a round trip on it; a silent one is
    /// replaced). Default 2 s.
    pub fn with_listen_check(mut self, every: Duration) -> Self {
        self.listen_check = every.max(Duration::from_millis(1));
        self
    }

    /// The lease table.
    pub fn table(&self) -> &TableName {
        &self.table
    }
}

/// Whether a connection made with these options is unverified: its server is not proven to be
/// the one named (anything below `sslmode=verify-full`: no TLS, TLS without checking the
/// certificate, or a certificate checked without its host name). `None` when verified, or when
/// no network lies in between (a Unix socket, a loopback address), where nobody can sit in the
/// middle; otherwise the mode, for the warning given at connect.
pub(crate) fn unverified_tls(options: &PgConnectOptions) -> Option<&'static str> {
    use sqlx::postgres::PgSslMode;
    let mode = match options.get_ssl_mode() {
        PgSslMode::VerifyFull => return None,
        PgSslMode::Disable => "disable",
        PgSslMode::Allow => "allow",
        PgSslMode::Prefer => "prefer",
        PgSslMode::Require => "require",
        PgSslMode::VerifyCa => "verify-ca",
    };
    let host = options.get_host();
    let local = options.get_socket().is_some()
        || host.starts_with('/')
        || host.eq_ignore_ascii_case("localhost")
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    (!local).then_some(mode)
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_conformance::kit::{ErrOrFail, OrFail, TestResult};
    use leasehold_core::backend::percent_decode;
    use leasehold_core::backend::redact_url;
    use leasehold_core::Error;
    use sqlx::ConnectOptions;

    /// A connection over a network that does not verify its server is reported, so
    /// the warning at connect names it; loopback and Unix sockets have nobody in between.
    #[test]
    fn connections_below_verify_full_over_a_network_are_unverified() -> TestResult {
        let mode = |url: &str| -> TestResult<Option<&'static str>> {
            let config =
                PostgresConfig::from_url(url).or_fail(format!("the postgres URL {url}"))?;
            Ok(unverified_tls(&config.connect))
        };
        assert_eq!(mode("postgres://u@db.example/app")?, Some("prefer"));
        assert_eq!(
            mode("postgres://u@db.example/app?sslmode=require")?,
            Some("require")
        );
        assert_eq!(
            mode("postgres://u@10.0.0.5/app?sslmode=verify-ca")?,
            Some("verify-ca")
        );
        assert_eq!(
            mode("postgres://u@db.example/app?sslmode=disable")?,
            Some("disable")
        );
        assert_eq!(
            mode("postgres://u@db.example/app?sslmode=verify-full")?,
            None
        );
        for local in [
            "postgres://u@localhost/app",
            "postgres://u@127.0.0.1/app?sslmode=require",
            "postgres://u@[::1]/app",
        ] {
            assert_eq!(mode(local)?, None, "{local}");
        }
        Ok(())
    }

    #[test]
    fn secrets_are_masked_and_the_query_password_is_read() -> TestResult {
        assert_eq!(
            redact_url("postgres://u:hunter2@h/db?sslpassword=hunter2&table=t&Password=x#f"),
            "postgres://u:***@h/db?sslpassword=***&table=t&Password=***#f"
        );
        assert_eq!(redact_url("postgres://u@h/db"), "postgres://u@h/db");
        // Both passwords reach the driver decoded, whatever they hold.
        for (url, want) in [
            ("postgres://u@h/db?password=p%40ss%20w", "p@ss w"),
            ("postgres://u:p@h/db?application_name=@", "p"),
            ("postgres://u:p@ss:w%2F%25@h/db", "p@ss:w/%"),
        ] {
            let c = PostgresConfig::from_url(url).or_fail("the postgres URL")?;
            let seen = c.connect.to_url_lossy();
            let password = seen.password().and_then(percent_decode);
            assert_eq!(password.as_deref(), Some(want), "{url}");
            assert_eq!(c.connect.get_username(), "u", "{url}");
        }
        for bad in [
            "postgres://h?password=a&password=b",
            "postgres://h?password=%zz",
            "postgres://u:%zz@h",
            "postgres://u:p@h1,h2/db",
        ] {
            let err = PostgresConfig::from_url(bad).err_or_fail("a bad URL")?;
            let shown = format!("{err} {err:?}");
            assert!(
                !shown.contains("%zz") && !shown.contains("=a") && !shown.contains(":p@"),
                "{shown}"
            );
        }
        let c = PostgresConfig::from_url(
            "postgres://u@h/db?password=hunter2&fence_safety=linearizable&listen_check_ms=500",
        )
        .or_fail("the postgres URL with TLS files")?;
        assert_eq!(c.connect.get_username(), "u");
        assert_eq!(c.fence_safety, FenceSafetyOption::Linearizable);
        assert_eq!(c.listen_check, Duration::from_millis(500));
        assert!(!format!("{c:?}").contains("hunter2"));
        assert!(PostgresConfig::from_url("postgres://h/db?listen_check_ms=0").is_err());
        Ok(())
    }

    #[test]
    fn parses_ours_and_the_drivers_and_rejects_the_rest() -> TestResult {
        let c = PostgresConfig::from_url(
            "postgres://u:hunter2@db:5433/app?table=locks.leases&pool_size=4&epoch=1&sslmode=disable&application_name=x",
        )
        .or_fail("the postgres URL with TLS files")?;
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
            let err = PostgresConfig::from_url(bad).err_or_fail("a bad URL")?;
            let shown = format!("{err} {err:?}");
            assert!(!shown.contains("hunter2"), "{shown}");
            assert!(
                matches!(err, Error::InvalidUrl { .. } | Error::InvalidConfig { .. }),
                "{bad}: {err}"
            );
        }
        Ok(())
    }

    #[test]
    fn the_pooler_and_the_listening_address_are_read() -> std::result::Result<(), String> {
        let pooled = PostgresConfig::from_url(
            "postgres://u:hunter2@bouncer:6432/app?pooler=transaction&listen_host=db&listen_port=5433",
        )
        .map_err(|e| e.to_string())?;
        if pooled.pooler != Pooler::Transaction {
            return Err(format!("pooler {:?}", pooled.pooler));
        }
        let direct = pooled
            .listen_connect
            .as_ref()
            .ok_or("no listening address")?;
        let at = (direct.get_host(), direct.get_port(), direct.get_database());
        if at != ("db", 5433, Some("app")) {
            return Err(format!("listening at {at:?}"));
        }
        if format!("{pooled:?}").contains("hunter2") {
            return Err("the password is shown".into());
        }
        let plain = PostgresConfig::from_url("postgres://u@db/app?pooler=session")
            .map_err(|e| e.to_string())?;
        if plain.pooler != Pooler::None || plain.listen_connect.is_some() {
            return Err(format!("{plain:?}"));
        }
        for bad in [
            "postgres://u:hunter2@db/app?pooler=statement",
            "postgres://u:hunter2@db/app?listen_port=none",
        ] {
            match PostgresConfig::from_url(bad) {
                Err(Error::InvalidUrl { .. }) => {}
                other => return Err(format!("{bad}: {other:?}")),
            }
        }
        Ok(())
    }
}
