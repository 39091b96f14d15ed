//! Latency samples and their percentiles (hand-off, acquire).

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::event::Nanos;

/// A set of latency samples in nanoseconds, kept whole so a report can draw the histogram.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Latencies {
    samples: Vec<Nanos>,
}

impl Latencies {
    /// No samples.
    pub fn new() -> Self {
        Latencies::default()
    }

    /// Adds a sample.
    pub fn push(&mut self, ns: Nanos) {
        self.samples.push(ns);
    }

    /// Every sample, in the order recorded.
    pub fn samples(&self) -> &[Nanos] {
        &self.samples
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    /// Whether there are no samples.
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// The `p`-th percentile (`0.0..=100.0`) by nearest rank: always a sample that was
    /// observed, never an interpolation. `None` without samples.
    pub fn percentile(&self, p: f64) -> Option<Duration> {
        if self.samples.is_empty() {
            return None;
        }
        let mut sorted = self.samples.clone();
        sorted.sort_unstable();
        let p = if p.is_nan() {
            100.0
        } else {
            p.clamp(0.0, 100.0)
        };
        let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
        let i = rank.clamp(1, sorted.len()) - 1;
        Some(Duration::from_nanos(sorted[i]))
    }

    /// The largest sample.
    pub fn max(&self) -> Option<Duration> {
        self.samples
            .iter()
            .max()
            .map(|&ns| Duration::from_nanos(ns))
    }
}

impl fmt::Display for Latencies {
    /// `n=…, p50 …, p90 …, p99 …, max …`, or `n=0`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (
            self.percentile(50.0),
            self.percentile(90.0),
            self.percentile(99.0),
            self.max(),
        ) {
            (Some(p50), Some(p90), Some(p99), Some(max)) => write!(
                f,
                "n={} p50 {p50:.1?} p90 {p90:.1?} p99 {p99:.1?} max {max:.1?}",
                self.len()
            ),
            _ => write!(f, "n=0"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_observed_samples() {
        let mut l = Latencies::new();
        assert_eq!(l.percentile(50.0), None);
        for ns in (1..=100).rev() {
            l.push(ns);
        }
        assert_eq!(l.percentile(50.0), Some(Duration::from_nanos(50)));
        assert_eq!(l.percentile(99.0), Some(Duration::from_nanos(99)));
        assert_eq!(l.percentile(100.0), Some(Duration::from_nanos(100)));
        assert_eq!(l.percentile(0.0), Some(Duration::from_nanos(1)));
        assert_eq!(l.percentile(f64::NAN), Some(Duration::from_nanos(100)));
        assert_eq!(l.max(), Some(Duration::from_nanos(100)));
    }
}
