//! Scenario outcomes and the report.

use std::fmt;
use std::time::Duration;

use leasehold_core::Capabilities;

/// A scenario's finding that the authority broke its contract; also what a test that returns
/// `Result` fails with (see [`crate::kit`]), printed as its message alone.
#[derive(Clone, PartialEq, Eq)]
pub struct Failure(pub String);

impl fmt::Debug for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<String> for Failure {
    fn from(message: String) -> Self {
        Failure(message)
    }
}

impl From<&str> for Failure {
    fn from(message: &str) -> Self {
        Failure(message.to_string())
    }
}

impl Failure {
    /// A failure with a message.
    pub fn new(message: impl Into<String>) -> Self {
        Failure(message.into())
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// How a scenario ended, when the authority did not break its contract.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Everything the scenario checks held.
    Passed,
    /// The scenario does not apply: the backend declares it cannot do this, or the harness
    /// offers no such fault. The reason says which.
    NotApplicable(String),
    /// The scenario observed a weakness the backend declares in its capabilities (for example a
    /// fence reissued after a failover of a failover-unsafe backend). Shown, not hidden.
    Declared(String),
}

/// A scenario's result.
pub type Outcome = Result<Verdict, Failure>;

/// Returns a [`Failure`] from the enclosing scenario unless `cond` holds.
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err($crate::Failure::new(format!($($msg)+)));
        }
    };
}

/// Turns any displayable error into a [`Failure`] that says what was being done.
pub trait OrFail<T> {
    /// Adds what was being done.
    fn or_fail(self, what: impl fmt::Display) -> Result<T, Failure>;
}

impl<T, E: fmt::Display> OrFail<T> for Result<T, E> {
    fn or_fail(self, what: impl fmt::Display) -> Result<T, Failure> {
        self.map_err(|e| Failure::new(format!("{what}: {e}")))
    }
}

/// One line of the report.
#[derive(Clone, Debug)]
pub struct Line {
    /// The scenario's name.
    pub scenario: &'static str,
    /// Its outcome.
    pub outcome: Outcome,
    /// How long it took.
    pub took: Duration,
}

impl fmt::Display for Line {
    /// One report line: outcome tag, scenario, time taken, and why when it did not pass.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (tag, detail) = match &self.outcome {
            Ok(Verdict::Passed) => ("pass", ""),
            Ok(Verdict::NotApplicable(why)) => ("n/a ", why.as_str()),
            Ok(Verdict::Declared(what)) => ("DECLARED", what.as_str()),
            Err(failure) => ("FAIL", failure.0.as_str()),
        };
        write!(
            f,
            "  {tag:8} {:40} {:>8.0?}  {detail}",
            self.scenario, self.took
        )
    }
}

/// The result of running the suite against one authority.
#[derive(Clone, Debug)]
pub struct Report {
    /// What the authority was called in this run (a backend, or a mutant's name).
    pub subject: String,
    /// Its declared capabilities.
    pub capabilities: Capabilities,
    /// One line per scenario, in order.
    pub lines: Vec<Line>,
}

impl Report {
    /// The scenarios that failed.
    pub fn failures(&self) -> Vec<&Line> {
        self.lines.iter().filter(|l| l.outcome.is_err()).collect()
    }

    /// The scenarios whose outcome was a declared weakness.
    pub fn declared(&self) -> Vec<&Line> {
        self.lines
            .iter()
            .filter(|l| matches!(l.outcome, Ok(Verdict::Declared(_))))
            .collect()
    }

    /// Whether `line` did not apply because the backend declares it lacks what the scenario
    /// exercises (a capability it does not claim), so a backend's own test that wants every
    /// other scenario to pass need not name it.
    pub fn declared_absent(&self, line: &Line) -> bool {
        let needs_what_is_declared_absent = match line.scenario {
            "try_acquire_all_takes_all_or_none" => !self.capabilities.atomic_acquire_all,
            _ => false,
        };
        needs_what_is_declared_absent && matches!(line.outcome, Ok(Verdict::NotApplicable(_)))
    }

    /// Panics with the whole report unless every scenario passed, was not applicable, or showed
    /// a declared weakness.
    pub fn assert_passed(&self) {
        assert!(self.failures().is_empty(), "conformance failed:\n{self}");
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.capabilities;
        writeln!(
            f,
            "conformance of {}: fences {}, {} across restart, leases {}, waits by {:?}, revocation \
             {:?}, TTL {:?}..={:?} step {:?}",
            self.subject,
            c.fence_safety,
            if c.durable_fences {
                "durable"
            } else {
                "NOT durable"
            },
            c.exclusion,
            c.wait,
            c.revocation,
            c.ttl.min,
            c.ttl.max,
            c.ttl.granularity
        )?;
        for line in &self.lines {
            writeln!(f, "{line}")?;
        }
        Ok(())
    }
}
