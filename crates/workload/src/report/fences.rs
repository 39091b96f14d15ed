//! Fences over time: per key, the fence of every grant against when it was granted. A healthy
//! backend draws a rising staircase per key; a reissued fence (the checker's finding, not a
//! guess from the plot) is circled in red, because that is what a failover-unsafe backend does.

use std::collections::{BTreeMap, BTreeSet};

use leasehold_conformance::workload::finding::FindingKind;
use leasehold_conformance::workload::{History, RunVerdict, What};
use plotters::prelude::*;

use super::compact::Paint;
use super::plot::{self, Drawn, Failure, Key, Span, Swatch, FONT, REFUSED};

const WIDTH: u32 = 1000;
const HEIGHT: u32 = 320;
const MARGIN: u32 = 10;
const Y_LABELS: u32 = 64;
const PLOT_WIDTH: u32 = WIDTH - 2 * MARGIN - Y_LABELS;
/// Keys named in the legend; more are drawn but summed up in one entry.
const LEGEND_KEYS: usize = 8;
/// Up to this many grants per key get a dot each; beyond, only the line.
const DOTS: usize = 300;

/// Per key, the grants as `(seconds, fence)`, at most two per pixel column (the first and the
/// last: for a rising series that keeps its shape).
fn series(history: &History, span: &Span, px: f64) -> BTreeMap<String, Vec<(f64, f64)>> {
    let mut out: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    let column = |x: f64| (x / px).floor() as i64;
    for e in history.events() {
        let What::AcquireOk { key, fence, .. } = &e.what else {
            continue;
        };
        let point = (span.secs(e.t), *fence as f64);
        let points = out.entry(key.clone()).or_default();
        let n = points.len();
        let same_column = |i: usize| {
            points
                .get(i)
                .is_some_and(|p| column(p.0) == column(point.0))
        };
        if n >= 2 && same_column(n - 1) && same_column(n - 2) {
            if let Some(last) = points.last_mut() {
                *last = point;
            }
        } else {
            points.push(point);
        }
    }
    out
}

/// The grants the checker found reissued, as `(seconds, fence)`.
fn reissued(history: &History, span: &Span, verdict: Option<&RunVerdict>) -> Vec<(f64, f64)> {
    let Some(verdict) = verdict else {
        return Vec::new();
    };
    let at: BTreeSet<usize> = verdict
        .findings
        .iter()
        .filter(|f| matches!(f.kind, FindingKind::ReissuedFence { .. }))
        .map(|f| f.at)
        .collect();
    at.into_iter()
        .filter_map(|i| history.events().get(i))
        .filter_map(|e| match &e.what {
            What::AcquireOk { fence, .. } => Some((span.secs(e.t), *fence as f64)),
            _ => None,
        })
        .collect()
}

/// The fence plot of one run as an SVG element.
pub(crate) fn draw(history: &History, verdict: Option<&RunVerdict>) -> Result<Drawn, Failure> {
    const TITLE: &str = "Fences granted over time, per key";
    let span = Span::of(history);
    let x_max = span.width_secs();
    let px = x_max / f64::from(PLOT_WIDTH);
    let series = series(history, &span, px);
    let reissued = reissued(history, &span, verdict);
    let fences = series.values().flatten().map(|p| p.1);
    let (Some(lo), Some(hi)) = (fences.clone().reduce(f64::min), fences.reduce(f64::max)) else {
        return plot::empty(TITLE, "no lease was granted", (WIDTH, 160));
    };
    let pad = ((hi - lo) * 0.05).max(1.0);
    let (lo, hi) = ((lo - pad).max(0.0), hi + pad);

    let mut keys: Vec<Key> = series
        .keys()
        .take(LEGEND_KEYS)
        .enumerate()
        .map(|(i, k)| Key::new(format!("key {k}"), Palette99::pick(i), Swatch::Line))
        .collect();
    if series.len() > LEGEND_KEYS {
        keys.push(Key::new(
            format!("{} more keys", series.len() - LEGEND_KEYS),
            Palette99::pick(LEGEND_KEYS),
            Swatch::Line,
        ));
    }
    if !reissued.is_empty() {
        keys.push(Key::new(
            format!("fence reissued ({})", reissued.len()),
            REFUSED,
            Swatch::Dot,
        ));
    }
    let legend_h = plot::legend_height(&keys, WIDTH);
    let x_decimals = plot::decimals_for(x_max);
    let x_label = |v: &f64| format!("{v:.x_decimals$}");
    let y_label = |v: &f64| {
        if (v - v.round()).abs() < 1e-6 {
            format!("{v:.0}")
        } else {
            String::new()
        }
    };

    plot::svg_with_shapes((WIDTH, HEIGHT + legend_h), |root, shapes| {
        let (top, bottom) = root.split_vertically(HEIGHT);
        let mut chart = ChartBuilder::on(&top)
            .caption(TITLE, (FONT, 18).into_font())
            .margin(MARGIN)
            .x_label_area_size(40)
            .y_label_area_size(Y_LABELS)
            .build_cartesian_2d(0.0..x_max, lo..hi)?;
        chart
            .configure_mesh()
            .light_line_style(TRANSPARENT)
            .bold_line_style(plot::GRID)
            .x_labels(12)
            .y_labels(8)
            .x_label_formatter(&x_label)
            .y_label_formatter(&y_label)
            .x_desc("seconds since the run started")
            .y_desc("fence")
            .label_style((FONT, 14))
            .axis_desc_style((FONT, 14))
            .draw()?;
        let at = |p: &(f64, f64)| chart.backend_coord(p);
        for (i, points) in series.values().enumerate() {
            let color = Palette99::pick(i.min(LEGEND_KEYS)).to_rgba();
            shapes.line(Paint::Stroke(color, 1), points.iter().map(at));
            if points.len() <= DOTS {
                for p in points {
                    shapes.dot(Paint::Stroke(color, 4), at(p));
                }
            }
        }
        for p in &reissued {
            let (x, y) = at(p);
            shapes.ring(Paint::Stroke(REFUSED.to_rgba(), 2), (x, y), 6);
        }
        plot::legend(&bottom, &keys)
    })
}
