//! Leader election on a lease: one leader at a time, and an **epoch** (the lease's fence) that
//! followers and downstream resources use to refuse a deposed leader.
//!
//! A leader that paused (a GC pause, a stopped VM) can wake up after its lease ran out and a new
//! leader was elected, and send commands as if it still led. Elections without fencing (client-go
//! says so of its own) cannot stop that. Here every [`Leadership`] carries the fence of its lease
//! as its epoch: greater than every earlier leader's, across resignation, expiry, crashes and
//! (where the backend's fences are durable) server restarts. A follower keeps the greatest epoch
//! it has accepted ([`crate::FencedRegister`], or any [`crate::FencedResource`]) and refuses
//! commands with an older one.
//!
//! A leader can hand leadership to a named candidate ([`Leadership::yield_to`], in
//! `election_handoff`), and a follower can keep the newest epoch it has seen in an
//! [`crate::EpochGuard`].
//!
//! Observers ([`Election::observe`]) read the leader's epoch and the value it proclaimed (an
//! address, say) and are told of changes by notification where the backend has it
//! ([`Authority::wait_for_change`]), with a timer as the fallback.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::Stream;

use tokio::time::Instant;

use crate::contract::authority::{check_proclaimed, Authority, Released};
use crate::contract::error::{Error, Result};
use crate::contract::fence::Fence;
use crate::contract::inspection::{Inspection, OwnerId};
use crate::contract::key::LockKey;
use crate::contract::lost::LostReason;
use crate::lease::{Lease, LeaseOptions};
use crate::recipes::election_handoff::{pending_for_other, HANDOFF_POLL};
use crate::time::saturating_add;

/// How often an observer reads the leader when no notification comes: the timer fallback that
/// notices a leader whose lease simply ran out.
pub const DEFAULT_OBSERVE_INTERVAL: Duration = Duration::from_millis(500);

/// An election on one key: every candidate and observer of it uses the same key.
#[derive(Clone, Debug)]
pub struct Election {
    authority: Arc<dyn Authority>,
    key: LockKey,
    value: Option<Vec<u8>>,
    name: Option<String>,
    options: LeaseOptions,
}

/// Who leads, as an observer sees it: a snapshot, stale the moment it is read (see
/// [`Inspection`]). Never a reason to act as leader: only a [`Leadership`] is.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leader {
    /// The leader's epoch: its lease's fence.
    pub epoch: Fence,
    /// What the leader proclaimed, once it has (a leader is elected a moment before its value
    /// is written).
    pub value: Option<Vec<u8>>,
    /// A short, non-secret id of the leader.
    pub owner: Option<OwnerId>,
}

impl Leader {
    /// The leader in an inspection of the election's key, if the key is held.
    pub fn from_inspection(seen: &Inspection) -> Option<Leader> {
        if !seen.held {
            return None;
        }
        Some(Leader {
            epoch: seen.fence?,
            value: seen.value.clone(),
            owner: seen.owner.clone(),
        })
    }

    /// The value as text, if it is UTF-8.
    pub fn value_str(&self) -> Option<&str> {
        self.value
            .as_deref()
            .and_then(|v| std::str::from_utf8(v).ok())
    }
}

impl fmt::Debug for Leader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Leader");
        d.field("epoch", &self.epoch.value());
        match (self.value_str(), &self.value) {
            (Some(text), _) => d.field("value", &text),
            (None, Some(bytes)) => d.field("value_len", &bytes.len()),
            (None, None) => d.field("value", &None::<()>),
        };
        d.field("owner", &self.owner).finish()
    }
}

impl fmt::Display for Leader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "epoch {}", self.epoch)?;
        match (self.value_str(), &self.value) {
            (Some(text), _) => write!(f, ", value {text:?}"),
            (None, Some(bytes)) => write!(f, ", a {}-byte value", bytes.len()),
            (None, None) => f.write_str(", no value yet"),
        }
    }
}

