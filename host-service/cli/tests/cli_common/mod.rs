//! Helpers shared by the `cli_*` tests: running the `shmtrace` binary,
//! private directories, and editable copies of the golden trace.

#![allow(dead_code)]

pub mod fake;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

use prost_reflect::{DynamicMessage, Value};
use shmtrace_cli::schema;
use shmtrace_cli::trace_file::{write_preamble, PacketReader};

/// The golden trace: a whole session recorded from the real Perfetto v59.
pub const GOLDEN: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../tests/golden/capture_run_trace.pftrace"
);

/// A trace the real Perfetto recorded into a RING buffer that wrapped
/// (see `tests/data/README.md`).
pub const REAL_RING_WRAP: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/data/real_ring_wrap.perfetto-trace"
);

/// The packets of the golden trace, serialized.
pub fn golden_packets() -> Vec<Vec<u8>> {
    let file = std::fs::File::open(GOLDEN).expect("open golden trace");
    PacketReader::new(file).map(|p| p.unwrap().bytes).collect()
}

/// The `shmtrace` binary.
pub fn shmtrace() -> Command {
    Command::new(env!("CARGO_BIN_EXE_shmtrace"))
}

/// Runs `shmtrace args...`.
pub fn run(args: &[&str]) -> Output {
    shmtrace().args(args).output().expect("run shmtrace")
}

/// `inspect --check --json FILES`: exit status and the analysis.
pub fn inspect(files: &[&Path]) -> (i32, serde_json::Value) {
    inspect_with(&["inspect", "--check", "--json"], files)
}

/// As [`inspect`], with `--strict`.
pub fn inspect_strict(files: &[&Path]) -> (i32, serde_json::Value) {
    inspect_with(&["inspect", "--check", "--strict", "--json"], files)
}

fn inspect_with(args: &[&str], files: &[&Path]) -> (i32, serde_json::Value) {
    let mut cmd = shmtrace();
    cmd.args(args).args(files);
    let out = cmd.output().expect("run shmtrace inspect");
    let json = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "inspect printed no JSON ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().unwrap_or(-1), json)
}

/// Asserts that `text` contains each of `expected`.
pub fn assert_contains_all(text: &str, expected: &[&str]) {
    for expected in expected {
        assert!(
            text.contains(expected),
            "{expected:?} missing from:\n{text}"
        );
    }
}

