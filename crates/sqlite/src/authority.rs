//! The SQLite authority: leases are rows in one file, the machine's monotonic clock decides
//! expiry.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold_core::backend::{claim_or_give_back, Backoff, Left};
use leasehold_core::time::{saturating_add, FOREVER};
use leasehold_core::{
    Authority, Capabilities, Error, FenceSafety, FencingToken, Grant, Inspection, Instant,
    KeyPrefix, LockKey, LostReason, OwnerId, OwnerToken, Released, Result, Revoked, TtlRange,
    WaitStrategy,
};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{AssertSqlSafe, Connection, SqlSafeStr, SqlStr};
use tokio::sync::Notify;

use crate::clock::{MachineClock, Now};
use crate::config::SqliteConfig;
use crate::errors::{self, BACKEND};
use crate::mounts;
use crate::token::SqliteFence;

mod set_acquisition;

/// TTLs in whole milliseconds from 1 ms to 30 days: the clock is read in nanoseconds, and a
/// lease longer than a month is a configuration mistake, not a lock.
const TTL: TtlRange = TtlRange::new(
    Duration::from_millis(1),
    Duration::from_secs(30 * 24 * 3600),
    Duration::from_millis(1),
);

/// How often a waiter looks again at most (and at least, at first): the hand-off latency
/// between processes, which have no way to notify each other.
const POLL_FIRST: Duration = Duration::from_millis(2);
const POLL_CAP: Duration = Duration::from_millis(50);

/// The statements, with the validated table name in place.
///
/// Every statement that writes runs inside `BEGIN IMMEDIATE`, which takes the database's write
/// lock first (waiting up to the busy timeout), and the clock is read *after* that: so `now` is
/// the moment the statement runs with the lock held, never a moment before a wait for the lock.
/// The client's deadline is counted from before `BEGIN`, so it always ends first.
#[derive(Debug, Clone)]
struct Statements {
    acquire: SqlStr,
    holder: SqlStr,
    renew: SqlStr,
    release: SqlStr,
    proclaim: SqlStr,
    inspect: SqlStr,
    list_keys: SqlStr,
}

fn sql(s: String) -> SqlStr {
    // Built from constants and a table name validated to `[A-Za-z_][A-Za-z0-9_]*` and quoted.
    AssertSqlSafe(s).into_sql_str()
}

impl Statements {
    fn new(t: &str) -> Self {
        Statements {
            // ?1 key, ?2 owner, ?3 boot id, ?4 new expiry, ?5 now, ?6 the wall clock now, ?7 the
            // new expiry by the wall clock, ?8 when this boot began by the wall clock. The row is
            // taken over when its lease is over: for a row of this boot, expired by this boot's
            // monotonic clock; for a row of another boot, written before this boot began (an
            // earlier boot's, or from before the wall-clock columns: NULL), or past its expiry by
            // the wall clock (another kernel's lease that ran out). See `Inner::left`, which
            // reads a row the same way.
            acquire: sql(format!(
                "INSERT INTO \"{t}\" AS l \
                   (lock_key, owner, fence, boot_id, expires_ns, written_unix_ns, expires_unix_ns) \
                 VALUES (?1, ?2, 1, ?3, ?4, ?6, ?7) \
                 ON CONFLICT (lock_key) DO UPDATE \
                 SET owner = excluded.owner, fence = l.fence + 1, boot_id = excluded.boot_id, \
                     expires_ns = excluded.expires_ns, written_unix_ns = excluded.written_unix_ns, \
                     expires_unix_ns = excluded.expires_unix_ns \
                 WHERE CASE WHEN l.boot_id = excluded.boot_id THEN l.expires_ns <= ?5 \
                       ELSE l.written_unix_ns IS NULL OR l.written_unix_ns < ?8 \
                         OR l.expires_unix_ns IS NULL OR l.expires_unix_ns <= ?6 END \
                 RETURNING fence"
            )),
            holder: sql(format!(
                "SELECT boot_id, expires_ns, written_unix_ns, expires_unix_ns \
                 FROM \"{t}\" WHERE lock_key = ?1"
            )),
            // ?1 key, ?2 owner, ?3 fence, ?4 boot id, ?5 now, ?6 new expiry, ?7 the wall clock
            // now, ?8 the new expiry by the wall clock (what another kernel reads).
            renew: sql(format!(
                "UPDATE \"{t}\" SET expires_ns = ?6, written_unix_ns = ?7, expires_unix_ns = ?8 \
                 WHERE lock_key = ?1 AND owner = ?2 AND fence = ?3 AND boot_id = ?4 \
                   AND expires_ns > ?5"
            )),
            // Release expires the row instead of deleting it, so the fence counter never
            // restarts; ?6 is the wall clock now, so the row is over by it too.
            release: sql(format!(
                "UPDATE \"{t}\" SET expires_ns = ?5, written_unix_ns = ?6, expires_unix_ns = ?6 \
                 WHERE lock_key = ?1 AND owner = ?2 AND fence = ?3 AND boot_id = ?4 \
                   AND expires_ns > ?5"
            )),
            // ?1 key, ?2 owner, ?3 fence, ?4 boot id, ?5 now, ?6 the value. The same match as
            // renew; the value is stamped with the grant's fence, so a later grant (which raises
            // the fence) starts with none without acquire touching it.
            proclaim: sql(format!(
                "UPDATE \"{t}\" SET value = ?6, value_fence = fence \
                 WHERE lock_key = ?1 AND owner = ?2 AND fence = ?3 AND boot_id = ?4 \
                   AND expires_ns > ?5"
            )),
            // The value only if the grant in the row proclaimed it; liveness is decided by the
            // caller, on the machine's clock.
            inspect: sql(format!(
                "SELECT owner, fence, CASE WHEN value_fence = fence THEN value END, \
                        boot_id, expires_ns, written_unix_ns, expires_unix_ns \
                 FROM \"{t}\" WHERE lock_key = ?1"
            )),
            // ?1 the prefix, ?2 the first text above it (NULL: none), ?3 how many. SQLite
            // compares text bytewise (BINARY), as keys are ordered everywhere else.
            list_keys: sql(format!(
                "SELECT lock_key FROM \"{t}\" \
                 WHERE lock_key >= ?1 AND (?2 IS NULL OR lock_key < ?2) \
                 ORDER BY lock_key LIMIT ?3"
            )),
        }
    }
}

