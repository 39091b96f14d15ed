//! The report's tables as plain cells, built once and written by both the Markdown and the
//! HTML renderer, so the two pages cannot disagree.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use leasehold_conformance::workload::{FaultKind, Latencies, RunVerdict, Status, What};

use super::faults::kind_name;
use super::Judged;

/// A table: a header and rows of text cells.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Table {
    pub header: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

/// Every table of the report.
#[derive(Clone, Debug)]
pub(crate) struct Tables {
    /// The checker's figures, one row per run, grouped by backend, fenced before control.
    pub headline: Table,
    /// Per backend, the fenced runs beside the unfenced control.
    pub control: Table,
    /// Faults started, by kind, per run.
    pub faults: Table,
    /// The runs' indices in the headline's order (the order every section follows).
    pub order: Vec<usize>,
}

const NONE: &str = "—";

fn strings<const N: usize>(cells: [&str; N]) -> Vec<String> {
    cells.iter().map(|s| s.to_string()).collect()
}

/// A duration as the checker prints it (`12.3ms`).
pub(crate) fn duration(ns: u64) -> String {
    format!("{:.1?}", Duration::from_nanos(ns))
}

fn p50_p99(l: &Latencies) -> String {
    match (l.percentile(50.0), l.percentile(99.0)) {
        (Some(a), Some(b)) => format!("{a:.1?} / {b:.1?}"),
        _ => NONE.to_string(),
    }
}

/// `lost of acknowledged`, with the share when something was lost.
fn lost_of(lost: u64, acked: u64) -> String {
    if lost == 0 || acked == 0 {
        format!("{lost} of {acked}")
    } else {
        format!(
            "{lost} of {acked} ({:.1}%)",
            lost as f64 * 100.0 / acked as f64
        )
    }
}

/// The verdict in one word or phrase.
pub(crate) fn status(verdict: Option<&RunVerdict>) -> &'static str {
    match verdict.map(|v| v.status) {
        Some(Status::Passed) => "pass",
        Some(Status::Declared) => "declared",
        Some(Status::Failed) => "FAIL",
        None => "not judged: no run header",
    }
}

/// `fenced` or `unfenced control`.
pub(crate) fn mode(fenced: Option<bool>) -> &'static str {
    match fenced {
        Some(true) => "fenced",
        Some(false) => "unfenced control",
        None => "?",
    }
}

