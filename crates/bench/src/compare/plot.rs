//! The compare mode's two charts, as SVG (plotters' SVG backend writes text as text, so no font
//! library is needed): throughput against worker processes per backend, and hand-off p50/p99
//! bars on a logarithmic scale (a polling peer's hand-off is hundreds of times a notified one).

use plotters::prelude::*;

use super::report::{Measure, Report, Row};
use crate::BoxError;

const LEASEHOLD: RGBColor = RGBColor(0x3b, 0x6e, 0xc2);
const LEASEHOLD_LIGHT: RGBColor = RGBColor(0x9d, 0xb8, 0xe6);
const PEER: RGBColor = RGBColor(0xe0, 0x7b, 0x10);
const PEER_LIGHT: RGBColor = RGBColor(0xf3, 0xc2, 0x8a);
const FONT: &str = "sans-serif";

/// The backends in the report, in the order they ran.
fn backends(report: &Report) -> Vec<String> {
    let mut seen: Vec<String> = Vec::new();
    for r in &report.rows {
        if !seen.contains(&r.backend) {
            seen.push(r.backend.clone());
        }
    }
    seen
}

fn rows<'a>(
    report: &'a Report,
    backend: &'a str,
    measure: Measure,
) -> impl Iterator<Item = &'a Row> + 'a {
    report
        .rows
        .iter()
        .filter(move |r| r.backend == backend && r.measure == measure)
}

/// Proven acquisitions per second against worker processes, one panel per backend, a line per
/// side and key count.
pub fn throughput(report: &Report) -> Result<String, BoxError> {
    let backends = backends(report);
    let mut buf = String::new();
    {
        let root = SVGBackend::with_string(&mut buf, (960, 720)).into_drawing_area();
        root.fill(&WHITE)?;
        let panels = root.split_evenly((2, 2));
        for (area, backend) in panels.iter().zip(&backends) {
            let points: Vec<&Row> = rows(report, backend, Measure::Throughput).collect();
            let top = points
                .iter()
                .filter_map(|r| r.per_second)
                .fold(1.0f64, f64::max)
                * 1.15;
            let mut chart = ChartBuilder::on(area)
                .caption(
                    format!("{backend}: acquisitions/s (exclusion proven)"),
                    (FONT, 16),
                )
                .margin(12)
                .x_label_area_size(32)
                .y_label_area_size(56)
                // x is log2 of the worker count, so 2, 8 and 32 sit evenly apart.
                .build_cartesian_2d(0.5f64..5.5f64, 0f64..top)?;
            chart
                .configure_mesh()
                .disable_x_mesh()
                .light_line_style(WHITE)
                .x_desc("worker processes")
                .x_labels(6)
                .x_label_formatter(&|x| format!("{:.0}", x.exp2()))
                .y_label_formatter(&|y| format!("{y:.0}"))
                .label_style((FONT, 12))
                .draw()?;
            let mut keys: Vec<u32> = points.iter().filter_map(|r| r.keys).collect();
            keys.sort_unstable();
            keys.dedup();
            for side in ["leasehold", "peer"] {
                for (i, &k) in keys.iter().enumerate() {
                    let line: Vec<(f64, f64)> = points
                        .iter()
                        .filter(|r| r.side == side && r.keys == Some(k))
                        .filter_map(|r| Some((f64::from(r.workers?).log2(), r.per_second?)))
                        .collect();
                    if line.is_empty() {
                        continue;
                    }
                    let colour = match (side, i) {
                        ("leasehold", 0) => LEASEHOLD,
                        ("leasehold", _) => LEASEHOLD_LIGHT,
                        (_, 0) => PEER,
                        _ => PEER_LIGHT,
                    };
                    let name = points
                        .iter()
                        .find(|r| r.side == side)
                        .map_or(side, |r| r.contestant.as_str());
                    chart
                        .draw_series(LineSeries::new(line.clone(), colour.stroke_width(2)))?
                        .label(format!("{name}, {k} key{}", if k == 1 { "" } else { "s" }))
                        .legend(move |(x, y)| {
                            PathElement::new(vec![(x, y), (x + 18, y)], colour.stroke_width(2))
                        });
                    chart.draw_series(line.iter().map(|&p| Circle::new(p, 3, colour.filled())))?;
                }
            }
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperRight)
                .label_font((FONT, 11))
                .background_style(WHITE.mix(0.85))
                .border_style(RGBColor(0xc0, 0xc0, 0xc0))
                .draw()?;
        }
        root.present()?;
    }
    Ok(buf)
}