/// The SQL that creates the lease table (the authority runs it at connect, and adds the
/// columns of later versions to a table an older version created: `ADDED_COLUMNS`).
///
/// `expires_ns` is a reading of the machine's `CLOCK_MONOTONIC` in the boot `boot_id`, which
/// decides every row of this boot. `written_unix_ns` and `expires_unix_ns` are the wall clock's
/// time of the row's last write and the lease's end by the wall clock, for other boots to read:
/// a row of another boot is over if it was written before this boot began, or its wall-clock
/// expiry has passed. `value` is what the grant of fence `value_fence` proclaimed; it counts
/// only while that grant holds the row.
pub fn schema_sql(table: &str) -> Result<String> {
    let table = crate::config::table_name(table)?;
    Ok(format!(
        "CREATE TABLE IF NOT EXISTS \"{table}\" (\n\
         \x20   lock_key    TEXT    NOT NULL PRIMARY KEY,\n\
         \x20   owner       TEXT    NOT NULL,\n\
         \x20   fence       INTEGER NOT NULL CHECK (fence > 0),\n\
         \x20   boot_id     TEXT    NOT NULL,\n\
         \x20   expires_ns  INTEGER NOT NULL,\n\
         \x20   value       BLOB,\n\
         \x20   value_fence INTEGER,\n\
         \x20   written_unix_ns INTEGER,\n\
         \x20   expires_unix_ns INTEGER\n\
         ) WITHOUT ROWID;"
    ))
}

/// The columns added since the first version, with their types: what opening a database adds
/// to a lease table that lacks them (SQLite has no `ADD COLUMN IF NOT EXISTS`).
const ADDED_COLUMNS: [(&str, &str); 4] = [
    ("value", "BLOB"),
    ("value_fence", "INTEGER"),
    ("written_unix_ns", "INTEGER"),
    ("expires_unix_ns", "INTEGER"),
];

/// Adds the [`ADDED_COLUMNS`] that `table` lacks, keeping its rows. Looks first without the
/// write lock, so that opening an up-to-date file never waits for a writer; adds them inside
/// `BEGIN IMMEDIATE`, looking again there, so that processes opening the file together do not
/// both add a column: the second one waits for the write lock and then finds it there.
async fn add_missing_columns(
    pool: &SqlitePool,
    table: &str,
) -> std::result::Result<(), sqlx::Error> {
    const COLUMNS: &str = "SELECT name FROM pragma_table_info(?1)";
    let missing = |present: &[String]| {
        ADDED_COLUMNS
            .into_iter()
            .filter(|(column, _)| !present.iter().any(|p| p.eq_ignore_ascii_case(column)))
            .collect::<Vec<_>>()
    };
    let present: Vec<String> = sqlx::query_scalar(COLUMNS)
        .bind(table)
        .fetch_all(pool)
        .await?;
    if missing(&present).is_empty() {
        return Ok(());
    }
    let mut conn = pool.acquire().await?;
    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
    let present: Vec<String> = sqlx::query_scalar(COLUMNS)
        .bind(table)
        .fetch_all(&mut *tx)
        .await?;
    for (column, kind) in missing(&present) {
        sqlx::query(sql(format!(
            "ALTER TABLE \"{table}\" ADD COLUMN {column} {kind}"
        )))
        .execute(&mut *tx)
        .await?;
        tracing::info!(
            table,
            column,
            "added a column of this version to the lease table"
        );
    }
    tx.commit().await
}

struct Inner {
    /// The connections of lease requests, and only of them: an application that holds the
    /// connections of [`SqliteAuthority::pool`] cannot make a renewal wait for one.
    lease_pool: SqlitePool,
    /// The application's connections to the same file ([`SqliteAuthority::pool`]), opened when
    /// first used.
    app_pool: SqlitePool,
    config: SqliteConfig,
    /// The database file, absolute.
    path: PathBuf,
    shown: String,
    clock: MachineClock,
    capabilities: Capabilities,
    statements: Statements,
    /// Wakes this client's own waiters when it releases a lease or proclaims a value, so tasks
    /// sharing a client hand a key on (or see the value) at once; other processes' waiters find
    /// out by polling.
    changed: Notify,
    /// Whether this client has warned that another kernel holds a lease in the file (once: a
    /// waiter would otherwise warn at every poll).
    warned_foreign: AtomicBool,
}

/// When a lease row ends: the boot that wrote it, its expiry on that boot's monotonic clock,
/// and the wall clock's time of its last write and its expiry by the wall clock (absent in rows
/// written before those columns existed).
type Timing = (String, i64, Option<i64>, Option<i64>);

