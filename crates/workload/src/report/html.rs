//! `report.html`: the Markdown's tables and verdicts plus every run's plots, inline, in one
//! page that references nothing outside itself (no scripts, stylesheets, fonts or images), so
//! it can be archived or attached as it is.

use std::fmt::Write;

use super::tables::{self, Table, Tables};
use super::{Judged, Plots};

/// Text as HTML: everything a label, a reason or a history line may contain, escaped.
fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

const STYLE: &str = "
body { font-family: sans-serif; margin: 2em auto; max-width: 1060px; color: #222; line-height: 1.4; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.5em; text-align: left; vertical-align: top; }
th { background: #f2f2f2; }
.scroll { overflow-x: auto; }
.pass { color: #1e7d32; font-weight: bold; }
.declared { color: #b36b00; font-weight: bold; }
.fail { color: #c62828; font-weight: bold; }
pre { background: #f7f7f7; padding: 0.5em; overflow-x: auto; font-size: 0.8em; }
figure { margin: 0.5em 0; }
figure svg { max-width: 100%; height: auto; }
.pair { display: flex; flex-wrap: wrap; gap: 0.5em; }
section.run { border-top: 2px solid #ddd; margin-top: 2em; }
";

fn table(out: &mut String, t: &Table) {
    out.push_str("<div class=\"scroll\"><table>\n<tr>");
    for h in &t.header {
        let _ = write!(out, "<th>{}</th>", esc(h));
    }
    out.push_str("</tr>\n");
    for row in &t.rows {
        out.push_str("<tr>");
        for c in row {
            let _ = write!(out, "<td>{}</td>", esc(c));
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</table></div>\n");
}

fn status_class(status: &str) -> &'static str {
    match status {
        "pass" => "pass",
        "declared" => "declared",
        _ => "fail",
    }
}

fn figure(out: &mut String, svg: &str, caption: &str) {
    let _ = write!(
        out,
        "<figure>\n{svg}\n<figcaption>{}</figcaption>\n</figure>\n",
        esc(caption)
    );
}

/// One run's section: verdict, reasons, failure slice, then its plots.
fn run_section(out: &mut String, i: usize, run: &Judged<'_>, plots: &Plots) {
    let status = tables::status(run.verdict.as_ref());
    let _ = write!(
        out,
        "<section class=\"run\" id=\"run-{i}\">\n<h3>{}: <span class=\"{}\">{}</span></h3>\n",
        esc(run.label),
        status_class(status),
        esc(status)
    );
    match &run.verdict {
        None => out.push_str(
            "<p>Not judged: the history has no <code>run</code> header line, so the checker \
             cannot tell a fenced run from the control (and has no seed to reproduce it).</p>\n",
        ),
        Some(v) => {
            let _ = writeln!(
                out,
                "<p>Backend {}, {}, seed {}, {} events.</p>",
                esc(v.backend.as_deref().unwrap_or("?")),
                esc(tables::mode(Some(v.fenced))),
                v.seed.map_or_else(|| "?".to_string(), |s| s.to_string()),
                run.history.len()
            );
            out.push_str("<ul class=\"made\">\n");
            if let Some(header) = &run.header {
                for (name, value) in header.provenance() {
                    let _ = writeln!(out, "<li>{name}: <code>{}</code></li>", esc(&value));
                }
            }
            let _ = writeln!(
                out,
                "<li>history: <code>{}</code></li>\n</ul>",
                esc(&super::history_file_name(run.label))
            );
            if v.reasons.is_empty() {
                out.push_str("<p>No findings.</p>\n");
            } else {
                out.push_str("<ul>\n");
                for reason in &v.reasons {
                    let _ = writeln!(out, "<li>{}</li>", esc(reason));
                }
                out.push_str("</ul>\n");
            }
            if let Some(slice) = &v.slice {
                let _ = writeln!(
                    out,
                    "<p>History around the first failure (<code>&gt;&gt;</code> marks it):</p>\n<pre>{}</pre>",
                    esc(&slice.to_string())
                );
            }
        }
    }
    figure(
        out,
        &plots.timeline,
        "Each row is a worker. Bars: the worker held a key (grant to release, loss, kill or \
         deadline); orange where it still held it past the lease's deadline. Grey: paused; \
         dark red: killed until restarted. Shading across all rows: server faults. Green \
         spikes: accepted writes; red marks: writes or claims the resource refused as stale.",
    );
    figure(
        out,
        &plots.fences,
        "The fence of every grant, per key, against time: it must only rise. Red circles: \
         grants the checker found reissued.",
    );
    out.push_str("<div class=\"pair\">\n");
    figure(
        out,
        &plots.handoff,
        "Hand-off: a release started, to the next grant to a worker already waiting.",
    );
    figure(out, &plots.acquire, "Acquire: invoke to grant.");
    out.push_str("</div>\n</section>\n");
}

/// The whole `report.html`.
pub(crate) fn page(runs: &[Judged<'_>], tables: &Tables, plots: &[Plots], how: &str) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <title>Fault workload report</title>\n<style>{STYLE}</style>\n</head>\n<body>\n\
         <h1>Fault workload report</h1>\n"
    );
    if runs.is_empty() {
        out.push_str("<p>No runs.</p>\n");
    }
    out.push_str(
        "<p>Every figure is the checker's (<code>leasehold_conformance::workload</code>), \
         computed from each run's merged history. The promises under test, the lock's first: \
         <strong>no fence granted twice and no key granted while another holder's lease was \
         valid</strong>; then, with fencing, <strong>0 acknowledged writes lost and 0 stale \
         writes accepted</strong>, while the unfenced control loses some. The resource's zeros \
         alone cannot catch a broken lock: it refuses every older fence, whoever granted \
         it.</p>\n",
    );
    out.push_str("<h2>Figures per run</h2>\n");
    table(&mut out, &tables.headline);
    out.push_str("<h2>Fenced runs against the unfenced control</h2>\n");
    table(&mut out, &tables.control);
    out.push_str("<h2>Faults injected, by kind</h2>\n");
    table(&mut out, &tables.faults);
    out.push_str("<h2>How the runs were made</h2>\n");
    for paragraph in how.split("\n\n").map(str::trim).filter(|p| !p.is_empty()) {
        let _ = writeln!(out, "<p>{}</p>", esc(paragraph));
    }
    out.push_str("<h2>Runs</h2>\n");
    for &i in &tables.order {
        if let (Some(run), Some(p)) = (runs.get(i), plots.get(i)) {
            run_section(&mut out, i, run, p);
        }
    }
    out.push_str("</body>\n</html>\n");
    out
}
