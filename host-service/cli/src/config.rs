//! Trace configs: the text format Perfetto users already write, binary
//! configs, and the quick flags (`-t 10s -b 32mb --app-categories a,b`),
//! each turned into the serialized `TraceConfig` that EnableTracing carries.
//!
//! A [`Config`] keeps the bytes exactly as written (a binary config is sent
//! as is, so fields this project does not know survive) next to a decoded
//! view for the checks and the summary. Overrides such as
//! `--write-into-file` are appended as fields, which protobuf's "last value
//! wins" rule applies without re-encoding the rest.
//!
//! Text configs are parsed with prost-reflect against upstream's complete
//! TraceConfig schema ([`super::schema::trace_config`]), so every data
//! source's config can be written (`ftrace_config`, `process_stats_config`,
//! `sys_stats_config`, `track_event_config`, ...); an error names the file, line, column and the field path
//! (`data_sources[1].config.track_event_config`), quotes the line, and
//! suggests the closest field name for a misspelt one.

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use miette::Diagnostic as _;
use prost::Message as _;
use prost_reflect::{DynamicMessage, Kind, MessageDescriptor};
use thiserror::Error;

use super::schema;
use shmtrace_ipc::protos::trace_config::buffer_config::FillPolicy;
use shmtrace_ipc::protos::trace_config::{BufferConfig, DataSource, IncrementalStateConfig};
use shmtrace_ipc::protos::wire::{put_tag, WireType};
use shmtrace_ipc::protos::{self, DataSourceConfig, TraceConfig, TrackEventConfig};

/// The data source of track events (the Perfetto SDKs' and ours).
pub const TRACK_EVENT: &str = "track_event";

/// `TraceConfig.write_into_file` (bool).
const TRACE_CONFIG_WRITE_INTO_FILE: u32 = 8;

/// The largest buffer accepted: its size in bytes fits in 32 bits
/// (`size_kb * 1024 < 2^32`), as the service requires.
pub const MAX_BUFFER_SIZE_KB: u32 = u32::MAX / 1024;

/// A trace config ready to send.

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    bytes: Vec<u8>,
    view: TraceConfig,
    origin: String,
}

/// Why a config cannot be used.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A text-format config does not parse.
    #[error(transparent)]
    Text(#[from] Box<TextError>),
    /// A binary config does not decode.
    #[error("{origin}: not a binary TraceConfig ({source}){hint}")]
    Binary {
        /// Where the config came from.
        origin: String,
        /// The decoder's complaint.
        source: prost::DecodeError,
        /// A suggestion, if the input looks like text.
        hint: &'static str,
    },
    /// The config decodes but cannot start a useful session.
    #[error("{origin}: {problem}")]
    Invalid {
        /// Where the config came from.
        origin: String,
        /// What is wrong, naming the field.
        problem: String,
    },
}

impl Config {
    /// Parses a text-format config; `origin` names it in errors.
    pub fn from_text(source: &str, origin: &str) -> Result<Self, ConfigError> {
        let message = DynamicMessage::parse_text_format(schema::trace_config(), source)
            .map_err(|e| Box::new(TextError::new(&e, source, origin)))?;
        Self::from_binary(message.encode_to_vec(), origin)
    }

    /// Takes a serialized config; `origin` names it in errors.
    pub fn from_binary(bytes: Vec<u8>, origin: &str) -> Result<Self, ConfigError> {
        match TraceConfig::decode(bytes.as_slice()) {
            Ok(view) => Ok(Config {
                bytes,
                view,
                origin: origin.to_owned(),
            }),
            Err(source) => {
                let looks_like_text = std::str::from_utf8(&bytes).is_ok_and(|s| {
                    s.trim_start()
                        .starts_with(|c: char| c.is_ascii_alphabetic() || c == '#')
                });
                Err(ConfigError::Binary {
                    origin: origin.to_owned(),
                    source,
                    hint: if looks_like_text {
                        "; it looks like a text-format config: add --txt"
                    } else {
                        ""
                    },
                })
            }
        }
    }

