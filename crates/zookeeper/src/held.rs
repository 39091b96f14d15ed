//! A held lease: its node, its session, and the tenure kept for it on this side.
//!
//! ZooKeeper ends a lease when its session expires: when the holder's process dies, freezes or
//! is cut off for longer than the session timeout. But a live client heartbeats its session on
//! its own, so a holder that simply stops renewing (a `Lease` past its maximum hold time, or a
//! grant nobody renews) would keep the node forever. So each grant also has a tenure: every
//! successful acquire or renewal extends it to (the instant before that request was sent) + TTL,
//! and when it runs out the [`Tenures`] keeper deletes the node. That deletion never comes before
//! the grant's own local deadline (which ends a safety margin earlier), so it cannot create a
//! second holder that the first one does not already consider gone.

use std::fmt;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex, Weak};

use leasehold_core::Instant;

use crate::config::ZkConfig;
use crate::session::{Active, Session};
use crate::token::Czxid;

#[derive(Debug)]
struct Tenure {
    /// When the lease ends unless renewed: the last confirmed request's send time + TTL.
    until: Instant,
    /// Released, expired or found gone: nothing may extend it any more.
    ended: bool,
    /// Counts this lease on its session until it ends, so the session is not closed to make
    /// room meanwhile.
    active: Option<Active>,
}

impl Tenure {
    fn finish(&mut self) -> bool {
        self.active = None;
        !std::mem::replace(&mut self.ended, true)
    }
}

/// What the keeper finds when a tenure's time comes.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Due {
    /// Released or lost meanwhile: nothing to do.
    Ended,
    /// Renewed meanwhile: look again then.
    Later(Instant),
    /// Ran out: the node must go.
    Expired,
}

/// The backend state a ZooKeeper [`leasehold_core::Grant`] carries.
pub(crate) struct Held {
    /// The contender node's full path.
    pub path: String,
    /// Its czxid, the fence.
    pub czxid: Czxid,
    /// The session that owns the node. Weak: a grant does not keep its session (and with it the
    /// node) alive after the authority is gone.
    pub session: Weak<Session>,
    /// The session's id, the node's `ephemeralOwner`.
    pub session_id: i64,
    pub config: Arc<ZkConfig>,
    tenure: Mutex<Tenure>,
    /// The node's data version as this grant last wrote or read it (0: created empty). A
    /// proclaim sets the data on that version, so it never overwrites a write it has not seen.
    data_version: AtomicI32,
}

impl fmt::Debug for Held {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Held")
            .field("path", &self.path)
            .field("czxid", &self.czxid)
            .field("session", &format_args!("{:#x}", self.session_id))
            .finish_non_exhaustive()
    }
}

impl Held {
    /// A held lease whose tenure runs `until`.
    pub fn new(
        path: String,
        czxid: Czxid,
        session: &Arc<Session>,
        config: Arc<ZkConfig>,
        until: Instant,
    ) -> Arc<Held> {
        Arc::new(Held {
            path,
            czxid,
            session: Arc::downgrade(session),
            session_id: session.id,
            config,
            tenure: Mutex::new(Tenure {
                until,
                ended: false,
                active: Some(session.enter()),
            }),
            data_version: AtomicI32::new(0),
        })
    }

    fn tenure(&self) -> std::sync::MutexGuard<'_, Tenure> {
        self.tenure.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Ends the tenure (release, or the node was found gone); `true` if it was still running.
    pub fn end(&self) -> bool {
        self.tenure().finish()
    }

    /// Whether the tenure ended.
    pub fn has_ended(&self) -> bool {
        self.tenure().ended
    }

    /// Whether the tenure is over as of `now`: ended, or run out (the keeper deletes the node
    /// then; this only looks, so it leaves that to the keeper).
    pub fn is_over(&self, now: Instant) -> bool {
        let tenure = self.tenure();
        tenure.ended || now >= tenure.until
    }

    /// The node's data version last seen by this grant.
    pub fn data_version(&self) -> i32 {
        self.data_version.load(Ordering::Acquire)
    }

    /// Notes the node's data version after a write or read of it.
    pub fn note_data_version(&self, version: i32) {
        self.data_version.store(version, Ordering::Release);
    }

    /// Extends the tenure to `until`, unless it already ended (then the renewal that wants to
    /// extend it must report the lease lost).
    pub fn extend(&self, until: Instant) -> bool {
        let mut tenure = self.tenure();
        if tenure.ended {
            return false;
        }
        tenure.until = tenure.until.max(until);
        true
    }

    /// When the tenure runs out, as of `now`; ends it if it ran out.
    pub fn due(&self, now: Instant) -> Due {
        let mut tenure = self.tenure();
        if tenure.ended {
            Due::Ended
        } else if now >= tenure.until {
            tenure.finish();
            Due::Expired
        } else {
            Due::Later(tenure.until)
        }
    }
}