/// What [`Inner::conditional`] does to a lease we hold.
enum Step<'v> {
    Renew(Duration),
    Release,
    Proclaim(&'v [u8]),
}

/// What one acquisition step found: the fence if we won, else how long the holder has left by
/// the machine's clock.
type Acquired = std::result::Result<(Option<i64>, Option<Duration>), sqlx::Error>;

/// How long a step waits for the file's write lock: three quarters of the request timeout.
/// A writer that keeps the lock is then reported as that (`SQLITE_BUSY`: contention, the file
/// answered) before the request as a whole times out (no answer: unavailable), and the last
/// quarter is left for the rest of the step (a connection from the pool, the statements, the
/// commit's sync).
fn busy_timeout(request_timeout: Duration) -> Duration {
    (request_timeout / 4 * 3).min(Duration::from_millis(i32::MAX as u64))
}

fn ttl_ns(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_nanos()).unwrap_or(i64::MAX)
}

impl Inner {
    fn timeout(&self) -> Duration {
        self.config.client.request_timeout
    }

    /// How long a lease row still runs, read at `now`; the same judgement as the acquire
    /// statement's. A row of this boot runs until its monotonic expiry. A row of another boot
    /// written before this boot began is an earlier boot's, over whatever it says; one written
    /// since is another kernel's (a second machine, a VM, a sandbox sharing the file), and runs
    /// until its expiry by the wall clock, the only clock two kernels share.
    fn left(&self, row: &Timing, now: Now) -> Duration {
        let (boot_id, expires_ns, written_unix_ns, expires_unix_ns) = row;
        let ns = if *boot_id == self.clock.boot_id {
            expires_ns.saturating_sub(now.ns)
        } else {
            match (written_unix_ns, expires_unix_ns) {
                (Some(written), Some(expires)) if *written >= now.boot_began_unix_ns => {
                    let left = expires.saturating_sub(now.wall_ns);
                    if left > 0 && !self.warned_foreign.swap(true, Ordering::Relaxed) {
                        tracing::warn!(
                            path = %self.shown,
                            other_boot = %boot_id,
                            "a lease in this file was written by another boot since this one began: another machine, VM or sandbox is using the file, and SQLite's locks do not hold between kernels; its leases are respected until their wall-clock expiry"
                        );
                    }
                    left
                }
                _ => 0,
            }
        };
        Duration::from_nanos(u64::try_from(ns).unwrap_or(0))
    }

    /// `work` bounded by `give_up`, with leasehold's errors.
    async fn bounded<T>(
        &self,
        what: &str,
        give_up: Instant,
        work: impl std::future::Future<Output = std::result::Result<T, sqlx::Error>>,
    ) -> Result<T> {
        tokio::time::timeout_at(give_up, work)
            .await
            .map_err(|_| errors::timed_out(what, self.timeout()))?
            .map_err(|e| errors::map(e, what, &self.shown))
    }

    /// One acquisition step, for `owner`, in one `BEGIN IMMEDIATE` transaction. Runs in its own
    /// task (see [`SqliteAuthority::attempt`]), so it is never cut off halfway by a caller.
    ///
    /// `gone` says whether the caller stopped waiting for the answer. A dropped attempt queued
    /// for a connection or for the write lock then takes nothing: otherwise hundreds of dropped
    /// attempts would win a free key long after their callers left, each giving it back only
    /// afterwards, and a waiter could meet those short-lived orphans.
    async fn acquire_step(
        &self,
        key: &str,
        owner: &str,
        ttl: Duration,
        gone: impl Fn() -> bool,
    ) -> Acquired {
        let mut conn = self.lease_pool.acquire().await?;
        if gone() {
            return Ok((None, None));
        }
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
        if gone() {
            tx.rollback().await?;
            return Ok((None, None));
        }
        let now = self.clock.now();
        let won: Option<i64> = sqlx::query_scalar(self.statements.acquire.clone())
            .bind(key)
            .bind(owner)
            .bind(&self.clock.boot_id)
            .bind(now.ns.saturating_add(ttl_ns(ttl)))
            .bind(now.ns)
            .bind(now.wall_ns)
            .bind(now.wall_ns.saturating_add(ttl_ns(ttl)))
            .bind(now.boot_began_unix_ns)
            .fetch_optional(&mut *tx)
            .await?;
        let remaining = match won {
            Some(_) => None,
            None => {
                let row: Option<Timing> = sqlx::query_as(self.statements.holder.clone())
                    .bind(key)
                    .fetch_optional(&mut *tx)
                    .await?;
                row.map(|row| self.left(&row, now))
            }
        };
        tx.commit().await?;
        Ok((won, remaining))
    }

    /// How long the current holder of `key` has left (zero: free, or its lease is over), read
    /// without the write lock (WAL readers never wait for the writer).
    async fn peek(&self, key: &str) -> std::result::Result<Duration, sqlx::Error> {
        let row: Option<Timing> = sqlx::query_as(self.statements.holder.clone())
            .bind(key)
            .fetch_optional(&self.lease_pool)
            .await?;
        let now = self.clock.now();
        Ok(row.map_or(Duration::ZERO, |row| self.left(&row, now)))
    }

