//! What leasehold recorded through the `metrics` facade in this process, for the telemetry
//! scenario: one debugging recorder installed as the process's recorder, and an accumulator
//! of its snapshots (a snapshot drains the recorder, and scenarios of several test threads may
//! read at once: each reads the sum of everything so far, filtered by its own key).

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

/// One series: the metric's name and its labels, sorted.
pub type Series = (String, Vec<(String, String)>);

/// A series' value so far.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Value {
    /// A counter's total.
    pub count: u64,
    /// A gauge's value (the sum of its changes).
    pub gauge: f64,
    /// A histogram's samples.
    pub samples: Vec<f64>,
}

struct Recorded {
    snapshotter: Option<Snapshotter>,
    seen: Mutex<HashMap<Series, Value>>,
}

fn recorded() -> &'static Recorded {
    static RECORDED: OnceLock<Recorded> = OnceLock::new();
    RECORDED.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        // Another recorder already installed (by the application's own tests) wins; the
        // scenario then says it cannot look.
        let snapshotter = recorder.install().ok().map(|()| snapshotter);
        Recorded {
            snapshotter,
            seen: Mutex::new(HashMap::new()),
        }
    })
}

/// Installs the recorder, if nothing else is the process's recorder; whether it is ours.
pub fn install() -> bool {
    recorded().snapshotter.is_some()
}

/// Everything recorded so far under `name` whose labels include all of `labels`, summed.
pub fn value(name: &str, labels: &[(&str, &str)]) -> Value {
    let recorded = recorded();
    let mut seen = recorded.seen.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(snapshotter) = &recorded.snapshotter {
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            let mut series_labels: Vec<(String, String)> = key
                .key()
                .labels()
                .map(|l| (l.key().to_string(), l.value().to_string()))
                .collect();
            series_labels.sort();
            let entry = seen
                .entry((key.key().name().to_string(), series_labels))
                .or_default();
            match value {
                DebugValue::Counter(n) => entry.count += n,
                DebugValue::Gauge(g) => entry.gauge += g.into_inner(),
                DebugValue::Histogram(h) => entry.samples.extend(h.iter().map(|x| x.into_inner())),
            }
        }
    }
    let mut total = Value::default();
    for ((series, series_labels), v) in seen.iter() {
        let matches = series == name
            && labels
                .iter()
                .all(|(k, want)| series_labels.iter().any(|(sk, sv)| sk == k && sv == want));
        if matches {
            total.count += v.count;
            total.gauge += v.gauge;
            total.samples.extend(&v.samples);
        }
    }
    total
}
