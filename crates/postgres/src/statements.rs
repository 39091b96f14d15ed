//! The lease statements: the SQL of every lease operation with the validated table name in
//! place, the forms for a table an older version made, and the schema `migrate` applies.

use std::time::Duration;

use sqlx::{AssertSqlSafe, SqlSafeStr, SqlStr};

use crate::notify;
use crate::table::TableName;

/// The statements, with the validated table name in place, prepared once per connection.
///
/// # Why `statement_timestamp()`
/// Only the database's clock decides expiry, and it must be read once per statement:
/// * `now()` is frozen at the start of the *transaction*. Inside a caller's long transaction, or
///   a transaction held open by a pooler, it can be far in the past: a renewal would then see an
///   expired lease as live.
/// * `clock_timestamp()` changes while the statement runs, so the expiry check and the new
///   expiry could be computed from two different instants.
/// * `statement_timestamp()` is one instant, taken when the statement arrived: after the client
///   sent it (so the client's deadline, counted from before sending, ends first), and before any
///   wait for a row lock (so a check after such a wait errs towards "still held").
#[derive(Debug, Clone)]
pub(crate) struct Statements {
    pub(crate) acquire: SqlStr,
    pub(crate) acquire_again: SqlStr,
    pub(crate) acquire_or_remaining: SqlStr,
    /// The set's step (see `authority::set_acquisition`).
    pub(crate) acquire_set: SqlStr,
    pub(crate) renew: SqlStr,
    pub(crate) renew_many: SqlStr,
    pub(crate) release: SqlStr,
    pub(crate) give_back_unconfirmed: SqlStr,
    pub(crate) mark_waited: SqlStr,
    pub(crate) proclaim: SqlStr,
    pub(crate) revoke: SqlStr,
    /// The forms of `acquire_or_remaining` and `release` for a table `migrate` has not upgraded
    /// yet (no `waited_until`): waiters mark nothing and every release notifies.
    pub(crate) previous: Previous,
    pub(crate) inspect: SqlStr,
    pub(crate) list_keys: SqlStr,
}

pub(crate) fn sql(s: String) -> SqlStr {
    // Every statement is built from constants and a `TableName`, whose parts are validated to
    // `[A-Za-z_][A-Za-z0-9_]*` and quoted: nothing from a user reaches the text unchecked.
    AssertSqlSafe(s).into_sql_str()
}

/// The statements of the version before `waited_until`, run while the table lacks it.
#[derive(Debug, Clone)]
pub(crate) struct Previous {
    pub(crate) acquire_or_remaining: SqlStr,
    pub(crate) release: SqlStr,
}

/// How long past the holder's expiry a waiter's mark lasts: the waiter looks again at that
/// expiry (plus at most 20 ms of jitter), so a release by the next holder before then still
/// wakes it; a scheduling delay longer than this only means the waiter's own timer is already due.
const MARK_SLACK: &str = "interval '1 second'";

/// The longest a `wait_for_change` mark lasts, and so the longest one wait lasts: callers of a
/// hint look again anyway.
pub(crate) const MARK_MAX: Duration = Duration::from_secs(3600);

