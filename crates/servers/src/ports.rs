//! Free loopback ports.
//!
//! A port is picked at random *below* the kernel's ephemeral range and checked by binding
//! `127.0.0.1:PORT`. Staying out of the ephemeral range matters for restarts: a killed server's
//! port would otherwise be free for the kernel to hand to an outgoing connection (or to a client
//! that reconnects in a loop and connects to itself), and the restart could not bind it again.
//! When the range cannot be read the kernel picks (`127.0.0.1:0`). Ports are never handed out
//! twice by one process. Another test binary may still take a port between the check and the
//! server's bind: the starts detect "address already in use" and retry on fresh ports.

use std::collections::HashSet;
use std::net::{Ipv4Addr, TcpListener};
use std::sync::{Mutex, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::{HarnessError, Result};

/// The lowest port the harness picks (well above the well-known and registered defaults it
/// could clash with, such as 2181, 2379, 5432, 6379).
const LOWEST: u16 = 12_000;

/// Picks a loopback TCP port that is free now and was not handed out before by this process.
pub fn free_port() -> Result<u16> {
    let mut state = state().lock().unwrap_or_else(|e| e.into_inner());
    let (low, high) = candidate_range();
    for _ in 0..1000 {
        let port = if high > low {
            low + (state.next_random() % u64::from(high - low)) as u16
        } else {
            kernel_port()?
        };
        if state.used.contains(&port) || !bindable(port) {
            continue;
        }
        state.used.insert(port);
        return Ok(port);
    }
    Err(HarnessError::io(
        "picking a free loopback port",
        std::io::Error::new(
            std::io::ErrorKind::AddrInUse,
            "no free port found in 1000 tries",
        ),
    ))
}

/// Picks `n` distinct free loopback ports.
pub fn free_ports(n: usize) -> Result<Vec<u16>> {
    (0..n).map(|_| free_port()).collect()
}

/// Whether `127.0.0.1:port` can be bound right now.
fn bindable(port: u16) -> bool {
    TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok()
}

/// A port chosen by the kernel, the fallback when the ephemeral range is unknown.
fn kernel_port() -> Result<u16> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .map_err(|e| HarnessError::io("binding 127.0.0.1:0", e))?;
    let port = listener
        .local_addr()
        .map_err(|e| HarnessError::io("reading the bound port", e))?
        .port();
    Ok(port)
}

/// `[LOWEST, start of the ephemeral range)`, or an empty range when that is unknown or too small.
fn candidate_range() -> (u16, u16) {
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok());
    match ephemeral_low {
        Some(low) if low > LOWEST + 1000 => (LOWEST, low),
        _ => (0, 0),
    }
}

/// Ports handed out so far, and a small random generator (no `rand` dependency here).
#[derive(Debug)]
struct PortState {
    used: HashSet<u16>,
    seed: u64,
}

impl PortState {
    /// xorshift64*.
    fn next_random(&mut self) -> u64 {
        let mut x = self.seed;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.seed = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

fn state() -> &'static Mutex<PortState> {
    static STATE: OnceLock<Mutex<PortState>> = OnceLock::new();
    STATE.get_or_init(|| {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let seed = nanos ^ (u64::from(std::process::id()) << 32) | 1;
        Mutex::new(PortState {
            used: HashSet::new(),
            seed,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    type TestResult<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

    #[test]
    fn ports_are_distinct_in_range_and_bindable_when_picked() -> TestResult {
        let (low, high) = candidate_range();
        let mut seen = HashSet::new();
        let mut taken = Vec::new();
        for _ in 0..20 {
            let port = free_port().map_err(|e| format!("a free port: {e}"))?;
            // Checked at once; still, other processes on the machine (servers other tests start)
            // may take a port in between, which is why server starts retry on a clash. One or
            // two of twenty is that race; more is a picker handing out ports in use.
            if !bindable(port) {
                taken.push(port);
            }
            assert!(
                (low..=high).contains(&port),
                "{port} outside {low}..={high}"
            );
            assert!(seen.insert(port), "port {port} handed out twice");
        }
        assert!(
            taken.len() <= 2,
            "ports not bindable when picked: {taken:?}"
        );
        Ok(())
    }
}