    /// The config the quick flags describe.
    pub fn from_quick(quick: &QuickConfig) -> Self {
        let track_event = if quick.categories.is_empty() {
            TrackEventConfig::default()
        } else {
            // Everything off, then exactly what was asked for.
            TrackEventConfig {
                disabled_categories: vec!["*".to_owned()],
                enabled_categories: quick.categories.clone(),
                ..Default::default()
            }
        };
        let data_source = DataSourceConfig {
            name: Some(TRACK_EVENT.to_owned()),
            target_buffer: Some(0),
            track_event_config: Some(protos::to_raw(&track_event)),
            ..Default::default()
        };
        let ring = quick.fill == Fill::Ring;
        let view = TraceConfig {
            buffers: vec![BufferConfig {
                size_kb: Some(quick.buffer_kb),
                fill_policy: Some(if ring {
                    FillPolicy::RingBuffer
                } else {
                    FillPolicy::Discard
                } as i32),
                ..Default::default()
            }],
            data_sources: vec![DataSource {
                config: Some(protos::to_raw(&data_source)),
                ..Default::default()
            }],
            duration_ms: quick
                .duration
                .map(|d| u32::try_from(d.as_millis()).unwrap_or(u32::MAX)),
            // A ring buffer overwrites the oldest data, interning tables
            // included: periodic clears keep what survives decodable.
            incremental_state_config: ring.then_some(IncrementalStateConfig {
                clear_period_ms: Some(QUICK_CLEAR_PERIOD_MS),
            }),
            ..Default::default()
        };
        Config {
            bytes: protos::canonical::encode(&view),
            view,
            origin: "the command line".to_owned(),
        }
    }

    /// Names where the config came from, for messages.
    pub fn with_origin(mut self, origin: &str) -> Self {
        origin.clone_into(&mut self.origin);
        self
    }

    /// The serialized config, as it will be sent.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The decoded config.
    pub fn view(&self) -> &TraceConfig {
        &self.view
    }

    /// Where the config came from (a path, `stdin`, `the command line`).
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// Sets `write_into_file` (if not set already).
    pub fn set_write_into_file(&mut self) {
        if self.view.write_into_file != Some(true) {
            put_tag(
                &mut self.bytes,
                TRACE_CONFIG_WRITE_INTO_FILE,
                WireType::Varint,
            );
            self.bytes.push(u8::from(true));
            self.view.write_into_file = Some(true);
        }
    }

    /// The data source configs, decoded (`None` for one that does not
    /// decode; [`Config::check`] reports those).
    pub fn data_sources(&self) -> Vec<Option<DataSourceConfig>> {
        self.view
            .data_sources
            .iter()
            .map(|ds| protos::from_raw::<DataSourceConfig>(ds.config.as_ref()).ok())
            .collect()
    }

    /// Whether its triggers ask for snapshots (CLONE_SNAPSHOT, or
    /// STOP_TRACING with `use_clone_snapshot_if_available`): the session is
    /// read only through clones, one per trigger.
    pub fn clone_snapshots(&self) -> bool {
        use protos::trace_config::trigger_config::TriggerMode;
        self.view.trigger_config.as_ref().is_some_and(|t| {
            t.trigger_mode == Some(TriggerMode::CloneSnapshot as i32)
                || t.use_clone_snapshot_if_available == Some(true)
        })
    }

    /// Whether its data sources start only on a START_TRACING trigger.
    pub fn waits_for_start_trigger(&self) -> bool {
        use protos::trace_config::trigger_config::TriggerMode;
        self.view
            .trigger_config
            .as_ref()
            .is_some_and(|t| t.trigger_mode == Some(TriggerMode::StartTracing as i32))
    }

    /// The distinct data source names, in config order.
    pub fn data_source_names(&self) -> Vec<String> {
        let mut names: Vec<String> = Vec::new();
        for name in self
            .data_sources()
            .into_iter()
            .flatten()
            .filter_map(|c| c.name)
        {
            if !names.contains(&name) {
                names.push(name);
            }
        }
        names
    }

