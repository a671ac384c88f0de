//! The trace vocabulary: field numbers and enum values of the Perfetto trace
//! protos this workspace writes, named after the proto definitions.
//!
//! One module per message (`protos/perfetto/trace/trace_packet.proto`,
//! `protos/perfetto/trace/track_event/*.proto`,
//! `protos/perfetto/trace/clock_snapshot.proto`,
//! `protos/perfetto/trace/interned_data/interned_data.proto`,
//! `protos/perfetto/common/builtin_clock.proto`), each constant the field
//! number of the field of the same name. Encoders take these numbers
//! ([`Message`](crate::proto::Message), [`Cursor`](crate::proto::Cursor));
//! constant tag bytes for hand-scheduled stores are derived from them with
//! [`tag1`] and [`tag2`], never typed by hand.
//!
//! Only the fields someone writes or checks are listed; the proto files are
//! the authority for the rest.

use crate::proto::wire::{tag, WireType};

/// The single tag byte of `field` with wire type `wire_type`. Fails to
/// compile (in a `const`) if the tag needs more than one byte (fields 16 and
/// up).
pub const fn tag1(field: u32, wire_type: WireType) -> u8 {
    let t = tag(field, wire_type);
    assert!(t < 0x80, "the tag takes more than one byte");
    t as u8
}

/// The two tag bytes of `field` with wire type `wire_type`. Fails to compile
/// (in a `const`) unless the tag takes exactly two bytes (fields 16..=2047).
pub const fn tag2(field: u32, wire_type: WireType) -> [u8; 2] {
    let t = tag(field, wire_type);
    assert!(t >= 0x80 && t < 0x4000, "the tag does not take two bytes");
    [(t as u8) | 0x80, (t >> 7) as u8]
}

/// `TracePacket` (`protos/perfetto/trace/trace_packet.proto`).
pub mod trace_packet {
    /// `Trace.packet`: a trace file is a sequence of these fields.
    pub const TRACE_PACKET_IN_TRACE: u32 = 1;
    /// `trusted_uid` (int32, written by the service only).
    pub const TRUSTED_UID: u32 = 3;
    /// `clock_snapshot` ([`ClockSnapshot`](super::clock_snapshot)).
    pub const CLOCK_SNAPSHOT: u32 = 6;
    /// `timestamp` (uint64).
    pub const TIMESTAMP: u32 = 8;
    /// `trusted_packet_sequence_id` (uint32, written by the service only).
    pub const TRUSTED_PACKET_SEQUENCE_ID: u32 = 10;
    /// `track_event` ([`TrackEvent`](super::track_event)).
    pub const TRACK_EVENT: u32 = 11;
    /// `interned_data` ([`InternedData`](super::interned_data)).
    pub const INTERNED_DATA: u32 = 12;
    /// `sequence_flags` (uint32, [`SequenceFlags`](super::sequence_flags)).
    pub const SEQUENCE_FLAGS: u32 = 13;
    /// `incremental_state_cleared` (bool, deprecated: superseded by
    /// [`SEQUENCE_FLAGS`]).
    pub const INCREMENTAL_STATE_CLEARED: u32 = 41;
    /// `trace_config` (written by the service only).
    pub const TRACE_CONFIG: u32 = 33;
    /// `trace_stats` (written by the service only).
    pub const TRACE_STATS: u32 = 35;
    /// `synchronization_marker` (bytes, written by the service only).
    pub const SYNCHRONIZATION_MARKER: u32 = 36;
    /// `previous_packet_dropped` (uint32 `DataLossReason` bits).
    pub const PREVIOUS_PACKET_DROPPED: u32 = 42;
    /// `system_info`.
    pub const SYSTEM_INFO: u32 = 45;
    /// `trigger` ([`Trigger`](super::trigger), written by the service only).
    pub const TRIGGER: u32 = 46;
    /// `clone_snapshot_trigger` ([`Trigger`](super::trigger), written by
    /// the service only, in a session cloned for a CLONE_SNAPSHOT trigger).
    pub const CLONE_SNAPSHOT_TRIGGER: u32 = 113;
    /// `compressed_packets` (bytes, written by the service only).
    pub const COMPRESSED_PACKETS: u32 = 50;
    /// `timestamp_clock_id` (uint32).
    pub const TIMESTAMP_CLOCK_ID: u32 = 58;
    /// `trace_packet_defaults`
    /// ([`TracePacketDefaults`](super::trace_packet_defaults)).
    pub const TRACE_PACKET_DEFAULTS: u32 = 59;
    /// `track_descriptor` ([`TrackDescriptor`](super::track_descriptor)).
    pub const TRACK_DESCRIPTOR: u32 = 60;
    /// `service_event` (written by the service only).
    pub const SERVICE_EVENT: u32 = 69;
    /// `trusted_pid` (int32, written by the service only).
    pub const TRUSTED_PID: u32 = 79;
    /// `first_packet_on_sequence` (bool).
    pub const FIRST_PACKET_ON_SEQUENCE: u32 = 87;
    /// `trace_uuid`.
    pub const TRACE_UUID: u32 = 89;
    /// `machine_id` (uint32, written by the service only).
    pub const MACHINE_ID: u32 = 98;
    /// `remote_clock_sync` (written by the service only, for relayed
    /// machines).
    pub const REMOTE_CLOCK_SYNC: u32 = 107;
    /// `trace_provenance` (written by the service only).
    pub const TRACE_PROVENANCE: u32 = 124;
    /// `protovms` (written by the service only).
    pub const PROTOVMS: u32 = 125;
    /// `zstd_compressed_packets` (bytes, written by the service only).
    pub const ZSTD_COMPRESSED_PACKETS: u32 = 133;
    /// `for_testing` (`TestEvent`).
    pub const FOR_TESTING: u32 = 900;
}

