//! Compact SVG: the data of a plot as one `<path>` per colour ([`Shapes`]), and plotters'
//! own markup with what it repeats for nothing taken out ([`tidy`]). plotters writes an element
//! of some ninety bytes per rectangle, line or marker; a ten-minute run draws thousands of them,
//! which made the report megabytes, where a path spends a few bytes per shape.

use std::fmt::Write;

use plotters::style::RGBAColor;

use super::plot::FONT;

/// plotters' markup without what it repeats for nothing: `opacity="1"` on every element
/// (the default), the font family on every text (the root carries it), font sizes to fifteen
/// decimals, the line breaks around each text, and an element per grid line or axis tick
/// (neighbouring lines of one stroke become one path, so the painting order stays).
pub(crate) fn tidy(svg: &str) -> String {
    let family = format!(" font-family=\"{FONT}\"");
    let svg = svg
        .replace(" opacity=\"1\"", "")
        .replace(&family, "")
        .replacen("<svg ", &format!("<svg{family} "), 1)
        .replace(">\n", ">")
        .replace("\n</text>", "</text>");
    let svg = join_lines(&svg);
    let mut out = String::with_capacity(svg.len());
    let mut rest = svg.as_str();
    const SIZE: &str = "font-size=\"";
    while let Some(at) = rest.find(SIZE) {
        let (head, tail) = rest.split_at(at + SIZE.len());
        out.push_str(head);
        let end = tail.find('"').unwrap_or(tail.len());
        match tail[..end].parse::<f64>() {
            Ok(size) => {
                let _ = write!(out, "{size:.1}");
            }
            Err(_) => out.push_str(&tail[..end]),
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

/// The value of attribute `name` in one tag.
fn attribute<'t>(tag: &'t str, name: &str) -> Option<&'t str> {
    let key = format!(" {name}=\"");
    let from = tag.find(&key)? + key.len();
    let len = tag[from..].find('"')?;
    Some(&tag[from..from + len])
}

/// A `<line>` or unfilled `<polyline>` as its stroke (colour and width) and path data.
fn as_stroke(tag: &str) -> Option<((String, String), String)> {
    let stroke = (
        attribute(tag, "stroke")?.to_string(),
        attribute(tag, "stroke-width")?.to_string(),
    );
    if tag.starts_with("<line ") {
        let at = |n| attribute(tag, n);
        let d = format!("M{} {}L{} {}", at("x1")?, at("y1")?, at("x2")?, at("y2")?);
        Some((stroke, d))
    } else if tag.starts_with("<polyline ") && attribute(tag, "fill") == Some("none") {
        let mut d = String::new();
        for (i, point) in attribute(tag, "points")?.split_whitespace().enumerate() {
            let (x, y) = point.split_once(',')?;
            let _ = write!(d, "{}{x} {y}", if i == 0 { 'M' } else { 'L' });
        }
        Some((stroke, d))
    } else {
        None
    }
}

/// Neighbouring `<line>`s and `<polyline>`s of one stroke as one `<path>`.
fn join_lines(svg: &str) -> String {
    let mut out = String::with_capacity(svg.len());
    let mut group: Option<((String, String), String)> = None;
    let flush = |out: &mut String, group: &mut Option<((String, String), String)>| {
        if let Some(((stroke, width), d)) = group.take() {
            let _ = write!(
                out,
                "<path fill=\"none\" stroke=\"{stroke}\" stroke-width=\"{width}\" d=\"{d}\"/>"
            );
        }
    };
    let mut rest = svg;
    while let Some(open) = rest.find('<') {
        let text = &rest[..open];
        if !text.is_empty() {
            flush(&mut out, &mut group);
            out.push_str(text);
        }
        let Some(len) = rest[open..].find('>') else {
            break;
        };
        let tag = &rest[open..=open + len];
        match as_stroke(tag) {
            Some((stroke, d)) => match &mut group {
                Some((current, path)) if *current == stroke => path.push_str(&d),
                _ => {
                    flush(&mut out, &mut group);
                    group = Some((stroke, d));
                }
            },
            None => {
                flush(&mut out, &mut group);
                out.push_str(tag);
            }
        }
        rest = &rest[open + len + 1..];
    }
    flush(&mut out, &mut group);
    out.push_str(rest);
    out
}

/// How a layer of [`Shapes`] is painted.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Paint {
    /// Filled, no outline.
    Fill(RGBAColor),
    /// Outlined with this width, not filled; round caps, so an empty segment is a dot.
    Stroke(RGBAColor, u32),
    /// Level bars this many pixels tall, drawn as strokes of that width: a bar is a move and a
    /// length (`m9 0h4`), half the bytes of a rectangle.
    Band(RGBAColor, u32),
}

