//! Rows written by another boot: another kernel sharing the file (a second machine on a share
//! the filesystem check missed, a VM, a sandbox) must not have its live leases taken, while the
//! rows an earlier boot of this machine left are free at once. And a file of the schema before
//! the wall-clock columns is migrated when opened.
//!
//! The other kernel is this test binary run again in a mount namespace of its own in which
//! `/proc/sys/kernel/random/boot_id` is a file with another id bound over it: the real
//! authority, on the real file, with a boot id that is not this one (see [`other_kernel_role`]).

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::time::saturating_add;
use leasehold_core::{Authority, Instant, Lease, LeaseOptions, Released};
use sqlx::{Connection, SqliteConnection};
use tokio::io::{AsyncBufReadExt, BufReader};

const ROLE_URL: &str = "LEASEHOLD_SQLITE_OTHER_KERNEL_URL";
const ROLE_KEY: &str = "LEASEHOLD_SQLITE_OTHER_KERNEL_KEY";
/// The other kernel's lease: it renews every third of it, so its row is rewritten well after
/// this boot began.
const OTHER_TTL: Duration = Duration::from_millis(1500);
const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

mod common;

use common::{connect, key};

fn url(path: &Path) -> String {
    format!("sqlite://{}?timeout_ms=1000", path.display())
}

/// The machine's clocks as the authority reads them (tests run outside any time namespace).
fn monotonic_ns() -> i64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec * 1_000_000_000 + t.tv_nsec
}

fn wall_ns() -> i64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Realtime);
    t.tv_sec * 1_000_000_000 + t.tv_nsec
}

/// When this boot began, on the wall clock (what `/proc/stat` shows as `btime`, in ns).
fn boot_began_ns() -> i64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    wall_ns() - (t.tv_sec * 1_000_000_000 + t.tv_nsec)
}

/// Not a test of its own: the body of the other kernel's process. Without the URL in the
/// environment it does nothing. It takes the key with a renewing lease, prints
/// `HOLDING <fence> <boot id>`, and keeps it until killed.
#[test]
fn other_kernel_role() -> Result<(), String> {
    let Ok(url) = std::env::var(ROLE_URL) else {
        return Ok(());
    };
    let key = key(&std::env::var(ROLE_KEY).map_err(|e| format!("{ROLE_KEY}: {e}"))?)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("runtime: {e}"))?;
    runtime.block_on(async move {
        let authority = Arc::new(connect(&url).await?);
        let boot = authority.boot_id().to_string();
        let lease = Lease::acquire(
            authority,
            &key,
            OTHER_TTL,
            Duration::from_secs(30),
            LeaseOptions::default(),
        )
        .await
        .map_err(|e| format!("the other kernel's acquire: {e}"))?;
        println!("HOLDING {} {boot}", lease.fence().raw());
        tokio::time::sleep(Duration::from_secs(120)).await;
        drop(lease);
        Ok(())
    })
}

/// Starts [`other_kernel_role`] in a mount namespace of its own where the boot id reads `boot`.
fn other_kernel(
    dir: &Path,
    url: &str,
    key: &str,
    boot: &str,
) -> Result<tokio::process::Child, String> {
    let fake = dir.join("other-boot-id");
    std::fs::write(&fake, format!("{boot}\n")).map_err(|e| format!("write the boot id: {e}"))?;
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    tokio::process::Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(format!(
            "mount --bind \"$1\" {BOOT_ID} && exec \"$0\" --exact other_kernel_role --nocapture --test-threads=1"
        ))
        .arg(exe)
        .arg(fake)
        .env(ROLE_URL, url)
        .env(ROLE_KEY, key)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("start the other kernel's process with unshare (needs root): {e}"))
}

