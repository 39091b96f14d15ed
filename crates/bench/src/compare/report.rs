//! The compare mode's results: one row per measured figure, printed as a table a user reads in
//! a minute (leasehold and the peer side by side), and written as CSV, JSON and Markdown.

use std::fmt::Write as _;

use serde::Serialize;

/// What a row measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Measure {
    Pair,
    Handoff,
    Throughput,
    Loss,
}

impl Measure {
    fn as_str(self) -> &'static str {
        match self {
            Measure::Pair => "pair",
            Measure::Handoff => "handoff",
            Measure::Throughput => "throughput",
            Measure::Loss => "loss",
        }
    }
}

/// One measured figure of one side on one backend.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Row {
    pub backend: String,
    pub measure: Measure,
    /// `leasehold` or `peer`.
    pub side: String,
    /// The recipe's name (leasehold, rslock, ...).
    pub contestant: String,
    /// The setting the figure reflects (TTL, session timeout, how the hand-off was set up).
    pub setting: String,
    pub workers: Option<u32>,
    pub keys: Option<u32>,
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
    /// Proven acquisitions per second (throughput).
    pub per_second: Option<f64>,
    /// The busiest worker's share of the window's acquisitions, in percent (throughput): 100
    /// divided by the workers is fair, 100 is one worker taking every turn.
    pub busiest_share: Option<f64>,
    pub samples: u64,
    /// Holds that overlapped another hold of the same key (a broken exclusion).
    pub overlaps: u64,
    /// Holds whose fence did not grow.
    pub fence_disorder: u64,
    pub errors: u64,
    pub note: String,
}

impl Row {
    pub fn new(backend: &str, measure: Measure, side: &str, contestant: &str) -> Row {
        Row {
            backend: backend.to_string(),
            measure,
            side: side.to_string(),
            contestant: contestant.to_string(),
            setting: String::new(),
            workers: None,
            keys: None,
            p50_us: None,
            p99_us: None,
            per_second: None,
            busiest_share: None,
            samples: 0,
            overlaps: 0,
            fence_disorder: 0,
            errors: 0,
            note: String::new(),
        }
    }

    /// The line of the summary this row belongs on.
    fn label(&self) -> String {
        match self.measure {
            Measure::Pair => "uncontended pair p50 / p99".into(),
            Measure::Handoff => "hand-off p50 / p99".into(),
            Measure::Throughput => format!(
                "throughput, {} procs x {} keys",
                self.workers.unwrap_or(0),
                self.keys.unwrap_or(0)
            ),
            Measure::Loss => format!("loss detection, {}", self.setting),
        }
    }

    /// The row's figure as the summary shows it.
    fn cell(&self) -> String {
        let mut cell = match self.measure {
            Measure::Pair | Measure::Handoff => format!(
                "{} / {}",
                duration(self.p50_us.unwrap_or(f64::NAN)),
                duration(self.p99_us.unwrap_or(f64::NAN))
            ),
            Measure::Throughput => format!(
                "{:.0}/s (busiest {:.0} %)",
                self.per_second.unwrap_or(0.0),
                self.busiest_share.unwrap_or(f64::NAN)
            ),
            Measure::Loss => format!(
                "{} (max {})",
                duration(self.p50_us.unwrap_or(f64::NAN)),
                duration(self.p99_us.unwrap_or(f64::NAN))
            ),
        };
        if self.overlaps > 0 || self.fence_disorder > 0 {
            let _ = write!(
                cell,
                " EXCLUSION BROKEN: {} overlaps, {} fences out of order",
                self.overlaps, self.fence_disorder
            );
        }
        if self.errors > 0 {
            let _ = write!(cell, " ({} errors)", self.errors);
        }
        cell
    }
}

/// Microseconds in the unit a reader takes in at a glance.
fn duration(us: f64) -> String {
    if us.is_nan() {
        "-".into()
    } else if us < 1_000.0 {
        format!("{us:.0} µs")
    } else if us < 1_000_000.0 {
        format!("{:.1} ms", us / 1_000.0)
    } else {
        format!("{:.2} s", us / 1_000_000.0)
    }
}

/// A whole run: where and when, and every row.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    pub date: String,
    pub machine: String,
    pub load: String,
    pub quick: bool,
    pub rows: Vec<Row>,
}

/// One line of the summary: leasehold's and the peer's figure for the same measurement.
#[derive(Debug, PartialEq)]
pub struct Line {
    pub backend: String,
    pub measure: String,
    pub peer: String,
    pub leasehold_cell: String,
    pub peer_cell: String,
}

impl Report {
    /// The side-by-side lines, in the order the rows were measured.
    pub fn summary(&self) -> Vec<Line> {
        let mut lines: Vec<Line> = Vec::new();
        for row in &self.rows {
            let label = row.label();
            let at = lines
                .iter()
                .position(|l| l.backend == row.backend && l.measure == label);
            let at = match at {
                Some(at) => at,
                None => {
                    lines.push(Line {
                        backend: row.backend.clone(),
                        measure: label,
                        peer: String::new(),
                        leasehold_cell: "-".into(),
                        peer_cell: "-".into(),
                    });
                    lines.len() - 1
                }
            };
            let line = &mut lines[at];
            if row.side == "leasehold" {
                line.leasehold_cell = row.cell();
            } else {
                line.peer = row.contestant.clone();
                line.peer_cell = row.cell();
            }
        }
        lines
    }

