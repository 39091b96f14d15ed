//! The report: Markdown and one self-contained HTML page with plots, from stored histories.
