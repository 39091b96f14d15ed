//! The default authority: a per-user SQLite file in the user's state directory, for `leasehold`
//! with no `--url` and no `LEASEHOLD_URL` (so it works on a bare machine, as `flock` does).

use std::ffi::OsString;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

/// Where the default file is, as `--help` and the messages say it.
pub const LOCATION: &str =
    "$XDG_STATE_HOME/leasehold/locks.db, or $HOME/.local/state/leasehold/locks.db";

/// The default database file, from the values of `XDG_STATE_HOME` and `HOME`. As the XDG base
/// directory specification says, a relative (or empty) `XDG_STATE_HOME` is ignored; so is a
/// relative `HOME` (it would name a different file in every working directory).
pub fn default_db(
    xdg_state_home: Option<OsString>,
    home: Option<OsString>,
) -> Result<PathBuf, String> {
    let absolute = |value: Option<OsString>| value.map(PathBuf::from).filter(|p| p.is_absolute());
    if let Some(state) = absolute(xdg_state_home) {
        return Ok(state.join("leasehold").join("locks.db"));
    }
    if let Some(home) = absolute(home) {
        return Ok(home.join(".local/state/leasehold/locks.db"));
    }
    Err(format!(
        "no authority: give --url or set LEASEHOLD_URL. Without them leasehold uses a per-user \
         SQLite file, {LOCATION}, but neither XDG_STATE_HOME nor HOME is set to an absolute path"
    ))
}

/// Creates the directory of `db` if it is missing (mode 0700: the file is the user's own; an
/// existing directory is left as it is), and returns the `sqlite://` URL of `db`.
pub fn prepare(db: &Path) -> Result<String, String> {
    if let Some(dir) = db.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| {
                format!(
                    "cannot create {} for the default authority: {e} (give --url or set \
                     LEASEHOLD_URL to use another)",
                    dir.display()
                )
            })?;
    }
    sqlite_url(db)
}

/// `sqlite://` and the path, percent-encoded where the URL would otherwise read it differently
/// (`?`, `#`, `%`, spaces, anything not ASCII).
pub fn sqlite_url(db: &Path) -> Result<String, String> {
    let text = db.to_str().ok_or_else(|| {
        format!(
            "the default authority's path {} is not UTF-8; give --url",
            db.display()
        )
    })?;
    let mut url = String::from("sqlite://");
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"/-._~".contains(&byte) {
            url.push(char::from(byte));
        } else {
            url.push_str(&format!("%{byte:02X}"));
        }
    }
    Ok(url)
}

/// The authority's URL: the one given, else the default file's (its directory created).
pub fn url_or_default(given: Option<&str>) -> Result<String, String> {
    match given {
        Some(url) => Ok(url.to_string()),
        None => prepare(&default_db(
            std::env::var_os("XDG_STATE_HOME"),
            std::env::var_os("HOME"),
        )?),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_conformance::kit::{ErrOrFail, OrFail, TestResult};

    fn os(s: &str) -> Option<OsString> {
        Some(OsString::from(s))
    }

    #[test]
    fn the_default_follows_xdg_then_home() -> TestResult {
        assert_eq!(
            default_db(os("/s"), os("/h")).or_fail("the default database under XDG_STATE_HOME")?,
            PathBuf::from("/s/leasehold/locks.db")
        );
        for xdg in [None, os(""), os("rel")] {
            assert_eq!(
                default_db(xdg, os("/h")).or_fail("the default database under XDG_STATE_HOME")?,
                PathBuf::from("/h/.local/state/leasehold/locks.db")
            );
        }
        for (xdg, home) in [(None, None), (os(""), os("")), (os("a"), os("b"))] {
            let e = default_db(xdg, home).err_or_fail("a default database with no home")?;
            assert!(e.contains("--url") && e.contains("XDG_STATE_HOME"), "{e}");
        }
        Ok(())
    }

    #[test]
    fn the_url_encodes_what_a_url_would_misread() -> TestResult {
        assert_eq!(
            sqlite_url(Path::new("/h/.local/state/leasehold/locks.db"))
                .or_fail("the sqlite URL of a plain path")?,
            "sqlite:///h/.local/state/leasehold/locks.db"
        );
        assert_eq!(
            sqlite_url(Path::new("/a b/c?d#e%f/é"))
                .or_fail("the sqlite URL of a path with URL syntax in it")?,
            "sqlite:///a%20b/c%3Fd%23e%25f/%C3%A9"
        );
        Ok(())
    }
}
