//! Proclaimed values on a SQLite file: a value belongs to its grant, a table of the previous
//! version is upgraded when the file is opened, and waits for a change wake on the same client's
//! proclaim and release.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use leasehold_conformance::kit::{ErrOrFail, OrFail, TestResult};
use leasehold_core::{Authority, Error, Instant, LockKey};
use leasehold_sqlite::SqliteAuthority;
use sqlx::{Connection, SqliteConnection};

mod common;

use common::{now_ns, url};

/// The value a grant proclaims belongs to that grant: a later grant on the key starts with none,
/// a stale grant's proclaim is refused with `LeaseLost` and leaves the holder's value as it was,
/// a released key shows no value, and a value over the limit is refused before any request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proclaimed_value_belongs_to_its_grant() -> TestResult {
    let dir = tempfile::tempdir().or_fail("a temporary directory")?;
    let path = dir.path().join("locks.db");
    let (a, b) = (
        SqliteAuthority::connect(&url(&path))
            .await
            .or_fail("connect A")?,
        SqliteAuthority::connect(&url(&path))
            .await
            .or_fail("connect B")?,
    );
    let key = LockKey::new("proclaim/owned").or_fail("the key")?;
    let ttl = Duration::from_millis(300);
    let old = a
        .try_acquire(&key, ttl)
        .await
        .or_fail("A acquires")?
        .or_fail("the key is free")?;
    a.proclaim(&old, b"old leader")
        .await
        .or_fail("A proclaims")?;
    let seen = b.inspect(&key).await.or_fail("B inspects")?;
    assert_eq!(seen.value.as_deref(), Some(&b"old leader"[..]), "{seen:?}");

    // The old grant runs out; the next one starts without a value.
    tokio::time::sleep(ttl + Duration::from_millis(50)).await;
    let new = b
        .try_acquire(&key, ttl * 100)
        .await
        .or_fail("B acquires")?
        .or_fail("A's grant ran out")?;
    assert!(new.fence() > old.fence());
    let seen = a.inspect(&key).await.or_fail("A inspects")?;
    assert!(seen.held && seen.value.is_none(), "{seen:?}");

    // The stale grant cannot write over the new holder's value, nor set one where it has none.
    let err = a
        .proclaim(&old, b"stale")
        .await
        .err_or_fail("A's stale proclaim")?;
    assert!(
        matches!(
            &err,
            Error::LeaseLost {
                reason: leasehold_core::LostReason::Refused,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(a.inspect(&key).await.or_fail("A inspects")?.value.is_none());
    b.proclaim(&new, b"new leader")
        .await
        .or_fail("B proclaims")?;
    let err = a
        .proclaim(&old, b"stale")
        .await
        .err_or_fail("A's stale proclaim")?;
    assert!(matches!(err, Error::LeaseLost { .. }), "{err:?}");
    let seen = a.inspect(&key).await.or_fail("A inspects")?;
    assert_eq!(seen.value.as_deref(), Some(&b"new leader"[..]), "{seen:?}");
    assert_eq!(seen.fence, Some(new.fence()));

    // Too long: refused before anything is sent; the value stays.
    let err = b
        .proclaim(&new, &vec![b'x'; leasehold_core::MAX_VALUE_LEN + 1])
        .await
        .err_or_fail("a proclaim over the limit")?;
    assert!(matches!(err, Error::InvalidConfig { .. }), "{err:?}");
    assert_eq!(
        a.inspect(&key)
            .await
            .or_fail("A inspects")?
            .value
            .as_deref(),
        Some(&b"new leader"[..])
    );

    // Released: free, no value; the next grant (the same client's) starts without one too.
    let _ = b.release(&new).await.or_fail("B releases")?;
    let seen = a.inspect(&key).await.or_fail("A inspects")?;
    assert!(!seen.held && seen.value.is_none(), "{seen:?}");
    let again = b
        .try_acquire(&key, ttl * 100)
        .await
        .or_fail("B acquires again")?
        .or_fail("the key is free")?;
    assert!(b.inspect(&key).await.or_fail("B inspects")?.value.is_none());
    let err = b
        .proclaim(&new, b"released")
        .await
        .err_or_fail("a released grant's proclaim")?;
    assert!(matches!(err, Error::LeaseLost { .. }), "{err:?}");
    let _ = b.release(&again).await.or_fail("B releases")?;
    Ok(())
}

/// The previous version's lease table, created by hand with its SQL, with a live lease in it.
const PREVIOUS_SCHEMA: &str = "CREATE TABLE \"leases_v0\" (
    lock_key   TEXT    NOT NULL PRIMARY KEY,
    owner      TEXT    NOT NULL,
    fence      INTEGER NOT NULL CHECK (fence > 0),
    boot_id    TEXT    NOT NULL,
    expires_ns INTEGER NOT NULL
) WITHOUT ROWID";

async fn previous_version_table(path: &Path, boot_id: &str) -> TestResult {
    let mut conn = SqliteConnection::connect(&format!("sqlite://{}?mode=rwc", path.display()))
        .await
        .or_fail("open the file")?;
    sqlx::query(PREVIOUS_SCHEMA)
        .execute(&mut conn)
        .await
        .or_fail("create the previous version's table")?;
    sqlx::query(
        "INSERT INTO leases_v0 (lock_key, owner, fence, boot_id, expires_ns) \
         VALUES ('upgrade/held', 'an-older-process', 7, ?1, ?2)",
    )
    .bind(boot_id)
    .bind(now_ns() + 3_600_000_000_000)
    .execute(&mut conn)
    .await
    .or_fail("insert a live lease")?;
    conn.close().await.or_fail("close the file")
}

/// A file whose lease table the previous version made (with a live lease in it) is upgraded when
/// clients open it, several at once: the columns are added, the rows kept (the held lease, its
/// fence, the counter), and proclaim works. A table remade the old way under an open client
/// (another program) gives a clear permanent error that says to connect again, which upgrades it.
/// (`boots.rs` migrates a file of the schema before the wall-clock columns.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_of_the_previous_version_is_upgraded_when_the_file_is_opened() -> TestResult {
    let dir = tempfile::tempdir().or_fail("a temporary directory")?;
    let path = dir.path().join("old.db");
    let boot_id =
        std::fs::read_to_string("/proc/sys/kernel/random/boot_id").or_fail("read the boot id")?;
    previous_version_table(&path, boot_id.trim()).await?;
    let url = format!("{}&table=leases_v0", url(&path));
    let opening: Vec<_> = (0..6)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { SqliteAuthority::connect(&url).await })
        })
        .collect();
    let mut clients = Vec::new();
    for o in opening {
        clients.push(o.await.or_fail("the connecting task")?.or_fail("connect")?);
    }
    let a = clients[0].clone();
    let columns: Vec<String> =
        sqlx::query_scalar("SELECT name FROM pragma_table_info('leases_v0')")
            .fetch_all(a.pool())
            .await
            .or_fail("read the table's columns")?;
    assert_eq!(
        columns,
        [
            "lock_key",
            "owner",
            "fence",
            "boot_id",
            "expires_ns",
            "value",
            "value_fence",
            "written_unix_ns",
            "expires_unix_ns"
        ]
    );
    let held = LockKey::new("upgrade/held").or_fail("a key")?;
    let seen = a.inspect(&held).await.or_fail("inspect the held key")?;
    assert!(seen.held && seen.value.is_none(), "{seen:?}");
    assert_eq!(seen.fence.map(|f| f.raw()), Some(7));
    assert!(a
        .try_acquire(&held, Duration::from_secs(5))
        .await
        .or_fail("try the held key")?
        .is_none());
    let key = LockKey::new("upgrade/new").or_fail("a key")?;
    let g = a
        .try_acquire(&key, Duration::from_secs(30))
        .await
        .or_fail("acquire a new key")?
        .or_fail("the new key is free")?;
    a.proclaim(&g, b"after the upgrade")
        .await
        .or_fail("proclaim after the upgrade")?;
    assert_eq!(
        clients[1]
            .inspect(&key)
            .await
            .or_fail("another client inspects")?
            .value
            .as_deref(),
        Some(&b"after the upgrade"[..])
    );

    // Another program remakes the table the old way while this client is open.
    sqlx::query("DROP TABLE leases_v0")
        .execute(a.pool())
        .await
        .or_fail("drop the table")?;
    drop(clients);
    previous_version_table(&path, boot_id.trim()).await?;
    let err = a
        .inspect(&held)
        .await
        .err_or_fail("inspect on the remade table")?;
    let err2 = a
        .proclaim(&g, b"v")
        .await
        .err_or_fail("proclaim on the remade table")?;
    // Acquisitions write the wall-clock columns too, so they say the same.
    let err3 = a
        .try_acquire(&key, Duration::from_secs(30))
        .await
        .err_or_fail("acquire on the remade table")?;
    for err in [err, err2, err3] {
        assert!(
            matches!(
                err,
                Error::Backend {
                    retryable: false,
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(err.to_string().contains("connect again"), "{err}");
    }
    // Connecting again upgrades it, and every client works on it again.
    let again = SqliteAuthority::connect(&url)
        .await
        .or_fail("connect again")?;
    let g = again
        .try_acquire(&key, Duration::from_secs(30))
        .await
        .or_fail("acquire after connecting again")?
        .or_fail("the new key is free")?;
    let seen = again.inspect(&held).await.or_fail("inspect the held key")?;
    assert!(
        seen.held && seen.fence.map(|f| f.raw()) == Some(7),
        "{seen:?}"
    );
    again
        .proclaim(&g, b"again")
        .await
        .or_fail("proclaim after connecting again")?;
    assert_eq!(
        a.inspect(&key)
            .await
            .or_fail("the first client inspects")?
            .value
            .as_deref(),
        Some(&b"again"[..])
    );
    Ok(())
}

/// Tasks sharing a client see its proclaim and release at once in `wait_for_change` (polling
/// otherwise, as declared), and `Duration::MAX` waits without panicking and can be dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_for_change_wakes_on_the_same_clients_changes() -> TestResult {
    let dir = tempfile::tempdir().or_fail("a temporary directory")?;
    let a = Arc::new(
        SqliteAuthority::connect(&url(&dir.path().join("locks.db")))
            .await
            .or_fail("connect")?,
    );
    let key = LockKey::new("wait/same-client").or_fail("the key")?;
    let g = a
        .try_acquire(&key, Duration::from_secs(30))
        .await
        .or_fail("acquire")?
        .or_fail("the key is free")?;
    for proclaim in [true, false] {
        let w = {
            let (a, key) = (a.clone(), key.clone());
            tokio::spawn(async move {
                a.wait_for_change(&key, Duration::from_secs(20))
                    .await
                    .or_fail("wait for a change")?;
                TestResult::Ok(Instant::now())
            })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!w.is_finished());
        let sent = Instant::now();
        if proclaim {
            a.proclaim(&g, b"v").await.or_fail("proclaim")?;
        } else {
            let _ = a.release(&g).await.or_fail("release")?;
        }
        let woken = tokio::time::timeout(Duration::from_secs(5), w)
            .await
            .or_fail("the wait was not woken")?
            .or_fail("the waiting task")??;
        assert!(woken - sent < Duration::from_secs(1), "{:?}", woken - sent);
    }
    let forever = tokio::time::timeout(
        Duration::from_millis(100),
        a.wait_for_change(&key, Duration::MAX),
    )
    .await;
    assert!(forever.is_err());
    Ok(())
}

/// Another client's release wakes `wait_for_change` within a few polls: processes share only the
/// file, so the wait reads the row (without the write lock) instead of sleeping out `max_wait`.
/// A semaphore's waiter in another process learns of a freed permit this way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_for_change_wakes_on_another_clients_release() -> TestResult {
    let dir = tempfile::tempdir().or_fail("a temporary directory")?;
    let path = dir.path().join("locks.db");
    let a = SqliteAuthority::connect(&url(&path))
        .await
        .or_fail("connect A")?;
    let b = Arc::new(
        SqliteAuthority::connect(&url(&path))
            .await
            .or_fail("connect B")?,
    );
    let key = LockKey::new("wait/other-client").or_fail("the key")?;
    let g = a
        .try_acquire(&key, Duration::from_secs(30))
        .await
        .or_fail("A acquires")?
        .or_fail("the key is free")?;
    let max_wait = Duration::from_secs(20);
    let w = {
        let (b, key) = (b.clone(), key.clone());
        tokio::spawn(async move {
            b.wait_for_change(&key, max_wait)
                .await
                .or_fail("B waits for a change")?;
            TestResult::Ok(Instant::now())
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    if w.is_finished() {
        return Err("B's wait returned while A still held the key".into());
    }
    let sent = Instant::now();
    let _ = a.release(&g).await.or_fail("A releases")?;
    let woken = tokio::time::timeout(max_wait, w)
        .await
        .or_fail("B's wait was not woken within max_wait")?
        .or_fail("the waiting task")??;
    // A tenth of max_wait: the old sleep-only wait returned only at max_wait.
    let took = woken - sent;
    if took > max_wait / 10 {
        return Err(format!("B learnt of A's release only after {took:?}").into());
    }
    Ok(())
}