impl Statements {
    pub(crate) fn new(t: &TableName) -> Self {
        let upsert = format!(
            "INSERT INTO {t} AS l (lock_key, owner, fence, expires_at) \
             VALUES ($1, $2, 1, statement_timestamp() + $3::float8 * interval '1 millisecond') \
             ON CONFLICT (lock_key) DO UPDATE \
             SET owner = excluded.owner, fence = l.fence + 1, expires_at = excluded.expires_at \
             WHERE l.expires_at <= statement_timestamp() \
             RETURNING fence"
        );
        let remaining = format!(
            "SELECT (SELECT fence FROM won), \
                    (SELECT greatest(0, ceil(extract(epoch FROM expires_at - statement_timestamp()) * 1000))::bigint \
                       FROM {t} WHERE lock_key = $1)"
        );
        let released = format!(
            "UPDATE {t} SET expires_at = statement_timestamp() \
             WHERE lock_key = $1 AND owner = $2 AND fence = $3 AND expires_at > statement_timestamp()"
        );
        let channel = notify::CHANNEL;
        Statements {
            // An acquisition sent again after its first statement went unanswered (a silent
            // connection, or a slow server), with the same owner token: it takes an expired
            // key as `acquire` does, and finds a key that first statement took meanwhile held
            // under its own owner token, which it leaves as it is and answers with its fence:
            // both statements then report the same grant. The owner token is fresh for every
            // acquisition, so no lease anyone else was told about has it.
            acquire_again: sql(format!(
                "INSERT INTO {t} AS l (lock_key, owner, fence, expires_at) \
                 VALUES ($1, $2, 1, statement_timestamp() + $3::float8 * interval '1 millisecond') \
                 ON CONFLICT (lock_key) DO UPDATE SET \
                   owner = CASE WHEN l.expires_at <= statement_timestamp() THEN excluded.owner ELSE l.owner END, \
                   fence = CASE WHEN l.expires_at <= statement_timestamp() THEN l.fence + 1 ELSE l.fence END, \
                   expires_at = CASE WHEN l.expires_at <= statement_timestamp() THEN excluded.expires_at ELSE l.expires_at END \
                 WHERE l.expires_at <= statement_timestamp() OR l.owner = excluded.owner \
                 RETURNING fence"
            )),
            acquire: sql(upsert.clone()),
            acquire_set: crate::authority::acquire_set_sql(t),
            // One upsert that either takes the key (expired: as `acquire`) or, finding it
            // held, marks it waited on until just past the holder's expiry, so that a release
            // before then notifies, and returns that expiry as the waiter's fallback timer: one
            // round trip, one row version. ON CONFLICT decides on the newest committed version
            // of the row, so a release or a new grant that committed after this statement's
            // snapshot, unannounced because nobody had marked the key yet, is what it sees: the
            // waiter takes a released key, and looks again when a new holder's expiry says
            // instead of at the expiry of a holder that is gone. The owner column says which
            // happened (the owner token is fresh for every attempt). A waiter's every attempt
            // after its first runs this (the first is the plain upsert, which takes a free key
            // without a mark); one upsert, because two data-modifying CTEs cost each attempt
            // more (measured, see docs/performance-log.md).
            acquire_or_remaining: sql(format!(
                "INSERT INTO {t} AS l (lock_key, owner, fence, expires_at) \
                 VALUES ($1, $2, 1, statement_timestamp() + $3::float8 * interval '1 millisecond') \
                 ON CONFLICT (lock_key) DO UPDATE SET \
                   owner = CASE WHEN l.expires_at <= statement_timestamp() THEN excluded.owner ELSE l.owner END, \
                   fence = CASE WHEN l.expires_at <= statement_timestamp() THEN l.fence + 1 ELSE l.fence END, \
                   expires_at = CASE WHEN l.expires_at <= statement_timestamp() THEN excluded.expires_at ELSE l.expires_at END, \
                   waited_until = CASE WHEN l.expires_at <= statement_timestamp() THEN l.waited_until \
                                  ELSE greatest(l.waited_until, l.expires_at + {MARK_SLACK}) END \
                 RETURNING CASE WHEN l.owner = $2 THEN l.fence END, \
                           CASE WHEN l.owner <> $2 THEN greatest(0, ceil(extract(epoch FROM l.expires_at - statement_timestamp()) * 1000))::bigint END"
            )),
            renew: sql(format!(
                "UPDATE {t} SET expires_at = statement_timestamp() + $4::float8 * interval '1 millisecond' \
                 WHERE lock_key = $1 AND owner = $2 AND fence = $3 AND expires_at > statement_timestamp()"
            )),
            // The renew above for a whole batch, in one statement: arrays of keys, owners,
            // fences and TTLs; returns the rows it renewed.
            renew_many: sql(format!(
                "UPDATE {t} AS l SET expires_at = statement_timestamp() + r.ttl_ms * interval '1 millisecond' \
                 FROM unnest($1::text[], $2::text[], $3::bigint[], $4::float8[]) AS r(lock_key, owner, fence, ttl_ms) \
                 WHERE l.lock_key = r.lock_key AND l.owner = r.owner AND l.fence = r.fence \
                   AND l.expires_at > statement_timestamp() \
                 RETURNING l.lock_key, l.fence"
            )),
            // Release expires the row instead of deleting it, so the fence counter never
            // restarts, and announces the release when the transaction commits, if a waiter
            // marked the key: PostgreSQL delivers a NOTIFY by signalling every listening server
            // process, which an uncontended pair should not pay for.
            // One plain UPDATE: the notification is a side effect of its RETURNING clause (a
            // CTE with an aggregate over it cost 15 µs more per release, measured).
            release: sql(format!(
                "{released} RETURNING CASE WHEN waited_until > statement_timestamp() \
                   THEN pg_notify('{channel}', $4 || ' ' || lock_key) END IS NULL"
            )),
            // The release of a grant whose acquisition's COMMIT went unanswered (see
            // `Inner::give_back_unconfirmed`): an upsert, so that it waits for a transaction
            // still inserting or updating the row and then matches its outcome. A key that had
            // no row gets one already expired, which is what a release leaves.
            give_back_unconfirmed: sql(format!(
                "INSERT INTO {t} AS l (lock_key, owner, fence, expires_at) \
                 VALUES ($1, $2, 1, statement_timestamp()) \
                 ON CONFLICT (lock_key) DO UPDATE SET expires_at = statement_timestamp() \
                 WHERE l.owner = $2 AND l.fence = $3 AND l.expires_at > statement_timestamp() \
                 RETURNING CASE WHEN l.waited_until > statement_timestamp() \
                   THEN pg_notify('{channel}', $4 || ' ' || l.lock_key) END IS NULL"
            )),
            // A waiter for any change (`wait_for_change`) marks the key for as long as it
            // waits (a mark is only ever extended), and reads the newest version of the row:
            // a change the caller has not seen yet returns at once.
            mark_waited: sql(format!(
                "UPDATE {t} SET waited_until = \
                   greatest(waited_until, statement_timestamp() + $2::float8 * interval '1 millisecond') \
                 WHERE lock_key = $1 \
                 RETURNING fence, expires_at > statement_timestamp()"
            )),
            previous: Previous {
                acquire_or_remaining: sql(format!("WITH won AS ({upsert}) {remaining}")),
                release: sql(format!(
                    "{released} RETURNING pg_notify('{channel}', $4 || ' ' || lock_key) IS NULL"
                )),
            },
            // The same match as renew. The value is stamped with the grant's fence: a later
            // grant raises the fence, so the value stops counting without acquire touching it.
            // Announced on the release channel so that observers and waiters look again.
            proclaim: sql(format!(
                "WITH proclaimed AS ( \
                   UPDATE {t} SET value = $4, value_fence = fence \
                   WHERE lock_key = $1 AND owner = $2 AND fence = $3 AND expires_at > statement_timestamp() \
                   RETURNING lock_key) \
                 SELECT count(*) FROM (SELECT pg_notify('{channel}', $5 || ' ' || lock_key) FROM proclaimed) n"
            )),
            // An operator's revoke: the live row, whoever holds it, expires now, in one
            // statement (its row lock means no holder can arrive between the check and the
            // update). The row stays, so the next grant's fence is one more. Always announced:
            // a revoke is rare, and its waiters should not wait for the expiry timer.
            revoke: sql(format!(
                "UPDATE {t} SET expires_at = statement_timestamp() \
                 WHERE lock_key = $1 AND expires_at > statement_timestamp() \
                 RETURNING fence, pg_notify('{channel}', $2 || ' ' || lock_key) IS NULL"
            )),
            // A plain read: under MVCC it takes no row lock, so it never waits for, nor delays,
            // an acquire, renew or release. The remaining time is counted on the database's
            // clock, in whole milliseconds rounded up (so a live lease never shows 0). The value
            // counts only if the live grant proclaimed it (its fence stamped on it).
            inspect: sql(format!(
                "SELECT owner, fence, expires_at > statement_timestamp(), \
                        greatest(0, ceil(extract(epoch FROM expires_at - statement_timestamp()) * 1000))::bigint, \
                        CASE WHEN value_fence = fence AND expires_at > statement_timestamp() THEN value END \
                 FROM {t} WHERE lock_key = $1"
            )),
            // $1 the prefix, $2 the first text above it (NULL: none), $3 how many. Compared
            // and sorted bytewise (`COLLATE "C"`), as keys are everywhere else; rows outlive
            // release, so free keys are listed too.
            list_keys: sql(format!(
                "SELECT lock_key FROM {t} \
                 WHERE lock_key COLLATE \"C\" >= $1 \
                   AND ($2::text IS NULL OR lock_key COLLATE \"C\" < $2) \
                 ORDER BY lock_key COLLATE \"C\" LIMIT $3"
            )),
        }
    }
}

