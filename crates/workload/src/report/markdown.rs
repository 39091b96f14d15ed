//! `README.md`: the tables, the verdicts and how the runs were made, readable where no HTML
//! page is (a forge's file view, a terminal). The plots are only in `report.html`.

use std::fmt::Write;

use super::tables::{self, Table, Tables};
use super::Judged;

/// A table cell: pipes escaped and lines joined, so a reason or label cannot break the table.
fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace(['\n', '\r'], " ")
}

fn table(out: &mut String, t: &Table) {
    let row = |cells: &[String]| {
        let cells: Vec<String> = cells.iter().map(|c| cell(c)).collect();
        format!("| {} |\n", cells.join(" | "))
    };
    out.push_str(&row(&t.header));
    out.push_str(&format!("|{}\n", "---|".repeat(t.header.len())));
    for r in &t.rows {
        out.push_str(&row(r));
    }
}

/// One run's verdict: the reasons, and for a failure the history around it.
fn verdict(out: &mut String, run: &Judged<'_>) {
    let _ = writeln!(
        out,
        "### {}: {}\n",
        cell(run.label),
        tables::status(run.verdict.as_ref())
    );
    let Some(v) = &run.verdict else {
        out.push_str(
            "Not judged: the history has no `run` header line, so the checker cannot tell a \
             fenced run from the control (and has no seed to reproduce it).\n\n",
        );
        return;
    };
    let _ = writeln!(
        out,
        "Backend {}, {}, seed {}, {} events.\n",
        v.backend.as_deref().unwrap_or("?"),
        tables::mode(Some(v.fenced)),
        v.seed.map_or_else(|| "?".to_string(), |s| s.to_string()),
        run.history.len()
    );
    if let Some(header) = &run.header {
        for (name, value) in header.provenance() {
            let _ = writeln!(out, "- {name}: `{}`", value.replace('`', "'"));
        }
    }
    let _ = writeln!(
        out,
        "- history: `{}`\n",
        super::history_file_name(run.label)
    );
    if v.reasons.is_empty() {
        out.push_str("No findings.\n\n");
    } else {
        for reason in &v.reasons {
            let _ = writeln!(out, "- {}", cell(reason));
        }
        out.push('\n');
    }
    if let Some(slice) = &v.slice {
        let _ = writeln!(
            out,
            "History around the first failure (`>>` marks it):\n\n```text\n{slice}```\n"
        );
    }
}

/// The whole `README.md`.
pub(crate) fn page(runs: &[Judged<'_>], tables: &Tables, how: &str) -> String {
    let mut out = String::from("# Fault workload report\n\n");
    if runs.is_empty() {
        out.push_str("No runs.\n\n");
    }
    out.push_str(
        "Every figure below is the checker's (`leasehold_conformance::workload`), computed \
         from each run's merged history. The promises under test, the lock's first: **no fence \
         granted twice and no key granted while another holder's lease was valid**; then, \
         with fencing, **0 acknowledged writes lost and 0 stale writes accepted**, while the \
         unfenced control loses some. The resource's zeros alone cannot catch a broken lock: \
         it refuses every older fence, whoever granted it. The timelines, fence plots and latency histograms are in `report.html` beside this \
         file.\n\n",
    );
    out.push_str("## Figures per run\n\n");
    table(&mut out, &tables.headline);
    out.push_str("\n## Fenced runs against the unfenced control\n\n");
    table(&mut out, &tables.control);
    out.push_str("\n## Faults injected, by kind\n\n");
    table(&mut out, &tables.faults);
    out.push_str("\n## Verdicts\n\n");
    for run in tables.order.iter().filter_map(|&i| runs.get(i)) {
        verdict(&mut out, run);
    }
    out.push_str("## How the runs were made\n\n");
    out.push_str(how.trim());
    out.push('\n');
    out
}
