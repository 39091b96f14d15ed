//! The resource suite: scenarios every *gate* must pass, a gate being what checks fences at a
//! protected store (a [`FencedResource`]: a SQL table, an object store, a Redis hash, the
//! in-memory [`FencedRegister`](leasehold_core::FencedRegister)).
//!
//! The authority suite ([`crate::scenarios`]) proves that fences are issued in order; this one
//! proves that the store refuses the older ones, atomically with the write. Like the authority
//! suite, each scenario is a public async function, here over a [`GateContext`] (a factory of
//! fresh resources and, where the store can be faulted, a [`GateFaults`]), and
//! [`run_all`] runs them in order. [`mutants`] are broken gates the suite must catch.
//!
//! ```ignore
//! let ctx = GateContext::new(Arc::new(MyTables::new(pool))).with_faults(Arc::new(faults));
//! leasehold_conformance::gate::run_all("postgres table", &ctx).await.assert_passed();
//! ```

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold_core::Instant;

use leasehold_core::{FencedRegister, FencedResource};

use crate::verdict::{Failure, Line, Outcome, Verdict};

mod faults;
pub mod mutants;
mod scenarios;
mod unknown_outcome;

pub use faults::{GateFaults, HeldWrites};
pub use scenarios::{
    claim_then_older_write_refused, equal_fence_accepted_again, fence_survives_restart,
    racing_writers_in_both_orders, refusal_is_atomic_under_concurrency, stale_fence_refused,
    WRITERS, WRITER_ROUNDS,
};
pub use unknown_outcome::unknown_outcome_resolved_by_claim;

/// Reads, from the store, the value a resource holds now: what its last accepted write wrote,
/// `None` before any write.
pub type ValueReader = Arc<
    dyn Fn() -> Pin<Box<dyn Future<Output = leasehold_core::Result<Option<String>>> + Send>>
        + Send
        + Sync,
>;

/// A fresh resource (it has accepted no fence yet), and how to read its value from the store:
/// the scenarios check that a refused write changed nothing, not only what the gate answered.
#[derive(Clone)]
pub struct Probed {
    /// The resource under test.
    pub resource: Arc<dyn FencedResource>,
    /// Its value, read from the store.
    pub value: ValueReader,
}

impl fmt::Debug for Probed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Probed").finish_non_exhaustive()
    }
}

/// Makes fresh resources for the gate scenarios.
#[async_trait]
pub trait GateFactory: Send + Sync {
    /// A resource that has accepted no fence yet, with its value reader.
    async fn resource(&self) -> leasehold_core::Result<Probed>;
}

/// The in-memory reference gate: a [`FencedRegister`] each time.
#[derive(Debug, Default, Clone, Copy)]
pub struct InMemoryGates;

#[async_trait]
impl GateFactory for InMemoryGates {
    async fn resource(&self) -> leasehold_core::Result<Probed> {
        let register = Arc::new(FencedRegister::new());
        let read = register.clone();
        Ok(Probed {
            resource: register,
            value: Arc::new(move || {
                let value = read.read().0;
                Box::pin(async move { Ok(value) })
            }),
        })
    }
}

/// What a gate scenario runs against.
#[derive(Clone)]
pub struct GateContext {
    resources: Arc<dyn GateFactory>,
    faults: Option<Arc<dyn GateFaults>>,
    forgets_on_restart: Option<String>,
}

impl fmt::Debug for GateContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GateContext")
            .field("faults", &self.faults.is_some())
            .finish_non_exhaustive()
    }
}

impl GateContext {
    /// Scenarios take fresh resources (no fence accepted yet) from `resources`.
    pub fn new(resources: Arc<dyn GateFactory>) -> Self {
        GateContext {
            resources,
            faults: None,
            forgets_on_restart: None,
        }
    }

    /// Declares that the store keeps nothing across a restart (`why`: Redis without
    /// persistence, say): a fence forgotten by a restart is then shown as declared, not failed.
    pub fn forgets_on_restart(mut self, why: impl Into<String>) -> Self {
        self.forgets_on_restart = Some(why.into());
        self
    }

    /// Why the store keeps nothing across a restart, when it was declared.
    pub fn declared_forgetful(&self) -> Option<&str> {
        self.forgets_on_restart.as_deref()
    }

    /// Lets the scenarios that need them fault the store.
    pub fn with_faults(mut self, faults: Arc<dyn GateFaults>) -> Self {
        self.faults = Some(faults);
        self
    }

    /// The factory of fresh resources.
    pub fn resources(&self) -> &Arc<dyn GateFactory> {
        &self.resources
    }

    /// The store's faults, if the harness can inject them.
    pub fn faults(&self) -> Option<&Arc<dyn GateFaults>> {
        self.faults.as_ref()
    }
}

type GateFuture<'a> = Pin<Box<dyn Future<Output = Outcome> + Send + 'a>>;

