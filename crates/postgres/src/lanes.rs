//! The connections lease statements run on: `pool_size` lanes, each one connection kept for as
//! long as it works.
//!
//! Why not sqlx's pool: it pings every connection it takes back (unconditionally, in a task of
//! its own), so each statement costs a second round trip on the server and the client; measured,
//! that was a quarter of an uncontended acquire + release (see docs/performance.md). A lane is
//! simply locked, used and unlocked. What the pool's ping protects against is handled here:
//! * a statement dropped halfway (a cancelled caller) leaves replies in flight, which sqlx reads
//!   away before the next statement on that connection (`wait_until_ready`);
//! * a connection that broke is closed when a statement on it fails so (see
//!   `errors::discards_connection`), and the lane connects again on its next use;
//! * a connection idle for [`PING_AFTER_IDLE`] is pinged before use, and replaced if that fails.
//!
//! Waiting for a lane is first come, first served (a semaphore with one permit per lane) and
//! bounded by the caller's own timeout, as every wait is.

use std::time::Duration;

use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection, PgConnection};
use tokio::sync::{Mutex, MutexGuard, Semaphore, SemaphorePermit};
use tokio::time::Instant;

/// A lane idle this long is pinged before its next statement.
pub(crate) const PING_AFTER_IDLE: Duration = Duration::from_secs(1);

#[derive(Debug)]
struct Slot {
    conn: Option<PgConnection>,
    last_used: Instant,
}

/// The lanes of one authority.
#[derive(Debug)]
pub(crate) struct Lanes {
    connect: PgConnectOptions,
    free: Semaphore,
    slots: Vec<Mutex<Slot>>,
}

/// One lane, held for one statement (with its retries).
pub(crate) struct Lane<'a> {
    slot: MutexGuard<'a, Slot>,
    _turn: SemaphorePermit<'a>,
}

impl Lanes {
    /// `size` lanes (at least one) connecting with `connect`; none connects before it is used.
    pub(crate) fn new(connect: PgConnectOptions, size: usize) -> Self {
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

    /// Waits for a free lane and makes sure it has a working connection.
    pub(crate) async fn take(&self) -> Result<Lane<'_>, sqlx::Error> {
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
        if let (Some(conn), true) = (slot.conn.as_mut(), idle) {
            if conn.ping().await.is_err() {
                slot.conn = None;
            }
        }
        if slot.conn.is_none() {
            slot.conn = Some(self.connect.connect().await?);
        }
        Ok(Lane { slot, _turn: turn })
    }
}

impl Lane<'_> {
    /// The lane's connection: always there from `take` until `discard`.
    pub(crate) fn conn(&mut self) -> Option<&mut PgConnection> {
        self.slot.conn.as_mut()
    }

    /// Closes the lane's connection (it broke, or reaches a server that cannot take writes);
    /// the next statement on this lane connects afresh.
    pub(crate) fn discard(&mut self) {
        self.slot.conn = None;
    }
}

impl Drop for Lane<'_> {
    fn drop(&mut self) {
        self.slot.last_used = Instant::now();
    }
}