/// Hand-off p50 and p99 per backend and side, bars on a logarithmic scale of microseconds.
pub fn handoff(report: &Report) -> Result<String, BoxError> {
    let backends = backends(report);
    let bars: Vec<(usize, &Row)> = backends
        .iter()
        .enumerate()
        .flat_map(|(i, b)| rows(report, b, Measure::Handoff).map(move |r| (i, r)))
        .collect();
    let top = bars
        .iter()
        .filter_map(|(_, r)| r.p99_us)
        .fold(10.0f64, f64::max)
        * 20.0;
    let bottom = 10.0f64;
    let mut buf = String::new();
    {
        let root = SVGBackend::with_string(&mut buf, (960, 480)).into_drawing_area();
        root.fill(&WHITE)?;
        let names = backends.clone();
        let mut chart = ChartBuilder::on(&root)
            .caption(
                "hand-off: release -> the next waiter holds (p50 solid, p99 light; log scale)",
                (FONT, 16),
            )
            .margin(12)
            .x_label_area_size(32)
            .y_label_area_size(64)
            .build_cartesian_2d(
                0f64..backends.len().max(1) as f64,
                (bottom..top).log_scale(),
            )?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .light_line_style(WHITE)
            .x_labels(backends.len() * 2 + 1)
            .x_label_formatter(&|x| {
                let centre = x - 0.5;
                if (centre - centre.round()).abs() < 0.01 && centre >= 0.0 {
                    names
                        .get(centre.round() as usize)
                        .cloned()
                        .unwrap_or_default()
                } else {
                    String::new()
                }
            })
            .y_desc("µs")
            .y_label_formatter(&|y| format!("{y:.0}"))
            .label_style((FONT, 12))
            .draw()?;
        for (side, offset, solid, light) in [
            ("leasehold", 0.1, LEASEHOLD, LEASEHOLD_LIGHT),
            ("peer", 0.5, PEER, PEER_LIGHT),
        ] {
            let mine: Vec<(f64, &Row)> = bars
                .iter()
                .filter(|(_, r)| r.side == side)
                .map(|&(i, r)| (i as f64 + offset, r))
                .collect();
            let p99 = mine.iter().filter_map(|&(x, r)| {
                let v = r.p99_us?.max(bottom);
                Some(Rectangle::new(
                    [(x + 0.2, bottom), (x + 0.38, v)],
                    light.filled(),
                ))
            });
            chart.draw_series(p99)?;
            let p50 = mine.iter().filter_map(|&(x, r)| {
                let v = r.p50_us?.max(bottom);
                Some(Rectangle::new([(x, bottom), (x + 0.18, v)], solid.filled()))
            });
            chart
                .draw_series(p50)?
                .label(if side == "leasehold" {
                    "leasehold".to_string()
                } else {
                    "the backend's peer recipe".to_string()
                })
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 14, y + 5)], solid.filled())
                });
            let labels = mine.iter().filter_map(|&(x, r)| {
                let v = r.p50_us?;
                Some(Text::new(
                    label(v),
                    (x, v.max(bottom) * 1.6),
                    (FONT, 11).into_font().color(&BLACK),
                ))
            });
            chart.draw_series(labels)?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .label_font((FONT, 12))
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(0xc0, 0xc0, 0xc0))
            .draw()?;
        root.present()?;
    }
    Ok(buf)
}

/// A bar's p50 as text.
fn label(us: f64) -> String {
    if us < 1_000.0 {
        format!("{us:.0} µs")
    } else {
        format!("{:.1} ms", us / 1_000.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> Report {
        let mut rows = Vec::new();
        for (side, name) in [("leasehold", "leasehold"), ("peer", "rslock (no fence)")] {
            for workers in [2, 8] {
                let mut r = Row::new("redis", Measure::Throughput, side, name);
                r.workers = Some(workers);
                r.keys = Some(1);
                r.per_second = Some(f64::from(workers) * 1000.0);
                rows.push(r);
            }
            let mut h = Row::new("redis", Measure::Handoff, side, name);
            h.p50_us = Some(150.0);
            h.p99_us = Some(100_000.0);
            rows.push(h);
        }
        Report {
            rows,
            ..Report::default()
        }
    }

    #[test]
    fn both_charts_are_whole_svg_documents_naming_the_backend_and_both_sides(
    ) -> Result<(), BoxError> {
        let report = report();
        let throughput = throughput(&report)?;
        for want in [
            "redis: acquisitions/s",
            "leasehold, 1 key",
            "rslock (no fence), 1 key",
        ] {
            if !throughput.contains(want) {
                return Err(format!("the throughput chart lacks {want:?}").into());
            }
        }
        let handoff = handoff(&report)?;
        for want in ["redis", "150 µs", "peer recipe"] {
            if !handoff.contains(want) {
                return Err(format!("the hand-off chart lacks {want:?}").into());
            }
        }
        for svg in [&throughput, &handoff] {
            if !svg.trim_end().ends_with("</svg>") {
                return Err("a chart is not a closed SVG document".into());
            }
        }
        Ok(())
    }
}