/// One paint's path data, and where its last band ended.
type Layer = (Paint, String, Option<(i32, i32)>);

/// Data shapes in pixels, grouped by paint into one SVG path each, in the order the layers
/// were first used (later layers paint over earlier ones).
#[derive(Debug, Default)]
pub(crate) struct Shapes {
    /// Each paint's path data, and where its last band ended (bands move relative to it).
    layers: Vec<Layer>,
}

impl Shapes {
    fn layer(&mut self, paint: Paint) -> &mut Layer {
        let i = match self.layers.iter().position(|(p, _, _)| *p == paint) {
            Some(i) => i,
            None => {
                self.layers.push((paint, String::new(), None));
                self.layers.len() - 1
            }
        };
        &mut self.layers[i]
    }

    fn d(&mut self, paint: Paint) -> &mut String {
        &mut self.layer(paint).1
    }

    /// A level bar filling the rectangle between two corners, in `color`.
    pub(crate) fn band(&mut self, color: RGBAColor, a: (i32, i32), b: (i32, i32)) {
        let (x, w) = (a.0.min(b.0), (a.0 - b.0).abs().max(1));
        let (top, h) = (a.1.min(b.1), (a.1 - b.1).abs().max(1));
        // A stroke is centred on its line: an odd height sits on a half pixel.
        let y2 = 2 * top + h;
        let (_, d, last) = self.layer(Paint::Band(color, h.unsigned_abs()));
        let _ = match *last {
            Some((lx, ly2)) if ly2 == y2 => write!(d, "m{} 0h{w}", x - lx),
            _ => write!(d, "M{x} {}h{w}", half(y2)),
        };
        *last = Some((x + w, y2));
    }

    /// A line through `points`, in relative moves, runs of level or upright steps joined (a
    /// rising staircase of a thousand grants is a few hundred short commands).
    pub(crate) fn line(&mut self, paint: Paint, points: impl IntoIterator<Item = (i32, i32)>) {
        let d = self.d(paint);
        let mut last: Option<(i32, i32)> = None;
        let mut pending: Option<(i32, i32)> = None;
        let flush = |d: &mut String, step: (i32, i32)| {
            let _ = match step {
                (dx, 0) => write!(d, "h{dx}"),
                (0, dy) => write!(d, "v{dy}"),
                (dx, dy) => write!(d, "l{dx} {dy}"),
            };
        };
        for (x, y) in points {
            let Some((lx, ly)) = last else {
                let _ = write!(d, "M{x} {y}");
                last = Some((x, y));
                continue;
            };
            let step = (x - lx, y - ly);
            if step == (0, 0) {
                continue;
            }
            pending = match pending {
                Some((px, 0)) if step.1 == 0 && (px > 0) == (step.0 > 0) => Some((px + step.0, 0)),
                Some((0, py)) if step.0 == 0 && (py > 0) == (step.1 > 0) => Some((0, py + step.1)),
                Some(p) => {
                    flush(d, p);
                    Some(step)
                }
                None => Some(step),
            };
            last = Some((x, y));
        }
        if let Some(p) = pending {
            flush(d, p);
        }
    }

    /// A cross of half-width `r` centred on `(x, y)`.
    pub(crate) fn cross(&mut self, paint: Paint, (x, y): (i32, i32), r: i32) {
        let (a, b) = (x - r, y - r);
        let _ = write!(self.d(paint), "M{a} {b}l{0} {0}m0 -{0}l-{0} {0}", 2 * r);
    }

    /// A triangle pointing up, of half-width `r`, centred on `(x, y)`.
    pub(crate) fn triangle(&mut self, paint: Paint, (x, y): (i32, i32), r: i32) {
        let _ = write!(self.d(paint), "M{x} {}l{r} {}h-{}z", y - r, 2 * r, 2 * r);
    }

    /// A circle of radius `r` centred on `(x, y)`.
    pub(crate) fn ring(&mut self, paint: Paint, (x, y): (i32, i32), r: i32) {
        let _ = write!(
            self.d(paint),
            "M{} {y}a{r} {r} 0 1 0 {} 0a{r} {r} 0 1 0 -{} 0",
            x - r,
            2 * r,
            2 * r
        );
    }