    /// Renews, releases or proclaims on a lease we hold: one conditional `UPDATE` on key,
    /// owner, fence and boot, only while the lease is live. Returns the rows changed.
    async fn conditional(
        &self,
        key: &str,
        owner: &str,
        fence: i64,
        step: Step<'_>,
    ) -> std::result::Result<u64, sqlx::Error> {
        let mut conn = self.lease_pool.acquire().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
        let now = self.clock.now();
        let done = match step {
            Step::Renew(ttl) => {
                sqlx::query(self.statements.renew.clone())
                    .bind(key)
                    .bind(owner)
                    .bind(fence)
                    .bind(&self.clock.boot_id)
                    .bind(now.ns)
                    .bind(now.ns.saturating_add(ttl_ns(ttl)))
                    .bind(now.wall_ns)
                    .bind(now.wall_ns.saturating_add(ttl_ns(ttl)))
                    .execute(&mut *tx)
                    .await?
            }
            Step::Proclaim(value) => {
                sqlx::query(self.statements.proclaim.clone())
                    .bind(key)
                    .bind(owner)
                    .bind(fence)
                    .bind(&self.clock.boot_id)
                    .bind(now.ns)
                    .bind(value)
                    .execute(&mut *tx)
                    .await?
            }
            Step::Release => {
                sqlx::query(self.statements.release.clone())
                    .bind(key)
                    .bind(owner)
                    .bind(fence)
                    .bind(&self.clock.boot_id)
                    .bind(now.ns)
                    .bind(now.wall_ns)
                    .execute(&mut *tx)
                    .await?
            }
        };
        tx.commit().await?;
        Ok(done.rows_affected())
    }

    /// Renews a batch in one `BEGIN IMMEDIATE` transaction (one write lock, one commit and one
    /// sync for all), each row matched as [`Step::Renew`] is. Returns whether each was renewed.
    async fn renew_batch(&self, grants: &[Grant]) -> std::result::Result<Vec<bool>, sqlx::Error> {
        let mut conn = self.lease_pool.acquire().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
        let now = self.clock.now();
        let mut renewed = Vec::with_capacity(grants.len());
        for grant in grants {
            let (key, owner, fence) = SqliteAuthority::owner_matches(grant);
            let done = sqlx::query(self.statements.renew.clone())
                .bind(key)
                .bind(owner)
                .bind(fence)
                .bind(&self.clock.boot_id)
                .bind(now.ns)
                .bind(now.ns.saturating_add(ttl_ns(grant.ttl())))
                .bind(now.wall_ns)
                .bind(now.wall_ns.saturating_add(ttl_ns(grant.ttl())))
                .execute(&mut *tx)
                .await?;
            renewed.push(done.rows_affected() == 1);
        }
        tx.commit().await?;
        Ok(renewed)
    }

    /// Releases a lease nobody was told about (its acquisition was cancelled or timed out, or
    /// its fence could not be used), so the key is free at once instead of after its TTL.
    async fn give_back(&self, key: String, owner: String, raw: i64, ttl: Duration) {
        let give_up = saturating_add(Instant::now(), ttl.max(self.timeout()));
        let released = self
            .bounded(
                "give back",
                give_up,
                self.conditional(&key, &owner, raw, Step::Release),
            )
            .await;
        match released {
            Ok(n) if n > 0 => {
                self.changed.notify_waiters();
                tracing::debug!("gave back a lease whose acquisition nobody awaited")
            }
            Ok(_) => tracing::trace!("a lease nobody awaited had already ended"),
            Err(error) => {
                tracing::debug!(%error, "could not give back a lease nobody awaited; it ends at its TTL")
            }
        }
    }
}

/// Whether an acquisition answer took a lease: its fence column, to give it back by.
fn won(acquired: &Acquired) -> Option<i64> {
    acquired.as_ref().ok().and_then(|(raw, _)| *raw)
}

fn spawn_give_back(inner: &Arc<Inner>, key: &str, owner: &str, raw: i64, ttl: Duration) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let (inner, key, owner) = (inner.clone(), key.to_string(), owner.to_string());
    runtime.spawn(async move { inner.give_back(key, owner, raw, ttl).await });
}

/// What one acquisition attempt found.
enum Attempt {
    Won(Grant),
    /// Held by someone else, for this long by the machine's clock (`None`: not known).
    Held(Option<Duration>),
}

/// An embedded authority: a lease table in one SQLite file, shared by the processes of one
/// machine. No server to run: the file is the authority.
///
/// * Acquire is one `BEGIN IMMEDIATE` transaction: an upsert that takes the key's row over only
///   when its lease is over (expired by the machine's clock; or of another boot and written
///   before this boot began, or past its wall-clock expiry: see docs/sqlite.md), raising
///   the row's `fence` counter, which is the fence. It runs on the caller's task, and on its own
///   if the caller is cancelled or times out first; a lease it took for nobody is given back.
/// * Renew and release are `UPDATE`s matched on key, owner token, fence and boot, only while
///   the lease is live; release expires the row and keeps its counter.
/// * Expiry is measured on the machine's `CLOCK_MONOTONIC`, read by the client after it holds
///   the write lock and passed into the statement, with the boot id beside it; never the wall
///   clock (see the crate's documentation).
/// * Waiting is jittered polling (2 to 50 ms, and never past the holder's expiry), reading
///   without the write lock until the key looks free; a release through the same client wakes
///   its waiters at once.
/// * Proclaim is an `UPDATE` matched as renew is, that stores the value with the grant's fence
///   beside it: it counts only while that grant holds the row. `wait_for_change` polls the
///   row until the key turns free or held (a release or proclaim through the same client cuts
///   it short).
/// * WAL mode, `synchronous=FULL` (a grant is on disk before anyone hears of it), and a busy
///   timeout of three quarters of the request timeout: a writer that keeps the lock longer makes
///   requests fail with a retryable `Backend` error (busy, not `Unavailable`), never "held".
///
/// Clones share the connection pool.
#[derive(Clone)]
pub struct SqliteAuthority {
    inner: Arc<Inner>,
}