/// Another kernel holds a key through a renewing lease on the same file: for two of its TTLs
/// this boot can neither take the key nor see it free, though the row's boot id is not this
/// one. Once that process is killed the key is free again within a TTL of its last renewal
/// (by the wall clock its row carries), with a greater fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_lease_of_another_kernel_on_the_same_file_is_not_taken_over() -> Result<(), String> {
    let dir = tempfile::tempdir().map_err(|e| format!("tempdir: {e}"))?;
    let url = url(&dir.path().join("locks.db"));
    let key = key("boots/other-kernel")?;
    let here = connect(&url).await?;
    let other_boot = "0be7e12e-5a3e-4c11-9d2a-00000000000b";
    assert_ne!(here.boot_id(), other_boot);
    let mut holder = other_kernel(dir.path(), &url, key.as_str(), other_boot)?;
    let stdout = holder
        .stdout
        .take()
        .ok_or("the other kernel has no stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let (fence, boot) = loop {
        let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .map_err(|_| "the other kernel said nothing for 30 s")?
            .map_err(|e| format!("the other kernel's output: {e}"))?
            .ok_or("the other kernel ended before holding")?;
        // libtest prints the test's name on the same line, before it.
        if let Some((_, rest)) = line.split_once("HOLDING ") {
            let (fence, boot) = rest.trim().split_once(' ').ok_or(line.clone())?;
            let fence: u64 = fence.parse().map_err(|e| format!("{line}: {e}"))?;
            break (fence, boot.to_string());
        }
    };
    assert_eq!(
        boot, other_boot,
        "the other kernel's process read this boot's id"
    );
    // Two of its TTLs: without its renewals the lease would have run out by the wall clock too.
    let until = saturating_add(Instant::now(), OTHER_TTL * 2);
    while Instant::now() < until {
        let taken = here
            .try_acquire(&key, OTHER_TTL)
            .await
            .map_err(|e| format!("try_acquire: {e}"))?;
        if let Some(g) = taken {
            return Err(format!(
                "took the key (fence {}) from a live lease of another kernel (fence {fence})",
                g.fence().raw()
            ));
        }
        let seen = here
            .inspect(&key)
            .await
            .map_err(|e| format!("inspect: {e}"))?;
        if !seen.held || seen.remaining.is_none_or(|r| r > OTHER_TTL) {
            return Err(format!(
                "inspect shows the other kernel's live lease as {seen:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    holder
        .start_kill()
        .map_err(|e| format!("kill the other kernel: {e}"))?;
    let killed = Instant::now();
    let _ = holder.wait().await;
    // Its last renewal was at most a third of the TTL (plus one request) before the kill.
    let grant = loop {
        if let Some(g) = here
            .try_acquire(&key, OTHER_TTL)
            .await
            .map_err(|e| format!("try_acquire after the kill: {e}"))?
        {
            break g;
        }
        if killed.elapsed() > OTHER_TTL * 2 {
            return Err(format!(
                "the key stayed held {:?} after the other kernel's holder was killed",
                killed.elapsed()
            ));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let after = killed.elapsed();
    println!(
        "the other kernel's key was free {after:?} after its holder was killed (TTL {OTHER_TTL:?})"
    );
    if after < OTHER_TTL / 4 {
        return Err(format!(
            "the key was free {after:?} after the kill, before the other kernel's TTL ran out"
        ));
    }
    if grant.fence().raw() <= fence {
        return Err(format!(
            "fence {} after the other kernel's {fence}",
            grant.fence().raw()
        ));
    }
    let _ = here
        .release(&grant)
        .await
        .map_err(|e| format!("release: {e}"))?;
    Ok(())
}

/// Rows of another boot, as their wall-clock columns place them: written before this boot began
/// (an earlier boot of this machine: free, whatever their expiry says), written since but past
/// their wall-clock expiry (free), and written since and still running (held, with its time
/// left by the wall clock). A row of this boot is decided by the monotonic clock alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_of_other_boots_are_judged_by_when_they_were_written() -> Result<(), String> {
    let dir = tempfile::tempdir().map_err(|e| format!("tempdir: {e}"))?;
    let a = connect(&url(&dir.path().join("locks.db"))).await?;
    let ttl = Duration::from_secs(5);
    let other = "00000000-0000-0000-0000-000000000000";
    let hour = 3_600_000_000_000i64;
    let (wall, began) = (wall_ns(), boot_began_ns());
    // (key, boot, expires_ns, written, wall expiry, free?)
    let rows = [
        (
            "boot/earlier",
            other,
            i64::MAX,
            began - hour,
            began + hour,
            true,
        ),
        (
            "boot/since-expired",
            other,
            i64::MAX,
            began + 1,
            wall - 1,
            true,
        ),
        (
            "boot/since-live",
            other,
            0,
            wall - 1_000_000,
            wall + hour,
            false,
        ),
        (
            "boot/this-expired",
            a.boot_id(),
            monotonic_ns() - 1,
            wall,
            wall + hour,
            true,
        ),
        (
            "boot/this-live",
            a.boot_id(),
            monotonic_ns() + hour,
            wall,
            wall - 1,
            false,
        ),
    ];
    for (name, boot, expires, written, wall_expires, free) in rows {
        sqlx::query(
            "INSERT INTO leasehold_leases \
             (lock_key, owner, fence, boot_id, expires_ns, written_unix_ns, expires_unix_ns) \
             VALUES (?1, 'someone-else', 41, ?2, ?3, ?4, ?5)",
        )
        .bind(name)
        .bind(boot)
        .bind(expires)
        .bind(written)
        .bind(wall_expires)
        .execute(a.pool())
        .await
        .map_err(|e| format!("insert {name}: {e}"))?;
        let k = key(name)?;
        let seen = a
            .inspect(&k)
            .await
            .map_err(|e| format!("inspect {name}: {e}"))?;
        let taken = a
            .try_acquire(&k, ttl)
            .await
            .map_err(|e| format!("try_acquire {name}: {e}"))?;
        match (free, taken) {
            (true, Some(g)) => {
                if seen.held || g.fence().raw() != 42 {
                    return Err(format!("{name}: seen {seen:?}, taken with {}", g.fence()));
                }
                let _ = a.release(&g).await.map_err(|e| format!("release: {e}"))?;
            }
            (false, None) => {
                let left = seen.remaining.unwrap_or_default();
                if !seen.held || left < Duration::from_secs(3590) {
                    return Err(format!("{name}: held for an hour, seen as {seen:?}"));
                }
            }
            (true, None) => return Err(format!("{name}: stayed held")),
            (false, Some(g)) => {
                return Err(format!(
                    "{name}: a live lease was taken over (fence {})",
                    g.fence()
                ))
            }
        }
    }
    Ok(())
}

/// The lease table as the version before the wall-clock columns made it.
const PREVIOUS_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS \"leasehold_leases\" (
    lock_key    TEXT    NOT NULL PRIMARY KEY,
    owner       TEXT    NOT NULL,
    fence       INTEGER NOT NULL CHECK (fence > 0),
    boot_id     TEXT    NOT NULL,
    expires_ns  INTEGER NOT NULL,
    value       BLOB,
    value_fence INTEGER
) WITHOUT ROWID";

/// A file made with the previous schema, holding a live lease of this boot (fence 7) and a
/// lease of an earlier boot (fence 3), is opened by several clients at once: the wall-clock
/// columns are added, the live lease still holds its key, the earlier boot's row is free (it
/// carries no write time: written before the columns existed), and leases renew and release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_of_the_previous_schema_is_migrated_when_opened() -> Result<(), String> {
    let dir = tempfile::tempdir().map_err(|e| format!("tempdir: {e}"))?;
    let path = dir.path().join("previous.db");
    let boot = std::fs::read_to_string(BOOT_ID).map_err(|e| format!("{BOOT_ID}: {e}"))?;
    {
        let mut conn = SqliteConnection::connect(&format!("sqlite://{}?mode=rwc", path.display()))
            .await
            .map_err(|e| format!("create the previous file: {e}"))?;
        sqlx::query("PRAGMA journal_mode = WAL")
            .execute(&mut conn)
            .await
            .map_err(|e| format!("wal: {e}"))?;
        sqlx::query(PREVIOUS_SCHEMA)
            .execute(&mut conn)
            .await
            .map_err(|e| format!("previous schema: {e}"))?;
        sqlx::query(
            "INSERT INTO leasehold_leases (lock_key, owner, fence, boot_id, expires_ns) \
             VALUES ('migrate/held', 'an-older-process', 7, ?1, ?2), \
                    ('migrate/earlier', 'an-earlier-boot', 3, 'an-earlier-boot-id', ?3)",
        )
        .bind(boot.trim())
        .bind(monotonic_ns() + 3_600_000_000_000)
        .bind(i64::MAX)
        .execute(&mut conn)
        .await
        .map_err(|e| format!("previous rows: {e}"))?;
        conn.close()
            .await
            .map_err(|e| format!("close the previous file: {e}"))?;
    }
    let url = url(&path);
    let opening: Vec<_> = (0..4)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { connect(&url).await })
        })
        .collect();
    let mut clients = Vec::new();
    for o in opening {
        clients.push(o.await.map_err(|e| format!("join: {e}"))??);
    }
    let a = &clients[0];
    let columns: Vec<String> =
        sqlx::query_scalar("SELECT name FROM pragma_table_info('leasehold_leases')")
            .fetch_all(a.pool())
            .await
            .map_err(|e| format!("columns: {e}"))?;
    for wanted in ["written_unix_ns", "expires_unix_ns", "value", "value_fence"] {
        if !columns.iter().any(|c| c == wanted) {
            return Err(format!("no column {wanted} after opening: {columns:?}"));
        }
    }
    let held = key("migrate/held")?;
    let seen = a
        .inspect(&held)
        .await
        .map_err(|e| format!("inspect: {e}"))?;
    if !seen.held || seen.fence.map(|f| f.raw()) != Some(7) {
        return Err(format!("the live lease after migrating: {seen:?}"));
    }
    if a.try_acquire(&held, Duration::from_secs(5))
        .await
        .map_err(|e| format!("try_acquire held: {e}"))?
        .is_some()
    {
        return Err("took a live lease of this boot after migrating".into());
    }
    let earlier = key("migrate/earlier")?;
    let g = clients[1]
        .try_acquire(&earlier, Duration::from_secs(5))
        .await
        .map_err(|e| format!("try_acquire earlier: {e}"))?
        .ok_or("the earlier boot's row stayed held after migrating")?;
    if g.fence().raw() != 4 {
        return Err(format!("fence {} after the earlier boot's 3", g.fence()));
    }
    clients[1]
        .renew(&g, Duration::from_secs(10))
        .await
        .map_err(|e| format!("renew: {e}"))?;
    let released = clients[1]
        .release(&g)
        .await
        .map_err(|e| format!("release: {e}"))?;
    if released != Released::Released {
        return Err(format!("release after renew: {released:?}"));
    }
    Ok(())
}
