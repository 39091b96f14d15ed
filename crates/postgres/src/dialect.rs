//! What the shared SQL code needs to know of PostgreSQL.

use leasehold_sql_common::SqlDialect;
use sqlx::error::DatabaseError;
use sqlx::postgres::PgConnectOptions;
use sqlx::PgConnection;

use crate::errors;

/// PostgreSQL, through sqlx's PostgreSQL driver.
pub(crate) struct Postgres;

impl SqlDialect for Postgres {
    type Connection = PgConnection;

    type Database = sqlx::Postgres;

    const BACKEND: &'static str = "postgres";

    const SERVER: &'static str = "PostgreSQL";

    const SCHEMES: &'static [&'static str] = &["postgres", "postgresql"];

    /// The driver reads both schemes.
    const DRIVER_SCHEME: Option<&'static str> = None;

    /// TLS, application name, server options, and the driver's own spellings of the address.
    const DRIVER_PARAMS: &'static [&'static str] = &[
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

    fn with_password(options: PgConnectOptions, password: &str) -> PgConnectOptions {
        options.password(password)
    }

    fn is_conflict(error: &sqlx::Error) -> bool {
        errors::is_conflict(error)
    }

    fn server_discards_connection(error: &dyn DatabaseError) -> bool {
        errors::server_discards_connection(error)
    }
}
