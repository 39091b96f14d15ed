//! External mode: endpoints of servers someone else started (e.g. `docker compose up` with the
//! repository's `docker-compose.yml`), named by environment variables.
//!
//! A test may use these instead of starting managed servers. Fault scenarios (kill, pause,
//! restart, failover) need managed servers: the harness can only signal processes it started.
//! An unset or empty variable gives `None`.

/// Comma-separated etcd client endpoints, e.g. `127.0.0.1:2379`.
pub const ETCD_ENDPOINTS_VAR: &str = "LEASEHOLD_ETCD_ENDPOINTS";

/// A ZooKeeper connect string, e.g. `127.0.0.1:2181`.
pub const ZK_HOSTS_VAR: &str = "LEASEHOLD_ZK_HOSTS";

/// A Redis URL, e.g. `redis://127.0.0.1:6379`.
pub const REDIS_URL_VAR: &str = "LEASEHOLD_REDIS_URL";

/// A PostgreSQL URL, e.g. `postgres://leasehold@127.0.0.1:5432/postgres`.
pub const POSTGRES_URL_VAR: &str = "LEASEHOLD_POSTGRES_URL";

/// A MariaDB (or MySQL) URL, e.g. `mysql://leasehold:leasehold@127.0.0.1:3306/leasehold`.
pub const MARIADB_URL_VAR: &str = "LEASEHOLD_MARIADB_URL";

/// An S3 endpoint with a bucket named [`crate::object_stores::BUCKET`], e.g. moto's
/// `http://127.0.0.1:5000` (path-style requests, any credentials).
pub const S3_ENDPOINT_VAR: &str = "LEASEHOLD_S3_ENDPOINT";

/// Azurite's blob endpoint of its development account, with a container named
/// [`crate::object_stores::BUCKET`], e.g. `http://127.0.0.1:10000/devstoreaccount1`.
pub const AZURITE_ENDPOINT_VAR: &str = "LEASEHOLD_AZURITE_ENDPOINT";

fn non_empty(var: &str) -> Option<String> {
    std::env::var(var)
        .ok()
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

/// `LEASEHOLD_ETCD_ENDPOINTS`: external etcd endpoints, comma-separated.
pub fn etcd_endpoints() -> Option<String> {
    non_empty(ETCD_ENDPOINTS_VAR)
}

/// `LEASEHOLD_ETCD_ENDPOINTS` split at commas, as etcd clients take them.
pub fn etcd_endpoint_list() -> Option<Vec<String>> {
    etcd_endpoints().map(|v| {
        v.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect()
    })
}

/// `LEASEHOLD_ZK_HOSTS`: an external ZooKeeper connect string.
pub fn zk_hosts() -> Option<String> {
    non_empty(ZK_HOSTS_VAR)
}

/// `LEASEHOLD_REDIS_URL`: an external Redis.
pub fn redis_url() -> Option<String> {
    non_empty(REDIS_URL_VAR)
}

/// `LEASEHOLD_POSTGRES_URL`: an external PostgreSQL.
pub fn postgres_url() -> Option<String> {
    non_empty(POSTGRES_URL_VAR)
}

/// `LEASEHOLD_MARIADB_URL`: an external MariaDB or MySQL.
pub fn mariadb_url() -> Option<String> {
    non_empty(MARIADB_URL_VAR)
}

/// `LEASEHOLD_S3_ENDPOINT`: an external S3 API (moto, say).
pub fn s3_endpoint() -> Option<String> {
    non_empty(S3_ENDPOINT_VAR)
}

/// `LEASEHOLD_AZURITE_ENDPOINT`: an external Azurite's blob endpoint, account included.
pub fn azurite_endpoint() -> Option<String> {
    non_empty(AZURITE_ENDPOINT_VAR)
}
