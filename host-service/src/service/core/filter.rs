//! Trace filters (`TraceConfig.trace_filter`): what a session's reads keep
//! of each packet.
//!
//! As upstream (`TracingServiceImpl::MaybeFilterPackets`,
//! src/tracing/service/tracing_service_impl.cc): every packet a read
//! produces — service packets and producer packets with their trusted
//! fields — goes through the filter before compression; only the
//! `trace_stats` packet does not (it is counted as passed through). The
//! bytecode's root is `perfetto.protos.Trace`; packets are filtered from
//! its `packet` field's message, which the bytecode must keep as a message.
//! A packet whose fields are all dropped is sent empty; a malformed one is
//! counted in `filter_stats.errors` and sent as nothing, as upstream sends
//! it with no slices (a file, and a compressed batch, get an empty packet,
//! as upstream's `WriteIntoFile` and compressor write it).
//!
//! * [`bytecode`]: the bytecode (and its v54 overlay).
//! * [`strings`]: the string filter chains.
//! * [`message`]: filtering one message.
//!
//! A session's filter is built once at `EnableTracing` and shared with its
//! clones (not with a clone that asks `skip_trace_filter`); each session
//! counts its own [`FilterStats`].

pub(crate) mod bytecode;
mod message;
mod strings;

use std::sync::Arc;

use shmtrace_abi::trace::trace_packet;

pub use bytecode::BytecodeError;
pub use strings::RulesError;

use crate::protos::trace_config::TraceFilter as FilterConfig;
use crate::protos::trace_stats::FilterStats as FilterStatsProto;
use crate::service::env::Environment;

/// Why a `trace_filter` is refused (upstream's wording first).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FilterError {
    /// The string filter chains.
    #[error(transparent)]
    Rules(#[from] RulesError),
    /// The bytecode or its overlay.
    #[error("Trace filter bytecode invalid: {0}")]
    Bytecode(#[from] BytecodeError),
    /// The bytecode does not keep `Trace.packet` as a message.
    #[error(
        "Failed to set filter root: the bytecode's root message (perfetto.protos.Trace) does \
         not keep field 1 (packet) as a message"
    )]
    Root,
}

/// A compiled `trace_filter`.
#[derive(Debug)]
pub struct TraceFilter {
    bytecode: bytecode::Bytecode,
    strings: strings::StringFilter,
    /// The message index of `TracePacket`.
    root: u32,
}

impl TraceFilter {
    /// Compiles `config`: its string rules (`string_filter_chain`, then
    /// `string_filter_chain_v54`), then `bytecode_v2` (or `bytecode` when
    /// v2 is empty) with `bytecode_overlay_v54`.
    pub fn new(config: &FilterConfig) -> Result<Self, FilterError> {
        let strings = strings::StringFilter::new(
            config.string_filter_chain.iter().flat_map(|c| &c.rules),
            config.string_filter_chain_v54.iter().flat_map(|c| &c.rules),
        )?;
        let v1 = config.bytecode.as_deref().unwrap_or_default();
        let v2 = config.bytecode_v2.as_deref().unwrap_or_default();
        let code = if v2.is_empty() { v1 } else { v2 };
        let overlay = config.bytecode_overlay_v54.as_deref().unwrap_or_default();
        let bytecode = bytecode::Bytecode::load(code, overlay)?;
        let root = bytecode
            .nested_root(trace_packet::TRACE_PACKET_IN_TRACE)
            .ok_or(FilterError::Root)?;
        Ok(Self {
            bytecode,
            strings,
            root,
        })
    }

    /// Filters one `TracePacket`, `input`, into `out` (cleared first;
    /// left empty if the packet is malformed).
    pub fn filter(&self, input: &[u8], out: &mut Vec<u8>) -> Result<(), message::Malformed> {
        out.clear();
        let result = message::filter(&self.bytecode, &self.strings, self.root, input, out);
        if result.is_err() {
            out.clear();
        }
        result
    }

    /// What `TracePacket` fields the filter keeps: whether it keeps field
    /// `field` at all.
    pub fn keeps_packet_field(&self, field: u32) -> bool {
        self.bytecode.query(self.root, field) != bytecode::Field::Dropped
    }
}

/// Scratch bytes a session's filter keeps between packets (a bigger
/// packet's are freed at the next one).
const SCRATCH_KEPT: usize = 1 << 20;