impl fmt::Debug for SqliteAuthority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteAuthority")
            .field("path", &self.inner.path)
            .field("table", &self.inner.config.table)
            .field("boot_id", &self.inner.clock.boot_id)
            .finish_non_exhaustive()
    }
}

/// The database's absolute path and a refusal of what cannot work: a missing directory, or one
/// on a filesystem not known to be local to this kernel (unless allowed, then with a warning).
fn checked_path(config: &SqliteConfig, mounts_table: Option<&str>) -> Result<PathBuf> {
    let invalid = |reason: String| Error::InvalidConfig { reason };
    let dir = mounts::resolved_dir(&config.path).map_err(|e| {
        invalid(format!(
            "the directory of the SQLite database {} cannot be used ({e}); leasehold creates the file but not its directory, so a mistyped or unmounted path is not silently a new lock file",
            config.path.display()
        ))
    })?;
    if !dir.is_dir() {
        return Err(invalid(format!("{} is not a directory", dir.display())));
    }
    let name = config
        .path
        .file_name()
        .ok_or_else(|| invalid(format!("{} names no file", config.path.display())))?;
    let path = dir.join(name);
    // A database file that is a link to elsewhere lives where the link points.
    let real_dir = path
        .canonicalize()
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .unwrap_or_else(|| dir.clone());
    // Without a mounts table (no /proc) there is no boot id either, and connect refuses that
    // with `Unsupported` next.
    let Some(table) = mounts_table else {
        return Ok(path);
    };
    let what = match mounts::mount_of(&real_dir, table) {
        Some(found) if found.is_local() => return Ok(path),
        Some(found) => format!(
            "{} is on a filesystem of type {} ({} mounted at {}), which leasehold does not know as local to this machine's kernel",
            path.display(),
            found.fs_type,
            found.fs_type,
            found.mount_point.display()
        ),
        None => format!(
            "{} is on no filesystem that /proc/self/mounts lists, so leasehold cannot tell that it is local to this machine's kernel",
            path.display()
        ),
    };
    let why = "SQLite's locks and shared memory hold only among processes of one kernel, so processes of two machines (or VMs, or sandboxes) on it could both hold a lease";
    if !config.allow_network_fs {
        return Err(invalid(format!(
            "{what}: {why}; put the database on a local filesystem ({}), or use a server authority (postgres://, etcd://); allow_network_fs=true accepts it, with a warning, for a filesystem that only this machine's kernel uses",
            mounts::LOCAL_TYPES.join(", ")
        )));
    }
    tracing::warn!("{what}: {why}; accepted because allow_network_fs=true");
    Ok(path)
}

