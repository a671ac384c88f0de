//! The packets a custom data source wrote: `TracePacket.for_testing`
//! (`TestEvent`, field 900), decoded with prost from a trace file, with the
//! trusted fields the service added. The shared checker judges track
//! events; this reads what the producer driver's custom data source
//! (`interop_producer --custom-source`) writes: `str` = the session's label
//! (its `DataSourceConfig.legacy_config`), `seq_value` = the iteration,
//! `counter` = the emitting thread.

use std::collections::BTreeMap;
use std::path::Path;

use prost::Message;

use crate::error::Result;
use crate::trace_file;

/// `perfetto.protos.TracePacket` (the fields read here).
#[derive(Clone, PartialEq, Message)]
struct Packet {
    #[prost(uint32, optional, tag = "10")]
    trusted_packet_sequence_id: Option<u32>,
    #[prost(int32, optional, tag = "79")]
    trusted_pid: Option<i32>,
    #[prost(message, optional, tag = "900")]
    for_testing: Option<TestEvent>,
}

/// `perfetto.protos.TestEvent` (the fields the driver writes).
#[derive(Clone, PartialEq, Message)]
struct TestEvent {
    #[prost(string, optional, tag = "1")]
    str: Option<String>,
    #[prost(uint32, optional, tag = "2")]
    seq_value: Option<u32>,
    #[prost(uint64, optional, tag = "3")]
    counter: Option<u64>,
}

/// One sequence's `for_testing` packets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TestSequence {
    /// The `trusted_pid`s of its packets.
    pub pids: Vec<u32>,
    /// The labels (`TestEvent.str`) of its packets.
    pub labels: Vec<String>,
    /// The emitting threads (`TestEvent.counter`) of its packets.
    pub threads: Vec<u64>,
    /// `TestEvent.seq_value` of each packet, in trace order.
    pub seq_values: Vec<u32>,
}

/// The `for_testing` packets of a trace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TestEvents {
    /// Packets per label (`TestEvent.str`).
    pub by_label: BTreeMap<String, u64>,
    /// Per `trusted_packet_sequence_id`.
    pub sequences: BTreeMap<u32, TestSequence>,
}

/// Decodes the `for_testing` packets of the trace at `path`.
pub fn read(path: &Path) -> Result<TestEvents> {
    let mut events = TestEvents::default();
    for packet in trace_file::packets::<Packet>(path)? {
        let Some(test) = packet.for_testing else {
            continue;
        };
        let label = test.str.unwrap_or_default();
        *events.by_label.entry(label.clone()).or_default() += 1;
        let sequence = events
            .sequences
            .entry(packet.trusted_packet_sequence_id.unwrap_or(0))
            .or_default();
        let pid = packet.trusted_pid.and_then(|p| u32::try_from(p).ok());
        if let Some(pid) = pid.filter(|p| !sequence.pids.contains(p)) {
            sequence.pids.push(pid);
        }
        if !sequence.labels.contains(&label) {
            sequence.labels.push(label);
        }
        let thread = test.counter.unwrap_or(u64::MAX);
        if !sequence.threads.contains(&thread) {
            sequence.threads.push(thread);
        }
        sequence.seq_values.push(test.seq_value.unwrap_or(u32::MAX));
    }
    Ok(events)
}
