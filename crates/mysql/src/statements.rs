//! The lease statements: the SQL of every lease operation with the validated table name in
//! place, and the schema `migrate` applies.
//!
//! # Why `UTC_TIMESTAMP(6)`
//! Only the server's clock decides expiry, read once per statement: `UTC_TIMESTAMP(6)` is the
//! instant the statement started, the same everywhere in it (`SYSDATE()` moves while it runs),
//! and in UTC whatever the session's `time_zone` (`NOW()` follows it, so two clients in two
//! zones would disagree about every expiry). The client's deadline is counted from before the
//! statement was sent, so it ends first.

use leasehold_core::MAX_VALUE_LEN;
use sqlx::{AssertSqlSafe, SqlSafeStr, SqlStr};

use crate::table::TableName;

/// The statements, with the validated table name in place, prepared once per connection.
#[derive(Debug, Clone)]
pub(crate) struct Statements {
    pub(crate) acquire: SqlStr,
    pub(crate) acquire_again: SqlStr,
    /// The set's upsert and its check (see `authority::set_acquisition`).
    pub(crate) acquire_set: SqlStr,
    pub(crate) taken_of_set: SqlStr,
    pub(crate) renew: SqlStr,
    pub(crate) renew_many: SqlStr,
    pub(crate) live_of_batch: SqlStr,
    pub(crate) release: SqlStr,
    pub(crate) proclaim: SqlStr,
    pub(crate) revoke: SqlStr,
    pub(crate) inspect: SqlStr,
    pub(crate) list_keys: SqlStr,
}

/// A renewal batch (one JSON array parameter) as a table.
const BATCH: &str = "JSON_TABLE(?, '$[*]' COLUMNS (\
    lock_key VARBINARY(800) PATH '$[0]', owner VARBINARY(64) PATH '$[1]', \
    fence BIGINT UNSIGNED PATH '$[2]', ttl_us BIGINT UNSIGNED PATH '$[3]'))";

fn sql(s: String) -> SqlStr {
    // Built from constants and a `TableName`, validated to `[A-Za-z_][A-Za-z0-9_]*` and quoted:
    // nothing from a user reaches the text unchecked.
    AssertSqlSafe(s).into_sql_str()
}

/// The condition "the lease on this row is over", by the server's clock.
const EXPIRED: &str = "expires_at <= UTC_TIMESTAMP(6)";

