//! Is the database on a filesystem local to this kernel? SQLite's locks are unreliable anywhere
//! else.
//!
//! SQLite's exclusion rests on POSIX advisory locks and, in WAL mode, on a shared-memory index
//! mapped by every process. Both work only where every process that opens the file runs on one
//! kernel: on NFS, SMB/CIFS, cluster filesystems (GFS2, OCFS2), parallel ones (BeeGFS, Lustre),
//! FUSE filesystems and the shares of VMs and sandboxes (9p, virtiofs) the locks are emulated,
//! partial or another kernel's, and the shared memory is not shared: two holders of one key would
//! follow. Such filesystems are many and new ones appear, so a list of them always misses one;
//! the check is therefore an allow-list of the filesystems the kernel itself keeps, and anything
//! else is refused unless the operator says otherwise (`allow_network_fs=true`, for a filesystem
//! that this kernel alone uses, with a warning).

use std::path::{Path, PathBuf};

/// Filesystem types (as `/proc/self/mounts` names them) that live in this kernel: disk
/// filesystems, memory filesystems, and the kernel's stacked filesystems over them (`overlay`, a
/// container's root, whose upper layer is a directory of the same kernel; `ecryptfs`, an
/// encrypted home directory, where the command line's default lock file lives).
pub(crate) const LOCAL_TYPES: &[&str] = &[
    "ext2", "ext3", "ext4", "xfs", "btrfs", "bcachefs", "f2fs", "jfs", "reiserfs", "nilfs2", "zfs",
    "tmpfs", "ramfs", "overlay", "ecryptfs",
];

/// The filesystem a path lives on: where it is mounted and what it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Mount {
    pub(crate) mount_point: PathBuf,
    pub(crate) fs_type: String,
}

impl Mount {
    /// Whether this is a filesystem of this kernel, where SQLite's locks hold.
    pub(crate) fn is_local(&self) -> bool {
        let t = self.fs_type.to_ascii_lowercase();
        LOCAL_TYPES.contains(&t.as_str())
    }
}

/// The filesystem `path` (absolute, with symbolic links resolved) lives on, looked up in a
/// mounts table in the format of `/proc/self/mounts`. The longest mount point that contains the
/// path wins; a later line for the same mount point (a mount on top of another) wins over an
/// earlier one. `None`: no line contains it (a table of another mount namespace).
pub(crate) fn mount_of(path: &Path, mounts: &str) -> Option<Mount> {
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
    Some(Mount {
        mount_point,
        fs_type,
    })
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
/dev/mapper/shared /cluster/gfs gfs2 rw,relatime 0 0
/dev/sdd /cluster/ocfs ocfs2 rw,_netdev 0 0
beegfs_nodev /mnt/beegfs beegfs rw,relatime 0 0
JuiceFS:vol /jfs fuse.juicefs rw,relatime 0 0
none / 9p rw,trans=fd,rfdno=4,wfdno=4 0 0
kataShared /run/kata-containers/shared virtiofs rw,relatime 0 0
/dev/nvme0n1p2 /data xfs rw,noatime 0 0
/dev/nvme0n1p3 /var/lib/build btrfs rw,ssd 0 0
/home/.ecryptfs/bob/.Private /home/alice/local/bob ecryptfs rw,ecryptfs_sig=x 0 0
";

    /// The filesystem of `path`, and whether it counts as local.
    fn check(path: &str) -> Option<(String, String, bool)> {
        mount_of(Path::new(path), TABLE).map(|m| {
            let local = m.is_local();
            (m.mount_point.display().to_string(), m.fs_type, local)
        })
    }

    fn local(path: &str) -> bool {
        check(path).is_some_and(|(_, _, local)| local)
    }

    #[test]
    fn local_filesystems_pass() {
        for path in [
            "/tmp/x",
            "/var/lib/docker/overlay2/x/merged/data",
            "/data/locks",
            "/var/lib/build/x",
            // A local disk mounted inside an NFS home: the longer mount point wins.
            "/home/alice/local/db",
            // An encrypted home directory over it.
            "/home/alice/local/bob/.local/state/leasehold",
        ] {
            assert!(local(path), "{path}: {:?}", check(path));
        }
        // `/homeless` is not under `/home`: components, not string prefixes; the line for `/`
        // that counts is the last one (9p, below).
        assert_eq!(check("/homeless").map(|c| c.1), Some("9p".into()));
    }

    #[test]
    fn everything_else_is_refused_with_its_type() {
        for (path, point, fs_type) in [
            ("/home/alice", "/home", "nfs4"),
            ("/home", "/home", "nfs4"),
            ("/mnt/my share/locks", "/mnt/my share", "cifs"),
            ("/mnt/ssh/x", "/mnt/ssh", "fuse.sshfs"),
            // NFS mounted over a local /srv: the later mount is the one in use.
            ("/srv/data", "/srv", "nfs"),
            // What a list of network filesystems missed: cluster and parallel filesystems,
            // FUSE clients, a gVisor sandbox's root, a Kata VM's share.
            ("/cluster/gfs/locks", "/cluster/gfs", "gfs2"),
            ("/cluster/ocfs/locks", "/cluster/ocfs", "ocfs2"),
            ("/mnt/beegfs/locks", "/mnt/beegfs", "beegfs"),
            ("/jfs/locks", "/jfs", "fuse.juicefs"),
            ("/var/lib/app", "/", "9p"),
            (
                "/run/kata-containers/shared/x",
                "/run/kata-containers/shared",
                "virtiofs",
            ),
        ] {
            assert_eq!(
                check(path),
                Some((point.into(), fs_type.into(), false)),
                "{path}"
            );
        }
    }

    #[test]
    fn escapes_and_junk_lines() {
        assert_eq!(unescape("/mnt/a\\040b\\134c"), "/mnt/a b\\c");
        assert_eq!(unescape("/plain"), "/plain");
        assert_eq!(unescape("/end\\04"), "/end\\04");
        assert_eq!(mount_of(Path::new("/x"), "garbage\n\n"), None);
    }
}
