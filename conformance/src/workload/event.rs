//! One entry of the workload history: every invoke and completion a worker or the nemesis saw.
//!
//! The shape follows Jepsen's histories (an operation is an *invoke* followed by one completion),
//! flattened into one JSON object per event so that a history is greppable line by line:
//!
//! ```text
//! {"t":1200,"event":"acquire_invoke","worker":2,"key":"k0","ttl_ns":2000000000}
//! {"t":1350,"event":"acquire_ok","worker":2,"key":"k0","fence":7,"deadline":2001349000}
//! {"t":1400,"event":"write_ok","worker":2,"key":"k0","fence":7,"element":33}
//! ```

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A worker's number, stable for the whole run: a worker process restarted after a kill keeps
/// it, so the history reads as one worker that died and came back.
pub type WorkerId = u32;

/// A time in nanoseconds of `CLOCK_MONOTONIC`. Every process on one machine reads the same
/// clock, so events recorded by different worker processes can be merged and compared.
pub type Nanos = u64;

/// One event: when it happened and what happened.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// When, in nanoseconds of `CLOCK_MONOTONIC` (see [`super::clock`]).
    pub t: Nanos,
    /// What happened; flattened so the line carries an `"event"` tag beside `"t"`.
    #[serde(flatten)]
    pub what: What,
}

impl Event {
    /// An event at `t`.
    pub fn new(t: Nanos, what: What) -> Self {
        Event { t, what }
    }

    /// The worker the event belongs to; `None` for the run header, the final state and faults
    /// (whose target worker, if any, is [`What::fault_worker`]).
    pub fn worker(&self) -> Option<WorkerId> {
        self.what.worker()
    }

    /// The lock key (and resource row) the event concerns; `None` for run-wide events.
    pub fn key(&self) -> Option<&str> {
        self.what.key()
    }
}

/// The faults the nemesis injects, named so a report can show that each kind happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum FaultKind {
    /// `SIGSTOP` of a worker (a holder, usually past its TTL), healed by `SIGCONT`.
    PauseWorker,
    /// `SIGKILL` of a worker; healed when its replacement process starts.
    KillWorker,
    /// The authority (one server) killed, healed by a restart on the same data.
    KillAuthority,
    /// One member of a cluster killed, healed by its restart.
    KillMember,
    /// The cluster's leader killed, healed by its restart.
    KillLeader,
    /// One member cut off from the other members (not from clients), healed by removing the
    /// rules.
    IsolateMember,
    /// The cluster's leader paused (`SIGSTOP`), healed by `SIGCONT`.
    PauseLeader,
    /// A Redis replica promoted to primary while the old primary may still answer.
    PromoteReplica,
    /// The authority's replies held back on their way to the clients for longer than the
    /// safety margin (in-process runs): a client that counts its deadline from the reply
    /// instead of from its request then believes in a lease the authority already ended.
    SlowReplies,
    /// The connection pooler in front of the authority (PgBouncer) killed and started again:
    /// every client and server connection through it ends at once. Healed when the pooler
    /// accepts logins again.
    RestartPooler,
    /// Redis Sentinel's own failover: the primary the sentinels name killed, the replica
    /// promoted by the sentinels' vote; healed when the old primary is back as the new one's
    /// replica and every sentinel names the new primary. Replication is asynchronous: fence
    /// counters the replica had not received are lost.
    SentinelFailover,
    /// Every sentinel re-provisioned (`SENTINEL REMOVE` and `MONITOR` of the current primary,
    /// what a redeploy without `sentinel.conf` amounts to): configuration epochs start from 0
    /// again. Healed when the sentinels agree on the primary, know the replica and each other.
    ReprovisionSentinels,
    /// A Redis Cluster primary killed; its replica takes its slots over (asynchronous
    /// replication: fence counters it had not received are lost). Healed when the killed node
    /// is back, as a replica of its replacement.
    KillPrimary,
    /// The hash slot of one of the run's Redis Cluster keys moved to another primary (`CLUSTER
    /// SETSLOT IMPORTING`/`MIGRATING`, `MIGRATE`, `SETSLOT NODE`) while clients use it.
    MigrateSlot,
    /// The resource's object store stopped (`SIGSTOP`) past its clients' request timeout, then
    /// resumed: requests sent meanwhile fail at the client (`write_unknown`), and the store may
    /// still apply them once it goes on.
    StallResource,
    /// Observed, not injected: the servers of a replicated Redis form answered with two
    /// primaries at once, or with another sole primary than before (Sentinel failing over on
    /// its own, for instance after re-provisioned sentinels voted on a stale view). Ends when
    /// one server alone answers as primary. Like a failover the nemesis causes, it can lose
    /// fence counters the new primary had not received.
    PrimaryChanged,
    /// `SIGKILL` of a worker caught holding the SQLite write lock (inside a `BEGIN IMMEDIATE`
    /// transaction); healed when its replacement process starts.
    KillWorkerInTransaction,
    /// A cluster's leader killed or paused the moment a holder starts releasing its lease, so
    /// the workers waiting for that key meet a leader change mid-wait; healed by a restart or
    /// `SIGCONT`.
    HandoffLeaderChange,
    /// One worker's packets to the authority dropped without a reset (nftables by the worker's
    /// uid), for less or for more than a TTL; healed by removing the rule. Its renewals vanish
    /// silently, so its lease must end as held-after-a-stall or lost, never as a write made in
    /// the belief that it still holds.
    CutWorker,
    /// The resource server's connections to workers terminated (`pg_terminate_backend`) while
    /// writes are in flight: a write whose commit the worker never saw is `write_unknown`.
    KillResourceConnection,
    /// The resource server killed and started again on its data (crash recovery); healed when
    /// it accepts connections again.
    RestartResource,
    /// The authority (one server) stopped (`SIGSTOP`) for a while, then resumed: requests sent
    /// meanwhile fail at the client or answer late, and leases run out by the authority's clock
    /// while no holder can renew.
    PauseAuthority,
    /// The authority (one server) stopped cleanly and started again on its data, for a store
    /// whose crash would test the emulator rather than the service it stands for (Azurite keeps
    /// its metadata in memory between saves); healed when it serves again.
    RestartAuthority,
}

