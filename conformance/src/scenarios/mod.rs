//! The scenarios, and running them as a suite.
//!
//! Each scenario is a public async function over a [`Context`], so a backend's test can run one
//! alone; [`run_all`] runs them in order and returns a [`Report`].

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use leasehold_core::Instant;

use crate::context::Context;
use crate::verdict::{Failure, Line, Outcome, Report};

mod bad_input;
mod batch_renewal;
mod cancellation;
mod clock;
mod election;
mod election_extras;
mod exclusion;
mod expiry;
mod fences;
mod forever;
mod helpers;
mod inspect;
mod listing;
pub(crate) mod multi_key;
mod multi_key_at_once;
mod outage;
mod release;
mod renew;
mod revoke;
pub(crate) mod rw_lock;
mod schedule;
mod schedule_options;
mod semaphore;
mod semaphore_extras;
mod stale_write;
mod suspension;
mod telemetry;
mod unavailable;
mod waiters;
mod waiting;

pub use bad_input::bad_input_is_refused_without_side_effects;
pub use batch_renewal::{
    batch_deadline_counts_from_the_request, batch_renew_after_expiry_is_refused,
    delayed_batch_reply_shortens_the_renewals,
};
pub use cancellation::{
    cancelled_acquire_leaves_nothing, cancelled_try_acquire_leaves_nothing, cut_short,
    dropped_waiter_does_not_delay_handoff, CANCEL_ROUNDS,
};
pub use clock::{deadline_counts_from_the_request, delayed_reply_shortens_the_grant};
pub use election::{
    election_cancelled_campaign_leaves_nothing, election_deposed_leader_is_refused,
    election_epochs_grow_across_resign_expiry_and_crash, election_epochs_survive_restart,
    election_observers_see_every_change, election_one_leader_at_a_time,
};
pub use election_extras::{
    election_follower_guard_refuses_a_deposed_leader,
    election_follower_without_watching_admits_a_deposed_leader,
    election_resign_leaves_a_gap_for_a_third, election_yield_hands_over_to_the_named_candidate,
};
pub use exclusion::{contention, exclusion, CONTENDERS, ROUNDS};
pub use expiry::vanished_holder_frees_within_ttl;
pub use fences::{
    fences_grow_after_idle_cleanup, fences_increase, fences_survive_failover,
    fences_survive_restart,
};
pub use forever::duration_max_means_no_limit;
pub use inspect::{inspect_changes_nothing, inspect_reports_holder_and_fence};
pub use listing::list_keys_finds_held_keys_under_a_prefix;
pub use multi_key::{acquire_all_failure_leaves_no_key, acquire_all_never_deadlocks_or_overlaps};
pub use multi_key_at_once::try_acquire_all_takes_all_or_none;
pub use outage::unresponsive_authority;
pub use release::{
    dropped_lease_releases, release_after_expiry_keeps_new_holder, release_frees_at_once,
    stale_release_after_reacquire_keeps_new_grant,
};
pub use renew::{
    lease_renews_past_ttl, lost_fires_at_deadline, lost_fires_on_refused_renewal,
    renew_after_expiry_is_refused, renewal_refusal_loses_only_that_lease,
};
pub use revoke::revoke_ends_the_holder_and_fences_it_out;
pub use rw_lock::{
    rw_lock_cancelled_writer_leaves_nothing, rw_lock_fences_grow_across_modes,
    rw_lock_never_writer_beside_anyone, rw_lock_readers_share,
    rw_lock_waiting_writer_blocks_new_readers,
};
pub use schedule::claim_period_claims_every_period;
pub use schedule_options::{
    schedule_at_least_keeps_a_fast_run_and_waits_are_bounded,
    schedule_at_most_ends_a_hung_run_and_fences_it, schedule_late_timer_anchored_at_firing,
    schedule_late_timer_does_not_skip_the_next_period,
};
pub use semaphore::{
    semaphore_cancelled_acquire_leaves_no_slot, semaphore_never_exceeds_its_permits,
    semaphore_permits_must_agree, semaphore_waits_by_notification,
};
pub use semaphore_extras::{
    semaphore_inspect_counts_free_permits_and_holders, semaphore_permit_lease_renews_by_hand,
    semaphore_revoked_permit_is_lost_and_fenced_out,
};
pub use stale_write::{
    stale_write_first_is_accepted_without_claim, stale_write_refused_after_claim,
};
pub use suspension::{long_outage_loses_at_the_deadline, short_outage_suspends_then_holds};
pub use telemetry::metrics_count_what_happened;
pub use unavailable::fail_open_and_closed_are_explicit;
pub use waiters::inspect_counts_waiters;
pub use waiting::{acquire_times_out, acquire_waits_for_release, cancelled_waiter_leaves_no_trace};

type ScenarioFuture<'a> = Pin<Box<dyn Future<Output = Outcome> + Send + 'a>>;

/// A named scenario.
#[derive(Clone, Copy)]
pub struct Scenario {
    /// Its name in reports.
    pub name: &'static str,
    run: for<'a> fn(&'a Context) -> ScenarioFuture<'a>,
}

impl std::fmt::Debug for Scenario {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

impl Scenario {
    /// Runs it.
    pub fn run<'a>(&self, ctx: &'a Context) -> ScenarioFuture<'a> {
        (self.run)(ctx)
    }
}

