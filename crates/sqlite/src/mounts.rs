//! Is the database on a network filesystem? SQLite's locks are unreliable there.
//!
//! SQLite's exclusion rests on POSIX advisory locks and, in WAL mode, on a shared-memory index
//! mapped by every process. On NFS, SMB/CIFS and their kin the locks are emulated or missing, and
//! the shared memory is not shared between machines: two holders of one key would follow. So a
//! path on such a filesystem is refused unless the operator says otherwise
//! (`allow_network_fs=true`, for a share one machine alone uses, with a warning).

use std::path::{Path, PathBuf};

/// Filesystem types (as `/proc/self/mounts` names them) whose locks SQLite cannot rely on.
const NETWORK_TYPES: &[&str] = &[
    "nfs",
    "nfs4",
    "cifs",
    "smb",
    "smb2",
    "smb3",
    "smbfs",
    "ncpfs",
    "ceph",
    "glusterfs",
    "lustre",
    "gpfs",
    "afs",
    "coda",
    "9p",
    "virtiofs",
    "davfs",
    "fuse.sshfs",
    "fuse.glusterfs",
    "fuse.cephfs",
    "fuse.s3fs",
    "fuse.rclone",
    "fuse.gcsfuse",
    "fuse.davfs",
    "fuse.smbnetfs",
];

/// A network filesystem found under a path: where it is mounted and what it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct NetworkMount {
    pub(crate) mount_point: PathBuf,
    pub(crate) fs_type: String,
}

/// The filesystem `path` (absolute, with symbolic links resolved) lives on, looked up in a
/// mounts table in the format of `/proc/self/mounts`, if it is a network filesystem. The longest
/// mount point that contains the path wins; a later line for the same mount point (a mount on
/// top of another) wins over an earlier one.
pub(crate) fn network_mount(path: &Path, mounts: &str) -> Option<NetworkMount> {
    let mut best: Option<(PathBuf, String)> = None;
    for line in mounts.lines() {
        let mut fields = line.split_whitespace();
        let (Some(_device), Some(point), Some(fs_type)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let point = PathBuf::from(unescape(point));
        if !path.starts_with(&point) {
            continue;
        }
        let longer = best
            .as_ref()
            .is_none_or(|(p, _)| point.as_os_str().len() >= p.as_os_str().len());
        if longer {
            best = Some((point, fs_type.to_string()));
        }
    }
    let (mount_point, fs_type) = best?;
    is_network(&fs_type).then_some(NetworkMount {
        mount_point,
        fs_type,
    })
}

fn is_network(fs_type: &str) -> bool {
    let t = fs_type.to_ascii_lowercase();
    NETWORK_TYPES.contains(&t.as_str())
}

/// Undoes the octal escapes of `/proc/self/mounts` (`\040` for a space, `\011`, `\012`, `\134`).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 4 <= bytes.len() {
            let digits = &bytes[i + 1..i + 4];
            if digits.iter().all(|d| (b'0'..=b'7').contains(d)) {
                let value = digits
                    .iter()
                    .fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0'));
                if let Ok(b) = u8::try_from(value) {
                    out.push(b);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The directory that will hold the database, absolute and with links resolved, so that the
/// mounts table's mount points can be compared with it.
pub(crate) fn resolved_dir(file: &Path) -> std::io::Result<PathBuf> {
    let dir = match file.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    dir.canonicalize()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "\
sysfs /sys sysfs rw,nosuid,nodev,noexec,relatime 0 0
/dev/sda1 / ext4 rw,relatime 0 0
tmpfs /tmp tmpfs rw,nosuid,nodev 0 0
nas:/export/home /home nfs4 rw,relatime,vers=4.2 0 0
/dev/sdb1 /home/alice/local ext4 rw 0 0
//fileserver/share /mnt/my\\040share cifs rw,vers=3.0 0 0
alice@box:/ /mnt/ssh fuse.sshfs rw,nosuid,nodev 0 0
overlay /var/lib/docker/overlay2/x/merged overlay rw 0 0
/dev/sdc1 /srv ext4 rw 0 0
server:/srv /srv nfs rw 0 0
";

    fn check(path: &str) -> Option<(String, String)> {
        network_mount(Path::new(path), TABLE)
            .map(|m| (m.mount_point.display().to_string(), m.fs_type))
    }

    #[test]
    fn local_filesystems_pass() {
        assert_eq!(check("/var/lib/app"), None);
        assert_eq!(check("/tmp/x"), None);
        assert_eq!(check("/var/lib/docker/overlay2/x/merged/data"), None);
        // A local disk mounted inside an NFS home: the longer mount point wins.
        assert_eq!(check("/home/alice/local/db"), None);
        // `/homeless` is not under `/home`: components, not string prefixes.
        assert_eq!(check("/homeless"), None);
    }

    #[test]
    fn network_filesystems_are_found() {
        assert_eq!(check("/home/alice"), Some(("/home".into(), "nfs4".into())));
        assert_eq!(check("/home"), Some(("/home".into(), "nfs4".into())));
        assert_eq!(
            check("/mnt/my share/locks"),
            Some(("/mnt/my share".into(), "cifs".into()))
        );
        assert_eq!(
            check("/mnt/ssh/x"),
            Some(("/mnt/ssh".into(), "fuse.sshfs".into()))
        );
        // NFS mounted over a local /srv: the later mount is the one in use.
        assert_eq!(check("/srv/data"), Some(("/srv".into(), "nfs".into())));
    }

    #[test]
    fn escapes_and_junk_lines() {
        assert_eq!(unescape("/mnt/a\\040b\\134c"), "/mnt/a b\\c");
        assert_eq!(unescape("/plain"), "/plain");
        assert_eq!(unescape("/end\\04"), "/end\\04");
        assert_eq!(network_mount(Path::new("/x"), "garbage\n\n"), None);
    }
}
