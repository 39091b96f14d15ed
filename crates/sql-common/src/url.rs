//! What every SQL backend's URL configures, read the same way: the scheme, the password (in the
//! user info or as `?password=`, never both), the client options, the lease table, `pool_size`,
//! `fence_safety`, and the driver's own parameters, which go to the driver as they are.

use std::str::FromStr;

use leasehold_core::backend::{redact_url, ConnectionUrl, Secret};
use leasehold_core::{ClientOptions, Error, Result};
use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
use sqlx::Connection;

use crate::{redact_text, FenceSafetyOption, SqlDialect};

/// The driver's connection options of a dialect.
pub type ConnectOptionsOf<D> = <<D as SqlDialect>::Connection as Connection>::Options;

/// Lanes a URL gets without `pool_size`.
pub const DEFAULT_POOL_SIZE: u32 = 10;

/// What a SQL backend's URL says: the parameters every backend reads, and `own`, what the
/// backend read of its own (see [`parse_url`]).
pub struct SqlUrl<D: SqlDialect, Table, Own> {
    /// The driver's options: user, password, host, database, TLS.
    pub connect: ConnectOptionsOf<D>,
    /// The URL with its secrets masked, for messages.
    pub redacted_url: String,
    /// The lease table (`table`).
    pub table: Table,
    /// How many lanes (`pool_size`, 1 to 1000).
    pub pool_size: u32,
    /// What the operator says about fences (`fence_safety`).
    pub fence_safety: FenceSafetyOption,
    /// Epoch, safety margin, clock drift, request timeout.
    pub client: ClientOptions,
    /// The backend's own parameters.
    pub own: Own,
}

impl<D: SqlDialect, Table: std::fmt::Debug, Own: std::fmt::Debug> std::fmt::Debug
    for SqlUrl<D, Table, Own>
{
    // The driver's options print the password in their Debug; never show them.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlUrl")
            .field("url", &self.redacted_url)
            .field("table", &self.table)
            .field("pool_size", &self.pool_size)
            .field("fence_safety", &self.fence_safety)
            .field("client", &self.client)
            .field("own", &self.own)
            .finish_non_exhaustive()
    }
}

/// Parses a URL of one of `D`'s schemes. `table` reads the `table` parameter (`None`: the
/// default table); `own` takes the backend's own parameters, before the driver's are taken and
/// anything left over is refused.
pub fn parse_url<D, Table, Own>(
    url: &str,
    table: impl FnOnce(Option<&str>) -> Result<Table>,
    own: impl FnOnce(&mut ConnectionUrl) -> Result<Own>,
) -> Result<SqlUrl<D, Table, Own>>
where
    D: SqlDialect,
    ConnectOptionsOf<D>: FromStr<Err = sqlx::Error>,
{
    let scheme = ConnectionUrl::scheme_of(url);
    if !D::SCHEMES.iter().any(|s| scheme.as_deref() == Some(*s)) {
        let schemes: Vec<String> = D::SCHEMES.iter().map(|s| format!("{s}://")).collect();
        return Err(Error::InvalidUrl {
            url: redact_url(url),
            reason: format!("expected a {} URL", schemes.join(" or ")),
        });
    }
    let mut url = ConnectionUrl::parse(url)?;
    let password = url.params().take_secret("password")?;
    if password.is_some() && url.password().is_some() {
        return Err(url.invalid("the password is given twice: in the user info and as `password=`"));
    }
    let client = url.params().take_client_options()?;
    let table = table(url.params().take("table").as_deref())?;
    let pool_size = url
        .params()
        .take_parsed::<u32>("pool_size")?
        .unwrap_or(DEFAULT_POOL_SIZE);
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
    let own = own(&mut url)?;
    let mut driver = Vec::new();
    for name in D::DRIVER_PARAMS {
        if let Some(v) = url.params().take(name) {
            driver.push(format!("{name}={v}"));
        }
    }
    url.finish_params()?;
    let driver_url = driver_url::<D>(&url, &driver)?;
    let secrets = [
        password.as_ref().map(Secret::expose).unwrap_or(""),
        url.password().map(Secret::expose).unwrap_or(""),
    ];
    let mut connect = ConnectOptionsOf::<D>::from_str(driver_url.expose()).map_err(|e| {
        url.invalid(format!(
            "the {} driver rejected it: {}",
            D::SERVER,
            redact_text(&e.to_string(), &secrets)
        ))
    })?;
    if let Some(password) = &password {
        connect = D::with_password(connect, password.expose());
    }
    Ok(SqlUrl {
        connect,
        redacted_url: url.redacted().to_string(),
        table,
        pool_size,
        fence_safety,
        client,
        own,
    })
}