/// What happened. Each worker operation is an `*_invoke` followed by exactly one completion,
/// unless the worker died in between (then the operation's outcome is unknown).
///
/// Fences are [`leasehold_core::Fence::value`]s; elements are the unique numbers written into a
/// key's set, never written twice in a run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
#[non_exhaustive]
pub enum What {
    /// The first line of a run: what reproduces it and how to judge it.
    Run {
        /// The seed of the nemesis schedule and of every worker's random choices.
        seed: u64,
        /// The backend (or mutant) under test.
        backend: String,
        /// Whether writes carry the fence to the resource (false: the unfenced control).
        fenced: bool,
        /// Whether the backend declares its fences failover-unsafe
        /// ([`leasehold_core::FenceSafety::FailoverUnsafe`]).
        failover_unsafe: bool,
        /// Whether the authority declares that it can end a live lease before its TTL
        /// ([`leasehold_core::ExclusionSafety::EarlyRevocation`]). Absent in older histories.
        #[serde(default)]
        early_revocation: bool,
        /// Whether every request of the authority goes through one write lock that a stopped
        /// client process can keep (an embedded SQLite file): a worker paused while one of its
        /// requests held that lock blocks every key, not only the keys it held or asked for.
        /// Absent in older histories.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        one_writer: bool,
        /// Every fault kind the nemesis planned for this run: a kind that never landed fails
        /// the run, and a plan with worker pauses obliges a fenced run to show its guard at
        /// work (stale writes refused, keys handed on while a holder was paused). Empty in
        /// older and hand-made histories, which are judged without those checks.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        planned_faults: Vec<FaultKind>,
        /// The source revision the run was built from (`git rev-parse HEAD` where the runner
        /// ran, or `unknown`). Absent in older histories.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        commit: Option<String>,
        /// The version of each server program the runner started, by program (`etcd`,
        /// `postgres`, ...), as the program itself reports it. Empty in older histories and
        /// for servers someone else started.
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        versions: BTreeMap<String, String>,
        /// The command that runs the same schedule again from the seed, every option spelled
        /// out. Absent in older histories and for in-process runs.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        command: Option<String>,
        /// The store the protected resource lived in (`postgres`, `azurite`). Absent in older
        /// histories (which all used PostgreSQL) and in-process runs.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        resource: Option<String>,
    },
    /// A worker starts `Lease::acquire`.
    AcquireInvoke {
        /// The worker.
        worker: WorkerId,
        /// The key.
        key: String,
        /// The TTL asked for.
        ttl_ns: Nanos,
        /// How long the worker will wait; absent means no limit.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max_wait_ns: Option<Nanos>,
    },
    /// The acquire returned a lease.
    AcquireOk {
        /// The worker.
        worker: WorkerId,
        /// The key.
        key: String,
        /// The lease's fence.
        fence: u64,
        /// The lease's local deadline on `CLOCK_MONOTONIC`, when the worker could read it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        deadline: Option<Nanos>,
    },
    /// The acquire failed with an error other than a timeout.
    AcquireFail {
        /// The worker.
        worker: WorkerId,
        /// The key.
        key: String,
        /// The error, as displayed.
        error: String,
    },
    /// The acquire gave up after its `max_wait`: someone else held the key.
    AcquireTimeout {
        /// The worker.
        worker: WorkerId,
        /// The key.
        key: String,
    },
    /// The worker dropped the acquire future on purpose, at a random point.
    AcquireCancelled {
        /// The worker.
        worker: WorkerId,
        /// The key.
        key: String,
    },
    /// A renewal moved the lease's local deadline (optional: without it the checker uses the
    /// deadline of the grant, which only makes validity windows shorter).
    Renewed {
        /// The worker.
        worker: WorkerId,
        /// The key.
        key: String,
        /// The lease's fence.
        fence: u64,
        /// The new local deadline.
        deadline: Nanos,
    },
    /// The worker saw its lease lost (`lease.lost()` resolved).
    Lost {
        /// The worker.
        worker: WorkerId,
        /// The key.
        key: String,
        /// The lost lease's fence.
        fence: u64,
        /// The `LostReason`, as displayed.
        reason: String,
    },
    /// The worker starts reading the set. With a fence, the read is also a claim: the resource
    /// raises `last_fence` to it or refuses, so an older holder's late write is refused from
    /// then on.
    ReadInvoke {
        /// The worker.
        worker: WorkerId,
        /// The key.
        key: String,
        /// The fence claimed with the read; absent for an unfenced read.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        fence: Option<u64>,
    },
    /// The read returned the set (and, with a fence, the claim was accepted).
    ReadOk {
        /// The worker.
        worker: WorkerId,
        /// The key.
        key: String,
        /// The fence claimed with the read.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        fence: Option<u64>,
        /// The set's elements as read.
        elements: Vec<u64>,
    },
    /// The resource refused the read's claim: it already accepted a greater fence.
    ReadStale {
        /// The worker.
        worker: WorkerId,
        /// The key.
        key: String,
        /// The fence presented.
        fence: u64,
        /// The resource's `last_fence`, greater than `fence`.
        newest: u64,
    },
    /// The read failed.
    ReadFail {
        /// The worker.
        worker: WorkerId,
        /// The key.
        key: String,
        /// The fence claimed with the read.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        fence: Option<u64>,
        /// The error, as displayed.
        error: String,
    },
    /// The worker starts writing the set it read plus `element`, guarded by `fence`.
    WriteInvoke {
        /// The worker.
        worker: WorkerId,
        /// The key.
        key: String,
        /// The fence the write carries (ignored by the resource in the unfenced control).
        fence: u64,
        /// The new element, unique in the run.
        element: u64,
    },
    /// The resource accepted the write: the acknowledgement the checker holds it to.
    WriteOk {
        /// The worker.
        worker: WorkerId,
        /// The key.
        key: String,
        /// The fence the write carried.
        fence: u64,
        /// The new element.
        element: u64,
        /// The resource's `last_fence` just before it accepted this write, when it reports it:
        /// makes the stale-accept check exact instead of bounded by real-time order.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        prior: Option<u64>,
    },
    /// The resource refused the write because it already accepted a greater fence: fencing
    /// doing its job.
    WriteStale {
        /// The worker.
        worker: WorkerId,
        /// The key.
        key: String,
        /// The fence the write carried.
        fence: u64,
        /// The new element (never to be seen in the set).
        element: u64,
        /// The resource's `last_fence`, greater than `fence`.
        newest: u64,
    },
    /// The write failed without a known outcome (it may or may not have been applied).
    WriteUnknown {
        /// The worker.
        worker: WorkerId,
        /// The key.
        key: String,
        /// The fence the write carried.
        fence: u64,
        /// The new element (may or may not be in the set).
        element: u64,
        /// The error, as displayed.
        error: String,
    },
    /// The worker starts releasing its lease; from here on it no longer acts as the holder.
    ReleaseInvoke {
        /// The worker.
        worker: WorkerId,
        /// The key.
        key: String,
        /// The released lease's fence.
        fence: u64,
    },
    /// The release returned.
    ReleaseOk {
        /// The worker.
        worker: WorkerId,
        /// The key.
        key: String,
        /// The released lease's fence.
        fence: u64,
    },
    /// The release failed (the TTL is then the safety net).
    ReleaseFail {
        /// The worker.
        worker: WorkerId,
        /// The key.
        key: String,
        /// The lease's fence.
        fence: u64,
        /// The error, as displayed.
        error: String,
    },
    /// The nemesis starts a fault.
    FaultStart {
        /// Pairs the start with its end.
        fault: u64,
        /// What kind of fault.
        kind: FaultKind,
        /// The worker it hits, for worker faults.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        worker: Option<WorkerId>,
        /// The server it hits (a member's name or address), for server faults.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        node: Option<String>,
    },
    /// The nemesis healed a fault (and, for the authority, saw it recover).
    FaultEnd {
        /// The `fault` of the matching [`What::FaultStart`].
        fault: u64,
        /// What kind of fault.
        kind: FaultKind,
        /// The worker it hit.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        worker: Option<WorkerId>,
        /// The server it hit.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        node: Option<String>,
    },
    /// The resource's final state of one key, read after every fault healed and every worker
    /// stopped.
    Final {
        /// The key.
        key: String,
        /// Every element in the set.
        elements: Vec<u64>,
        /// The resource's `last_fence`; absent if the row was never written.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        last_fence: Option<u64>,
    },
}

