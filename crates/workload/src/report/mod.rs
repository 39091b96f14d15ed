//! The report: Markdown and one self-contained HTML page with plots, from stored histories.
//!
//! [`render`] judges each run with [`check_recorded`] (so the report shows what the checker
//! says, never a second opinion), and writes `README.md` (tables only, readable on any forge)
//! and `report.html` (the same tables plus inline SVG plots: axes and legends by plotters, the
//! data as one path per colour, so a ten-minute run's page stays tens of kilobytes). The HTML
//! page loads nothing from anywhere, so it can be archived or mailed as one file.
//!
//! Text in the plots: plotters is built without `ttf`/`ab_glyph`, so it only *estimates* text
//! sizes, and the SVG backend writes `<text>` elements with a generic `font-family` that the
//! browser renders. No font file is needed at build or run time.

mod compact;
mod faults;
mod fences;
mod histogram;
mod html;
mod markdown;
mod plot;
mod tables;
mod timeline;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::error::Error as StdError;
use std::io;
use std::path::{Path, PathBuf};

use leasehold_conformance::workload::{check_recorded, History, RunVerdict, What};

/// One run to show: a label, and its merged history (with the `run` header line and the
/// `final` lines).
#[derive(Clone, Debug)]
pub struct ReportRun {
    /// What the report calls the run (for example `etcd fenced, seed 7`).
    pub label: String,
    /// The merged history, header first and `final` lines last.
    pub history: History,
}

/// Why the report could not be written. A history the checker cannot judge is not an error:
/// it shows as a row saying so.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReportError {
    /// Creating the output directory or writing a file failed.
    #[error("writing the report to {}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// plotters failed to draw a plot.
    #[error("drawing the {plot} of run {run:?}: {source}")]
    Plot {
        /// Which plot.
        plot: &'static str,
        /// The run's label.
        run: String,
        /// What plotters reported.
        #[source]
        source: Box<dyn StdError + Send + Sync>,
    },
}

/// The `run` header: what the report needs even when the checker cannot run.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Header {
    seed: u64,
    backend: String,
    fenced: bool,
    failover_unsafe: bool,
    commit: Option<String>,
    versions: BTreeMap<String, String>,
    command: Option<String>,
    resource: Option<String>,
}

impl Header {
    /// What made the run, as one line each: the commit, the server versions and the command
    /// that reruns the schedule. Older histories did not record them, and say so.
    fn provenance(&self) -> [(&'static str, String); 3] {
        let versions = if self.versions.is_empty() {
            "not recorded".to_string()
        } else {
            self.versions
                .iter()
                .map(|(program, version)| format!("{program} {version}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        [
            (
                "commit",
                self.commit.clone().unwrap_or_else(|| "not recorded".into()),
            ),
            ("server versions", versions),
            (
                "reproduce with",
                self.command
                    .clone()
                    .unwrap_or_else(|| format!("not recorded (seed {})", self.seed)),
            ),
        ]
    }
}

/// A run with its verdict, computed once and shared by every table and plot.
struct Judged<'r> {
    label: &'r str,
    history: &'r History,
    header: Option<Header>,
    verdict: Option<RunVerdict>,
}

impl<'r> Judged<'r> {
    fn new(run: &'r ReportRun) -> Self {
        let header = run.history.events().iter().find_map(|e| match &e.what {
            What::Run {
                seed,
                backend,
                fenced,
                failover_unsafe,
                commit,
                versions,
                command,
                resource,
                ..
            } => Some(Header {
                seed: *seed,
                backend: backend.clone(),
                fenced: *fenced,
                failover_unsafe: *failover_unsafe,
                commit: commit.clone(),
                versions: versions.clone(),
                command: command.clone(),
                resource: resource.clone(),
            }),
            _ => None,
        });
        Judged {
            label: &run.label,
            history: &run.history,
            header,
            verdict: check_recorded(&run.history),
        }
    }

    /// The backend, from the verdict (which read the header), else the header.
    fn backend(&self) -> Option<&str> {
        self.verdict
            .as_ref()
            .and_then(|v| v.backend.as_deref())
            .or(self.header.as_ref().map(|h| h.backend.as_str()))
    }

    /// The store the protected resource lived in; histories whose run line does not say are
    /// from before the choice, when it was always a PostgreSQL table, and `?` without one.
    fn resource(&self) -> &str {
        match &self.header {
            Some(h) => h.resource.as_deref().unwrap_or("postgres"),
            None => "?",
        }
    }

    fn fenced(&self) -> Option<bool> {
        self.verdict
            .as_ref()
            .map(|v| v.fenced)
            .or(self.header.as_ref().map(|h| h.fenced))
    }
}

/// The SVG plots of one run, each a complete `<svg>` element.
struct Plots {
    timeline: plot::Drawn,
    fences: plot::Drawn,
    handoff: plot::Drawn,
    acquire: plot::Drawn,
}

/// The file a run's history is kept in beside the report: its label, with anything but
/// letters, digits, `.`, `_` and `-` replaced, as gzip-compressed JSON lines.
pub fn history_file_name(label: &str) -> String {
    let stem: String = label
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '-'
            }
        })
        .collect();
    format!("{stem}.history.jsonl.gz")
}

/// Writes `out_dir/README.md` (the tables, the verdicts and `how` the runs were made),
/// `out_dir/report.html` (the same plus a timeline, a fence plot and two latency histograms
/// per run, inline) and each run's history beside them ([`history_file_name`]), so the report
/// can be checked and rendered again from what it shows. Creates `out_dir` if needed.
pub fn render(runs: &[ReportRun], how: &str, out_dir: &Path) -> Result<(), ReportError> {
    let judged: Vec<Judged<'_>> = runs.iter().map(Judged::new).collect();
    let tables = tables::Tables::of(&judged);
    let markdown = markdown::page(&judged, &tables, how);

    let mut plots = Vec::with_capacity(judged.len());
    for run in &judged {
        plots.push(draw(run)?);
    }
    let html = html::page(&judged, &tables, &plots, how);

    std::fs::create_dir_all(out_dir).map_err(|source| ReportError::Io {
        path: out_dir.to_path_buf(),
        source,
    })?;
    write(&out_dir.join("README.md"), &markdown)?;
    write(&out_dir.join("report.html"), &html)?;
    for run in runs {
        let path = out_dir.join(history_file_name(&run.label));
        run.history
            .write_file(&path)
            .map_err(|source| ReportError::Io { path, source })?;
    }
    Ok(())
}

fn draw(run: &Judged<'_>) -> Result<Plots, ReportError> {
    let named = |plot: &'static str| {
        move |source| ReportError::Plot {
            plot,
            run: run.label.to_string(),
            source,
        }
    };
    let figures = run.verdict.as_ref().map(|v| &v.figures);
    Ok(Plots {
        timeline: timeline::draw(run.history).map_err(named("timeline"))?,
        fences: fences::draw(run.history, run.verdict.as_ref()).map_err(named("fence plot"))?,
        handoff: histogram::draw(
            "hand-off latency (release started to next grant)",
            figures.map(|f| &f.handoff),
        )
        .map_err(named("hand-off histogram"))?,
        acquire: histogram::draw(
            "acquire latency (invoke to grant)",
            figures.map(|f| &f.acquire_latency),
        )
        .map_err(named("acquire histogram"))?,
    })
}

fn write(path: &Path, text: &str) -> Result<(), ReportError> {
    std::fs::write(path, text).map_err(|source| ReportError::Io {
        path: path.to_path_buf(),
        source,
    })
}
