//! Network partitions on loopback: one cluster member cut off from the other members while its
//! clients still reach it.
//!
//! Killing or pausing a member (see the fault methods) looks the same to its clients as to its
//! peers. A member that is cut off from its quorum but still answers its clients is the case
//! that matters for locks: it may serve stale state, or time out, and its clients must notice.
//!
//! That needs a member nftables can tell apart, which [`EtcdCluster::start_isolatable`] and
//! [`ZkEnsemble::start_isolatable`] start: each member listens (client, peer, quorum and election
//! ports) on its own loopback address (`lo` carries all of 127/8, no setup needed), and runs
//! under its own uid. What others send to the member is dropped by its address; what it sends is
//! dropped by its uid, because the connections it opens leave from 127.0.0.1 like everyone
//! else's. Its client port is spared both ways, so clients on 127.0.0.1 still reach it.
//!
//! A [`Partition`] puts its rules in an nftables table of its own (named after the process and a
//! counter, so parallel test binaries do not clash) and deletes the table when healed or
//! dropped, also when the test fails. Tables left behind by a killed test process are deleted by
//! the next [`Partition::isolate`] on the machine. Needs root and `nft` (Debian's `nftables`).
//!
//! [`EtcdCluster::start_isolatable`]: crate::EtcdCluster::start_isolatable
//! [`ZkEnsemble::start_isolatable`]: crate::ZkEnsemble::start_isolatable

use std::io::Write;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Once;

use crate::error::{HarnessError, Result};
use crate::process::find_program;

/// Prefix of every table a [`Partition`] creates: `leasehold_partition_<pid>_<n>`.
const TABLE_PREFIX: &str = "leasehold_partition_";

/// What nftables needs to cut one member off: its own address and uid, and the client port that
/// stays open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberIdentity {
    /// The member's name, for errors (e.g. `etcd-1`).
    pub name: String,
    /// The loopback address all its ports listen on.
    pub addr: Ipv4Addr,
    /// The uid (and gid) it runs as.
    pub uid: u32,
    /// Its client port, which stays reachable.
    pub client_port: u16,
}

/// A cluster member that a [`Partition`] can cut off ([`EtcdServer`](crate::EtcdServer),
/// [`ZkServer`](crate::ZkServer)).
pub trait Isolatable {
    /// The member's address, uid and client port; [`HarnessError::Server`] when it was started
    /// without an address and uid of its own (by `start` rather than `start_isolatable`).
    fn identity(&self) -> Result<MemberIdentity>;
}

impl<T: Isolatable + ?Sized> Isolatable for &T {
    fn identity(&self) -> Result<MemberIdentity> {
        (**self).identity()
    }
}

/// The error for a member started without its own address and uid.
pub(crate) fn not_isolatable(name: &str) -> HarnessError {
    HarnessError::server(
        name,
        "cannot be isolated: it was started without a loopback address and uid of its own, so \
         nftables cannot tell its traffic apart (start the cluster with `start_isolatable`)",
    )
}

/// One member cut off from the other members (but not from its clients) until
/// [`Partition::heal`] or drop.
#[derive(Debug)]
#[must_use = "dropping a Partition heals it at once"]
pub struct Partition {
    table: String,
    member: MemberIdentity,
    healed: bool,
}

impl Partition {
    /// Cuts `member` off from every other member: drops all TCP traffic to its address except
    /// to its client port, and all TCP traffic its uid sends except from its client port (and
    /// to its own address, which etcd's HTTP gateway uses to reach its gRPC server). Clients on
    /// 127.0.0.1 still reach it. The rules go in at once (one `nft -f` transaction), so a
    /// failure leaves nothing behind.
    pub fn isolate(member: &impl Isolatable) -> Result<Self> {
        let member = member.identity()?;
        let nft = nft_program(&member.name)?;
        let table = new_table(&nft);
        run_nft(&nft, &isolation_script(&table, &member))?;
        Ok(Partition {
            table,
            member,
            healed: false,
        })
    }