impl FaultKind {
    /// Whether a fault of this kind can make a failover-unsafe authority forget fences it
    /// issued or leases it granted: a server that loses its memory (killed without persistence)
    /// or a replica that missed the latest writes taking over. A reissued fence or a key
    /// granted twice on such a backend is declared only if one of these began between the two
    /// grants; without one it is a failure like on any other backend.
    pub fn can_lose_grants(self) -> bool {
        matches!(
            self,
            FaultKind::KillAuthority
                | FaultKind::PromoteReplica
                | FaultKind::KillMember
                | FaultKind::KillLeader
                | FaultKind::SentinelFailover
                | FaultKind::KillPrimary
                | FaultKind::PrimaryChanged
        )
    }
}

impl What {
    /// The worker whose operation this is; faults report theirs in [`What::fault_worker`].
    pub fn worker(&self) -> Option<WorkerId> {
        use What::*;
        match self {
            AcquireInvoke { worker, .. }
            | AcquireOk { worker, .. }
            | AcquireFail { worker, .. }
            | AcquireTimeout { worker, .. }
            | AcquireCancelled { worker, .. }
            | Renewed { worker, .. }
            | Lost { worker, .. }
            | ReadInvoke { worker, .. }
            | ReadOk { worker, .. }
            | ReadStale { worker, .. }
            | ReadFail { worker, .. }
            | WriteInvoke { worker, .. }
            | WriteOk { worker, .. }
            | WriteStale { worker, .. }
            | WriteUnknown { worker, .. }
            | ReleaseInvoke { worker, .. }
            | ReleaseOk { worker, .. }
            | ReleaseFail { worker, .. } => Some(*worker),
            Run { .. } | FaultStart { .. } | FaultEnd { .. } | Final { .. } => None,
        }
    }