    /// Checks what would make the session useless or be refused: no
    /// buffers, a zero-sized buffer, no data sources, a data source without
    /// a name or aiming at a buffer that does not exist.
    pub fn check(&self) -> Result<(), ConfigError> {
        let invalid = |problem: String| ConfigError::Invalid {
            origin: self.origin.clone(),
            problem,
        };
        let buffers = &self.view.buffers;
        if buffers.is_empty() {
            return Err(invalid(
                "no buffers: add e.g. `buffers { size_kb: 32768 }`".into(),
            ));
        }
        for (i, buffer) in buffers.iter().enumerate() {
            let size_kb = buffer.size_kb.unwrap_or(0);
            if size_kb == 0 {
                return Err(invalid(format!("buffers[{i}]: size_kb is missing or 0")));
            }
            if size_kb > MAX_BUFFER_SIZE_KB {
                return Err(invalid(format!(
                    "buffers[{i}]: size_kb {size_kb} is over the limit: a buffer holds less \
                     than 4 GiB (size_kb at most {MAX_BUFFER_SIZE_KB})"
                )));
            }
        }
        if self.view.data_sources.is_empty() {
            return Err(invalid(
                "no data_sources: the session would record nothing".into(),
            ));
        }
        for (i, ds) in self.data_sources().into_iter().enumerate() {
            let ds = ds.ok_or_else(|| {
                invalid(format!(
                    "data_sources[{i}].config is not a valid DataSourceConfig"
                ))
            })?;
            let name = ds.name.as_deref().unwrap_or("");
            if name.is_empty() {
                return Err(invalid(format!("data_sources[{i}].config.name is missing")));
            }
            if let Some(buffer_name) = ds.target_buffer_name.as_deref() {
                if !buffers
                    .iter()
                    .any(|b| b.name.as_deref() == Some(buffer_name))
                {
                    return Err(invalid(format!(
                        "data_sources[{i}] ({name}): target_buffer_name {buffer_name:?} \
                         names no buffer"
                    )));
                }
            } else {
                let target = ds.target_buffer.unwrap_or(0);
                if target as usize >= buffers.len() {
                    return Err(invalid(format!(
                        "data_sources[{i}] ({name}): target_buffer is {target}, but the \
                         config declares {} buffer(s) (valid: 0..={})",
                        buffers.len(),
                        buffers.len() - 1
                    )));
                }
            }
        }
        Ok(())
    }

    /// The config in text format.
    pub fn to_text(&self) -> String {
        to_text(&self.bytes)
    }
}

/// A serialized `TraceConfig` in text format, as Perfetto's own text
/// configs are written (and `perfetto --txt` reads them: its parser,
/// src/protozero/text_to_proto/text_to_proto.cc, has no `[...]` lists): one
/// line, or block, per value of a repeated field, enums by name. Bytes that
/// do not decode are shown as such; fields the schema does not know are
/// counted in a comment.
pub fn to_text(bytes: &[u8]) -> String {
    match DynamicMessage::decode(schema::trace_config(), bytes) {
        Ok(message) => {
            let mut out = String::new();
            write_text(&mut out, &message, 0);
            out
        }
        Err(e) => format!("# not a valid TraceConfig: {e}"),
    }
}