    /// A dot (with a [`Paint::Stroke`] as wide as the dot).
    pub(crate) fn dot(&mut self, paint: Paint, (x, y): (i32, i32)) {
        let _ = write!(self.d(paint), "M{x} {y}h0");
    }

    /// The layers as SVG paths.
    pub(crate) fn markup(&self) -> String {
        let hex = |c: &RGBAColor| format!("#{:02x}{:02x}{:02x}", c.0, c.1, c.2);
        let mut out = String::new();
        for (paint, d, _) in self.layers.iter().filter(|(_, d, _)| !d.is_empty()) {
            let _ = match paint {
                Paint::Fill(c) => writeln!(
                    out,
                    "<path fill=\"{}\" fill-opacity=\"{:.3}\" d=\"{d}\"/>",
                    hex(c),
                    c.3
                ),
                Paint::Stroke(c, w) => writeln!(
                    out,
                    "<path fill=\"none\" stroke=\"{}\" stroke-opacity=\"{:.3}\" \
                     stroke-width=\"{w}\" stroke-linecap=\"round\" d=\"{d}\"/>",
                    hex(c),
                    c.3
                ),
                Paint::Band(c, h) => writeln!(
                    out,
                    "<path fill=\"none\" stroke=\"{}\" stroke-opacity=\"{:.3}\" \
                     stroke-width=\"{h}\" d=\"{d}\"/>",
                    hex(c),
                    c.3
                ),
            };
        }
        out
    }
}

/// Twice a coordinate, as the coordinate: `7` for 14, `7.5` for 15.
fn half(twice: i32) -> String {
    if twice % 2 == 0 {
        (twice / 2).to_string()
    } else {
        format!("{}.5", twice.div_euclid(2))
    }
}

#[cfg(test)]
mod tests {
    use plotters::style::{Color, RGBColor};

    use super::*;

    #[test]
    fn bars_of_one_row_and_colour_are_one_path_of_relative_moves() {
        let blue = RGBColor(0, 0, 255).to_rgba();
        let mut shapes = Shapes::default();
        shapes.band(blue, (10, 20), (14, 32));
        shapes.band(blue, (20, 20), (21, 32));
        shapes.band(blue, (5, 40), (6, 53));
        let markup = shapes.markup();
        assert_eq!(markup.matches("<path").count(), 2, "{markup}");
        assert!(
            markup.contains(r#"stroke-width="12" d="M10 26h4m6 0h1""#),
            "{markup}"
        );
        assert!(
            markup.contains(r#"stroke-width="13" d="M5 46.5h1""#),
            "{markup}"
        );
    }

    #[test]
    fn a_staircase_line_joins_its_level_and_upright_steps() {
        let mut shapes = Shapes::default();
        let red = Paint::Stroke(RGBColor(255, 0, 0).to_rgba(), 1);
        shapes.line(red, [(0, 10), (1, 10), (2, 10), (2, 9), (2, 8), (3, 7)]);
        assert!(shapes.markup().contains(r#"d="M0 10h2v-2l1 -1""#));
    }

    #[test]
    fn neighbouring_grid_lines_become_one_path_and_the_order_stays() {
        let svg = concat!(
            r##"<svg width="10"><rect x="0"/>"##,
            r##"<line opacity="1" stroke="#E0E0E0" stroke-width="1" x1="1" y1="2" x2="1" y2="9"/>"##,
            r##"<line opacity="1" stroke="#E0E0E0" stroke-width="1" x1="5" y1="2" x2="5" y2="9"/>"##,
            r##"<polyline fill="none" opacity="1" stroke="#000000" stroke-width="1" points="0,0 3,4 "/>"##,
            "<text x=\"1\" font-family=\"sans-serif\" font-size=\"11.290322580645162\">\nlabel\n</text></svg>"
        );
        assert_eq!(
            tidy(svg),
            concat!(
                r##"<svg font-family="sans-serif" width="10"><rect x="0"/>"##,
                r##"<path fill="none" stroke="#E0E0E0" stroke-width="1" d="M1 2L1 9M5 2L5 9"/>"##,
                r##"<path fill="none" stroke="#000000" stroke-width="1" d="M0 0L3 4"/>"##,
                r##"<text x="1" font-size="11.3">label</text></svg>"##
            )
        );
    }
}