impl Tables {
    pub(crate) fn of(runs: &[Judged<'_>]) -> Tables {
        let mut order: Vec<usize> = (0..runs.len()).collect();
        order.sort_by_key(|&i| {
            let run = runs.get(i);
            let backend = run.and_then(|r| r.backend()).map(str::to_string);
            let fenced = run.and_then(|r| r.fenced());
            let resource = run.map(|r| r.resource().to_string());
            (backend.is_none(), backend, resource, fenced != Some(true))
        });
        Tables {
            headline: headline(runs, &order),
            control: control(runs),
            faults: faults(runs, &order),
            order,
        }
    }
}

fn headline(runs: &[Judged<'_>], order: &[usize]) -> Table {
    let header = strings([
        "run",
        "backend",
        "resource",
        "mode",
        "verdict",
        "fences reissued",
        "keys granted while a lease was valid",
        "leases ended early",
        "hand-offs during a pause",
        "writes acknowledged",
        "acknowledged lost",
        "elements read, then missing",
        "stale writes accepted",
        "stale writes refused",
        "stale claims refused",
        "overlapping holders",
        "longest stale window",
        "availability",
        "hand-off p50 / p99",
        "acquire p50 / p99",
        "seed",
    ]);
    let rows = order
        .iter()
        .filter_map(|&i| runs.get(i))
        .map(|r| {
            let first = [
                r.label.to_string(),
                r.backend().unwrap_or("?").to_string(),
                r.resource().to_string(),
                mode(r.fenced()).to_string(),
                status(r.verdict.as_ref()).to_string(),
            ];
            let seed = r
                .verdict
                .as_ref()
                .and_then(|v| v.seed)
                .or(r.header.as_ref().map(|h| h.seed))
                .map_or_else(|| NONE.to_string(), |s| s.to_string());
            let figures = match &r.verdict {
                Some(v) => {
                    let f = &v.figures;
                    // The lock's evidence first; the resource's figures after it.
                    vec![
                        f.fences_reissued.to_string(),
                        f.valid_overlaps.to_string(),
                        f.leases_ended_early.to_string(),
                        f.handoffs_during_pause.to_string(),
                        f.writes_acknowledged.to_string(),
                        lost_of(f.lost_acks, f.writes_acknowledged),
                        f.reads_lost.to_string(),
                        f.stale_accepted.to_string(),
                        f.writes_refused_stale.to_string(),
                        f.claims_refused_stale.to_string(),
                        f.overlapping_holders.to_string(),
                        duration(f.longest_stale_window_ns),
                        format!("{:.1}%", f.mean_availability() * 100.0),
                        p50_p99(&f.handoff),
                        p50_p99(&f.acquire_latency),
                    ]
                }
                None => vec![NONE.to_string(); 15],
            };
            first.into_iter().chain(figures).chain([seed]).collect()
        })
        .collect();
    Table { header, rows }
}

#[derive(Clone, Copy, Debug, Default)]
struct Sum {
    runs: u64,
    reissued: u64,
    overlaps: u64,
    acked: u64,
    lost: u64,
    stale: u64,
    /// Some run was judged declared (a weakness the backend declares).
    declared: bool,
}

fn control(runs: &[Judged<'_>]) -> Table {
    let header = strings([
        "backend",
        "fenced runs",
        "fenced: fences reissued",
        "fenced: keys granted while a lease was valid",
        "fenced: acknowledged lost",
        "fenced: stale accepted",
        "control runs",
        "control: acknowledged lost",
        "control: stale accepted",
        "what it shows",
    ]);
    let mut by_backend: BTreeMap<String, (Sum, Sum)> = BTreeMap::new();
    for r in runs {
        let Some(v) = &r.verdict else { continue };
        // A backend protecting another store than the PostgreSQL table is a row of its own.
        let backend = match r.resource() {
            "postgres" => r.backend().unwrap_or("?").to_string(),
            other => format!("{} (resource: {other})", r.backend().unwrap_or("?")),
        };
        let entry = by_backend.entry(backend).or_default();
        let sum = if v.fenced { &mut entry.0 } else { &mut entry.1 };
        sum.runs += 1;
        sum.reissued += v.figures.fences_reissued;
        sum.overlaps += v.figures.valid_overlaps;
        sum.acked += v.figures.writes_acknowledged;
        sum.lost += v.figures.lost_acks;
        sum.stale += v.figures.stale_accepted;
        sum.declared |= v.status == leasehold_conformance::workload::Status::Declared;
    }
    let rows = by_backend
        .into_iter()
        .map(|(backend, (fenced, control))| {
            let lock = if fenced.runs == 0 {
                [NONE.to_string(), NONE.to_string()]
            } else {
                [fenced.reissued.to_string(), fenced.overlaps.to_string()]
            };
            let cells = |s: Sum| {
                if s.runs == 0 {
                    [0.to_string(), NONE.to_string(), NONE.to_string()]
                } else {
                    [
                        s.runs.to_string(),
                        lost_of(s.lost, s.acked),
                        s.stale.to_string(),
                    ]
                }
            };
            let shows = match (fenced.runs > 0, control.runs > 0) {
                (true, false) => "no unfenced control run".to_string(),
                (false, _) => "no fenced run".to_string(),
                (true, true) if fenced.stale == 0 && fenced.declared => format!(
                    "DECLARED: the backend declares failover-unsafe fences, and fences reissued \
                     after a failover or a restart lost {}; without fences {} were lost",
                    lost_of(fenced.lost, fenced.acked),
                    lost_of(control.lost, control.acked)
                ),
                (true, true)
                    if !fenced.declared && (fenced.reissued > 0 || fenced.overlaps > 0) =>
                {
                    "the lock failed: fences reissued or keys granted while a lease was valid; \
                     see the verdicts"
                        .to_string()
                }
                (true, true) if fenced.lost > 0 || fenced.stale > 0 => {
                    "the fenced runs lost or accepted stale writes: see the verdicts".to_string()
                }
                (true, true) if control.lost == 0 => {
                    "the control lost nothing: the nemesis was too weak to show what fences prevent"
                        .to_string()
                }
                (true, true) => format!(
                    "fences kept every acknowledged write; without them {} were lost",
                    lost_of(control.lost, control.acked)
                ),
            };
            let [runs, lost, stale] = cells(fenced);
            std::iter::once(backend)
                .chain([runs])
                .chain(lock)
                .chain([lost, stale])
                .chain(cells(control))
                .chain([shows])
                .collect()
        })
        .collect();
    Table { header, rows }
}

/// Faults started per kind, counted from the history so that an unjudged run shows them too.
fn faults(runs: &[Judged<'_>], order: &[usize]) -> Table {
    let counts: Vec<BTreeMap<FaultKind, u64>> = runs
        .iter()
        .map(|r| {
            let mut m = BTreeMap::new();
            for e in r.history.events() {
                if let What::FaultStart { kind, .. } = &e.what {
                    *m.entry(*kind).or_default() += 1;
                }
            }
            m
        })
        .collect();
    let kinds: BTreeSet<FaultKind> = counts.iter().flat_map(|m| m.keys().copied()).collect();
    let header = std::iter::once("run".to_string())
        .chain(kinds.iter().map(|k| kind_name(*k)))
        .chain(["total".to_string()])
        .collect();
    let rows = order
        .iter()
        .filter_map(|&i| Some((runs.get(i)?, counts.get(i)?)))
        .map(|(r, m)| {
            std::iter::once(r.label.to_string())
                .chain(
                    kinds
                        .iter()
                        .map(|k| m.get(k).copied().unwrap_or(0).to_string()),
                )
                .chain([m.values().sum::<u64>().to_string()])
                .collect()
        })
        .collect();
    Table { header, rows }
}