    /// The nftables table holding the rules (family `inet`).
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The member that is cut off.
    pub fn member(&self) -> &MemberIdentity {
        &self.member
    }

    /// Reconnects the member by deleting the table. On error the drop tries once more.
    pub fn heal(mut self) -> Result<()> {
        self.delete_table()?;
        self.healed = true;
        Ok(())
    }

    fn delete_table(&self) -> Result<()> {
        let nft = nft_program(&self.member.name)?;
        run_nft(&nft, &format!("delete table inet {}\n", self.table))
    }
}

impl Drop for Partition {
    fn drop(&mut self) {
        if self.healed {
            return;
        }
        if let Err(e) = self.delete_table() {
            eprintln!(
                "leasehold harness: could not delete nftables table inet {} (isolating {}); \
                 delete it with `nft delete table inet {}`: {e}",
                self.table, self.member.name, self.table
            );
        }
    }
}

/// The nftables script that creates `table` with the rules cutting `member` off.
fn isolation_script(table: &str, member: &MemberIdentity) -> String {
    let MemberIdentity {
        addr,
        uid,
        client_port,
        ..
    } = member;
    format!(
        "add table inet {table}\n\
         add chain inet {table} out {{ type filter hook output priority 0; policy accept; }}\n\
         add rule inet {table} out meta skuid {uid} ip daddr != {addr} tcp sport != {client_port} drop\n\
         add rule inet {table} out ip daddr {addr} tcp dport != {client_port} drop\n"
    )
}

/// A fresh table name, `leasehold_partition_<pid>_<n>`, after deleting the tables that killed
/// processes left behind (once per process).
pub(crate) fn new_table(nft: &Path) -> String {
    static CLEANED: Once = Once::new();
    CLEANED.call_once(|| delete_stale_tables(nft));
    static SEQ: AtomicU32 = AtomicU32::new(0);
    format!(
        "{TABLE_PREFIX}{}_{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

pub(crate) fn nft_program(member: &str) -> Result<PathBuf> {
    find_program("nft")
        .ok_or_else(|| HarnessError::missing(format!("a partition of {member}"), "nft (nftables)"))
}

/// Runs an nftables script (`nft -f -`), which nft applies as one transaction.
pub(crate) fn run_nft(nft: &Path, script: &str) -> Result<()> {
    let mut child = Command::new(nft)
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| HarnessError::io(format!("running {}", nft.display()), e))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(script.as_bytes())
            .map_err(|e| HarnessError::io("writing the nftables script to nft", e))?;
    }
    let output = child
        .wait_with_output()
        .map_err(|e| HarnessError::io(format!("waiting for {}", nft.display()), e))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(HarnessError::server(
            "nftables",
            format!(
                "nft -f failed ({}): {}\nscript:\n{script}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ),
        ))
    }
}

/// Deletes the tables of partitions whose process no longer exists (a test killed before its
/// drop ran). Best effort: a failure here must not stop a new partition.
fn delete_stale_tables(nft: &Path) {
    let Ok(output) = Command::new(nft).args(["list", "tables"]).output() else {
        return;
    };
    let own = std::process::id();
    let stale: String = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.trim().strip_prefix("table inet "))
        .filter(|table| {
            table
                .strip_prefix(TABLE_PREFIX)
                .and_then(|rest| rest.split('_').next())
                .and_then(|pid| pid.parse::<u32>().ok())
                .is_some_and(|pid| pid != own && !Path::new(&format!("/proc/{pid}")).exists())
        })
        .map(|table| format!("delete table inet {table}\n"))
        .collect();
    if !stale.is_empty() {
        let _ = run_nft(nft, &stale);
    }
}

/// The addresses `127.x.y.z` handed out: x in 1..=255 (127.0.*.* holds 127.0.0.1, Debian's
/// 127.0.1.1 and resolvers' 127.0.0.53), y in 0..=255, z in 2..=254.
const ADDRESS_SPACE: u64 = 255 * 256 * 253;

/// The first uid handed out, far above any real user's.
const UID_BASE: u32 = 1_000_000;

