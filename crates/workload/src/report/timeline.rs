//! The timeline: one row per worker, showing when it held a key, when the nemesis paused or
//! killed it, what it wrote, and the server faults across all rows.
//!
//! Held intervals are conformance's observed windows ([`windows::windows`]: grant to release,
//! loss, kill or deadline), so the picture and the checker's overlap figures agree. The part
//! of a window past the lease's own deadline (a paused holder that has not yet noticed) is
//! drawn in its own colour: that is the stale window fences make harmless.
//!
//! A ten-minute run has tens of thousands of events; the SVG stays small because everything
//! is merged at the pixel and drawn as one path per colour ([`super::compact::Shapes`]): intervals of one
//! row closer than a pixel become one bar, accepted writes in neighbouring pixel columns one
//! strip, and markers are capped.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use leasehold_conformance::workload::windows;
use leasehold_conformance::workload::{FaultKind, History, What, WorkerId};
use plotters::prelude::*;

use super::compact::Paint;
use super::faults::{self, kind_name};
use super::plot::{
    self, Drawn, Failure, Key, Span, Swatch, ACCEPTED, FONT, HELD, KILLED, PAUSED, REFUSED, STALE,
};

const WIDTH: u32 = 1000;
const MARGIN: u32 = 10;
const Y_LABELS: u32 = 74;
const X_LABELS: u32 = 40;
const CAPTION: u32 = 30;
const ROW: u32 = 26;
/// The plotting area's width in pixels: what "one pixel" means when merging.
const PLOT_WIDTH: u32 = WIDTH - 2 * MARGIN - Y_LABELS;
/// At most this many refused-write markers; beyond, the legend says how many were left out.
const MAX_MARKERS: usize = 2_000;
/// At most this many accepted-write spikes (after merging per pixel); beyond, none are drawn.
const MAX_TICKS: usize = 20_000;

/// Everything the timeline draws, in chart coordinates: x in seconds, y the row's centre.
#[derive(Debug, Default)]
pub(crate) struct Layers {
    /// Row per worker, top to bottom, as `(worker, y)`.
    pub rows: Vec<(WorkerId, f64)>,
    /// Server faults: kind and span.
    pub server: Vec<(FaultKind, f64, f64)>,
    /// Per row: held and valid, as `(y, start, end, share)` where `share` is how much of
    /// each pixel's time the worker held a key (a quarter at least, so a short hold shows).
    pub held: Vec<(f64, f64, f64, f64)>,
    /// Per row: held past the deadline, paused, killed.
    pub stale: Vec<(f64, f64, f64)>,
    pub paused: Vec<(f64, f64, f64)>,
    pub killed: Vec<(f64, f64, f64)>,
    /// Per row: accepted writes, one x per pixel column.
    pub ticks: BTreeMap<u64, Vec<f64>>,
    /// How many accepted writes there were (before merging).
    pub accepted: usize,
    /// Whether the ticks were left out for being too many.
    pub ticks_dropped: bool,
    /// Refused writes and claims as `(y, x, is_claim)`, at most [`MAX_MARKERS`].
    pub refused: Vec<(f64, f64, bool)>,
    /// How many refusals there were.
    pub refused_total: usize,
}

/// The workers in row order: every worker an event or a fault names.
fn workers(history: &History) -> Vec<WorkerId> {
    let set: BTreeSet<WorkerId> = history
        .events()
        .iter()
        .filter_map(|e| e.worker().or(e.what.fault_worker()))
        .collect();
    set.into_iter().collect()
}