/// The URL the driver reads: the user info, the host, the database and the driver's own
/// parameters, without ours. The user info's password is written back into it (so that, as
/// with the URL as given, the driver looks for a password file only when there is none), so
/// it is a [`Secret`].
fn driver_url<D: SqlDialect>(url: &ConnectionUrl, driver_params: &[String]) -> Result<Secret> {
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
            return Err(url.invalid(format!(
                "{} is reached at one host; a list of hosts is not supported",
                D::SERVER
            )))
        }
    };
    let scheme = D::DRIVER_SCHEME.unwrap_or(url.scheme());
    let mut text = format!("{scheme}://{user_info}{host}{}", url.path());
    if !driver_params.is_empty() {
        text.push('?');
        text.push_str(&driver_params.join("&"));
    }
    Ok(Secret::new(text))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlx::error::DatabaseError;
    use sqlx::postgres::PgConnectOptions;

    /// A dialect of its own schemes on the PostgreSQL driver, which reads only `postgres://`.
    struct Renamed;

    impl SqlDialect for Renamed {
        type Connection = sqlx::PgConnection;
        type Database = sqlx::Postgres;
        const BACKEND: &'static str = "renamed";
        const SERVER: &'static str = "Renamed";
        const SCHEMES: &'static [&'static str] = &["one", "two"];
        const DRIVER_SCHEME: Option<&'static str> = Some("postgres");
        const DRIVER_PARAMS: &'static [&'static str] = &["sslmode"];

        fn with_password(options: PgConnectOptions, password: &str) -> PgConnectOptions {
            options.password(password)
        }

        fn is_conflict(_: &sqlx::Error) -> bool {
            false
        }

        fn server_discards_connection(_: &dyn DatabaseError) -> bool {
            false
        }
    }

    fn parse(url: &str) -> Result<SqlUrl<Renamed, Option<String>, Option<String>>> {
        parse_url::<Renamed, _, _>(
            url,
            |t| Ok(t.map(str::to_string)),
            |url| Ok(url.params().take("own")),
        )
    }

    #[test]
    fn both_schemes_reach_the_driver_under_its_own() -> Result<()> {
        for scheme in ["one", "two"] {
            let url = parse(&format!(
                "{scheme}://u:s3cret@db:5433/app?table=t&pool_size=3&own=x&sslmode=disable&fence_safety=failover-unsafe"
            ))?;
            assert_eq!(url.connect.get_host(), "db");
            assert_eq!(url.connect.get_port(), 5433);
            assert_eq!(url.connect.get_database(), Some("app"));
            assert_eq!(url.table.as_deref(), Some("t"));
            assert_eq!(url.own.as_deref(), Some("x"));
            assert_eq!(url.pool_size, 3);
            assert_eq!(url.fence_safety, FenceSafetyOption::FailoverUnsafe);
            assert!(!format!("{url:?}").contains("s3cret"));
        }
        let url = parse("one://u@db/app")?;
        assert_eq!(url.pool_size, DEFAULT_POOL_SIZE);
        assert_eq!(url.fence_safety, FenceSafetyOption::Auto);
        assert_eq!((url.table, url.own), (None, None));
        Ok(())
    }

    #[test]
    fn what_is_wrong_is_refused_without_the_secrets() {
        let refused = [
            (
                "postgres://u:s3cret@db/app",
                "expected a one:// or two:// URL",
            ),
            ("one://u:s3cret@db/app?password=x", "given twice"),
            ("one://u:s3cret@db/app?pool_size=0", "pool_size 0"),
            ("one://u:s3cret@db/app?pool_size=1001", "pool_size 1001"),
            (
                "one://u:s3cret@db/app?fence_safety=maybe",
                "fence_safety `maybe`",
            ),
            ("one://u:s3cret@db/app?unknown=1", "unknown"),
            ("one://u:s3cret@a,b/app", "Renamed is reached at one host"),
            (
                "one://u:s3cret@db/app?sslmode=sometimes",
                "the Renamed driver rejected it",
            ),
        ];
        for (url, why) in refused {
            match parse(url) {
                Ok(_) => panic!("{url} was accepted"),
                Err(e) => {
                    let shown = format!("{e} {e:?}");
                    assert!(!shown.contains("s3cret"), "{shown}");
                    assert!(shown.contains(why), "{url}: {shown}");
                }
            }
        }
    }

    #[test]
    fn the_query_password_reaches_the_driver() -> Result<()> {
        let url = parse("two://u@db/app?password=p%40ss")?;
        let seen = sqlx::ConnectOptions::to_url_lossy(&url.connect);
        let password = seen
            .password()
            .and_then(leasehold_core::backend::percent_decode);
        assert_eq!(password.as_deref(), Some("p@ss"));
        Ok(())
    }
}