    /// The summary as a plain-text table.
    pub fn table(&self) -> String {
        let lines = self.summary();
        let width = |f: &dyn Fn(&Line) -> usize, min: usize| {
            lines.iter().map(f).max().unwrap_or(0).max(min)
        };
        let (wb, wm, wl) = (
            width(&|l| l.backend.chars().count(), 7),
            width(&|l| l.measure.chars().count(), 7),
            width(&|l| l.leasehold_cell.chars().count(), 9),
        );
        let mut out = format!(
            "{:<wb$}  {:<wm$}  {:<wl$}  peer\n",
            "backend", "measure", "leasehold"
        );
        for l in &lines {
            let _ = writeln!(
                out,
                "{:<wb$}  {:<wm$}  {:<wl$}  {} [{}]",
                l.backend, l.measure, l.leasehold_cell, l.peer_cell, l.peer
            );
        }
        out
    }

    /// The summary as a Markdown table.
    pub fn markdown(&self) -> String {
        let mut out = String::from(
            "| backend | measure | leasehold | peer | peer recipe |\n|---|---|---|---|---|\n",
        );
        for l in self.summary() {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} |",
                l.backend, l.measure, l.leasehold_cell, l.peer_cell, l.peer
            );
        }
        out
    }

    /// Every row as CSV, one header line.
    pub fn csv(&self) -> String {
        let mut out = String::from(
            "backend,measure,side,contestant,setting,workers,keys,p50_us,p99_us,per_second,\
             busiest_share,samples,overlaps,fence_disorder,errors,note\n",
        );
        let opt = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.1}"));
        let count = |v: Option<u32>| v.map_or(String::new(), |v| v.to_string());
        for r in &self.rows {
            let fields = [
                field(&r.backend),
                r.measure.as_str().to_string(),
                field(&r.side),
                field(&r.contestant),
                field(&r.setting),
                count(r.workers),
                count(r.keys),
                opt(r.p50_us),
                opt(r.p99_us),
                opt(r.per_second),
                opt(r.busiest_share),
                r.samples.to_string(),
                r.overlaps.to_string(),
                r.fence_disorder.to_string(),
                r.errors.to_string(),
                field(&r.note),
            ];
            out += &fields.join(",");
            out.push('\n');
        }
        out
    }
}

/// A CSV field, quoted when it holds a comma, a quote or a line break.
fn field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Report {
        let mut pair = Row::new("redis", Measure::Pair, "leasehold", "leasehold");
        pair.p50_us = Some(80.0);
        pair.p99_us = Some(1500.0);
        let mut peer_pair = Row::new("redis", Measure::Pair, "peer", "rslock (no fence)");
        peer_pair.p50_us = Some(60.0);
        peer_pair.p99_us = Some(90.0);
        let mut tp = Row::new("redis", Measure::Throughput, "peer", "rslock (no fence)");
        tp.workers = Some(8);
        tp.keys = Some(1);
        tp.per_second = Some(1234.4);
        tp.busiest_share = Some(62.5);
        tp.overlaps = 2;
        tp.note = "window 3 s, \"best\" of one".into();
        Report {
            rows: vec![pair, peer_pair, tp],
            ..Report::default()
        }
    }

    #[test]
    fn the_summary_sets_both_sides_of_a_measurement_on_one_line() -> Result<(), String> {
        let lines = sample().summary();
        if lines.len() != 2 {
            return Err(format!("expected 2 lines, got {lines:?}"));
        }
        let pair = &lines[0];
        if pair.leasehold_cell != "80 µs / 1.5 ms" || pair.peer_cell != "60 µs / 90 µs" {
            return Err(format!("the pair line reads {pair:?}"));
        }
        let tp = &lines[1];
        if tp.leasehold_cell != "-"
            || !tp
                .peer_cell
                .starts_with("1234/s (busiest 62 %) EXCLUSION BROKEN: 2")
        {
            return Err(format!("the throughput line reads {tp:?}"));
        }
        let table = sample().table();
        if !table.contains("throughput, 8 procs x 1 keys") || !table.contains("[rslock (no fence)]")
        {
            return Err(format!("the table lacks the throughput line:\n{table}"));
        }
        Ok(())
    }

    #[test]
    fn the_csv_has_one_line_per_row_each_as_wide_as_the_header() -> Result<(), String> {
        let csv = sample().csv();
        let lines: Vec<&str> = csv.lines().collect();
        if lines.len() != 4 {
            return Err(format!("expected a header and 3 rows:\n{csv}"));
        }
        if !lines[3].ends_with(",8,1,,,1234.4,62.5,0,2,0,0,\"window 3 s, \"\"best\"\" of one\"") {
            return Err(format!("the throughput row reads {}", lines[3]));
        }
        // Split outside quotes: every line has the header's 16 fields.
        for line in &lines {
            let mut fields = 1;
            let mut quoted = false;
            for c in line.chars() {
                match c {
                    '"' => quoted = !quoted,
                    ',' if !quoted => fields += 1,
                    _ => {}
                }
            }
            if fields != 16 {
                return Err(format!("{fields} fields in {line}"));
            }
        }
        Ok(())
    }

    #[test]
    fn durations_read_in_the_unit_that_fits() -> Result<(), String> {
        for (us, want) in [
            (75.4, "75 µs"),
            (2_500.0, "2.5 ms"),
            (2_010_000.0, "2.01 s"),
        ] {
            if duration(us) != want {
                return Err(format!("{us} µs printed as {}", duration(us)));
            }
        }
        Ok(())
    }
}
