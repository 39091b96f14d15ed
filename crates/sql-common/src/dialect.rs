//! What differs between the SQL authorities, for the code they share: the driver's connection,
//! the URL forms, and which server errors mean what.

use sqlx::error::DatabaseError;
use sqlx::Connection;

/// One SQL server family as the shared code sees it: implemented by a unit type in each
/// backend (PostgreSQL, MySQL/MariaDB).
pub trait SqlDialect: Send + Sync + 'static {
    /// The driver's connection (`sqlx::PgConnection`, `sqlx::MySqlConnection`).
    type Connection: Connection + 'static;

    /// The driver's database (`sqlx::Postgres`, `sqlx::MySql`).
    type Database: sqlx::Database<Connection = Self::Connection>;

    /// The backend's name in errors and capabilities (`"postgres"`, `"mysql"`).
    const BACKEND: &'static str;

    /// The server's name in messages (`"PostgreSQL"`, `"MySQL"`).
    const SERVER: &'static str;

    /// The URL schemes this backend is reached by, the first one the canonical.
    const SCHEMES: &'static [&'static str];

    /// The scheme of the URL handed to the driver: `None` keeps the one given (the driver
    /// knows them all), `Some` replaces it with the only one the driver reads.
    const DRIVER_SCHEME: Option<&'static str>;

    /// Query parameters handed to the driver as they are (TLS, character set, ...).
    const DRIVER_PARAMS: &'static [&'static str];

    /// The driver's options with the password given as a URL parameter.
    fn with_password(
        options: <Self::Connection as Connection>::Options,
        password: &str,
    ) -> <Self::Connection as Connection>::Options;

    /// The server rolled the statement back for a conflict with a concurrent transaction
    /// (serialization failure, deadlock, lock wait): it changed nothing, and the same statement
    /// again may succeed.
    fn is_conflict(error: &sqlx::Error) -> bool;

    /// A server error after which its connection should not be reused: the connection is
    /// going away, or it reaches a server that takes no writes (a demoted primary; a new
    /// connection may reach the new one).
    fn server_discards_connection(error: &dyn DatabaseError) -> bool;

    /// An error after which this connection should not be reused: as the server's error says
    /// (see [`SqlDialect::server_discards_connection`]), or the connection itself broke.
    fn discards_connection(error: &sqlx::Error) -> bool {
        match error.as_database_error() {
            Some(db) => Self::server_discards_connection(db),
            None => matches!(
                error,
                sqlx::Error::Io(_) | sqlx::Error::Tls(_) | sqlx::Error::Protocol(_)
            ),
        }
    }
}
