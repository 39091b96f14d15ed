//! What every plot shares: the SVG canvas in a String, the run's time axis, colours and a
//! legend row under the chart (inside the SVG, so a plot copied out of the page keeps it).

use std::error::Error;

use leasehold_conformance::workload::{History, Nanos, What};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::compact::{tidy, Shapes};

/// Whatever plotters reports, boxed so the public error does not name plotters' types.
pub(crate) type Failure = Box<dyn Error + Send + Sync>;

/// A finished plot: one complete `<svg>` element.
pub(crate) type Drawn = String;

/// The canvas every plot draws on.
pub(crate) type Canvas<'a> = DrawingArea<SVGBackend<'a>, Shift>;

/// The font family written into the SVG: generic, so the browser picks one and no font is
/// embedded or fetched.
pub(crate) const FONT: &str = "sans-serif";

pub(crate) const HELD: RGBColor = RGBColor(0x3b, 0x6e, 0xc2);
pub(crate) const STALE: RGBColor = RGBColor(0xf0, 0x8c, 0x1e);
pub(crate) const PAUSED: RGBColor = RGBColor(0x70, 0x70, 0x70);
pub(crate) const KILLED: RGBColor = RGBColor(0x9b, 0x11, 0x1e);
pub(crate) const ACCEPTED: RGBColor = RGBColor(0x2a, 0x9d, 0x3f);
pub(crate) const REFUSED: RGBColor = RGBColor(0xd6, 0x27, 0x28);
/// Grid lines: light, so data stands out; the minor grid is not drawn at all (it would be most
/// of a plot's bytes).
pub(crate) const GRID: RGBColor = RGBColor(0xe0, 0xe0, 0xe0);
pub(crate) const TEXT: RGBColor = RGBColor(0x22, 0x22, 0x22);

/// Draws into a String with plotters' SVG backend: axes, labels, legends and the few shapes
/// of small plots.
pub(crate) fn svg<F>(size: (u32, u32), draw: F) -> Result<Drawn, Failure>
where
    F: FnOnce(&Canvas<'_>) -> Result<(), Failure>,
{
    svg_with_shapes(size, |root, _| draw(root))
}

/// Like [`svg`], and the data drawn into [`Shapes`] goes in after plotters' markup, one
/// `<path>` per style: plotters writes an element of some ninety bytes per rectangle or
/// marker, which made a long run's page megabytes, where a path spends a dozen per shape.
pub(crate) fn svg_with_shapes<F>(size: (u32, u32), draw: F) -> Result<Drawn, Failure>
where
    F: FnOnce(&Canvas<'_>, &mut Shapes) -> Result<(), Failure>,
{
    let mut buf = String::new();
    let mut shapes = Shapes::default();
    {
        let root = SVGBackend::with_string(&mut buf, size).into_drawing_area();
        root.fill(&WHITE)?;
        draw(&root, &mut shapes)?;
        root.present()?;
    }
    let mut buf = tidy(&buf);
    let markup = shapes.markup();
    match buf.rfind("</svg>") {
        Some(end) => buf.insert_str(end, &markup),
        None => return Err("plotters wrote no closing </svg>".into()),
    }
    Ok(buf)
}

/// The run's time axis: from its first to its last event, the `run` header and the `final`
/// lines left out (the runner may stamp those with other clocks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Span {
    pub origin: Nanos,
    pub end: Nanos,
}

impl Span {
    pub(crate) fn of(history: &History) -> Span {
        let mut times = history
            .events()
            .iter()
            .filter(|e| !matches!(e.what, What::Run { .. } | What::Final { .. }))
            .map(|e| e.t);
        let Some(first) = times.next() else {
            return Span { origin: 0, end: 0 };
        };
        let (origin, end) = times.fold((first, first), |(lo, hi), t| (lo.min(t), hi.max(t)));
        Span { origin, end }
    }

    /// Seconds since the run started.
    pub(crate) fn secs(&self, t: Nanos) -> f64 {
        t.saturating_sub(self.origin) as f64 / 1e9
    }

    /// The x axis's length in seconds; never zero, so plotters gets a real range.
    pub(crate) fn width_secs(&self) -> f64 {
        self.secs(self.end).max(1e-3)
    }
}

/// Formats axis values with as many decimals as the axis's length needs, so a one-second
/// run does not read `0, 0, 0` and a ten-minute one not `120.000000`.
pub(crate) fn decimals_for(length: f64) -> usize {
    if length >= 20.0 {
        0
    } else if length >= 2.0 {
        1
    } else if length >= 0.2 {
        2
    } else {
        3
    }
}

/// How a legend entry is drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Swatch {
    /// A filled square (spans, bars).
    Block,
    /// A short line (series, ticks, percentiles).
    Line,
    /// A cross (markers).
    Cross,
    /// A dot (points).
    Dot,
}