    /// The worker a fault hits.
    pub fn fault_worker(&self) -> Option<WorkerId> {
        match self {
            What::FaultStart { worker, .. } | What::FaultEnd { worker, .. } => *worker,
            _ => None,
        }
    }

    /// The key the event concerns.
    pub fn key(&self) -> Option<&str> {
        use What::*;
        match self {
            AcquireInvoke { key, .. }
            | AcquireOk { key, .. }
            | AcquireFail { key, .. }
            | AcquireTimeout { key, .. }
            | AcquireCancelled { key, .. }
            | Renewed { key, .. }
            | Lost { key, .. }
            | ReadInvoke { key, .. }
            | ReadOk { key, .. }
            | ReadStale { key, .. }
            | ReadFail { key, .. }
            | WriteInvoke { key, .. }
            | WriteOk { key, .. }
            | WriteStale { key, .. }
            | WriteUnknown { key, .. }
            | ReleaseInvoke { key, .. }
            | ReleaseOk { key, .. }
            | ReleaseFail { key, .. }
            | Final { key, .. } => Some(key),
            Run { .. } | FaultStart { .. } | FaultEnd { .. } => None,
        }
    }

    /// Whether this is a fault's start or end (shown in every history slice, whatever its key).
    pub fn is_fault(&self) -> bool {
        matches!(self, What::FaultStart { .. } | What::FaultEnd { .. })
    }
}