/// Writes `message`'s fields at indentation `depth`.
fn write_text(out: &mut String, message: &DynamicMessage, depth: usize) {
    use prost_reflect::Value;
    use std::fmt::Write as _;
    let indent = "  ".repeat(depth);
    let one = |out: &mut String, field: &prost_reflect::FieldDescriptor, value: &Value| {
        let name = field.name();
        match value {
            Value::Message(m) => {
                let _ = writeln!(out, "{indent}{name} {{");
                write_text(out, m, depth + 1);
                let _ = writeln!(out, "{indent}}}");
            }
            Value::EnumNumber(n) => {
                let by_name = field.kind().as_enum().and_then(|e| e.get_value(*n));
                match by_name {
                    Some(v) => writeln!(out, "{indent}{name}: {}", v.name()),
                    None => writeln!(out, "{indent}{name}: {n}"),
                }
                .unwrap_or(());
            }
            // Scalars as prost-reflect writes them in text format
            // (strings and bytes quoted and escaped).
            v => writeln!(out, "{indent}{name}: {v}").unwrap_or(()),
        }
    };
    for (field, value) in message.fields() {
        match value {
            Value::List(items) => items.iter().for_each(|v| one(out, &field, v)),
            // (No TraceConfig field is a map; written as its entries.)
            Value::Map(map) => {
                for (key, v) in map {
                    let key = Value::from(key.clone());
                    let name = field.name();
                    let _ = writeln!(out, "{indent}{name} {{ key: {key} value: {v} }}");
                }
            }
            v => one(out, &field, v),
        }
    }
    let unknown = message.unknown_fields().count();
    if unknown > 0 {
        let _ = writeln!(
            out,
            "{indent}# {unknown} field(s) this schema does not know, not shown"
        );
    }
}

/// Incremental-state clear period of a quick-flags ring-buffer session.
pub const QUICK_CLEAR_PERIOD_MS: u32 = 5000;

/// Buffer size when `-b` is not given, as Perfetto's CLI.
pub const DEFAULT_BUFFER_KB: u32 = 32 * 1024;

/// What happens when the trace buffer is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Fill {
    /// Overwrite the oldest data (keeps the end of the session).
    #[default]
    Ring,
    /// Drop new data (keeps the beginning of the session).
    Discard,
}

/// The quick flags of `shmtrace record`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuickConfig {
    /// `-t`: stop after this long (else: when stopped).
    pub duration: Option<Duration>,
    /// `-b`: buffer size, KiB.
    pub buffer_kb: u32,
    /// `--app-categories`: enable only these track_event categories (all
    /// but the producers' default-disabled ones if empty).
    pub categories: Vec<String>,
    /// `--fill`.
    pub fill: Fill,
}

impl Default for QuickConfig {
    fn default() -> Self {
        QuickConfig {
            duration: None,
            buffer_kb: DEFAULT_BUFFER_KB,
            categories: Vec::new(),
            fill: Fill::Ring,
        }
    }
}

/// A text-format config that does not parse: where, which field, why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextError {
    /// Where the config came from.
    pub origin: String,
    /// 1-based line.
    pub line: usize,
    /// 1-based column (characters).
    pub column: usize,
    /// The field being parsed (`data_sources[0].config.name`), if any.
    pub field: Option<String>,
    /// The parser's complaint.
    pub message: String,
    /// The offending line and a caret under the problem.
    pub snippet: String,
    /// A suggestion.
    pub hint: Option<String>,
}

impl std::error::Error for TextError {}

impl fmt::Display for TextError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}: {}",
            self.origin, self.line, self.column, self.message
        )?;
        if let Some(field) = &self.field {
            write!(f, " (in field {field})")?;
        }
        write!(f, "\n{}", self.snippet)?;
        if let Some(hint) = &self.hint {
            write!(f, "\nhint: {hint}")?;
        }
        Ok(())
    }
}

impl TextError {
    fn new(error: &prost_reflect::text_format::ParseError, source: &str, origin: &str) -> Self {
        let (offset, len) = error
            .labels()
            .and_then(|mut labels| labels.next())
            .map_or((source.len(), 0), |l| (l.offset(), l.len()));
        let offset = offset.min(source.len());
        let (line, column, line_text) = locate(source, offset);
        let caret_len = len.clamp(1, line_text.len().saturating_sub(column - 1).max(1));
        let gutter = line.to_string().len();
        let snippet = format!(
            "{:>gutter$} | {line_text}\n{:>gutter$} | {}{}",
            line,
            "",
            " ".repeat(column - 1),
            "^".repeat(caret_len)
        );
        let path = field_path_at(source, offset);
        let resolved = resolve_path(&schema::trace_config(), &path);
        Self {
            origin: origin.to_owned(),
            line,
            column,
            field: (!path.is_empty()).then_some(resolved.display),
            message: error.to_string(),
            snippet,
            hint: resolved.hint,
        }
    }
}