/// A session's filter and what it did (`TraceStats.filter_stats`).
#[derive(Debug)]
pub struct SessionFilter {
    filter: Arc<TraceFilter>,
    stats: FilterStats,
    /// The packet being filtered, when it came in several slices.
    input: Vec<u8>,
    /// The filtered packet.
    output: Vec<u8>,
}

/// `TraceStats.FilterStats`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FilterStats {
    /// Packets that went through the filter.
    pub input_packets: u64,
    /// Their bytes.
    pub input_bytes: u64,
    /// The bytes they came out as.
    pub output_bytes: u64,
    /// Packets dropped whole as malformed.
    pub errors: u64,
    /// Wall time spent filtering.
    pub time_taken_ns: u64,
    /// Per buffer (in config order, as far as a packet came from),
    /// producer bytes the filter took out.
    pub bytes_discarded_per_buffer: Vec<u64>,
}

impl FilterStats {
    /// As the trace's `filter_stats`.
    pub fn to_proto(&self) -> FilterStatsProto {
        FilterStatsProto {
            input_packets: Some(self.input_packets),
            input_bytes: Some(self.input_bytes),
            output_bytes: Some(self.output_bytes),
            errors: Some(self.errors),
            time_taken_ns: Some(self.time_taken_ns),
            bytes_discarded_per_buffer: self.bytes_discarded_per_buffer.clone(),
        }
    }
}

impl SessionFilter {
    /// A filter with nothing counted yet.
    pub fn new(filter: Arc<TraceFilter>) -> Self {
        Self {
            filter,
            stats: FilterStats::default(),
            input: Vec::new(),
            output: Vec::new(),
        }
    }

    /// The compiled filter, to share with a clone.
    pub fn shared(&self) -> Arc<TraceFilter> {
        Arc::clone(&self.filter)
    }

    /// What was filtered so far.
    pub fn stats(&self) -> &FilterStats {
        &self.stats
    }

    /// Filters the packet made of `slices` (from the session's buffer
    /// `buffer`, or the service's own), timed by `clock`: the filtered
    /// packet, possibly empty, or `None` if it was malformed.
    pub fn packet<'a>(
        &mut self,
        slices: impl IntoIterator<Item = &'a [u8]>,
        buffer: Option<usize>,
        clock: &dyn Environment,
    ) -> Option<&[u8]> {
        let started = clock.now();
        // A big packet's scratch space is not kept for the small ones.
        if self.input.capacity() > SCRATCH_KEPT {
            self.input = Vec::new();
            self.output = Vec::new();
        }
        self.input.clear();
        for s in slices {
            self.input.extend_from_slice(s);
        }
        let result = self.filter.filter(&self.input, &mut self.output);
        let stats = &mut self.stats;
        stats.input_packets += 1;
        stats.input_bytes += self.input.len() as u64;
        stats.time_taken_ns += clock.now().saturating_sub(started);
        if result.is_err() {
            stats.errors += 1;
            return None;
        }
        stats.output_bytes += self.output.len() as u64;
        if let Some(i) = buffer {
            let per_buffer = &mut stats.bytes_discarded_per_buffer;
            if per_buffer.len() <= i {
                per_buffer.resize(i + 1, 0);
            }
            per_buffer[i] += (self.input.len() - self.output.len()) as u64;
        }
        Some(&self.output)
    }

    /// Counts a packet of `len` bytes sent unfiltered (the stats packet).
    pub fn passed(&mut self, len: usize) {
        self.stats.input_packets += 1;
        self.stats.input_bytes += len as u64;
        self.stats.output_bytes += len as u64;
    }
}

/// Builds filter configs the way Perfetto's `proto_filter` tool writes them
/// (tests of the filter and of the sessions that use one).
#[cfg(test)]
pub mod testing {
    pub use super::bytecode::encode;

    /// `field << 3 | SIMPLE_FIELD`.
    pub const fn simple(field: u32) -> u32 {
        field << 3 | 1
    }
    /// `field << 3 | NESTED_FIELD`; the message index follows.
    pub const fn nested(field: u32) -> u32 {
        field << 3 | 3
    }
    /// `field << 3 | FILTER_STRING`.
    pub const fn filter_string(field: u32) -> u32 {
        field << 3 | 4
    }
    /// `END_OF_MESSAGE`.
    pub const END: u32 = 0;
}