impl SqliteAuthority {
    /// Opens (creating if missing) the database a `sqlite://` URL names (see
    /// [`SqliteConfig::from_url`]) and creates the lease table in it if needed, or adds the
    /// columns of this version to one an older version created.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::with_config(SqliteConfig::from_url(url)?).await
    }

    /// Opens the database of a parsed configuration.
    ///
    /// # Errors
    /// `InvalidConfig` when the file's directory does not exist or is on a filesystem not known
    /// to be local to this kernel (NFS, SMB/CIFS, GFS2, FUSE, 9p, virtiofs, ...: see
    /// docs/sqlite.md), naming its type and the override `allow_network_fs=true`; `Unsupported` off Linux (no boot id);
    /// `Unavailable` when another process keeps the file locked past the timeout;
    /// `Unauthorized` for a file this process may only read; `Backend` for a file that is not a
    /// database or cannot be opened.
    pub async fn with_config(config: SqliteConfig) -> Result<Self> {
        let mounts_table = std::fs::read_to_string("/proc/self/mounts").ok();
        let path = checked_path(&config, mounts_table.as_deref())?;
        let clock = MachineClock::read()?;
        let shown = path.display().to_string();
        let timeout = config.client.request_timeout;
        let options = SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .foreign_keys(false)
            .busy_timeout(busy_timeout(timeout));
        let give_up = saturating_add(Instant::now(), timeout);
        let schema = schema_sql(&config.table)?;
        let mut backoff = Backoff::new(Duration::from_millis(2), Duration::from_millis(50));
        // Switching a new file to WAL needs an exclusive lock that the busy timeout does not
        // wait for: processes opening a fresh file together are retried, within the timeout.
        let pool = loop {
            let opened = async {
                let pool = SqlitePoolOptions::new()
                    .max_connections(config.pool_size)
                    .acquire_timeout(timeout.min(FOREVER))
                    .connect_with(options.clone())
                    .await?;
                sqlx::query(sql(schema.clone())).execute(&pool).await?;
                add_missing_columns(&pool, &config.table).await?;
                Ok::<_, sqlx::Error>(pool)
            };
            match tokio::time::timeout_at(give_up, opened).await {
                Err(_) => return Err(errors::timed_out("open", timeout)),
                Ok(Ok(pool)) => break pool,
                Ok(Err(e)) if errors::is_busy(&e) && Instant::now() < give_up => {
                    let next = saturating_add(Instant::now(), backoff.next_delay());
                    tokio::time::sleep_until(next.min(give_up)).await;
                }
                Ok(Err(e)) => return Err(errors::map(e, "open", &shown)),
            }
        };
        // A pool of its own, so that the application's connections are never the ones a lease
        // request waits for; the file's write lock is still one (see `pool`).
        let app_pool = SqlitePoolOptions::new()
            .max_connections(config.pool_size)
            .acquire_timeout(timeout.min(FOREVER))
            .connect_lazy_with(options);
        let capabilities = Capabilities::new(BACKEND, FenceSafety::Linearizable, true, TTL)
            .with_wait(WaitStrategy::Polling)
            .with_batch_renewal(true)
            .with_atomic_acquire_all(true);
        Ok(SqliteAuthority {
            inner: Arc::new(Inner {
                statements: Statements::new(&config.table),
                lease_pool: pool,
                app_pool,
                config,
                path,
                shown,
                clock,
                capabilities,
                changed: Notify::new(),
                warned_foreign: AtomicBool::new(false),
            }),
        })
    }

    /// Connections to the database file for the application: to read the lease table, or for
    /// its own writes in the same file. At most `pool_size` of them, opened when first used, and
    /// never the connections lease requests use, so holding them all stalls no acquisition,
    /// renewal or release.
    ///
    /// But the file has one write lock, shared with every lease request of every process on
    /// it: a write transaction through this pool delays every lease write on the file for as
    /// long as it holds the lock (a renewal waits up to the busy timeout, `timeout_ms`, then
    /// fails as `Unavailable` and the lease is suspended; a lease whose deadline passes while
    /// the lock is held is lost). Keep such transactions short, or keep the application's data
    /// in a database file of its own (see docs/sqlite.md).
    pub fn pool(&self) -> &SqlitePool {
        &self.inner.app_pool
    }

    /// Closes every connection of this client, the lease requests' and the application's
    /// ([`SqliteAuthority::pool`]), waiting for those in use to be returned. Requests made
    /// afterwards fail; the file and its leases stay as they are (a lease still held ends at
    /// its TTL).
    pub async fn close(&self) {
        self.inner.app_pool.close().await;
        self.inner.lease_pool.close().await;
    }

    /// The database file, absolute.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// The lease table's name.
    pub fn table(&self) -> &str {
        &self.inner.config.table
    }

    /// This boot's id, stored beside every expiry.
    pub fn boot_id(&self) -> &str {
        &self.inner.clock.boot_id
    }

    fn grant(
        &self,
        key: &LockKey,
        owner: OwnerToken,
        raw: i64,
        ttl: Duration,
        sent: Instant,
    ) -> Result<Grant> {
        let token = SqliteFence::from_column(raw)?;
        let fence = token.to_fence(BACKEND, self.inner.config.client.epoch)?;
        let deadline = self.inner.config.client.safety_margin.deadline(sent, ttl);
        Ok(leasehold_core::backend::grant(
            key.clone(),
            owner,
            fence,
            ttl,
            deadline,
        ))
    }

    /// One acquisition attempt. This side waits for the step's answer up to the request
    /// timeout; if it stops waiting first, the step finishes in a task of its own. Either way a
    /// lease the step takes is handed over or given back (see [`claim_or_give_back`]).
    async fn attempt(&self, key: &LockKey, ttl: Duration) -> Result<Attempt> {
        let owner = OwnerToken::generate()?;
        let owner_hex = owner.to_hex();
        // Read before the step: the grant's deadline counts from here, before the lock and
        // the clock reading that start the lease in the file.
        let sent = Instant::now();
        let give_up = saturating_add(sent, self.inner.timeout());
        let request = {
            let (inner, key, owner) = (
                self.inner.clone(),
                key.as_str().to_string(),
                owner_hex.clone(),
            );
            move |left: Left| async move { inner.acquire_step(&key, &owner, ttl, || left.get()).await }
        };
        let give_back = {
            let (inner, key, owner) = (
                self.inner.clone(),
                key.as_str().to_string(),
                owner_hex.clone(),
            );
            move |raw: i64| {
                let (inner, key, owner) = (inner.clone(), key.clone(), owner.clone());
                async move { inner.give_back(key, owner, raw, ttl).await }
            }
        };
        let acquired = claim_or_give_back(request, give_up, won, give_back)
            .await
            .map_err(|why| why.into_error(BACKEND, "acquire", self.inner.timeout()))?;
        match acquired {
            Err(e) => Err(errors::map(e, "acquire", &self.inner.shown)),
            Ok((Some(raw), _)) => match self.grant(key, owner, raw, ttl, sent) {
                Ok(grant) => Ok(Attempt::Won(grant)),
                Err(e) => {
                    spawn_give_back(&self.inner, key.as_str(), &owner_hex, raw, ttl);
                    Err(e)
                }
            },
            Ok((None, remaining)) => Ok(Attempt::Held(remaining)),
        }
    }

    fn owner_matches(grant: &Grant) -> (String, String, i64) {
        (
            grant.key().as_str().to_string(),
            grant.owner().to_hex(),
            // A fence's raw part is at most 2^48-1, so it always fits.
            grant.fence().raw() as i64,
        )
    }
}

#[async_trait]
impl Authority for SqliteAuthority {
    fn capabilities(&self) -> &Capabilities {
        &self.inner.capabilities
    }