/// 1-based line and column of `offset`, and the text of its line.
fn locate(source: &str, offset: usize) -> (usize, usize, &str) {
    let before = &source[..floor_char_boundary(source, offset)];
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let line = before.matches('\n').count() + 1;
    let column = before[line_start..].chars().count() + 1;
    let line_end = source[line_start..]
        .find('\n')
        .map_or(source.len(), |i| line_start + i);
    (
        line,
        column,
        source[line_start..line_end].trim_end_matches('\r'),
    )
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// One step of a field path: a field name and which occurrence of it in
/// its message (for repeated fields).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Segment {
    name: String,
    index: usize,
}

/// The fields enclosing `offset` in a text-format message, outermost first,
/// ending with the field being parsed there. A light scan (strings and
/// comments skipped, braces counted), good enough to name the place of an
/// error that the real parser found.
fn field_path_at(source: &str, offset: usize) -> Vec<Segment> {
    #[derive(PartialEq)]
    enum State {
        Key,
        AfterKey,
        Value,
        List,
    }
    struct Level {
        entered: Option<Segment>,
        counts: HashMap<String, usize>,
        in_list: bool,
    }
    let mut levels = vec![Level {
        entered: None,
        counts: HashMap::new(),
        in_list: false,
    }];
    let mut current: Option<Segment> = None;
    let mut state = State::Key;
    let bytes = source.as_bytes();
    let mut i = 0;
    while i < bytes.len() && i <= offset {
        let c = bytes[i];
        match c {
            b'#' => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
                continue;
            }
            b'"' | b'\'' => {
                i += 1;
                while i < bytes.len() && bytes[i] != c && bytes[i] != b'\n' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
                if state == State::Value {
                    state = State::Key;
                }
                continue;
            }
            b'{' | b'<' => {
                let in_list = state == State::List;
                if let Some(level) = levels.last_mut() {
                    level.in_list = in_list;
                }
                let entered = if in_list {
                    current.clone()
                } else {
                    current.take()
                };
                levels.push(Level {
                    entered,
                    counts: HashMap::new(),
                    in_list: false,
                });
                state = State::Key;
            }
            b'}' | b'>' if levels.len() > 1 => {
                let level = levels.pop();
                if levels.last().is_some_and(|l| l.in_list) {
                    current = level.and_then(|l| l.entered);
                    state = State::List;
                } else {
                    current = None;
                    state = State::Key;
                }
            }
            b':' if state == State::AfterKey => state = State::Value,
            b'[' if state == State::Value => state = State::List,
            b']' if state == State::List => {
                if let Some(level) = levels.last_mut() {
                    level.in_list = false;
                }
                state = State::Key;
            }
            b';' | b',' if state != State::List => state = State::Key,
            c if c.is_ascii_alphanumeric() || c == b'_' || c == b'-' || c == b'.' => {
                let start = i;
                while i < bytes.len()
                    && (bytes[i].is_ascii_alphanumeric() || matches!(bytes[i], b'_' | b'.' | b'-'))
                {
                    i += 1;
                }
                let word = &source[start..i];
                match state {
                    State::Key => {
                        let level = levels.last_mut().expect("the root level is never popped");
                        let count = level.counts.entry(word.to_owned()).or_insert(0);
                        current = Some(Segment {
                            name: word.to_owned(),
                            index: *count,
                        });
                        *count += 1;
                        state = State::AfterKey;
                    }
                    State::Value => state = State::Key,
                    State::AfterKey | State::List => {}
                }
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    levels
        .into_iter()
        .filter_map(|l| l.entered)
        .chain(current)
        .collect()
}

/// A field path resolved against the schema: how to show it, and a hint
/// for a field that does not exist or cannot be written as text.
struct ResolvedPath {
    display: String,
    hint: Option<String>,
}

fn resolve_path(root: &MessageDescriptor, path: &[Segment]) -> ResolvedPath {
    let mut display = String::new();
    let mut hint = None;
    let mut message = Some(root.clone());
    for segment in path {
        if !display.is_empty() {
            display.push('.');
        }
        display.push_str(&segment.name);
        let Some(msg) = message.take() else { continue };
        match msg.get_field_by_name(&segment.name) {
            Some(field) => {
                if field.is_list() {
                    display.push_str(&format!("[{}]", segment.index));
                }
                if let Kind::Message(inner) = field.kind() {
                    message = Some(inner);
                }
            }
            None => {
                hint = closest_field(&msg, &segment.name).map(|best| {
                    format!(
                        "{} has no field `{}`; did you mean `{best}`?",
                        msg.name(),
                        segment.name
                    )
                });
            }
        }
    }
    ResolvedPath { display, hint }
}

/// The field of `message` whose name is closest to `name`, if close.
fn closest_field(message: &MessageDescriptor, name: &str) -> Option<String> {
    message
        .fields()
        .map(|f| (edit_distance(f.name(), name), f.name().to_owned()))
        .filter(|(d, candidate)| *d <= (candidate.len().max(name.len()) / 3).max(1))
        .min()
        .map(|(_, candidate)| candidate)
}

/// Levenshtein distance.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (diagonal + usize::from(ca != *cb))
                .min(row[j] + 1)
                .min(above + 1);
            diagonal = above;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Any text, made of config words, punctuation and stray (multi-byte)
    /// characters, parses or names where it fails: never a panic, and the
    /// error renders with its caret inside the line it shows.
    #[test]
    fn any_text_config_parses_or_says_where_it_fails() {
        use proptest::prelude::*;
        let token = prop_oneof![
            Just("buffers".to_owned()),
            Just("data_sources".to_owned()),
            Just("config".to_owned()),
            Just("name".to_owned()),
            Just("size_kb".to_owned()),
            Just("fill_policy".to_owned()),
            Just("RING_BUFFER".to_owned()),
            Just("track_event_config".to_owned()),
            Just("enabled_categories".to_owned()),
            Just("\"x\"".to_owned()),
            Just("{".to_owned()),
            Just("}".to_owned()),
            Just("[".to_owned()),
            Just("]".to_owned()),
            Just(":".to_owned()),
            Just(",".to_owned()),
            Just("#".to_owned()),
            Just("\n".to_owned()),
            Just("\r\n".to_owned()),
            Just(" ".to_owned()),
            Just("\"".to_owned()),
            Just("é".to_owned()),
            Just("🦀".to_owned()),
            Just("-1".to_owned()),
            Just("4294967296".to_owned()),
            any::<char>().prop_map(String::from),
        ];
        let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
            cases: 500,
            failure_persistence: None,
            ..ProptestConfig::default()
        });
        runner
            .run(&proptest::collection::vec(token, 0..40), |tokens| {
                let text = tokens.concat();
                if let Err(ConfigError::Text(e)) = Config::from_text(&text, "fuzz") {
                    let rendered = e.to_string();
                    prop_assert!(rendered.starts_with("fuzz:"), "{rendered}");
                    prop_assert!(e.line >= 1 && e.column >= 1);
                    prop_assert!(e.snippet.contains('^'), "{}", e.snippet);
                }
                Ok(())
            })
            .unwrap();
    }

    /// The README's sample text config is the one the quick flags of the
    /// same step make.
    #[test]
    fn the_readme_sample_config_is_what_the_quick_flags_make() {
        let readme = include_str!("../../../README.md");
        let start = readme
            .find("`config.pbtxt` is, say,")
            .expect("the README's sample config");
        let block = &readme[start..];
        let open = block.find("```text").expect("its block") + "```text".len();
        let close = open + block[open..].find("```").expect("its end");
        let sample = Config::from_text(&block[open..close], "the README").unwrap();
        let quick = Config::from_quick(&QuickConfig {
            duration: Some(Duration::from_secs(10)),
            buffer_kb: 32 * 1024,
            categories: vec!["rendering".to_owned()],
            fill: Fill::Ring,
        });
        assert_eq!(sample.view(), quick.view());
    }

    fn text_error(source: &str) -> TextError {
        match Config::from_text(source, "cfg.txt") {
            Err(ConfigError::Text(e)) => *e,
            other => panic!("expected a text error, got {other:?}"),
        }
    }

    #[test]
    fn paths_name_the_field_being_parsed() {
        let src = "buffers { size_kb: 1 }\nbuffers: { size_kb: 2 }\n\
                   data_sources { config { name: \"x\" track_event_config { enabled_categories: [\"a\", \"b\"] bogus: 1 } } }";
        let at = |needle: &str| field_path_at(src, src.find(needle).unwrap());
        let names = |p: Vec<Segment>| {
            p.into_iter()
                .map(|s| format!("{}#{}", s.name, s.index))
                .collect::<Vec<_>>()
                .join(".")
        };
        assert_eq!(names(at("2 }")), "buffers#1.size_kb#0");
        assert_eq!(names(at("\"x\"")), "data_sources#0.config#0.name#0");
        assert_eq!(
            names(at("\"b\"")),
            "data_sources#0.config#0.track_event_config#0.enabled_categories#0"
        );
        assert_eq!(
            names(at("bogus")),
            "data_sources#0.config#0.track_event_config#0.bogus#0"
        );
    }

    #[test]
    fn edit_distances() {
        assert_eq!(edit_distance("size_kb", "size_kb"), 0);
        assert_eq!(edit_distance("size_kbb", "size_kb"), 1);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("fill_polcy", "fill_policy"), 1);
    }

    #[test]
    fn misspelt_field_points_at_line_column_field_and_suggests() {
        let src = "buffers {\n  size_kb: 1024\n  fill_polcy: DISCARD\n}\n";
        let e = text_error(src);
        assert_eq!((e.line, e.column), (3, 3));
        assert_eq!(e.field.as_deref(), Some("buffers[0].fill_polcy"));
        assert_eq!(
            e.hint.as_deref(),
            Some("BufferConfig has no field `fill_polcy`; did you mean `fill_policy`?")
        );
        assert!(
            e.snippet.contains("3 |   fill_polcy: DISCARD"),
            "{}",
            e.snippet
        );
        assert!(e.snippet.ends_with("|   ^^^^^^^^^^"), "{:?}", e.snippet);
        let shown = e.to_string();
        assert!(shown.starts_with("cfg.txt:3:3: "), "{shown}");
    }

    #[test]
    fn quick_config_enables_only_the_listed_categories() {
        let config = Config::from_quick(&QuickConfig {
            duration: Some(Duration::from_secs(10)),
            buffer_kb: 2048,
            categories: vec!["net".into(), "gfx.*".into()],
            fill: Fill::Discard,
        });
        config.check().unwrap();
        let view = config.view();
        assert_eq!(view.duration_ms, Some(10_000));
        assert_eq!(view.buffers[0].size_kb, Some(2048));
        assert_eq!(
            view.buffers[0].fill_policy,
            Some(FillPolicy::Discard as i32)
        );
        assert_eq!(view.incremental_state_config, None);
        let ds = config.data_sources()[0].clone().unwrap();
        assert_eq!(ds.name.as_deref(), Some(TRACK_EVENT));
        let te: TrackEventConfig = protos::from_raw(ds.track_event_config.as_ref()).unwrap();
        assert_eq!(te.disabled_categories, ["*"]);
        assert_eq!(te.enabled_categories, ["net", "gfx.*"]);
        // The bytes decode to the same view.
        assert_eq!(&TraceConfig::decode(config.bytes()).unwrap(), view);
    }

    #[test]
    fn write_into_file_is_appended_once() {
        let mut config = Config::from_quick(&QuickConfig::default());
        let before = config.bytes().len();
        config.set_write_into_file();
        config.set_write_into_file();
        assert_eq!(config.bytes().len(), before + 2);
        let decoded = TraceConfig::decode(config.bytes()).unwrap();
        assert_eq!(decoded.write_into_file, Some(true));
        assert_eq!(decoded.buffers, config.view().buffers);
    }
}