/// The problem messages of an analysis, one per line.
pub fn problems(analysis: &serde_json::Value) -> String {
    analysis["problems"]
        .as_array()
        .map(|ps| {
            ps.iter()
                .map(|p| format!("[{}] {}", p["kind"].as_str().unwrap_or("?"), p["message"]))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

/// A private temporary directory, removed when dropped.
pub struct TempDir(PathBuf);

impl TempDir {
    /// A new empty directory.
    pub fn new(name: &str) -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("shmtrace-cli-{name}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create temp dir");
        TempDir(dir)
    }

    /// A path inside.
    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A trace as editable packets (prost-reflect keeps unknown fields).
#[derive(Clone)]
pub struct EditTrace {
    /// The packets.
    pub packets: Vec<DynamicMessage>,
}

/// `TrackEvent.Type` values.
pub const SLICE_BEGIN: i32 = 1;
pub const SLICE_END: i32 = 2;
pub const INSTANT: i32 = 3;
pub const COUNTER: i32 = 4;

fn merge(into: &mut DynamicMessage, mut from: DynamicMessage) {
    let fields: Vec<_> = from.take_fields().collect();
    for (desc, value) in fields {
        let target = into.get_field_mut(&desc);
        match (target, value) {
            (Value::Message(old), Value::Message(new)) => merge(old, new),
            (Value::List(old), Value::List(new)) => old.extend(new),
            (slot, value) => *slot = value,
        }
    }
}

fn field<'a>(m: &'a DynamicMessage, name: &str) -> Option<std::borrow::Cow<'a, Value>> {
    m.has_field_by_name(name)
        .then(|| m.get_field_by_name(name))
        .flatten()
}

impl EditTrace {
    /// Reads a trace file.
    pub fn read(path: &Path) -> Self {
        let file = std::fs::File::open(path).expect("open trace");
        let packets = PacketReader::new(file)
            .map(|p| {
                DynamicMessage::decode(schema::message("TracePacket"), p.unwrap().bytes.as_slice())
                    .unwrap()
            })
            .collect();
        EditTrace { packets }
    }

    /// The golden trace.
    pub fn golden() -> Self {
        Self::read(Path::new(GOLDEN))
    }

    /// The sequence id of packet `i`.
    pub fn seq(&self, i: usize) -> Option<u32> {
        field(&self.packets[i], "trusted_packet_sequence_id").and_then(|v| v.as_u32())
    }

    /// The track event type of packet `i`, if it is a track event.
    pub fn event_type(&self, i: usize) -> Option<i32> {
        let event = field(&self.packets[i], "track_event")?;
        let event = event.as_message()?;
        Some(
            field(event, "type")
                .and_then(|v| v.as_enum_number())
                .unwrap_or(0),
        )
    }

    /// Indices of the packets of sequence `seq` holding a track event of
    /// type `ty`.
    pub fn events(&self, seq: u32, ty: i32) -> Vec<usize> {
        (0..self.packets.len())
            .filter(|&i| self.seq(i) == Some(seq) && self.event_type(i) == Some(ty))
            .collect()
    }

    /// Indices of the packets of sequence `seq`.
    pub fn sequence(&self, seq: u32) -> Vec<usize> {
        (0..self.packets.len())
            .filter(|&i| self.seq(i) == Some(seq))
            .collect()
    }

    /// Index of the first packet whose text form contains `needle`.
    pub fn find(&self, needle: &str) -> usize {
        self.packets
            .iter()
            .position(|p| p.to_text_format().contains(needle))
            .unwrap_or_else(|| panic!("no packet contains {needle:?}"))
    }

    /// Merges text-format fields into packet `i` with protobuf merge
    /// semantics: sub-messages merge, repeated fields append, scalars are
    /// replaced.
    pub fn edit(&mut self, i: usize, text: &str) -> &mut Self {
        let patch = DynamicMessage::parse_text_format(schema::message("TracePacket"), text)
            .unwrap_or_else(|e| panic!("edit {text:?}: {e}"));
        merge(&mut self.packets[i], patch);
        self
    }

    /// Clears a field of packet `i` (`track_event.terminating_flow_ids`
    /// style paths).
    pub fn clear(&mut self, i: usize, path: &str) -> &mut Self {
        let mut parts: Vec<&str> = path.split('.').collect();
        let last = parts.pop().unwrap();
        let mut msg = &mut self.packets[i];
        for part in parts {
            msg = msg
                .get_field_by_name_mut(part)
                .and_then(|v| v.as_message_mut())
                .unwrap_or_else(|| panic!("no message field {part}"));
        }
        msg.clear_field_by_name(last);
        self
    }

    /// Sets a counter of `buffer_stats[0]` in the (last) trace_stats
    /// packet, as a service whose buffer wrapped or lost data would.
    pub fn set_buffer_stat(&mut self, name: &str, value: u64) -> &mut Self {
        let stats = self
            .packets
            .iter()
            .rposition(|p| p.has_field_by_name("trace_stats"))
            .expect("a trace_stats packet");
        let buffers = self.packets[stats]
            .get_field_by_name_mut("trace_stats")
            .and_then(Value::as_message_mut)
            .and_then(|s| s.get_field_by_name_mut("buffer_stats"))
            .and_then(Value::as_list_mut)
            .expect("trace_stats.buffer_stats");
        buffers[0]
            .as_message_mut()
            .expect("BufferStats")
            .set_field_by_name(name, Value::U64(value));
        self
    }

    /// `sequence_flags` of packet `i` (0 if unset).
    pub fn sequence_flags(&self, i: usize) -> u32 {
        field(&self.packets[i], "sequence_flags")
            .and_then(|v| v.as_u32())
            .unwrap_or(0)
    }

    /// Removes packet `i`.
    pub fn remove(&mut self, i: usize) -> &mut Self {
        self.packets.remove(i);
        self
    }

    /// The serialized trace.
    pub fn bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for p in &self.packets {
            let bytes = prost::Message::encode_to_vec(p);
            write_preamble(&mut out, bytes.len()).unwrap();
            out.extend_from_slice(&bytes);
        }
        out
    }

    /// Writes the trace to `path`.
    pub fn write(&self, path: &Path) -> PathBuf {
        std::fs::write(path, self.bytes()).expect("write trace");
        path.to_path_buf()
    }
}