/// `TracePacket.SequenceFlags` bits (`sequence_flags`).
pub mod sequence_flags {
    /// The sequence's incremental state (interned data, defaults, clocks on
    /// it) starts anew at this packet.
    pub const SEQ_INCREMENTAL_STATE_CLEARED: u32 = 1;
    /// This packet refers to incremental state; readers that lost data drop
    /// it until the next clear.
    pub const SEQ_NEEDS_INCREMENTAL_STATE: u32 = 2;
}

/// `DataLossReason` bits of `TracePacket.previous_packet_dropped`.
pub mod data_loss {
    /// Set on every loss.
    pub const PRESENT: u32 = 1;
    /// Packets were lost because the shared memory buffer was full.
    pub const SMB_FULL: u32 = 256;
}

/// `TracePacketDefaults` (`protos/perfetto/trace/trace_packet_defaults.proto`).
pub mod trace_packet_defaults {
    /// `timestamp_clock_id` (uint32).
    pub const TIMESTAMP_CLOCK_ID: u32 = 58;
    /// `track_event_defaults`
    /// ([`TrackEventDefaults`](super::track_event_defaults)).
    pub const TRACK_EVENT_DEFAULTS: u32 = 11;
}

/// `TrackEventDefaults` (`protos/perfetto/trace/track_event/track_event.proto`).
pub mod track_event_defaults {
    /// `track_uuid` (uint64).
    pub const TRACK_UUID: u32 = 11;
}

/// `TrackEvent` (`protos/perfetto/trace/track_event/track_event.proto`).
pub mod track_event {
    /// `category_iids` (repeated uint64).
    pub const CATEGORY_IIDS: u32 = 3;
    /// `debug_annotations` (repeated
    /// [`DebugAnnotation`](super::debug_annotation)).
    pub const DEBUG_ANNOTATIONS: u32 = 4;
    /// `type` ([`Type`]).
    pub const TYPE: u32 = 9;
    /// `name_iid` (uint64).
    pub const NAME_IID: u32 = 10;
    /// `track_uuid` (uint64).
    pub const TRACK_UUID: u32 = 11;
    /// `categories` (repeated string).
    pub const CATEGORIES: u32 = 22;
    /// `name` (string).
    pub const NAME: u32 = 23;
    /// `counter_value` (int64).
    pub const COUNTER_VALUE: u32 = 30;
    /// `double_counter_value` (double).
    pub const DOUBLE_COUNTER_VALUE: u32 = 44;
    /// `flow_ids` (repeated fixed64).
    pub const FLOW_IDS: u32 = 47;
    /// `terminating_flow_ids` (repeated fixed64).
    pub const TERMINATING_FLOW_IDS: u32 = 48;

    /// `TrackEvent.Type`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    #[repr(u8)]
    pub enum Type {
        /// `TYPE_SLICE_BEGIN`.
        SliceBegin = 1,
        /// `TYPE_SLICE_END`: ends the innermost open slice on the track.
        SliceEnd = 2,
        /// `TYPE_INSTANT`.
        Instant = 3,
        /// `TYPE_COUNTER`.
        Counter = 4,
    }
}

/// `InternedData` (`protos/perfetto/trace/interned_data/interned_data.proto`).
/// Each entry of these fields is an `{iid = 1, name = 2}` message
/// ([`interned_string`]).
pub mod interned_data {
    /// `event_categories` (repeated `EventCategory`).
    pub const EVENT_CATEGORIES: u32 = 1;
    /// `event_names` (repeated `EventName`).
    pub const EVENT_NAMES: u32 = 2;
    /// `debug_annotation_names` (repeated `DebugAnnotationName`).
    pub const DEBUG_ANNOTATION_NAMES: u32 = 3;
}