/// Picks a loopback address and a uid for one member that no other member uses: derived from
/// this process's id plus a counter (each process gets its own run of addresses and uids, so
/// parallel test binaries do not clash), skipping addresses some socket is bound to already.
pub(crate) fn own_identity() -> Result<(Ipv4Addr, u32)> {
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let pid = std::process::id();
    for _ in 0..253 {
        let seq = SEQ.fetch_add(1, Ordering::Relaxed);
        let addr = address_for(pid, seq);
        // pid_max is at most 2^22, so pid * 256 + 255 + UID_BASE stays below u32::MAX.
        let uid = UID_BASE
            .saturating_add(pid.saturating_mul(256))
            .saturating_add(seq % 256);
        if !address_in_use(addr) {
            return Ok((addr, uid));
        }
    }
    Err(HarnessError::io(
        "picking a loopback address of its own for a cluster member",
        std::io::Error::new(
            std::io::ErrorKind::AddrInUse,
            "every address tried already has sockets bound to it",
        ),
    ))
}

fn address_for(pid: u32, seq: u32) -> Ipv4Addr {
    let index = (u64::from(pid) * 253 + u64::from(seq)) % ADDRESS_SPACE;
    let x = 1 + index / (256 * 253);
    let y = (index / 253) % 256;
    let z = 2 + index % 253;
    // Each part is below 256 by construction.
    Ipv4Addr::new(
        127,
        u8::try_from(x).unwrap_or(u8::MAX),
        u8::try_from(y).unwrap_or(0),
        u8::try_from(z).unwrap_or(2),
    )
}

/// Whether any TCP socket is bound to `addr` (a member of another run still uses it).
fn address_in_use(addr: Ipv4Addr) -> bool {
    // /proc/net/tcp prints the address as the hex of its network-order bytes read natively.
    let hex = format!("{:08X}", u32::from_ne_bytes(addr.octets()));
    std::fs::read_to_string("/proc/net/tcp").is_ok_and(|table| {
        table.lines().skip(1).any(|line| {
            line.split_whitespace()
                .nth(1)
                .and_then(|local| local.split(':').next())
                .is_some_and(|local| local == hex)
        })
    })
}

/// Gives a member's temp dir (and everything in it) to its uid, so that it can write its data.
pub(crate) fn chown_tree(path: &Path, uid: u32) -> Result<()> {
    std::os::unix::fs::chown(path, Some(uid), Some(uid))
        .map_err(|e| HarnessError::io(format!("chown {uid} {}", path.display()), e))?;
    if path.is_dir() {
        let entries = std::fs::read_dir(path)
            .map_err(|e| HarnessError::io(format!("reading {}", path.display()), e))?;
        for entry in entries {
            let entry =
                entry.map_err(|e| HarnessError::io(format!("reading {}", path.display()), e))?;
            chown_tree(&entry.path(), uid)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_stay_in_127_and_out_of_127_0() {
        for (pid, seq) in [(1, 0), (4_194_304, 252), (65_280, 7), (12_345, 1_000)] {
            let addr = address_for(pid, seq);
            let [a, x, _, z] = addr.octets();
            assert_eq!(a, 127);
            assert!(x >= 1, "{addr}");
            assert!((2..=254).contains(&z), "{addr}");
        }
        assert_ne!(address_for(100, 0), address_for(101, 0));
        assert_ne!(address_for(100, 0), address_for(100, 1));
    }

    #[test]
    fn the_script_spares_the_client_port_both_ways() {
        let member = MemberIdentity {
            name: "etcd-1".into(),
            addr: Ipv4Addr::new(127, 9, 8, 7),
            uid: 1_000_001,
            client_port: 12_345,
        };
        let script = isolation_script("t", &member);
        assert!(script.contains("meta skuid 1000001 ip daddr != 127.9.8.7 tcp sport != 12345 drop"));
        assert!(script.contains("ip daddr 127.9.8.7 tcp dport != 12345 drop"));
    }
}
