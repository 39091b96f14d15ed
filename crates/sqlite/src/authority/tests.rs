//! Unit tests of the SQLite authority's own parts, on files in temporary directories.

use super::*;
use leasehold_conformance::kit::{ErrOrFail, OrFail, TestResult};

const MOUNTS: &str = "/dev/sda1 / ext4 rw 0 0\nnas:/x /net nfs4 rw 0 0\n";

#[test]
fn filesystems_not_known_as_local_are_refused_unless_allowed() -> TestResult {
    let dir = std::env::temp_dir();
    let local = SqliteConfig::new(dir.join("a.db"));
    assert_eq!(
        checked_path(&local, Some(MOUNTS)).or_fail("the checked path of a local file")?,
        dir.canonicalize()
            .or_fail("the canonical temporary directory")?
            .join("a.db")
    );
    // The temporary directory, as if it were mounted from a NAS.
    let resolved = dir
        .canonicalize()
        .or_fail("the canonical temporary directory")?;
    let nfs = format!("{MOUNTS}nas:/tmp {} nfs rw 0 0\n", resolved.display());
    let err = checked_path(&local, Some(&nfs)).err_or_fail("a path on NFS")?;
    assert!(matches!(err, Error::InvalidConfig { .. }), "{err}");
    assert!(
        err.to_string().contains("of type nfs (nfs mounted at"),
        "{err}"
    );
    let allowed = local.clone().with_allow_network_fs(true);
    assert!(checked_path(&allowed, Some(&nfs)).is_ok());
    // No mounts table (not Linux, /proc not mounted): nothing to check against.
    assert!(checked_path(&local, None).is_ok());
    // A relative path is the current directory's, resolved at connect.
    let relative = checked_path(&SqliteConfig::new("locks.db"), Some(MOUNTS))
        .or_fail("the checked relative path")?;
    assert_eq!(
        relative,
        std::env::current_dir()
            .or_fail("the current directory")?
            .canonicalize()
            .or_fail("the canonical current directory")?
            .join("locks.db")
    );
    Ok(())
}

#[test]
fn a_missing_directory_is_refused_not_created() -> TestResult {
    let missing = std::env::temp_dir().join("leasehold-no-such-dir-4f1c/sub/locks.db");
    let err = checked_path(&SqliteConfig::new(missing), Some(MOUNTS))
        .err_or_fail("a missing directory")?;
    assert!(matches!(err, Error::InvalidConfig { .. }), "{err}");
    assert!(err.to_string().contains("not its directory"), "{err}");
    Ok(())
}

/// What the conformance suite cannot set up: a row of an earlier boot (free, whatever its
/// expiry reads, but its fence is still the last one issued) and a foreign owner.
#[tokio::test]
async fn inspect_reads_boots_and_foreign_owners() -> TestResult {
    let dir = tempfile::tempdir().or_fail("a temporary directory")?;
    let url = format!("sqlite://{}", dir.path().join("locks.db").display());
    let a = SqliteAuthority::connect(&url)
        .await
        .or_fail("connecting to the sqlite database")?;
    let insert = "INSERT INTO leasehold_leases (lock_key, owner, fence, boot_id, expires_ns) \
                  VALUES (?1, 'a-peer-secret', 41, ?2, ?3)";
    for (key, boot) in [
        ("earlier", "00000000-0000-0000-0000-000000000000"),
        ("this", a.boot_id()),
    ] {
        sqlx::query(insert)
            .bind(key)
            .bind(boot)
            .bind(i64::MAX)
            .execute(a.pool())
            .await
            .or_fail("writing a row that expires at i64::MAX")?;
    }
    let earlier = a
        .inspect(&LockKey::new("earlier").or_fail("the key earlier")?)
        .await
        .or_fail("inspecting earlier")?;
    assert!(!earlier.held && earlier.owner.is_none(), "{earlier:?}");
    assert_eq!(earlier.last_fence.map(|f| f.raw()), Some(41));
    let this = a
        .inspect(&LockKey::new("this").or_fail("the key this")?)
        .await
        .or_fail("inspecting this")?;
    assert!(this.held, "{this:?}");
    assert_eq!(this.fence.map(|f| f.raw()), Some(41));
    let owner = this.owner.or_fail("the owner of this")?;
    assert!(
        owner.is_peer() && !owner.as_str().contains("secret"),
        "{owner}"
    );
    let never = a
        .inspect(&LockKey::new("never").or_fail("the key never")?)
        .await
        .or_fail("inspecting never")?;
    assert!(!never.held && never.last_fence.is_none(), "{never:?}");
    Ok(())
}

#[test]
fn schema_names_are_validated() -> TestResult {
    assert!(schema_sql("leases")
        .or_fail("the schema SQL")?
        .contains("\"leases\""));
    assert!(schema_sql("a\"b").is_err());
    Ok(())
}