/// `EventCategory`, `EventName` and `DebugAnnotationName`: an interned
/// string.
pub mod interned_string {
    /// `iid` (uint64, from 1; 0 means unset).
    pub const IID: u32 = 1;
    /// `name` (string).
    pub const NAME: u32 = 2;
}

/// `DebugAnnotation` (`protos/perfetto/trace/track_event/debug_annotation.proto`).
pub mod debug_annotation {
    /// `name_iid` (uint64).
    pub const NAME_IID: u32 = 1;
    /// `bool_value`.
    pub const BOOL_VALUE: u32 = 2;
    /// `uint_value` (uint64).
    pub const UINT_VALUE: u32 = 3;
    /// `int_value` (int64).
    pub const INT_VALUE: u32 = 4;
    /// `double_value`.
    pub const DOUBLE_VALUE: u32 = 5;
    /// `string_value`.
    pub const STRING_VALUE: u32 = 6;
    /// `pointer_value` (uint64).
    pub const POINTER_VALUE: u32 = 7;
    /// `name` (string).
    pub const NAME: u32 = 10;
    /// `dict_entries` (repeated DebugAnnotation).
    pub const DICT_ENTRIES: u32 = 11;
    /// `array_values` (repeated DebugAnnotation).
    pub const ARRAY_VALUES: u32 = 12;
}

/// `TrackDescriptor` (`protos/perfetto/trace/track_event/track_descriptor.proto`).
pub mod track_descriptor {
    /// `uuid` (uint64).
    pub const UUID: u32 = 1;
    /// `name` (string).
    pub const NAME: u32 = 2;
    /// `process` ([`ProcessDescriptor`](super::process_descriptor)).
    pub const PROCESS: u32 = 3;
    /// `thread` ([`ThreadDescriptor`](super::thread_descriptor)).
    pub const THREAD: u32 = 4;
    /// `parent_uuid` (uint64).
    pub const PARENT_UUID: u32 = 5;
    /// `counter` ([`CounterDescriptor`](super::counter_descriptor)).
    pub const COUNTER: u32 = 8;
    /// `child_ordering` ([`ChildTracksOrdering`]).
    pub const CHILD_ORDERING: u32 = 11;
    /// `sibling_order_rank` (int32).
    pub const SIBLING_ORDER_RANK: u32 = 12;
    /// `description` (string).
    pub const DESCRIPTION: u32 = 14;

    /// `TrackDescriptor.ChildTracksOrdering`: how a UI orders the track's
    /// children.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    #[repr(u8)]
    pub enum ChildTracksOrdering {
        /// `UNKNOWN`: the UI decides.
        #[default]
        Unknown = 0,
        /// `LEXICOGRAPHIC`: alphabetical by name.
        Lexicographic = 1,
        /// `CHRONOLOGICAL`: by first event.
        Chronological = 2,
        /// `EXPLICIT`: by `sibling_order_rank`.
        Explicit = 3,
    }
}

/// `ProcessDescriptor` (`protos/perfetto/trace/track_event/process_descriptor.proto`).
pub mod process_descriptor {
    /// `pid` (int32).
    pub const PID: u32 = 1;
    /// `cmdline` (repeated string).
    pub const CMDLINE: u32 = 2;
    /// `process_name` (string).
    pub const PROCESS_NAME: u32 = 6;
}

/// `ThreadDescriptor` (`protos/perfetto/trace/track_event/thread_descriptor.proto`).
pub mod thread_descriptor {
    /// `pid` (int32).
    pub const PID: u32 = 1;
    /// `tid` (int64).
    pub const TID: u32 = 2;
    /// `thread_name` (string).
    pub const THREAD_NAME: u32 = 5;
}

/// `CounterDescriptor` (`protos/perfetto/trace/track_event/counter_descriptor.proto`).
pub mod counter_descriptor {
    /// `categories` (repeated string).
    pub const CATEGORIES: u32 = 2;
    /// `unit` ([`Unit`]).
    pub const UNIT: u32 = 3;
    /// `unit_multiplier` (int64).
    pub const UNIT_MULTIPLIER: u32 = 4;
    /// `is_incremental` (bool).
    pub const IS_INCREMENTAL: u32 = 5;
    /// `unit_name` (string).
    pub const UNIT_NAME: u32 = 6;

    /// `CounterDescriptor.Unit`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    #[repr(u8)]
    pub enum Unit {
        /// `UNIT_UNSPECIFIED`.
        #[default]
        Unspecified = 0,
        /// `UNIT_TIME_NS`.
        TimeNs = 1,
        /// `UNIT_COUNT`.
        Count = 2,
        /// `UNIT_SIZE_BYTES`.
        SizeBytes = 3,
    }
}

