//! What the shared SQL code needs to know of MySQL/MariaDB.

use leasehold_sql_common::SqlDialect;
use sqlx::error::DatabaseError;
use sqlx::mysql::MySqlConnectOptions;
use sqlx::MySqlConnection;

use crate::errors;

/// MySQL and MariaDB, through sqlx's MySQL driver.
pub(crate) struct Mysql;

impl SqlDialect for Mysql {
    type Connection = MySqlConnection;

    type Database = sqlx::MySql;

    const BACKEND: &'static str = "mysql";

    const SERVER: &'static str = "MySQL";

    const SCHEMES: &'static [&'static str] = &["mysql", "mariadb"];

    /// The driver reads `mysql://` only, for MariaDB too.
    const DRIVER_SCHEME: Option<&'static str> = Some("mysql");

    /// TLS, character set, a Unix socket.
    const DRIVER_PARAMS: &'static [&'static str] = &[
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

    fn with_password(options: MySqlConnectOptions, password: &str) -> MySqlConnectOptions {
        options.password(password)
    }

    fn is_conflict(error: &sqlx::Error) -> bool {
        errors::is_conflict(error)
    }

    fn server_discards_connection(error: &dyn DatabaseError) -> bool {
        errors::server_discards_connection(error)
    }
}