/// Being the leader: a lease on the election's key, renewed in the background, whose fence is
/// the epoch. Check [`Leadership::ensure_valid`] before each command and send
/// [`Leadership::epoch`] with it.
#[derive(Debug)]
pub struct Leadership {
    lease: Lease,
    value: Option<Vec<u8>>,
}

impl Leadership {
    /// This leadership's epoch: greater than every earlier leader's on this election.
    pub fn epoch(&self) -> Fence {
        self.lease.fence()
    }

    /// The value this leader proclaimed.
    pub fn value(&self) -> Option<&[u8]> {
        self.value.as_deref()
    }

    /// The lease behind the leadership.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// `Ok` while this process still leads: call it right before each command.
    pub fn ensure_valid(&self) -> Result<()> {
        self.lease.ensure_valid()
    }

    /// Resolves when the leadership is lost (see [`Lease::lost`]).
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        self.lease.lost()
    }

    /// Replaces the proclaimed value (observers see the change), if this process still leads.
    pub async fn proclaim(&mut self, value: impl Into<Vec<u8>>) -> Result<()> {
        let value = checked_value(value.into())?;
        self.lease.ensure_valid()?;
        self.lease
            .authority()
            .proclaim(self.lease.grant(), &value)
            .await?;
        self.value = Some(value);
        Ok(())
    }

    /// Steps down: releases the lease, so the next candidate is elected at once.
    pub async fn resign(self) -> Result<Released> {
        self.lease.release().await
    }
}

fn checked_value(value: Vec<u8>) -> Result<Vec<u8>> {
    check_proclaimed(&value)?;
    Ok(value)
}

impl Election {
    /// The election on `key`.
    pub fn new(authority: Arc<dyn Authority>, key: &LockKey) -> Self {
        Election {
            authority,
            key: key.clone(),
            value: None,
            name: None,
            options: LeaseOptions::default(),
        }
    }

    /// This candidate's name, by which a leader can hand leadership to it
    /// ([`Leadership::yield_to`]). Without one, a candidate never receives a hand-off (and
    /// waits out every hand-off window).
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// The value this candidate proclaims when elected (at most [`crate::MAX_VALUE_LEN`] bytes).
    pub fn with_value(mut self, value: impl Into<Vec<u8>>) -> Result<Self> {
        self.value = Some(checked_value(value.into())?);
        Ok(self)
    }

    /// The options of the leadership's lease (renewal, release on drop).
    pub fn with_lease_options(mut self, options: LeaseOptions) -> Self {
        self.options = options;
        self
    }

    /// The election's key.
    pub fn key(&self) -> &LockKey {
        &self.key
    }

    /// The authority the election runs on.
    pub fn authority(&self) -> &Arc<dyn Authority> {
        &self.authority
    }

    /// Waits at most `max_wait` to be elected, then proclaims this candidate's value.
    ///
    /// Waits as [`Authority::acquire`] does (by notification where the backend has it), and
    /// fails with [`crate::Error::Timeout`] when another leader stayed. While a leader's
    /// hand-off ([`Leadership::yield_to`]) names another candidate, it waits that out too, and
    /// gives back at once a key it won inside such a window. If the value cannot be proclaimed,
    /// the leadership is given back and the error returned. Dropping the future leaves nothing
    /// behind: a leadership won but not yet returned is released.
    pub async fn campaign(&self, ttl: Duration, max_wait: Duration) -> Result<Leadership> {
        let started = Instant::now();
        let give_up = saturating_add(started, max_wait);
        loop {
            let now = Instant::now();
            if let Some(left) = self.handoff_to_another().await? {
                if now >= give_up {
                    return Err(Error::Timeout {
                        key: self.key.to_string(),
                        waited: now - started,
                    });
                }
                let pause = left.min(HANDOFF_POLL).min(give_up - now);
                self.authority.wait_for_change(&self.key, pause).await?;
                continue;
            }
            let lease = Lease::acquire(
                self.authority.clone(),
                &self.key,
                ttl,
                give_up.saturating_duration_since(now),
                self.options.clone(),
            )
            .await?;
            if self.handoff_to_another().await?.is_some() {
                // Won in another candidate's hand-off window: give the key back at once.
                let _ = lease.release().await;
                continue;
            }
            return self.proclaimed(lease).await;
        }
    }