/// A named gate scenario.
#[derive(Clone, Copy)]
pub struct GateScenario {
    /// Its name in reports.
    pub name: &'static str,
    run: for<'a> fn(&'a GateContext) -> GateFuture<'a>,
}

impl fmt::Debug for GateScenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name)
    }
}

macro_rules! gate_scenarios {
    ($($name:ident),* $(,)?) => {
        /// Every gate scenario, in the order [`run_all`] runs them.
        pub fn all() -> Vec<GateScenario> {
            vec![$(GateScenario { name: stringify!($name), run: |ctx| Box::pin($name(ctx)) }),*]
        }
    };
}

gate_scenarios![
    stale_fence_refused,
    equal_fence_accepted_again,
    claim_then_older_write_refused,
    racing_writers_in_both_orders,
    refusal_is_atomic_under_concurrency,
    unknown_outcome_resolved_by_claim,
    fence_survives_restart,
];

/// The scenarios that fault the store, which do not apply where the harness has no
/// [`GateFaults`] for it (an embedded file, an in-memory store): what such a binding names to
/// [`GateReport::passed_except`].
pub const NEEDS_FAULTS: [&str; 2] = [
    "unknown_outcome_resolved_by_claim",
    "fence_survives_restart",
];

/// The longest a gate scenario may run before it counts as hung.
pub const GATE_SCENARIO_TIMEOUT: Duration = Duration::from_secs(120);

/// Runs one scenario in its own task: a panic or a hang fails that scenario only.
pub async fn run_one(ctx: &GateContext, scenario: GateScenario) -> Line {
    let start = Instant::now();
    let task = {
        let ctx = ctx.clone();
        tokio::spawn(async move { (scenario.run)(&ctx).await })
    };
    let outcome = match tokio::time::timeout(GATE_SCENARIO_TIMEOUT, task).await {
        Ok(Ok(outcome)) => outcome,
        Ok(Err(join)) if join.is_panic() => Err(Failure::new("the scenario panicked")),
        Ok(Err(join)) => Err(Failure::new(format!("the scenario task failed: {join}"))),
        Err(_) => Err(Failure::new(format!(
            "the scenario hung for {GATE_SCENARIO_TIMEOUT:?}"
        ))),
    };
    Line {
        scenario: scenario.name,
        outcome,
        took: start.elapsed(),
    }
}

/// Runs every gate scenario against the gate behind `ctx`, one after another.
pub async fn run_all(subject: &str, ctx: &GateContext) -> GateReport {
    let mut lines = Vec::new();
    for scenario in all() {
        lines.push(run_one(ctx, scenario).await);
    }
    GateReport {
        subject: subject.to_string(),
        lines,
    }
}

/// The result of running the resource suite against one gate.
#[derive(Clone, Debug)]
pub struct GateReport {
    /// What the gate was called in this run (a store, or a mutant's name).
    pub subject: String,
    /// One line per scenario, in order.
    pub lines: Vec<Line>,
}

impl GateReport {
    /// The scenarios that failed.
    pub fn failures(&self) -> Vec<&Line> {
        self.lines.iter().filter(|l| l.outcome.is_err()).collect()
    }

    /// An error with the whole report unless every scenario passed or did not apply.
    pub fn passed(&self) -> Result<(), Failure> {
        if self.failures().is_empty() {
            Ok(())
        } else {
            Err(Failure::new(format!("the resource suite failed:\n{self}")))
        }
    }

    /// An error with the whole report unless every scenario passed but those in `expected`,
    /// which must each be in the report and not have passed (declared, or not applicable): a
    /// store's binding names what it is known not to do, and is told both when something else
    /// stops passing and when a named scenario starts to.
    pub fn passed_except(&self, expected: &[&str]) -> Result<(), Failure> {
        self.passed()?;
        let missing: Vec<&str> = expected
            .iter()
            .copied()
            .filter(|name| !self.lines.iter().any(|l| l.scenario == *name))
            .collect();
        let passed = |l: &&Line| l.outcome == Ok(Verdict::Passed);
        let unexpected: Vec<&str> = self
            .lines
            .iter()
            .filter(|l| passed(l) == expected.contains(&l.scenario))
            .map(|l| l.scenario)
            .collect();
        if missing.is_empty() && unexpected.is_empty() {
            return Ok(());
        }
        Err(Failure::new(format!(
            "every scenario should pass except {expected:?} (which should not); \
             not so for {unexpected:?}{}:\n{self}",
            if missing.is_empty() {
                String::new()
            } else {
                format!(", and {missing:?} did not run")
            }
        )))
    }
}

impl fmt::Display for GateReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "resource suite on {}:", self.subject)?;
        for line in &self.lines {
            writeln!(f, "{line}")?;
        }
        Ok(())
    }
}