impl Statements {
    pub(crate) fn new(t: &TableName) -> Self {
        // Matched as renew, release and proclaim match: the grant's key, owner token and fence,
        // while its lease is live.
        let ours = "lock_key = ? AND owner = ? AND fence = ? AND expires_at > UTC_TIMESTAMP(6)";
        let (acquire_set, taken_of_set) = crate::authority::set_statements(t);
        Statements {
            acquire_set,
            taken_of_set,
            // ?1 key, ?2 owner, ?3 TTL in microseconds. One statement, atomic by itself: InnoDB
            // takes the row's exclusive lock before it evaluates the UPDATE part on the newest
            // committed row, so acquisitions of one key are ordered by it, and no transaction
            // is left open by a client that goes away. There is no RETURNING here: the fence
            // comes back as the reply's `last_insert_id`, which `LAST_INSERT_ID(x)` sets: 1 for
            // a new row, the raised fence for a row taken over, 0 for a row still held (the
            // driver asks for found rows, so affected rows cannot tell a new row from an
            // unchanged one). MySQL assigns left to right, each assignment seeing the ones
            // before: `expires_at` goes last, so every condition reads the old expiry.
            acquire: sql(format!(
                "INSERT INTO {t} (lock_key, owner, fence, expires_at) \
                 VALUES (?, ?, LAST_INSERT_ID(1), UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND) \
                 ON DUPLICATE KEY UPDATE \
                   owner = IF({EXPIRED}, VALUES(owner), owner), \
                   fence = IF({EXPIRED}, LAST_INSERT_ID(fence + 1), fence + 0 * LAST_INSERT_ID(0)), \
                   expires_at = IF({EXPIRED}, VALUES(expires_at), expires_at)"
            )),
            // An acquisition sent again after its first statement went unanswered (a silent
            // connection, or a slow server), with the same owner token: it takes an expired key
            // as `acquire` does, and finds a key that the first statement took meanwhile held
            // under its own owner token, which it leaves as it is and answers with its fence:
            // both statements then report the same grant. `owner` is assigned first and keeps
            // its old value on a live row, so the comparison reads the holder's token. The
            // owner token is fresh for every acquisition, so no lease anyone else was told
            // about has it.
            acquire_again: sql(format!(
                "INSERT INTO {t} (lock_key, owner, fence, expires_at) \
                 VALUES (?, ?, LAST_INSERT_ID(1), UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND) \
                 ON DUPLICATE KEY UPDATE \
                   owner = IF({EXPIRED}, VALUES(owner), owner), \
                   fence = IF({EXPIRED}, LAST_INSERT_ID(fence + 1), \
                              IF(owner = VALUES(owner), LAST_INSERT_ID(fence), fence + 0 * LAST_INSERT_ID(0))), \
                   expires_at = IF({EXPIRED}, VALUES(expires_at), expires_at)"
            )),
            // ?1 TTL in microseconds, then the grant. Found rows: 1 when renewed.
            renew: sql(format!(
                "UPDATE {t} SET expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND WHERE {ours}"
            )),
            // ?1 the batch, a JSON array of [key, owner, fence, TTL in microseconds]: each row
            // matched as `renew` matches it.
            renew_many: sql(format!(
                "UPDATE {t} AS l JOIN {BATCH} AS r \
                   ON l.lock_key = r.lock_key AND l.owner = r.owner AND l.fence = r.fence \
                 SET l.expires_at = UTC_TIMESTAMP(6) + INTERVAL r.ttl_us MICROSECOND \
                 WHERE l.expires_at > UTC_TIMESTAMP(6)"
            )),
            // ?1 the same batch, right after `renew_many`: the rows it renewed (see
            // `authority::batch_renewal`).
            live_of_batch: sql(format!(
                "SELECT l.lock_key, l.fence FROM {t} AS l JOIN {BATCH} AS r \
                   ON l.lock_key = r.lock_key AND l.owner = r.owner AND l.fence = r.fence \
                 WHERE l.expires_at > UTC_TIMESTAMP(6)"
            )),
            // Expires the row instead of deleting it, so the fence counter never restarts.
            release: sql(format!(
                "UPDATE {t} SET expires_at = UTC_TIMESTAMP(6) WHERE {ours}"
            )),
            // ?1 the value, then the grant. The value is stamped with the grant's fence: a later
            // grant raises the fence, so the value stops counting without acquire touching it.
            proclaim: sql(format!(
                "UPDATE {t} SET value = ?, value_fence = fence WHERE {ours}"
            )),
            // ?1 the key. An operator's revoke: the live row, whoever holds it, expires now, in
            // one statement (the row's exclusive lock orders it among the key's acquisitions).
            // The holder's fence comes back as the reply's `last_insert_id`, as acquire's does;
            // the row stays, so the next grant's fence is one more.
            revoke: sql(format!(
                "UPDATE {t} SET fence = LAST_INSERT_ID(fence), expires_at = UTC_TIMESTAMP(6) \
                 WHERE lock_key = ? AND expires_at > UTC_TIMESTAMP(6)"
            )),
            // A plain (consistent, non-locking) read: never waits for, nor delays, a holder.
            // The remaining time in whole milliseconds rounded up, so a live lease never shows 0.
            inspect: sql(format!(
                "SELECT owner, fence, CAST(expires_at > UTC_TIMESTAMP(6) AS SIGNED), \
                        CAST(GREATEST(0, CEIL(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) / 1000)) AS SIGNED), \
                        IF(value_fence = fence AND expires_at > UTC_TIMESTAMP(6), value, NULL) \
                 FROM {t} WHERE lock_key = ?"
            )),
            // ?1 the prefix, ?2 and ?3 the first key above it (NULL: none), ?4 how many. Keys
            // are VARBINARY: compared and sorted bytewise. Rows outlive release, so free keys
            // are listed too.
            list_keys: sql(format!(
                "SELECT lock_key FROM {t} WHERE lock_key >= ? AND (? IS NULL OR lock_key < ?) \
                 ORDER BY lock_key LIMIT ?"
            )),
        }
    }
}

/// The SQL that creates the lease table (what [`crate::MysqlAuthority::migrate`] runs), for
/// DBAs who apply schema themselves. Idempotent.
///
/// Keys are `VARBINARY` (a key is at most 200 characters, so 800 bytes of UTF-8): compared
/// bytewise, as keys are everywhere else, where a `utf8mb4` collation would pad spaces and make
/// `a` and `a ` one row. `expires_at` is UTC, written and compared with `UTC_TIMESTAMP(6)`
/// only. `value` and `value_fence` hold what a grant proclaimed; the value counts only while
/// `value_fence` equals the row's `fence`.
pub fn schema_sql(table: &TableName) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {table} (\n\
         \x20   lock_key    VARBINARY(800)  NOT NULL PRIMARY KEY,\n\
         \x20   owner       VARBINARY(64)   NOT NULL,\n\
         \x20   fence       BIGINT UNSIGNED NOT NULL,\n\
         \x20   expires_at  DATETIME(6)     NOT NULL,\n\
         \x20   value       VARBINARY({MAX_VALUE_LEN}) NULL,\n\
         \x20   value_fence BIGINT UNSIGNED NULL\n\
         ) ENGINE = InnoDB;"
    )
}
