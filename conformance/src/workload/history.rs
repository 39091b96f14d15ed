//! A run's history: events in time order, stored as one JSON object per line.
//!
//! Why JSON lines: each worker process appends its own events with one `write(2)` per line, so a
//! `SIGKILL` can at worst cut the last line short, never interleave two; the runner merges the
//! files by time; people read and grep the result; and line *n* of the file is event *n - 1*, so
//! a checker finding points at a line.

use std::fmt;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Write};
use std::path::Path;

use flate2::read::MultiGzDecoder;
use flate2::write::GzEncoder;
use flate2::Compression;

use super::event::{Event, What};
use super::final_state::{FinalState, KeyState};
use crate::resource::{Access, Op};

/// Why a history could not be read. Never a panic: a history is input from other processes.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HistoryError {
    /// Opening or reading the file failed.
    #[error("reading the history at line {line}: {source}")]
    Io {
        /// The line being read (1-based); 0 when the file could not be opened.
        line: usize,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// A line is not one event (bad JSON, an unknown `"event"`, a missing field).
    #[error("history line {line} is not an event: {source}")]
    Malformed {
        /// The line (1-based).
        line: usize,
        /// What serde_json found.
        #[source]
        source: serde_json::Error,
    },
    /// The last line has no newline and does not parse: its writer was most likely killed while
    /// writing it.
    #[error("history line {line} is cut short (no newline, not an event): {source}")]
    Truncated {
        /// The line (1-based).
        line: usize,
        /// What serde_json found.
        #[source]
        source: serde_json::Error,
    },
}

impl HistoryError {
    /// The 1-based line the error is about.
    pub fn line(&self) -> usize {
        match self {
            HistoryError::Io { line, .. }
            | HistoryError::Malformed { line, .. }
            | HistoryError::Truncated { line, .. } => *line,
        }
    }
}

/// A run's events. Index `i` is line `i + 1` of the file it was read from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct History {
    events: Vec<Event>,
}

impl History {
    /// A history of `events` in the order given (a worker's own events are in time order; use
    /// [`History::merge`] to put several workers' histories together).
    pub fn new(events: Vec<Event>) -> Self {
        History { events }
    }

    /// The events.
    pub fn events(&self) -> &[Event] {
        &self.events
    }

    /// Number of events.
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// Whether there are no events.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// Appends an event.
    pub fn push(&mut self, event: Event) {
        self.events.push(event);
    }

    /// Several processes' histories as one, ordered by time. Stable: events with the same time
    /// keep the order of `parts` and, within a part, their own order.
    pub fn merge(parts: impl IntoIterator<Item = History>) -> History {
        let mut events: Vec<Event> = parts.into_iter().flat_map(|h| h.events).collect();
        events.sort_by_key(|e| e.t);
        History { events }
    }

    /// Parses JSON lines. A line that is not an event is [`HistoryError::Malformed`] with its
    /// line number; an unparsable last line without a newline is [`HistoryError::Truncated`].
    pub fn read(mut input: impl BufRead) -> Result<History, HistoryError> {
        let mut events = Vec::new();
        let mut buf = String::new();
        let mut line = 0;
        loop {
            line += 1;
            buf.clear();
            let n = input
                .read_line(&mut buf)
                .map_err(|source| HistoryError::Io { line, source })?;
            if n == 0 {
                break;
            }
            let complete = buf.ends_with('\n');
            let text = buf.trim_end_matches(['\n', '\r']);
            match serde_json::from_str::<Event>(text) {
                Ok(event) => events.push(event),
                Err(source) if complete => return Err(HistoryError::Malformed { line, source }),
                Err(source) => return Err(HistoryError::Truncated { line, source }),
            }
        }
        Ok(History { events })
    }

    /// Parses JSON lines from a string.
    pub fn from_jsonl(text: &str) -> Result<History, HistoryError> {
        History::read(text.as_bytes())
    }

