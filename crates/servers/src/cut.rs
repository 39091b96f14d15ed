//! A silent cut between one client process and some server ports: the client's packets to
//! them are dropped, and nothing answers, not even a reset.
//!
//! A killed or paused server shows its clients a closed or a stalled connection; a client whose
//! own packets vanish on the way out sees neither. Its connections stay open, its requests time
//! out, and the server hears nothing from it (no renewal, no release, no close). That is the
//! case a lease's deadline exists for, and it can only be made on purpose for one client when
//! nftables can tell that client's traffic apart: so the client runs under a uid of its own
//! ([`CommandSpec::user`](crate::CommandSpec::user)), and the rule drops what that uid sends to
//! the ports (`meta skuid`, in the output hook: on loopback a packet dropped there is never
//! seen by the receiver, so no reset comes back either).
//!
//! Like a [`Partition`](crate::Partition), a [`Cut`] lives in an nftables table of its own,
//! deleted when healed or dropped; needs root and `nft`.

use crate::error::{HarnessError, Result};
use crate::partition::{new_table, nft_program, run_nft};

/// One uid's TCP traffic to some ports dropped until [`Cut::heal`] or drop.
#[derive(Debug)]
#[must_use = "dropping a Cut heals it at once"]
pub struct Cut {
    table: String,
    uid: u32,
    healed: bool,
}

impl Cut {
    /// Drops every TCP packet that processes of `uid` send to any of `ports` (on any address).
    /// An error when nftables cannot be driven: a cut that did not land must not pass as one
    /// that did.
    pub fn uid_from_ports(uid: u32, ports: &[u16]) -> Result<Cut> {
        let name = format!("a cut of uid {uid}");
        if ports.is_empty() {
            return Err(HarnessError::server(name, "no port to cut"));
        }
        let nft = nft_program(&name)?;
        let table = new_table(&nft);
        run_nft(&nft, &cut_script(&table, uid, ports))?;
        Ok(Cut {
            table,
            uid,
            healed: false,
        })
    }

    /// The nftables table holding the rule (family `inet`).
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The uid whose packets are dropped.
    pub fn uid(&self) -> u32 {
        self.uid
    }

    /// Lets the packets through again by deleting the table. On error the drop tries once more.
    pub fn heal(mut self) -> Result<()> {
        self.delete_table()?;
        self.healed = true;
        Ok(())
    }

    fn delete_table(&self) -> Result<()> {
        let nft = nft_program(&format!("a cut of uid {}", self.uid))?;
        run_nft(&nft, &format!("delete table inet {}\n", self.table))
    }
}

impl Drop for Cut {
    fn drop(&mut self) {
        if self.healed {
            return;
        }
        if let Err(e) = self.delete_table() {
            eprintln!(
                "leasehold harness: could not delete nftables table inet {} (cutting uid {}); \
                 delete it with `nft delete table inet {}`: {e}",
                self.table, self.uid, self.table
            );
        }
    }
}

/// The nftables script that creates `table` with the rule dropping `uid`'s packets to `ports`.
fn cut_script(table: &str, uid: u32, ports: &[u16]) -> String {
    let ports: Vec<String> = ports.iter().map(u16::to_string).collect();
    format!(
        "add table inet {table}\n\
         add chain inet {table} out {{ type filter hook output priority 0; policy accept; }}\n\
         add rule inet {table} out meta skuid {uid} tcp dport {{ {} }} drop\n",
        ports.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_script_drops_only_that_uid_to_those_ports() {
        let script = cut_script("t", 61_003, &[2379, 5432]);
        assert!(
            script.contains("add rule inet t out meta skuid 61003 tcp dport { 2379, 5432 } drop"),
            "{script}"
        );
        assert!(script.contains("hook output"), "{script}");
    }

    #[test]
    fn no_port_is_an_error() {
        assert!(Cut::uid_from_ports(61_000, &[]).is_err());
    }

    /// A process of the cut uid cannot even open a connection: its SYN vanishes, no reset
    /// comes back (bash's connect hangs until `timeout` ends it), and the listener sees nothing.
    #[test]
    fn the_cut_uid_hears_nothing_back() -> Result<()> {
        use std::os::unix::process::CommandExt;
        let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| HarnessError::io("bind", e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| HarnessError::io("nonblocking", e))?;
        let port = listener
            .local_addr()
            .map_err(|e| HarnessError::io("local_addr", e))?
            .port();
        let uid = 3_999_999_002;
        let cut = Cut::uid_from_ports(uid, &[port])?;
        let status = std::process::Command::new("timeout")
            .args([
                "2",
                "bash",
                "-c",
                &format!("exec 3<>/dev/tcp/127.0.0.1/{port}"),
            ])
            .uid(uid)
            .gid(uid)
            .status()
            .map_err(|e| HarnessError::io("running timeout bash", e))?;
        assert_eq!(
            status.code(),
            Some(124),
            "the connect ended early: {status}"
        );
        assert!(
            listener.accept().is_err(),
            "a connection got through the cut"
        );
        cut.heal()?;
        let status = std::process::Command::new("timeout")
            .args([
                "5",
                "bash",
                "-c",
                &format!("exec 3<>/dev/tcp/127.0.0.1/{port}"),
            ])
            .uid(uid)
            .gid(uid)
            .status()
            .map_err(|e| HarnessError::io("running timeout bash", e))?;
        assert!(status.success(), "no connection after heal: {status}");
        Ok(())
    }

    /// Root's own traffic is untouched by a cut of another uid, and the table goes with heal.
    #[test]
    fn a_cut_of_another_uid_leaves_this_process_alone() -> Result<()> {
        if crate::process::find_program("nft").is_none() {
            return Err(HarnessError::missing("a cut", "nft (nftables)"));
        }
        let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| HarnessError::io("bind", e))?;
        let port = listener
            .local_addr()
            .map_err(|e| HarnessError::io("local_addr", e))?
            .port();
        let cut = Cut::uid_from_ports(3_999_999_001, &[port])?;
        let table = cut.table().to_string();
        let mut client = TcpStream::connect_timeout(
            &listener
                .local_addr()
                .map_err(|e| HarnessError::io("local_addr", e))?,
            Duration::from_secs(2),
        )
        .map_err(|e| HarnessError::io("connect past a cut of another uid", e))?;
        client
            .write_all(b"x")
            .map_err(|e| HarnessError::io("write", e))?;
        let (mut server, _) = listener
            .accept()
            .map_err(|e| HarnessError::io("accept", e))?;
        let mut byte = [0u8; 1];
        server
            .read_exact(&mut byte)
            .map_err(|e| HarnessError::io("read", e))?;
        assert_eq!(&byte, b"x");
        cut.heal()?;
        let tables = std::process::Command::new("nft")
            .args(["list", "tables"])
            .output()
            .map_err(|e| HarnessError::io("nft list tables", e))?;
        assert!(
            !String::from_utf8_lossy(&tables.stdout).contains(&table),
            "{table} outlived heal"
        );
        Ok(())
    }
}