/// Merges intervals closer than `px` and widens each to at least `px`, so a millisecond hold in
/// a ten-minute run is still a visible pixel and a busy row is a few long bars.
fn merge(mut spans: Vec<(f64, f64)>, px: f64) -> Vec<(f64, f64)> {
    spans.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut out: Vec<(f64, f64)> = Vec::new();
    for (s, e) in spans {
        let e = e.max(s + px);
        match out.last_mut() {
            Some(last) if s <= last.1 + px => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

/// Shades a held row needs: a share of a pixel's time is rounded up to a quarter.
const LEVELS: f64 = 4.0;

/// Held time per pixel column, as runs of columns of one shade `(start, end, share)`: at a
/// ten-minute scale a worker holding a key 5 ms out of every 160 ms must not look like it held
/// the key the whole time, and consecutive columns of one shade are one rectangle.
fn density(spans: &[(f64, f64)], px: f64, columns: usize) -> Vec<(f64, f64, f64)> {
    let mut cover = vec![0.0f64; columns + 1];
    let column = |x: f64| ((x / px).floor().max(0.0) as usize).min(columns);
    for &(s, e) in spans {
        if e <= s {
            if let Some(v) = cover.get_mut(column(s)) {
                *v += px * 0.01;
            }
            continue;
        }
        for c in column(s)..=column(e) {
            let lo = (c as f64 * px).max(s);
            let hi = ((c + 1) as f64 * px).min(e);
            if let Some(v) = cover.get_mut(c) {
                *v += (hi - lo).max(0.0);
            }
        }
    }
    let level = |v: f64| {
        if v <= 0.0 {
            0
        } else {
            ((v / px).min(1.0) * LEVELS).ceil().max(1.0) as u32
        }
    };
    let mut out = Vec::new();
    let mut run: Option<(usize, u32)> = None;
    let mut flush = |start: usize, end: usize, l: u32| {
        if l > 0 {
            out.push((start as f64 * px, end as f64 * px, f64::from(l) / LEVELS));
        }
    };
    for (c, &v) in cover.iter().enumerate() {
        let l = level(v);
        match run {
            Some((_, current)) if current == l => {}
            Some((start, current)) => {
                flush(start, c, current);
                run = Some((c, l));
            }
            None => run = Some((c, l)),
        }
    }
    if let Some((start, current)) = run {
        flush(start, cover.len(), current);
    }
    out
}

/// The row key used for per-row maps (f64 is not `Ord`; rows are small integers).
fn row_key(y: f64) -> u64 {
    y.max(0.0).round() as u64
}

pub(crate) fn layers(history: &History, span: &Span, px: f64) -> Layers {
    let rows = workers(history);
    let n = rows.len();
    let y_of: HashMap<WorkerId, f64> = rows
        .iter()
        .enumerate()
        .map(|(i, w)| (*w, (n - 1 - i) as f64))
        .collect();
    let mut out = Layers {
        rows: rows
            .iter()
            .enumerate()
            .map(|(i, w)| (*w, (n - 1 - i) as f64))
            .collect(),
        ..Layers::default()
    };

    let mut held: BTreeMap<u64, Vec<(f64, f64)>> = BTreeMap::new();
    let mut stale: BTreeMap<u64, Vec<(f64, f64)>> = BTreeMap::new();
    for w in windows::windows(history) {
        let Some(&y) = y_of.get(&w.worker) else {
            continue;
        };
        let (start, valid_end, end) =
            (span.secs(w.start), span.secs(w.valid_end), span.secs(w.end));
        held.entry(row_key(y)).or_default().push((start, valid_end));
        if end > valid_end {
            stale.entry(row_key(y)).or_default().push((valid_end, end));
        }
    }
    let mut paused: BTreeMap<u64, Vec<(f64, f64)>> = BTreeMap::new();
    let mut killed: BTreeMap<u64, Vec<(f64, f64)>> = BTreeMap::new();
    for f in faults::spans(history, span.end) {
        let (start, end) = (span.secs(f.start), span.secs(f.end));
        match (f.kind, f.worker.and_then(|w| y_of.get(&w))) {
            (FaultKind::PauseWorker, Some(&y)) => {
                paused.entry(row_key(y)).or_default().push((start, end))
            }
            (FaultKind::KillWorker | FaultKind::KillWorkerInTransaction, Some(&y)) => {
                killed.entry(row_key(y)).or_default().push((start, end))
            }
            (kind, _) => out.server.push((kind, start, end.max(start + px))),
        }
    }
    let flatten = |m: BTreeMap<u64, Vec<(f64, f64)>>| -> Vec<(f64, f64, f64)> {
        m.into_iter()
            .flat_map(|(y, spans)| {
                merge(spans, px)
                    .into_iter()
                    .map(move |(s, e)| (y as f64, s, e))
            })
            .collect()
    };
    out.held = held
        .into_iter()
        .flat_map(|(y, spans)| {
            density(&spans, px, PLOT_WIDTH as usize)
                .into_iter()
                .map(move |(s, e, share)| (y as f64, s, e, share))
        })
        .collect();
    out.stale = flatten(stale);
    out.paused = flatten(paused);
    out.killed = flatten(killed);

    let column = |x: f64| (x / px).floor() as i64;
    let mut ticks: BTreeMap<u64, Vec<f64>> = BTreeMap::new();
    let mut seen: BTreeSet<(u64, i64, bool)> = BTreeSet::new();
    for e in history.events() {
        let Some(&y) = e.worker().and_then(|w| y_of.get(&w)) else {
            continue;
        };
        let x = span.secs(e.t);
        match &e.what {
            What::WriteOk { .. } => {
                out.accepted += 1;
                let row = ticks.entry(row_key(y)).or_default();
                if row.last().is_none_or(|&last| column(last) != column(x)) {
                    row.push(x);
                }
            }
            What::WriteStale { .. } | What::ReadStale { .. } => {
                out.refused_total += 1;
                let claim = matches!(e.what, What::ReadStale { .. });
                if out.refused.len() < MAX_MARKERS && seen.insert((row_key(y), column(x), claim)) {
                    out.refused.push((y, x, claim));
                }
            }
            _ => {}
        }
    }
    if ticks.values().map(Vec::len).sum::<usize>() > MAX_TICKS {
        out.ticks_dropped = true;
    } else {
        out.ticks = ticks;
    }
    out
}

/// The colour of a server fault's shading, by kind.
fn server_color(kind: FaultKind) -> RGBColor {
    match kind {
        FaultKind::KillAuthority => RGBColor(0xe0, 0x4a, 0x4a),
        FaultKind::KillLeader => RGBColor(0xc0, 0x39, 0x2b),
        FaultKind::KillMember => RGBColor(0xe6, 0x7e, 0x22),
        FaultKind::IsolateMember => RGBColor(0x8e, 0x44, 0xad),
        FaultKind::PauseLeader => RGBColor(0xd4, 0xac, 0x0d),
        FaultKind::PromoteReplica => RGBColor(0x79, 0x55, 0x48),
        FaultKind::HandoffLeaderChange => RGBColor(0xd3, 0x54, 0x00),
        FaultKind::CutWorker => RGBColor(0x29, 0x80, 0xb9),
        FaultKind::KillResourceConnection => RGBColor(0x16, 0xa0, 0x85),
        FaultKind::RestartResource => RGBColor(0x27, 0xae, 0x60),
        FaultKind::StallResource => RGBColor(0x1a, 0xbc, 0x9c),
        FaultKind::PrimaryChanged => RGBColor(0xe8, 0x43, 0x93),
        FaultKind::PauseAuthority => RGBColor(0xf1, 0xc4, 0x0f),
        FaultKind::RestartAuthority => RGBColor(0xc0, 0x39, 0x7b),
        _ => RGBColor(0x95, 0xa5, 0xa6),
    }
}

const SERVER_ALPHA: f64 = 0.2;

fn keys(l: &Layers) -> Vec<Key> {
    let mut keys = vec![Key::new(
        "held, lease valid (paler: part of the time)",
        HELD,
        Swatch::Block,
    )];
    if !l.stale.is_empty() {
        keys.push(Key::new("held past its deadline", STALE, Swatch::Block));
    }
    if !l.paused.is_empty() {
        keys.push(Key::new("worker paused", PAUSED.mix(0.35), Swatch::Block));
    }
    if !l.killed.is_empty() {
        keys.push(Key::new(
            "worker killed (until restarted)",
            KILLED.mix(0.45),
            Swatch::Block,
        ));
    }
    let kinds: BTreeSet<FaultKind> = l.server.iter().map(|(k, _, _)| *k).collect();
    for kind in kinds {
        keys.push(Key::new(
            kind_name(kind),
            server_color(kind).mix(SERVER_ALPHA * 2.0),
            Swatch::Block,
        ));
    }
    if l.ticks_dropped {
        keys.push(Key::new(
            format!("{} accepted writes (too many to draw)", l.accepted),
            ACCEPTED,
            Swatch::Line,
        ));
    } else if l.accepted > 0 {
        keys.push(Key::new("write accepted", ACCEPTED, Swatch::Line));
    }
    if l.refused_total > 0 {
        let shown = if l.refused.len() < l.refused_total {
            format!(" ({} drawn of {})", l.refused.len(), l.refused_total)
        } else {
            String::new()
        };
        keys.push(Key::new(
            format!("refused as stale: write x, claim triangle{shown}"),
            REFUSED,
            Swatch::Cross,
        ));
    }
    keys
}

/// The timeline of one run as an SVG element.
pub(crate) fn draw(history: &History) -> Result<Drawn, Failure> {
    let span = Span::of(history);
    let x_max = span.width_secs();
    let px = x_max / f64::from(PLOT_WIDTH);
    let l = layers(history, &span, px);
    let n = l.rows.len().max(1);
    let keys = keys(&l);
    let legend_h = plot::legend_height(&keys, WIDTH);
    let chart_h = CAPTION + X_LABELS + 2 * MARGIN + ROW * u32::try_from(n).unwrap_or(1);
    let y_top = n as f64 - 0.5;

    let names: HashMap<u64, String> = l
        .rows
        .iter()
        .map(|(w, y)| (row_key(*y), format!("worker {w}")))
        .collect();
    let y_label = |v: &f64| {
        let r = v.round();
        if (v - r).abs() > 1e-6 || r < 0.0 {
            return String::new();
        }
        names.get(&row_key(r)).cloned().unwrap_or_default()
    };
    let decimals = plot::decimals_for(x_max);
    let x_label = |v: &f64| format!("{v:.decimals$}");

    plot::svg_with_shapes((WIDTH, chart_h + legend_h), |root, shapes| {
        let (top, bottom) = root.split_vertically(chart_h);
        let mut chart = ChartBuilder::on(&top)
            .caption(
                "Timeline: who held a key, faults, writes",
                (FONT, 18).into_font(),
            )
            .margin(MARGIN)
            .x_label_area_size(X_LABELS)
            .y_label_area_size(Y_LABELS)
            .build_cartesian_2d(0.0..x_max, -0.5..y_top)?;
        chart
            .configure_mesh()
            .light_line_style(TRANSPARENT)
            .bold_line_style(plot::GRID)
            .disable_y_mesh()
            .x_labels(12)
            .y_labels(n + 1)
            .x_label_formatter(&x_label)
            .y_label_formatter(&y_label)
            .x_desc("seconds since the run started")
            .label_style((FONT, 14))
            .axis_desc_style((FONT, 14))
            .draw()?;

        let at = |x: f64, y: f64| chart.backend_coord(&(x, y));
        for &(kind, s, e) in &l.server {
            shapes.band(
                server_color(kind).mix(SERVER_ALPHA),
                at(s, -0.5),
                at(e, y_top),
            );
        }
        for &(y, s, e, share) in &l.held {
            shapes.band(HELD.mix(share), at(s, y - 0.22), at(e, y + 0.22));
        }
        let bars = [
            (&l.stale, 0.22, STALE.to_rgba()),
            (&l.paused, 0.42, PAUSED.mix(0.35)),
            (&l.killed, 0.42, KILLED.mix(0.45)),
        ];
        for (spans, half, color) in bars {
            for &(y, s, e) in spans {
                shapes.band(color, at(s, y - half), at(e, y + half));
            }
        }
        // Writes in neighbouring pixel columns make one strip: a busy row is a few strips,
        // not a spike per column.
        for (&y, xs) in &l.ticks {
            let (base, tip) = (at(0.0, y as f64 + 0.25).1, at(0.0, y as f64 + 0.4).1);
            let mut strip: Option<(i32, i32)> = None;
            for x in xs.iter().map(|&x| at(x, 0.0).0) {
                strip = match strip {
                    Some((from, to)) if x <= to + 1 => Some((from, x.max(to))),
                    Some((from, to)) => {
                        shapes.band(ACCEPTED.to_rgba(), (from, base), (to + 1, tip));
                        Some((x, x))
                    }
                    None => Some((x, x)),
                };
            }
            if let Some((from, to)) = strip {
                shapes.band(ACCEPTED.to_rgba(), (from, base), (to + 1, tip));
            }
        }
        for &(y, x, claim) in &l.refused {
            if claim {
                shapes.triangle(Paint::Fill(REFUSED.to_rgba()), at(x, y), 5);
            } else {
                shapes.cross(Paint::Stroke(REFUSED.to_rgba(), 2), at(x, y), 4);
            }
        }
        plot::legend(&bottom, &keys)
    })
}

#[cfg(test)]
mod tests {
    use super::{density, merge};

    #[test]
    fn a_short_hold_shows_as_a_pale_pixel_and_a_long_one_as_one_solid_bar() {
        assert_eq!(density(&[(0.0, 0.001)], 1.0, 10), vec![(0.0, 1.0, 0.25)]);
        assert_eq!(density(&[(0.0, 3.0)], 1.0, 10), vec![(0.0, 3.0, 1.0)]);
        assert_eq!(
            density(&[(0.0, 2.5)], 1.0, 10),
            vec![(0.0, 2.0, 1.0), (2.0, 3.0, 0.5)]
        );
        assert_eq!(density(&[], 1.0, 10), vec![]);
    }

    #[test]
    fn spans_closer_than_a_pixel_merge_and_none_is_thinner_than_one() {
        assert_eq!(
            merge(vec![(5.0, 5.0), (0.0, 1.0), (1.5, 2.0)], 1.0),
            vec![(0.0, 2.5), (5.0, 6.0)]
        );
    }
}
