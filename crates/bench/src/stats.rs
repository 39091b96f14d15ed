//! Percentiles and the printed comparison.

use std::time::Duration;

/// Samples of one measurement.
#[derive(Debug, Default, Clone)]
pub struct Samples(Vec<Duration>);

impl Samples {
    pub fn push(&mut self, d: Duration) {
        self.0.push(d);
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn percentile(&self, p: f64) -> Duration {
        let mut v = self.0.clone();
        v.sort();
        if v.is_empty() {
            return Duration::ZERO;
        }
        let i = ((v.len() - 1) as f64 * p).round() as usize;
        v[i.min(v.len() - 1)]
    }

    /// The mean, to set beside mean CPU times (a percentile is not a sum of its parts).
    pub fn mean(&self) -> Duration {
        let total: Duration = self.0.iter().sum();
        total / self.0.len().max(1) as u32
    }

    pub fn p50(&self) -> Duration {
        self.percentile(0.50)
    }

    pub fn p99(&self) -> Duration {
        self.percentile(0.99)
    }
}

fn ratio(a: Duration, b: Duration) -> f64 {
    if b.is_zero() {
        return f64::NAN;
    }
    a.as_secs_f64() / b.as_secs_f64()
}

/// Prints one measurement next to its baseline, with the p50 ratio against a target (none for
/// the in-memory authority, whose raw pair has no round trip to amortise leasehold's work).
pub fn report(
    name: &str,
    ours: &Samples,
    baseline_name: &str,
    baseline: &Samples,
    target: Option<f64>,
) {
    let r = ratio(ours.p50(), baseline.p50());
    let verdict = match target {
        Some(t) if r <= t => format!("(target <= {t:.2}x) ok"),
        Some(t) => format!("(target <= {t:.2}x) OVER"),
        None => "(for reference, no target)".to_string(),
    };
    println!(
        "{name:<40} p50 {:>9.1?} p99 {:>9.1?} | {baseline_name:<32} p50 {:>9.1?} p99 {:>9.1?} | ratio p50 {r:>6.2}x {verdict}",
        ours.p50(),
        ours.p99(),
        baseline.p50(),
        baseline.p99(),
    );
}