    /// Tries once to be elected: `Ok(None)` when someone else leads, or a hand-off window names
    /// another candidate.
    pub async fn try_campaign(&self, ttl: Duration) -> Result<Option<Leadership>> {
        if self.handoff_to_another().await?.is_some() {
            return Ok(None);
        }
        match Lease::try_acquire(self.authority.clone(), &self.key, ttl, self.options.clone())
            .await?
        {
            Some(lease) => {
                if self.handoff_to_another().await?.is_some() {
                    let _ = lease.release().await;
                    return Ok(None);
                }
                Ok(Some(self.proclaimed(lease).await?))
            }
            None => Ok(None),
        }
    }

    async fn handoff_to_another(&self) -> Result<Option<Duration>> {
        pending_for_other(&*self.authority, &self.key, self.name.as_deref()).await
    }

    async fn proclaimed(&self, lease: Lease) -> Result<Leadership> {
        let Some(value) = &self.value else {
            return Ok(Leadership { lease, value: None });
        };
        // The lease is released if this future is dropped here (release on drop) or if the
        // value cannot be written: a leader nobody can find is worse than no leader.
        if let Err(e) = self.authority.proclaim(lease.grant(), value).await {
            let _ = lease.release().await;
            return Err(e);
        }
        Ok(Leadership {
            lease,
            value: Some(value.clone()),
        })
    }

    /// Who leads now (one read at the authority), or `None` when nobody does.
    pub async fn leader(&self) -> Result<Option<Leader>> {
        let seen = self.authority.inspect(&self.key).await?;
        Ok(Leader::from_inspection(&seen))
    }

    /// An observer of this election, which reads at least every
    /// [`DEFAULT_OBSERVE_INTERVAL`].
    pub fn observe(&self) -> Observer {
        Observer {
            authority: self.authority.clone(),
            key: self.key.clone(),
            last: None,
            interval: DEFAULT_OBSERVE_INTERVAL,
        }
    }
}

/// Follows an election: each [`Observer::next`] returns the leader when it differs from the one
/// returned before (another epoch, another value, or nobody).
///
/// Changes arrive by notification where the backend has it, and otherwise (and for a leader whose
/// lease just ran out, which nobody announces) within the observer's interval. Changes closer
/// together than one read can be seen as one: an observer sees the newest state, not a history.
#[derive(Debug)]
pub struct Observer {
    authority: Arc<dyn Authority>,
    key: LockKey,
    last: Option<Option<Leader>>,
    interval: Duration,
}

impl Observer {
    /// Reads at least this often when nothing notifies (a shorter interval notices an expired
    /// leader sooner, at one read each time).
    pub fn with_interval(mut self, interval: Duration) -> Self {
        self.interval = interval.max(Duration::from_millis(1));
        self
    }

    /// The leader last returned by [`Observer::next`] (`None` before the first call).
    pub fn last(&self) -> Option<&Option<Leader>> {
        self.last.as_ref()
    }

    /// The first call returns who leads now; each later call waits until that changes.
    /// Cancel-safe: dropping the future loses nothing (the next call compares with the last
    /// leader returned).
    pub async fn next(&mut self) -> Result<Option<Leader>> {
        loop {
            let now = Leader::from_inspection(&self.authority.inspect(&self.key).await?);
            if self.last.as_ref() != Some(&now) {
                self.last = Some(now.clone());
                return Ok(now);
            }
            self.authority
                .wait_for_change(&self.key, self.interval)
                .await?;
        }
    }

    /// The changes as a stream (each item as [`Observer::next`] returns it).
    pub fn into_stream(self) -> impl Stream<Item = Result<Option<Leader>>> + Send {
        futures_util::stream::unfold(self, |mut observer| async move {
            let item = observer.next().await;
            Some((item, observer))
        })
    }
}
