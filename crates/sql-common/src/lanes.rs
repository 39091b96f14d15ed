//! The connections the SQL authorities' lease statements run on: `pool_size` lanes, each one
//! connection kept for as long as it works. Generic over sqlx's connection type, so the
//! PostgreSQL and MySQL authorities share it.
//!
//! Why not sqlx's pool: it pings every connection it takes back (unconditionally, in a task of
//! its own), so each statement costs a second round trip on the server and the client; measured,
//! that was a quarter of an uncontended acquire + release (see docs/performance-log.md in the repository). A lane is
//! simply locked, used and unlocked. What the pool's ping protects against is handled here:
//! * a statement in flight owns its connection: it leaves the lane with [`Lane::connection`] and
//!   comes back with the answer ([`Lane::put_back`]). A statement dropped unanswered (its caller
//!   cancelled, or out of time: a frozen backend, a primary moved behind a virtual IP without a
//!   reset) closes its connection with it, and the lane connects afresh on its next use. Kept,
//!   such a connection would make the next statement on the lane wait for the lost reply first,
//!   and the lowest free lane is the one taken next: one silent connection stalled every lease
//!   of the authority until TCP gave up (about 15 minutes);
//! * a connection that broke is closed when a statement on it fails so (see
//!   each backend's `errors::discards_connection`), and the lane connects again on its next use;
//! * a connection idle for [`PING_AFTER_IDLE`] is pinged before use, within half the time the
//!   caller has left, and replaced if that fails or stays silent.
//!
//! Waiting for a lane is first come, first served (a semaphore with one permit per lane) and
//! bounded by the caller's own timeout, as every wait is.

use std::fmt;
use std::time::Duration;

use leasehold_core::time::saturating_add;
use sqlx::{ConnectOptions, Connection};
use tokio::sync::{Mutex, MutexGuard, Semaphore, SemaphorePermit};
use tokio::time::Instant;

/// A lane idle this long is pinged before its next statement.
pub const PING_AFTER_IDLE: Duration = Duration::from_secs(1);

struct Slot<C> {
    conn: Option<C>,
    last_used: Instant,
}

/// The lanes of one authority, each with a connection of type `C` (`sqlx::PgConnection`,
/// `sqlx::MySqlConnection`).
pub struct Lanes<C: Connection> {
    connect: C::Options,
    free: Semaphore,
    slots: Vec<Mutex<Slot<C>>>,
}

impl<C: Connection> fmt::Debug for Lanes<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lanes")
            .field("lanes", &self.slots.len())
            .field("free", &self.free.available_permits())
            .finish_non_exhaustive()
    }
}

/// One lane, held for one statement (with its retries).
pub struct Lane<'a, C> {
    slot: MutexGuard<'a, Slot<C>>,
    _turn: SemaphorePermit<'a>,
}

impl<C> fmt::Debug for Lane<'_, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lane")
            .field("connected", &self.slot.conn.is_some())
            .finish_non_exhaustive()
    }
}

impl<C: Connection> Lanes<C>
where
    C::Options: ConnectOptions<Connection = C>,
{
    /// `size` lanes (at least one) connecting with `connect`; none connects before it is used.
    pub fn new(connect: C::Options, size: usize) -> Self {
        let size = size.max(1);
        Lanes {
            connect,
            free: Semaphore::new(size),
            slots: (0..size)
                .map(|_| {
                    Mutex::new(Slot {
                        conn: None,
                        last_used: Instant::now(),
                    })
                })
                .collect(),
        }
    }

    /// Waits for a free lane and makes sure it has a working connection; a statement on it is
    /// due by `give_up`.
    pub async fn take(&self, give_up: Instant) -> Result<Lane<'_, C>, sqlx::Error> {
        let turn = self
            .free
            .acquire()
            .await
            .map_err(|_| sqlx::Error::PoolClosed)?;
        // With a permit, at least one lane is unlocked. The lowest free one is taken: the few
        // lanes a light load needs stay warm (their server processes awake, their statements
        // prepared), and the others connect only when the load needs them.
        let mut slot = None;
        for lane in &self.slots {
            if let Ok(guard) = lane.try_lock() {
                slot = Some(guard);
                break;
            }
        }
        let mut slot = match slot {
            Some(slot) => slot,
            // Unreachable while every lock is taken under a permit; waiting is still correct.
            None => self.slots[0].lock().await,
        };
        let idle = slot.last_used.elapsed() >= PING_AFTER_IDLE;
        if let Some(mut conn) = slot.conn.take_if(|_| idle) {
            // The ping owns the connection as a statement does: dropped unanswered, it closes
            // it. A silent one is given up with half the caller's time left for a fresh one.
            let now = Instant::now();
            let half = give_up.saturating_duration_since(now) / 2;
            let pinged = tokio::time::timeout_at(saturating_add(now, half), conn.ping()).await;
            if let Ok(Ok(())) = pinged {
                slot.conn = Some(conn);
            }
        }
        if slot.conn.is_none() {
            slot.conn = Some(self.connect.connect().await?);
        }
        Ok(Lane { slot, _turn: turn })
    }
}

impl<C> Lane<'_, C> {
    /// The lane's connection, for one statement: it stays out of the lane until
    /// [`Lane::put_back`], so a statement dropped before its answer closes it. Always there
    /// after `take`.
    pub fn connection(&mut self) -> Result<C, sqlx::Error> {
        self.slot
            .conn
            .take()
            .ok_or_else(|| sqlx::Error::Protocol("a lane without a connection".into()))
    }

    /// Returns the connection after its statement was answered. A connection not put back
    /// (it broke, or reaches a server that cannot take writes, or its statement was dropped
    /// unanswered) is closed, and the next statement on this lane connects afresh.
    pub fn put_back(&mut self, conn: C) {
        self.slot.conn = Some(conn);
    }
}

impl<C> Drop for Lane<'_, C> {
    fn drop(&mut self) {
        self.slot.last_used = Instant::now();
    }
}
