//! Latency histograms (hand-off, acquire) from the checker's samples, in milliseconds, with
//! the p50 and p99 marked: the shape shows what a percentile hides, such as a second mode of
//! hand-offs that waited out a paused holder's TTL.

use std::time::Duration;

use leasehold_conformance::workload::{Latencies, Nanos};
use plotters::prelude::*;

use super::plot::{self, Drawn, Failure, Key, Swatch, FONT, HELD, REFUSED, STALE};

const WIDTH: u32 = 490;
const HEIGHT: u32 = 300;

fn ms(ns: Nanos) -> f64 {
    ns as f64 / 1e6
}

/// Bin counts over `0..hi` ms: √n bins, between 5 and 40.
fn bins(sorted: &[Nanos], hi: f64) -> Vec<u64> {
    let k = ((sorted.len() as f64).sqrt().ceil() as usize).clamp(5, 40);
    let mut counts = vec![0u64; k];
    for &ns in sorted {
        let i = ((ms(ns) / hi) * k as f64).floor() as usize;
        if let Some(c) = counts.get_mut(i.min(k - 1)) {
            *c += 1;
        }
    }
    counts
}

/// A latency histogram as an SVG element; `latencies` is `None` when the run was not judged.
/// The percentile marks are `Latencies`' own, so they match the tables.
pub(crate) fn draw(title: &str, latencies: Option<&Latencies>) -> Result<Drawn, Failure> {
    let Some(latencies) = latencies else {
        return plot::empty(title, "not judged: no run header", (WIDTH, 140));
    };
    if latencies.is_empty() {
        return plot::empty(title, "no samples", (WIDTH, 140));
    }
    let mut sorted = latencies.samples().to_vec();
    sorted.sort_unstable();
    let max = sorted.last().copied().map_or(0.0, ms);
    let hi = if max > 0.0 { max * 1.02 } else { 1.0 };
    let counts = bins(&sorted, hi);
    let width = hi / counts.len() as f64;
    let top = counts.iter().copied().max().unwrap_or(1) as f64 * 1.15 + 1.0;

    let marks: Vec<(&str, Duration, RGBColor)> = [("p50", 50.0, STALE), ("p99", 99.0, REFUSED)]
        .into_iter()
        .filter_map(|(name, p, color)| latencies.percentile(p).map(|v| (name, v, color)))
        .collect();
    let mut keys = vec![Key::new(
        format!("samples, n={}", sorted.len()),
        HELD,
        Swatch::Block,
    )];
    keys.extend(
        marks
            .iter()
            .map(|&(name, v, color)| Key::new(format!("{name} {v:.1?}"), color, Swatch::Line)),
    );
    let legend_h = plot::legend_height(&keys, WIDTH);
    let decimals = plot::decimals_for(hi);
    let x_label = |v: &f64| format!("{v:.decimals$}");
    let y_label = |v: &f64| {
        if (v - v.round()).abs() < 1e-6 {
            format!("{v:.0}")
        } else {
            String::new()
        }
    };

    plot::svg((WIDTH, HEIGHT + legend_h), |root| {
        let (area, bottom) = root.split_vertically(HEIGHT);
        let mut chart = ChartBuilder::on(&area)
            .caption(title, (FONT, 16).into_font())
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(50)
            .build_cartesian_2d(0.0..hi, 0.0..top)?;
        chart
            .configure_mesh()
            .light_line_style(TRANSPARENT)
            .bold_line_style(plot::GRID)
            .disable_x_mesh()
            .x_labels(8)
            .y_labels(6)
            .x_label_formatter(&x_label)
            .y_label_formatter(&y_label)
            .x_desc("milliseconds")
            .y_desc("count")
            .label_style((FONT, 14))
            .axis_desc_style((FONT, 14))
            .draw()?;
        chart.draw_series(
            counts
                .iter()
                .enumerate()
                .filter(|(_, &c)| c > 0)
                .map(|(i, &c)| {
                    let x0 = i as f64 * width;
                    let mut bar =
                        Rectangle::new([(x0, 0.0), (x0 + width, c as f64)], HELD.filled());
                    bar.set_margin(0, 0, 1, 1);
                    bar
                }),
        )?;
        for &(_, v, color) in &marks {
            let x = v.as_secs_f64() * 1e3;
            chart.draw_series(std::iter::once(PathElement::new(
                vec![(x, 0.0), (x, top)],
                color.stroke_width(2),
            )))?;
        }
        plot::legend(&bottom, &keys)
    })
}