macro_rules! scenarios {
    ($($name:ident),* $(,)?) => {
        /// Every scenario, in the order [`run_all`] runs them.
        pub fn all() -> Vec<Scenario> {
            vec![$(Scenario { name: stringify!($name), run: |ctx| Box::pin($name(ctx)) }),*]
        }
    };
}

scenarios![
    bad_input_is_refused_without_side_effects,
    exclusion,
    release_frees_at_once,
    release_after_expiry_keeps_new_holder,
    stale_release_after_reacquire_keeps_new_grant,
    dropped_lease_releases,
    inspect_reports_holder_and_fence,
    inspect_changes_nothing,
    inspect_counts_waiters,
    list_keys_finds_held_keys_under_a_prefix,
    metrics_count_what_happened,
    renew_after_expiry_is_refused,
    deadline_counts_from_the_request,
    delayed_reply_shortens_the_grant,
    batch_renew_after_expiry_is_refused,
    batch_deadline_counts_from_the_request,
    delayed_batch_reply_shortens_the_renewals,
    lease_renews_past_ttl,
    lost_fires_at_deadline,
    lost_fires_on_refused_renewal,
    renewal_refusal_loses_only_that_lease,
    revoke_ends_the_holder_and_fences_it_out,
    vanished_holder_frees_within_ttl,
    fences_increase,
    fences_grow_after_idle_cleanup,
    acquire_waits_for_release,
    acquire_times_out,
    cancelled_waiter_leaves_no_trace,
    cancelled_try_acquire_leaves_nothing,
    cancelled_acquire_leaves_nothing,
    dropped_waiter_does_not_delay_handoff,
    duration_max_means_no_limit,
    stale_write_refused_after_claim,
    stale_write_first_is_accepted_without_claim,
    contention,
    unresponsive_authority,
    fail_open_and_closed_are_explicit,
    semaphore_never_exceeds_its_permits,
    semaphore_permits_must_agree,
    semaphore_cancelled_acquire_leaves_no_slot,
    semaphore_waits_by_notification,
    semaphore_inspect_counts_free_permits_and_holders,
    semaphore_permit_lease_renews_by_hand,
    semaphore_revoked_permit_is_lost_and_fenced_out,
    rw_lock_never_writer_beside_anyone,
    rw_lock_readers_share,
    rw_lock_waiting_writer_blocks_new_readers,
    rw_lock_fences_grow_across_modes,
    rw_lock_cancelled_writer_leaves_nothing,
    acquire_all_never_deadlocks_or_overlaps,
    acquire_all_failure_leaves_no_key,
    try_acquire_all_takes_all_or_none,
    claim_period_claims_every_period,
    schedule_late_timer_does_not_skip_the_next_period,
    schedule_at_most_ends_a_hung_run_and_fences_it,
    schedule_at_least_keeps_a_fast_run_and_waits_are_bounded,
    election_one_leader_at_a_time,
    election_epochs_grow_across_resign_expiry_and_crash,
    election_observers_see_every_change,
    election_deposed_leader_is_refused,
    election_cancelled_campaign_leaves_nothing,
    election_yield_hands_over_to_the_named_candidate,
    election_follower_guard_refuses_a_deposed_leader,
    short_outage_suspends_then_holds,
    long_outage_loses_at_the_deadline,
    fences_survive_restart,
    election_epochs_survive_restart,
    fences_survive_failover,
];

/// The longest a scenario may run before it counts as hung: generous, in TTLs.
pub fn scenario_timeout(ctx: &Context) -> Duration {
    (ctx.ttl() + ctx.tolerance()) * 60 + Duration::from_secs(30)
}

/// Runs one scenario in its own task, so a panic or a hang is a failure of that scenario and not
/// of the whole run.
pub async fn run_one(ctx: &Context, scenario: Scenario) -> Line {
    let start = Instant::now();
    let limit = scenario_timeout(ctx);
    let task = {
        let ctx = ctx.clone();
        tokio::spawn(async move { scenario.run(&ctx).await })
    };
    let outcome = match tokio::time::timeout(limit, task).await {
        Ok(Ok(outcome)) => outcome,
        Ok(Err(join)) if join.is_panic() => Err(Failure::new("the scenario panicked")),
        Ok(Err(join)) => Err(Failure::new(format!("the scenario task failed: {join}"))),
        Err(_) => Err(Failure::new(format!("the scenario hung for {limit:?}"))),
    };
    Line {
        scenario: scenario.name,
        outcome,
        took: start.elapsed(),
    }
}

/// Runs every scenario against the authority behind `ctx`, one after another.
pub async fn run_all(subject: &str, ctx: &Context) -> Report {
    run_selected(subject, ctx, &all()).await
}

/// Runs the given scenarios.
pub async fn run_selected(subject: &str, ctx: &Context, scenarios: &[Scenario]) -> Report {
    let mut lines = Vec::new();
    for scenario in scenarios {
        let line = run_one(ctx, *scenario).await;
        tracing::info!(
            scenario = line.scenario,
            ok = line.outcome.is_ok(),
            "scenario done"
        );
        lines.push(line);
    }
    Report {
        subject: subject.to_string(),
        capabilities: ctx.capabilities().clone(),
        lines,
    }
}