    async fn try_acquire(&self, key: &LockKey, ttl: Duration) -> Result<Option<Grant>> {
        TTL.check(ttl)?;
        Ok(match self.attempt(key, ttl).await? {
            Attempt::Won(grant) => Some(grant),
            Attempt::Held(_) => None,
        })
    }

    /// One `BEGIN IMMEDIATE` transaction over the set (see `set_acquisition`).
    async fn try_acquire_all(&self, keys: &[LockKey], ttl: Duration) -> Result<Option<Vec<Grant>>> {
        self.acquire_set(keys, ttl).await
    }

    async fn acquire(&self, key: &LockKey, ttl: Duration, max_wait: Duration) -> Result<Grant> {
        TTL.check(ttl)?;
        let start = Instant::now();
        let give_up = saturating_add(start, max_wait);
        let mut poll = Backoff::new(POLL_FIRST, POLL_CAP);
        loop {
            let mut left = match self.attempt(key, ttl).await? {
                Attempt::Won(grant) => return Ok(grant),
                Attempt::Held(left) => left,
            };
            // Wait, reading without the write lock, until the key looks free: a crowd of
            // waiters then does not queue for the lock that renewals need.
            loop {
                let now = Instant::now();
                if now >= give_up {
                    return Err(Error::Timeout {
                        key: key.to_string(),
                        waited: now - start,
                    });
                }
                let mut delay = poll.next_delay();
                if let Some(left) = left.filter(|l| !l.is_zero()) {
                    delay = delay.min(left);
                }
                // Registered before the sleep, so a release by this client while we sleep
                // is not missed.
                let released = self.inner.changed.notified();
                tokio::select! {
                    _ = released => {}
                    _ = tokio::time::sleep_until(saturating_add(now, delay).min(give_up)) => {}
                }
                let looked = self
                    .inner
                    .bounded(
                        "acquire",
                        saturating_add(Instant::now(), self.inner.timeout()),
                        self.inner.peek(key.as_str()),
                    )
                    .await?;
                if looked.is_zero() {
                    break;
                }
                left = Some(looked);
            }
        }
    }

    async fn renew(&self, grant: &Grant, ttl: Duration) -> Result<Instant> {
        TTL.check(ttl)?;
        let (key, owner, fence) = Self::owner_matches(grant);
        let sent = Instant::now();
        let changed = self
            .inner
            .bounded(
                "renew",
                saturating_add(sent, self.inner.timeout()),
                self.inner
                    .conditional(&key, &owner, fence, Step::Renew(ttl)),
            )
            .await?;
        if changed != 1 {
            return Err(Error::lease_lost(grant.key().as_str(), LostReason::Refused));
        }
        Ok(self.inner.config.client.safety_margin.deadline(sent, ttl))
    }

    /// One transaction renews the whole batch.
    async fn renew_many(&self, grants: &[Grant]) -> Vec<Result<Instant>> {
        if let Err(refused) = leasehold_core::backend::check_batch_ttls(grants, &TTL) {
            return refused;
        }
        let sent = Instant::now();
        let renewed = self
            .inner
            .bounded(
                "renew",
                saturating_add(sent, self.inner.timeout()),
                self.inner.renew_batch(grants),
            )
            .await;
        match renewed {
            Err(e) => leasehold_core::backend::batch_failed(e, grants.len()),
            Ok(renewed) => leasehold_core::backend::batch_answers(
                grants,
                sent,
                &self.inner.config.client.safety_margin,
                |i, _| renewed.get(i) == Some(&true),
            ),
        }
    }

    async fn release(&self, grant: &Grant) -> Result<Released> {
        let (key, owner, fence) = Self::owner_matches(grant);
        let changed = self
            .inner
            .bounded(
                "release",
                saturating_add(Instant::now(), self.inner.timeout()),
                self.inner.conditional(&key, &owner, fence, Step::Release),
            )
            .await?;
        Ok(if changed > 0 {
            self.inner.changed.notify_waiters();
            Released::Released
        } else {
            Released::AlreadyGone
        })
    }

    /// One conditional `UPDATE` in `BEGIN IMMEDIATE`, matched as renew is (owner, fence, boot,
    /// live by the machine's clock read with the write lock held), that stamps the value with
    /// the grant's fence.
    async fn proclaim(&self, grant: &Grant, value: &[u8]) -> Result<()> {
        leasehold_core::backend::check_proclaimed(value)?;
        let (key, owner, fence) = Self::owner_matches(grant);
        let changed = self
            .inner
            .bounded(
                "proclaim",
                saturating_add(Instant::now(), self.inner.timeout()),
                self.inner
                    .conditional(&key, &owner, fence, Step::Proclaim(value)),
            )
            .await?;
        if changed != 1 {
            return Err(Error::lease_lost(grant.key().as_str(), LostReason::Refused));
        }
        self.inner.changed.notify_waiters();
        Ok(())
    }