/// The SQL that creates the lease table, or upgrades one an older version created (what
/// [`crate::PostgresAuthority::migrate`] runs), for DBAs who apply schema themselves. Idempotent.
///
/// `value` and `value_fence` hold what a grant proclaimed ([`leasehold_core::Authority::proclaim`]);
/// the value counts only while `value_fence` equals the row's `fence`, so acquire, renew and
/// release never touch them and a new grant starts with none. `waited_until` is set by waiters: a release
/// notifies only while it is in the future.
pub fn schema_sql(table: &TableName) -> String {
    format!("{}\n{}", create_sql(table), add_columns_sql(table))
}

pub(crate) fn create_sql(table: &TableName) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {table} (\n\
         \x20   lock_key     text        PRIMARY KEY,\n\
         \x20   owner        text        NOT NULL,\n\
         \x20   fence        bigint      NOT NULL CHECK (fence > 0),\n\
         \x20   expires_at   timestamptz NOT NULL,\n\
         \x20   value        bytea,\n\
         \x20   value_fence  bigint,\n\
         \x20   waited_until timestamptz\n\
         ) WITH (fillfactor = 70);"
    )
}

/// The columns added since the first version: nullable without a default, so adding them to
/// a table in use changes only the catalog, never rewrites the rows.
pub(crate) fn add_columns_sql(table: &TableName) -> String {
    format!(
        "ALTER TABLE {table}\n\
         \x20   ADD COLUMN IF NOT EXISTS value        bytea,\n\
         \x20   ADD COLUMN IF NOT EXISTS value_fence  bigint,\n\
         \x20   ADD COLUMN IF NOT EXISTS waited_until timestamptz;"
    )
}

/// How many of the added columns the table has: `ALTER TABLE` takes the table's strongest lock
/// even when there is nothing to add, and would queue every lease statement behind it, so
/// `migrate` looks first.
pub(crate) const ADDED_COLUMNS: &str = "SELECT count(*) FROM pg_attribute \
     WHERE attrelid = to_regclass($1) AND attname IN ('value', 'value_fence', 'waited_until') \
       AND attnum > 0 AND NOT attisdropped";
pub(crate) const ADDED: i64 = 3;
