//! What the operator says about the fences of the connected server (URL `fence_safety`).

use std::str::FromStr;

/// What the operator says about the fences of the connected server (URL `fence_safety`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum FenceSafetyOption {
    /// Read the server's replication settings at connect and declare what they promise
    /// (PostgreSQL: linearizable only where every commit waits for a synchronous standby;
    /// MySQL/MariaDB: failover-unsafe, since semi-synchronous replication falls back to
    /// asynchronous silently). The default.
    #[default]
    Auto,
    /// The operator vouches that a failover never loses a commit (for example a managed service
    /// that replicates storage synchronously, which the server's settings cannot show).
    Linearizable,
    /// Declare fences failover-unsafe whatever the server says.
    FailoverUnsafe,
}

impl FromStr for FenceSafetyOption {
    type Err = ();

    fn from_str(s: &str) -> std::result::Result<Self, ()> {
        match s {
            "auto" => Ok(FenceSafetyOption::Auto),
            "linearizable" => Ok(FenceSafetyOption::Linearizable),
            "failover-unsafe" => Ok(FenceSafetyOption::FailoverUnsafe),
            _ => Err(()),
        }
    }
}
