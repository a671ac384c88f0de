//! What `record` tells the person (or program) watching: a live status line
//! on a terminal, plain log lines otherwise, or JSON lines on stdout.
//!
//! Human messages always go to stderr (stdout stays free for `--progress
//! json`). On a terminal the status line is redrawn in place and cleared
//! before any other message, so messages never interleave with it.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::units::{Bytes, Elapsed};

/// How progress is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum ProgressMode {
    /// A live line on a terminal, plain lines otherwise.
    #[default]
    Auto,
    /// A live status line on stderr.
    Line,
    /// A plain status line on stderr every few seconds.
    Plain,
    /// JSON lines on stdout (`{"event": ...}`), for programs.
    Json,
    /// Only errors and the summary.
    None,
}

/// How often the live line is redrawn.
pub const LINE_PERIOD: Duration = Duration::from_millis(500);
/// How often a plain line is printed.
pub const PLAIN_PERIOD: Duration = Duration::from_secs(5);
/// How often a JSON progress event is printed.
pub const JSON_PERIOD: Duration = Duration::from_secs(1);

/// One look at a running session.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Since tracing was enabled.
    pub elapsed: Duration,
    /// Bytes the producers wrote into the trace buffers.
    pub bytes: u64,
    /// Producers with a data source instance in the session.
    pub producers: usize,
    /// Data source instances started.
    pub data_sources: usize,
    /// Non-zero loss counters: `(short name, value)`.
    pub losses: Vec<(&'static str, u64)>,
}

impl Snapshot {
    fn loss_text(&self) -> String {
        if self.losses.is_empty() {
            return "no loss".to_owned();
        }
        let parts: Vec<String> = self
            .losses
            .iter()
            .map(|(name, n)| format!("{n} {name}"))
            .collect();
        format!("loss: {}", parts.join(", "))
    }

    fn text(&self) -> String {
        format!(
            "{} | {} | {} producer{} | {} data source{} | {}",
            Elapsed(self.elapsed),
            Bytes(self.bytes),
            self.producers,
            if self.producers == 1 { "" } else { "s" },
            self.data_sources,
            if self.data_sources == 1 { "" } else { "s" },
            self.loss_text()
        )
    }

    fn json(&self) -> Value {
        let losses: serde_json::Map<String, Value> = self
            .losses
            .iter()
            .map(|(name, n)| ((*name).to_owned(), json!(n)))
            .collect();
        json!({
            "event": "progress",
            "elapsed_ms": self.elapsed.as_millis() as u64,
            "bytes": self.bytes,
            "producers": self.producers,
            "data_sources": self.data_sources,
            "losses": losses,
        })
    }
}

/// The progress reporter of one `record`.
#[derive(Debug)]
pub struct Progress {
    mode: ProgressMode,
    last: Option<Instant>,
    line_shown: bool,
}

impl Progress {
    /// A reporter; `Auto` picks `Line` if stderr is a terminal.
    pub fn new(mode: ProgressMode) -> Self {
        let mode = match mode {
            ProgressMode::Auto if std::io::stderr().is_terminal() => ProgressMode::Line,
            ProgressMode::Auto => ProgressMode::Plain,
            other => other,
        };
        Progress {
            mode,
            last: None,
            line_shown: false,
        }
    }

    /// The mode in effect.
    pub fn mode(&self) -> ProgressMode {
        self.mode
    }

    /// Whether JSON events go to stdout.
    pub fn json(&self) -> bool {
        self.mode == ProgressMode::Json
    }

    fn clear_line(&mut self) {
        if self.line_shown {
            eprint!("\r\x1b[2K");
            self.line_shown = false;
        }
    }

    /// A JSON event (only in JSON mode).
    pub fn event(&mut self, event: Value) {
        if self.json() {
            let mut stdout = std::io::stdout().lock();
            // A closed stdout only loses the events; the trace still matters.
            let _ = writeln!(stdout, "{event}");
            let _ = stdout.flush();
        }
    }

    /// A message for people (stderr), and an event for programs.
    pub fn note(&mut self, message: &str) {
        self.clear_line();
        if self.mode != ProgressMode::None || self.json() {
            eprintln!("shmtrace: {message}");
        }
        self.event(json!({"event": "note", "message": message}));
    }

    /// A warning: always shown.
    pub fn warn(&mut self, message: &str) {
        self.clear_line();
        eprintln!("shmtrace: warning: {message}");
        self.event(json!({"event": "warning", "message": message}));
    }

    /// Shows `snapshot` if it is time to.
    pub fn update(&mut self, snapshot: &Snapshot, hint: &str) {
        let period = match self.mode {
            ProgressMode::Line => LINE_PERIOD,
            ProgressMode::Plain => PLAIN_PERIOD,
            ProgressMode::Json => JSON_PERIOD,
            ProgressMode::Auto | ProgressMode::None => return,
        };
        let now = Instant::now();
        if self
            .last
            .is_some_and(|last| now.duration_since(last) < period)
        {
            return;
        }
        self.last = Some(now);
        match self.mode {
            ProgressMode::Line => {
                eprint!("\r\x1b[2Krecording {} | {hint}", snapshot.text());
                let _ = std::io::stderr().flush();
                self.line_shown = true;
            }
            ProgressMode::Plain => eprintln!("shmtrace: recording {}", snapshot.text()),
            ProgressMode::Json => self.event(snapshot.json()),
            ProgressMode::Auto | ProgressMode::None => {}
        }
    }

    /// Whether a progress update is due (callers skip querying the service
    /// otherwise).
    pub fn due(&self) -> bool {
        let period = match self.mode {
            ProgressMode::Line => LINE_PERIOD,
            ProgressMode::Plain => PLAIN_PERIOD,
            ProgressMode::Json => JSON_PERIOD,
            ProgressMode::Auto | ProgressMode::None => return false,
        };
        self.last.is_none_or(|last| last.elapsed() >= period)
    }

    /// Clears the live line (before the summary).
    pub fn done(&mut self) {
        self.clear_line();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_text() {
        let mut s = Snapshot {
            elapsed: Duration::from_millis(12_300),
            bytes: 3 << 20,
            producers: 1,
            data_sources: 2,
            losses: vec![],
        };
        assert_eq!(
            s.text(),
            "12.3 s | 3.0 MiB | 1 producer | 2 data sources | no loss"
        );
        s.losses = vec![("overwritten", 4), ("dropped", 1)];
        assert!(s.text().ends_with("loss: 4 overwritten, 1 dropped"));
        let j = s.json();
        assert_eq!(j["event"], "progress");
        assert_eq!(j["bytes"], 3 << 20);
        assert_eq!(j["losses"]["overwritten"], 4);
    }
}