/// One legend entry.
#[derive(Clone, Debug)]
pub(crate) struct Key {
    pub label: String,
    pub color: RGBAColor,
    pub swatch: Swatch,
}

impl Key {
    pub(crate) fn new(label: impl Into<String>, color: impl Color, swatch: Swatch) -> Key {
        Key {
            label: label.into(),
            color: color.to_rgba(),
            swatch,
        }
    }
}

const LEGEND_LINE: u32 = 18;
const LEGEND_FONT: u32 = 14;

/// Estimated width of a legend entry: plotters has no font metrics here, so this assumes a
/// generous 6.5 px per character of the legend font (14 in plotters' units, 11.3 px in SVG).
fn key_width(key: &Key) -> u32 {
    let chars = u32::try_from(key.label.chars().count()).unwrap_or(u32::MAX / 8);
    14 + 4 + chars.saturating_mul(13) / 2 + 18
}

/// The legend's lines for a canvas `width` wide.
fn layout(keys: &[Key], width: u32) -> Vec<Vec<&Key>> {
    let mut lines: Vec<Vec<&Key>> = Vec::new();
    let mut used = width;
    for key in keys {
        let w = key_width(key);
        if used + w > width.saturating_sub(10) {
            lines.push(Vec::new());
            used = 10;
        }
        if let Some(line) = lines.last_mut() {
            line.push(key);
        }
        used += w;
    }
    lines
}

/// The height a legend of `keys` takes under a chart `width` wide.
pub(crate) fn legend_height(keys: &[Key], width: u32) -> u32 {
    let lines = u32::try_from(layout(keys, width).len()).unwrap_or(0);
    if lines == 0 {
        0
    } else {
        lines * LEGEND_LINE + 8
    }
}

/// Draws the legend into `area` (in pixels), entries left to right, wrapping.
pub(crate) fn legend(area: &Canvas<'_>, keys: &[Key]) -> Result<(), Failure> {
    let (width, _) = area.dim_in_pixel();
    let font = (FONT, LEGEND_FONT).into_font().color(&TEXT);
    for (row, line) in layout(keys, width).into_iter().enumerate() {
        let y = 2 + i32::try_from(row).unwrap_or(0) * LEGEND_LINE as i32;
        let mut x = 10;
        for key in line {
            let mid = y + 7;
            match key.swatch {
                Swatch::Block => area.draw(&Rectangle::new(
                    [(x, y + 1), (x + 12, y + 13)],
                    key.color.filled(),
                ))?,
                Swatch::Line => area.draw(&PathElement::new(
                    vec![(x, mid), (x + 12, mid)],
                    key.color.stroke_width(2),
                ))?,
                Swatch::Cross => {
                    area.draw(&Cross::new((x + 6, mid), 4, key.color.stroke_width(2)))?
                }
                Swatch::Dot => area.draw(&Circle::new((x + 6, mid), 4, key.color.filled()))?,
            }
            area.draw(&Text::new(key.label.clone(), (x + 18, y), font.clone()))?;
            x += i32::try_from(key_width(key)).unwrap_or(i32::MAX / 2);
        }
    }
    Ok(())
}

/// A plot that has nothing to show still renders (an empty page would look like a bug):
/// its title and why it is empty.
pub(crate) fn empty(title: &str, why: &str, size: (u32, u32)) -> Result<Drawn, Failure> {
    svg(size, |root| {
        let (w, h) = root.dim_in_pixel();
        let (w, h) = (
            i32::try_from(w).unwrap_or(400),
            i32::try_from(h).unwrap_or(300),
        );
        root.draw(&Text::new(
            title.to_string(),
            (10, 10),
            (FONT, 18).into_font().color(&TEXT),
        ))?;
        root.draw(&Text::new(
            why.to_string(),
            (w / 2, h / 2),
            (FONT, 16)
                .into_font()
                .color(&PAUSED)
                .pos(Pos::new(HPos::Center, VPos::Center)),
        ))?;
        Ok(())
    })
}