    /// Reads a history file; one whose name ends in `.gz` is gunzipped on the way (a long
    /// run's histories are kept compressed beside its report).
    pub fn read_file(path: impl AsRef<Path>) -> Result<History, HistoryError> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|source| HistoryError::Io { line: 0, source })?;
        if is_gzip(path) {
            History::read(BufReader::new(MultiGzDecoder::new(BufReader::new(file))))
        } else {
            History::read(BufReader::new(file))
        }
    }

    /// Writes the history to a file as JSON lines, gzip-compressed when the name ends in
    /// `.gz`.
    pub fn write_file(&self, path: impl AsRef<Path>) -> io::Result<()> {
        let path = path.as_ref();
        let file = io::BufWriter::new(File::create(path)?);
        if is_gzip(path) {
            let mut gz = GzEncoder::new(file, Compression::default());
            self.write_to(&mut gz)?;
            gz.finish()?.flush()
        } else {
            let mut file = file;
            self.write_to(&mut file)?;
            file.flush()
        }
    }

    /// The history as JSON lines, each ending in a newline.
    pub fn to_jsonl(&self) -> String {
        let mut out = String::new();
        for event in &self.events {
            out.push_str(&line_of(event));
            out.push('\n');
        }
        out
    }

    /// Writes the history as JSON lines.
    pub fn write_to(&self, out: impl Write) -> io::Result<()> {
        let mut writer = HistoryWriter::new(out);
        for event in &self.events {
            writer.record(event)?;
        }
        Ok(())
    }

    /// The final state the history records in its [`What::Final`] lines (the last one per key
    /// wins).
    pub fn final_state(&self) -> FinalState {
        let mut state = FinalState::new();
        for event in &self.events {
            if let What::Final {
                key,
                elements,
                last_fence,
            } = &event.what
            {
                state = state.with(key.clone(), KeyState::new(elements.clone(), *last_fence));
            }
        }
        state
    }

    /// One key's fenced resource accesses (claims and writes with a known outcome), in
    /// completion order, in the form [`crate::resource::check_history`] checks: the in-process
    /// recorder and this history describe the same resource.
    pub fn accesses(&self, key: &str) -> Vec<Access> {
        self.events
            .iter()
            .filter(|e| e.key() == Some(key))
            .filter_map(|e| match &e.what {
                What::ReadOk {
                    fence: Some(fence), ..
                } => Some(Access {
                    op: Op::Claim,
                    fence: *fence,
                    accepted: true,
                }),
                What::ReadStale { fence, .. } => Some(Access {
                    op: Op::Claim,
                    fence: *fence,
                    accepted: false,
                }),
                What::WriteOk { fence, .. } => Some(Access {
                    op: Op::Write,
                    fence: *fence,
                    accepted: true,
                }),
                What::WriteStale { fence, .. } => Some(Access {
                    op: Op::Write,
                    fence: *fence,
                    accepted: false,
                }),
                _ => None,
            })
            .collect()
    }

    /// The events around `index` that concern `key` (and every fault meanwhile): up to `before`
    /// such events before it and `after` after it. What a failure prints.
    pub fn slice_around(
        &self,
        index: usize,
        key: Option<&str>,
        before: usize,
        after: usize,
    ) -> HistorySlice {
        let relevant = |e: &Event| key.is_none() || e.key() == key || e.what.is_fault();
        let mut start = index.min(self.events.len());
        let mut taken = 0;
        while start > 0 && taken < before {
            start -= 1;
            if relevant(&self.events[start]) {
                taken += 1;
            }
        }
        let mut end = index.saturating_add(1).min(self.events.len());
        taken = 0;
        while end < self.events.len() && taken < after {
            if relevant(&self.events[end]) {
                taken += 1;
            }
            end += 1;
        }
        let events = (start..end)
            .filter(|&i| i == index || relevant(&self.events[i]))
            .map(|i| (i, self.events[i].clone()))
            .collect();
        HistorySlice {
            focus: index,
            events,
        }
    }
}

impl FromIterator<Event> for History {
    fn from_iter<I: IntoIterator<Item = Event>>(iter: I) -> Self {
        History::new(iter.into_iter().collect())
    }
}

/// Part of a history, with each event's index, shown around a checker finding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HistorySlice {
    /// The index of the event the slice is about.
    pub focus: usize,
    /// `(index, event)` pairs in history order.
    pub events: Vec<(usize, Event)>,
}

impl fmt::Display for HistorySlice {
    /// One line per event: its line number in the history file, `>>` marking the focus, and
    /// the JSON line itself.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, event) in &self.events {
            let mark = if *i == self.focus { ">>" } else { "  " };
            writeln!(f, "{mark} line {:>6}: {}", i + 1, line_of(event))?;
        }
        Ok(())
    }
}

/// Appends events to a history file, one `write` call per line, so that a process killed
/// mid-run leaves whole lines (at worst its last one cut short, which the reader reports as
/// [`HistoryError::Truncated`]). Open the file with `O_APPEND` when several processes share it.
#[derive(Debug)]
pub struct HistoryWriter<W> {
    out: W,
    buf: Vec<u8>,
}

impl<W: Write> HistoryWriter<W> {
    /// Writes to `out`.
    pub fn new(out: W) -> Self {
        HistoryWriter {
            out,
            buf: Vec::with_capacity(256),
        }
    }

    /// Appends one event as one line, in one write.
    pub fn record(&mut self, event: &Event) -> io::Result<()> {
        self.buf.clear();
        serde_json::to_writer(&mut self.buf, event).map_err(io::Error::other)?;
        self.buf.push(b'\n');
        self.out.write_all(&self.buf)
    }

    /// Flushes the underlying writer.
    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    /// The underlying writer.
    pub fn into_inner(self) -> W {
        self.out
    }
}

/// Whether `path` names a gzip file (`.gz`).
fn is_gzip(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "gz")
}

/// One event as its JSON line, without the newline. Serializing an [`Event`] cannot fail (no
/// maps with non-string keys, no floats), but a message beats a panic if that ever changes.
fn line_of(event: &Event) -> String {
    serde_json::to_string(event)
        .unwrap_or_else(|e| format!("{{\"unserializable\":\"{e}\",\"t\":{}}}", event.t))
}