    /// Polling, as the backend declares: nothing crosses processes, so it sleeps for
    /// `max_wait`, cut short by a release or proclaim through this same client (any key: a
    /// spurious wake costs one read).
    /// This client's own changes wake the wait at once; another process's reach it only
    /// through the file, so the row is read (without the write lock) every poll step, and a key
    /// that went from held to free or back ends the wait. A failed read ends it too: the
    /// caller's next read meets the error itself.
    async fn wait_for_change(&self, key: &LockKey, max_wait: Duration) -> Result<()> {
        let until = saturating_add(Instant::now(), max_wait);
        let read = |now: Instant| {
            let give_up = saturating_add(now, self.inner.timeout()).min(until);
            self.inner
                .bounded("wait for a change", give_up, self.inner.peek(key.as_str()))
        };
        let changed = self.inner.changed.notified();
        tokio::pin!(changed);
        let Ok(first) = read(Instant::now()).await else {
            return Ok(());
        };
        let mut poll = Backoff::new(POLL_FIRST, POLL_CAP);
        loop {
            let next = saturating_add(Instant::now(), poll.next_delay()).min(until);
            tokio::select! {
                _ = &mut changed => return Ok(()),
                _ = tokio::time::sleep_until(next) => {}
            }
            if next >= until {
                return Ok(());
            }
            match read(next).await {
                Ok(left) if left.is_zero() == first.is_zero() => {}
                _ => return Ok(()),
            }
        }
    }

    /// Reads the key's row outside any transaction: in WAL mode a reader takes no lock that a
    /// writer waits on, so holders and waiters are never delayed. Liveness and the remaining
    /// time are the machine's monotonic clock (read after the row, so the remaining time errs
    /// short) against the stored expiry; a row of another boot is free if it was written
    /// before this boot began, else it runs to its expiry by the wall clock. The fence
    /// column is the last fence issued (release and expiry keep the row).
    async fn inspect(&self, key: &LockKey) -> Result<Inspection> {
        let inner = &self.inner;
        let row: Option<(
            String,
            i64,
            Option<Vec<u8>>,
            String,
            i64,
            Option<i64>,
            Option<i64>,
        )> = inner
            .bounded(
                "inspect",
                saturating_add(Instant::now(), inner.timeout()),
                sqlx::query_as(inner.statements.inspect.clone())
                    .bind(key.as_str())
                    .fetch_optional(&inner.lease_pool),
            )
            .await?;
        let Some((owner, raw, value, boot, expires_ns, written, expires_unix)) = row else {
            return Ok(Inspection::free(BACKEND, key.clone()));
        };
        let fence = SqliteFence::from_column(raw)?.to_fence(BACKEND, inner.config.client.epoch)?;
        let left = inner.left(
            &(boot, expires_ns, written, expires_unix),
            inner.clock.now(),
        );
        let seen = if left > Duration::ZERO {
            Inspection::held(BACKEND, key.clone(), OwnerId::from_stored(&owner))
                .with_fence(Some(fence))
                .with_remaining(Some(left))
                .with_value(value)
        } else {
            Inspection::free(BACKEND, key.clone())
        };
        Ok(seen.with_last_fence(Some(fence)))
    }

    /// Reads the holder as inspect does, then ends that holder's lease as its own release
    /// would (matched on its owner and fence, in `BEGIN IMMEDIATE`): a holder that arrived in
    /// between has another fence and is left alone. A live row written under another boot
    /// (a file shared with another machine) does not match this boot's release, and is
    /// refused rather than misreported.
    async fn revoke(&self, key: &LockKey) -> Result<Revoked> {
        let inner = &self.inner;
        type Row = (
            String,
            i64,
            Option<Vec<u8>>,
            String,
            i64,
            Option<i64>,
            Option<i64>,
        );
        let row: Option<Row> = inner
            .bounded(
                "revoke",
                saturating_add(Instant::now(), inner.timeout()),
                sqlx::query_as(inner.statements.inspect.clone())
                    .bind(key.as_str())
                    .fetch_optional(&inner.lease_pool),
            )
            .await?;
        let Some((owner, raw, _, boot, expires_ns, written, expires_unix)) = row else {
            return Ok(Revoked::WasFree);
        };
        let left = inner.left(
            &(boot.clone(), expires_ns, written, expires_unix),
            inner.clock.now(),
        );
        if left == Duration::ZERO {
            return Ok(Revoked::WasFree);
        }
        let ended = inner
            .bounded(
                "revoke",
                saturating_add(Instant::now(), inner.timeout()),
                inner.conditional(key.as_str(), &owner, raw, Step::Release),
            )
            .await?;
        if ended == 0 {
            if boot != inner.clock.boot_id {
                return Err(Error::Unsupported {
                    backend: BACKEND,
                    operation: format!(
                        "revoking {key}: its lease was written under another boot ({boot})"
                    ),
                });
            }
            // The holder it read ended by itself meanwhile.
            return Ok(Revoked::WasFree);
        }
        inner.changed.notify_waiters();
        let fence = SqliteFence::from_column(raw)?.to_fence(BACKEND, inner.config.client.epoch)?;
        Ok(Revoked::Revoked { fence })
    }

    /// One read of the table's keys in the prefix's range, outside any transaction (as
    /// inspect): every key ever taken in this file (rows outlive release), held or not.
    async fn list_keys(&self, prefix: &KeyPrefix, limit: usize) -> Result<Vec<LockKey>> {
        let inner = &self.inner;
        let names: Vec<String> = inner
            .bounded(
                "list_keys",
                saturating_add(Instant::now(), inner.timeout()),
                sqlx::query_scalar(inner.statements.list_keys.clone())
                    .bind(prefix.as_str())
                    .bind(prefix.upper_bound())
                    .bind(i64::try_from(limit).unwrap_or(i64::MAX))
                    .fetch_all(&inner.lease_pool),
            )
            .await?;
        Ok(names
            .into_iter()
            .filter_map(|name| LockKey::new(name).ok())
            .collect())
    }
}

#[cfg(test)]
mod tests;
