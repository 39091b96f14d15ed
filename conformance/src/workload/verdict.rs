//! A run's verdict: pass or fail, why, the figures, and the history around the first failure.

use std::fmt;

use super::figures::Figures;
use super::finding::{Finding, Severity};
use super::history::HistorySlice;
use crate::{Failure, Outcome, Verdict};

/// The run's standing, in the conformance report's terms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// Nothing the checker judges went wrong (for the control: it showed lost updates).
    Passed,
    /// Only weaknesses the backend declares were seen.
    Declared,
    /// At least one finding fails the run.
    Failed,
}

/// What the checker concluded about one run.
#[derive(Clone, Debug)]
pub struct RunVerdict {
    /// Pass, declared, or fail.
    pub status: Status,
    /// Whether this was a fenced run (false: the unfenced control).
    pub fenced: bool,
    /// The seed that reproduces the run, from the history's `run` line.
    pub seed: Option<u64>,
    /// The backend, from the history's `run` line.
    pub backend: Option<String>,
    /// One line per kind of finding: how many, how they weigh, and the first instance.
    pub reasons: Vec<String>,
    /// Every finding, in history order.
    pub findings: Vec<Finding>,
    /// What was measured.
    pub figures: Figures,
    /// For a failure, the history around the first failing event.
    pub slice: Option<HistorySlice>,
}

impl RunVerdict {
    /// Whether the run passed (a declared weakness passes, labelled).
    pub fn passed(&self) -> bool {
        self.status != Status::Failed
    }

    /// The findings of one severity.
    pub fn findings_of(&self, severity: Severity) -> impl Iterator<Item = &Finding> {
        self.findings.iter().filter(move |f| f.severity == severity)
    }

    /// The first failing finding, the one the slice is about.
    pub fn first_failure(&self) -> Option<&Finding> {
        self.findings_of(Severity::Failure).min_by_key(|f| f.at)
    }

    /// The verdict as a conformance [`Outcome`], so a workload run can sit in a [`crate::Report`]
    /// beside the scenarios. A failure carries the whole verdict, slice and seed included.
    pub fn outcome(&self) -> Outcome {
        match self.status {
            Status::Passed => Ok(Verdict::Passed),
            Status::Declared => Ok(Verdict::Declared(self.reasons.join("; "))),
            Status::Failed => Err(Failure::new(self.to_string())),
        }
    }
}

impl fmt::Display for RunVerdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let status = match self.status {
            Status::Passed => "pass",
            Status::Declared => "DECLARED",
            Status::Failed => "FAIL",
        };
        write!(
            f,
            "workload {status}: {} run",
            if self.fenced {
                "fenced"
            } else {
                "unfenced control"
            }
        )?;
        if let Some(backend) = &self.backend {
            write!(f, " on {backend}")?;
        }
        match self.seed {
            Some(seed) => writeln!(f, ", seed {seed}")?,
            None => writeln!(f)?,
        }
        for reason in &self.reasons {
            writeln!(f, "  - {reason}")?;
        }
        write!(f, "{}", self.figures)?;
        if let Some(slice) = &self.slice {
            writeln!(f, "history around the first failure:")?;
            write!(f, "{slice}")?;
        }
        Ok(())
    }
}