/// `Trigger` (`protos/perfetto/trace/trigger.proto`): a trigger a session
/// received.
pub mod trigger {
    /// `trigger_name` (string).
    pub const TRIGGER_NAME: u32 = 1;
    /// `producer_name` (string).
    pub const PRODUCER_NAME: u32 = 2;
    /// `trusted_producer_uid` (int32).
    pub const TRUSTED_PRODUCER_UID: u32 = 3;
    /// `stop_delay_ms` (uint64).
    pub const STOP_DELAY_MS: u32 = 4;
}

/// `TrackEventDescriptor`
/// (`protos/perfetto/common/track_event_descriptor.proto`): the categories
/// a track event data source advertises in its `DataSourceDescriptor`.
pub mod track_event_descriptor {
    /// `available_categories` (repeated
    /// [`TrackEventCategory`](super::track_event_category)).
    pub const AVAILABLE_CATEGORIES: u32 = 1;
}

/// `TrackEventCategory`
/// (`protos/perfetto/common/track_event_descriptor.proto`).
pub mod track_event_category {
    /// `name` (string).
    pub const NAME: u32 = 1;
    /// `description` (string).
    pub const DESCRIPTION: u32 = 2;
    /// `tags` (repeated string).
    pub const TAGS: u32 = 3;
}

/// `ClockSnapshot` (`protos/perfetto/trace/clock_snapshot.proto`).
pub mod clock_snapshot {
    /// `clocks` (repeated [`Clock`](super::clock)).
    pub const CLOCKS: u32 = 1;
    /// `primary_trace_clock` (enum `BuiltinClock`).
    pub const PRIMARY_TRACE_CLOCK: u32 = 2;
}

/// `ClockSnapshot.Clock`.
pub mod clock {
    /// `clock_id` (uint32, see [`builtin_clock`](super::builtin_clock)).
    pub const CLOCK_ID: u32 = 1;
    /// `timestamp` (uint64).
    pub const TIMESTAMP: u32 = 2;
    /// `is_incremental` (bool).
    pub const IS_INCREMENTAL: u32 = 3;
    /// `unit_multiplier_ns` (uint64).
    pub const UNIT_MULTIPLIER_NS: u32 = 4;
}

/// Clock ids (`protos/perfetto/common/builtin_clock.proto` and
/// `ClockSnapshot.Clock.clock_id`): 1..=63 are builtin, 64..=127 are
/// user-defined clocks scoped to one packet sequence, 128 and up are
/// reserved.
pub mod builtin_clock {
    /// `BUILTIN_CLOCK_REALTIME`.
    pub const REALTIME: u32 = 1;
    /// `BUILTIN_CLOCK_REALTIME_COARSE`.
    pub const REALTIME_COARSE: u32 = 2;
    /// `BUILTIN_CLOCK_MONOTONIC`.
    pub const MONOTONIC: u32 = 3;
    /// `BUILTIN_CLOCK_MONOTONIC_COARSE`.
    pub const MONOTONIC_COARSE: u32 = 4;
    /// `BUILTIN_CLOCK_MONOTONIC_RAW`.
    pub const MONOTONIC_RAW: u32 = 5;
    /// `BUILTIN_CLOCK_BOOTTIME`: the default trace clock.
    pub const BOOTTIME: u32 = 6;
    /// `BUILTIN_CLOCK_TSC`: the x86-64 time-stamp counter, in ticks, not
    /// nanoseconds.
    pub const TSC: u32 = 9;
    /// `BUILTIN_CLOCK_PERF`: the clock of perf events.
    pub const PERF: u32 = 10;
    /// `BUILTIN_CLOCK_TRACE_FILE`: the clock of the trace file's own
    /// timestamps.
    pub const TRACE_FILE: u32 = 11;
    /// The first sequence-scoped clock id.
    pub const FIRST_SEQUENCE_CLOCK: u32 = 64;
    /// The last sequence-scoped clock id.
    pub const LAST_SEQUENCE_CLOCK: u32 = 127;
    /// The sequence-scoped clock track events are stamped on as deltas (the
    /// C++ SDK's choice of id).
    pub const INCREMENTAL: u32 = 64;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_tags_match_the_wire_format() {
        assert_eq!(tag1(trace_packet::TIMESTAMP, WireType::Varint), 0x40);
        assert_eq!(
            tag1(trace_packet::TRACK_EVENT, WireType::LengthDelimited),
            0x5A
        );
        assert_eq!(
            tag2(trace_packet::TIMESTAMP_CLOCK_ID, WireType::Varint),
            [0xD0, 0x03]
        );
        assert_eq!(tag2(track_event::FLOW_IDS, WireType::Fixed64), [0xF9, 0x02]);
        assert_eq!(
            tag2(trace_packet::PREVIOUS_PACKET_DROPPED, WireType::Varint),
            [0xD0, 0x02]
        );
        assert_eq!(
            tag2(trace_packet::FIRST_PACKET_ON_SEQUENCE, WireType::Varint),
            [0xB8, 0x05]
        );
    }
}
