//! The subset of Perfetto's `TraceConfig` the scenarios use, as prost
//! messages with the field numbers of `protos/perfetto/config/trace_config.proto`
//! (v59).
//!
//! These are local on purpose: the IPC library in `host-service` is growing
//! its own complete prost `TraceConfig`. When it lands, switch here: the
//! scenarios only build configs through [`TraceConfig::track_event`] and
//! `Scenario::trace_config`, and serialize them with [`encode`].

use prost::Message;

/// `perfetto.protos.TraceConfig` (selected fields).
#[derive(Clone, PartialEq, Message)]
pub struct TraceConfig {
    /// Trace buffers of the session (field 1).
    #[prost(message, repeated, tag = "1")]
    pub buffers: Vec<BufferConfig>,
    /// Data sources to enable (field 2).
    #[prost(message, repeated, tag = "2")]
    pub data_sources: Vec<DataSource>,
    /// Session duration; the service stops the session after it (field 3).
    #[prost(uint32, optional, tag = "3")]
    pub duration_ms: Option<u32>,
    /// Per-producer shared memory sizing (field 6).
    #[prost(message, repeated, tag = "6")]
    pub producers: Vec<ProducerConfig>,
    /// Stream the trace into the file descriptor given with EnableTracing
    /// (field 8).
    #[prost(bool, optional, tag = "8")]
    pub write_into_file: Option<bool>,
    /// Drain period for write_into_file (field 9; default 5000, min 100).
    #[prost(uint32, optional, tag = "9")]
    pub file_write_period_ms: Option<u32>,
    /// How long the service waits for flush acks (field 14).
    #[prost(uint32, optional, tag = "14")]
    pub flush_timeout_ms: Option<u32>,
    /// Periodic incremental-state clearing (field 21).
    #[prost(message, optional, tag = "21")]
    pub incremental_state_config: Option<IncrementalStateConfig>,
    /// How long the service waits for data sources to stop (field 23).
    #[prost(uint32, optional, tag = "23")]
    pub data_source_stop_timeout_ms: Option<u32>,
    /// `CompressionType` (field 24, deprecated; 1 = `COMPRESSION_TYPE_DEFLATE`):
    /// the service deflates each batch into one `compressed_packets`.
    #[prost(int32, optional, tag = "24")]
    pub compression_type: Option<i32>,
    /// What every packet read keeps (field 33).
    #[prost(message, optional, tag = "33")]
    pub trace_filter: Option<TraceFilter>,
    /// Set data sources up on relayed machines' producers too (field 43;
    /// since v54 the service's default is this machine's only).
    #[prost(bool, optional, tag = "43")]
    pub trace_all_machines: Option<bool>,
}

/// `TraceConfig.BufferConfig`.
#[derive(Clone, PartialEq, Message)]
pub struct BufferConfig {
    /// Buffer size in KiB (field 1).
    #[prost(uint32, optional, tag = "1")]
    pub size_kb: Option<u32>,
    /// What happens when the buffer is full (field 4).
    #[prost(enumeration = "FillPolicy", optional, tag = "4")]
    pub fill_policy: Option<i32>,
}

/// `TraceConfig.BufferConfig.FillPolicy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum FillPolicy {
    /// Same as ring buffer.
    Unspecified = 0,
    /// Overwrite the oldest chunks when full.
    RingBuffer = 1,
    /// Drop new data when full.
    Discard = 2,
}

/// `TraceConfig.DataSource`.
#[derive(Clone, PartialEq, Message)]
pub struct DataSource {
    /// The data source's configuration (field 1).
    #[prost(message, optional, tag = "1")]
    pub config: Option<DataSourceConfig>,
}

/// `perfetto.protos.DataSourceConfig` (selected fields).
#[derive(Clone, PartialEq, Message)]
pub struct DataSourceConfig {
    /// Data source name, e.g. `track_event` (field 1).
    #[prost(string, optional, tag = "1")]
    pub name: Option<String>,
    /// Index into `TraceConfig.buffers` (field 2).
    #[prost(uint32, optional, tag = "2")]
    pub target_buffer: Option<u32>,
    /// Track event options (field 113).
    #[prost(message, optional, tag = "113")]
    pub track_event_config: Option<TrackEventConfig>,
    /// A free-form string for the data source (field 1000); the producer
    /// driver's custom data source tags its packets with it.
    #[prost(string, optional, tag = "1000")]
    pub legacy_config: Option<String>,
}

/// `perfetto.protos.TrackEventConfig` (selected fields).
#[derive(Clone, PartialEq, Message)]
pub struct TrackEventConfig {
    /// Category patterns to disable (field 1).
    #[prost(string, repeated, tag = "1")]
    pub disabled_categories: Vec<String>,
    /// Category patterns to enable (field 2).
    #[prost(string, repeated, tag = "2")]
    pub enabled_categories: Vec<String>,
}

/// `TraceConfig.ProducerConfig`.
#[derive(Clone, PartialEq, Message)]
pub struct ProducerConfig {
    /// The producer this applies to (field 1).
    #[prost(string, optional, tag = "1")]
    pub producer_name: Option<String>,
    /// Shared memory buffer size in KiB (field 2).
    #[prost(uint32, optional, tag = "2")]
    pub shm_size_kb: Option<u32>,
    /// Shared memory page size in KiB (field 3).
    #[prost(uint32, optional, tag = "3")]
    pub page_size_kb: Option<u32>,
}

/// `TraceConfig.TraceFilter` (selected fields).
#[derive(Clone, PartialEq, Message)]
pub struct TraceFilter {
    /// Filter bytecode, as Perfetto's `proto_filter` writes it (field 1).
    #[prost(bytes = "vec", optional, tag = "1")]
    pub bytecode: Option<Vec<u8>>,
    /// Rules for the string fields the bytecode marks for filtering
    /// (field 3).
    #[prost(message, optional, tag = "3")]
    pub string_filter_chain: Option<StringFilterChain>,
}

/// `TraceConfig.TraceFilter.StringFilterChain`.
#[derive(Clone, PartialEq, Message)]
pub struct StringFilterChain {
    /// The rules, in order (field 1).
    #[prost(message, repeated, tag = "1")]
    pub rules: Vec<StringFilterRule>,
}

/// `TraceConfig.TraceFilter.StringFilterRule` (selected fields).
#[derive(Clone, PartialEq, Message)]
pub struct StringFilterRule {
    /// `StringFilterPolicy` (field 1; 1 = `SFP_MATCH_REDACT_GROUPS`).
    #[prost(int32, optional, tag = "1")]
    pub policy: Option<i32>,
    /// The pattern (field 2).
    #[prost(string, optional, tag = "2")]
    pub regex_pattern: Option<String>,
}

/// `TraceConfig.IncrementalStateConfig`.
#[derive(Clone, PartialEq, Message)]
pub struct IncrementalStateConfig {
    /// Period of ClearIncrementalState requests (field 1).
    #[prost(uint32, optional, tag = "1")]
    pub clear_period_ms: Option<u32>,
}

impl TraceConfig {
    /// A config with one buffer and the `track_event` data source enabling
    /// `categories`.
    pub fn track_event(size_kb: u32, fill_policy: FillPolicy, categories: &[&str]) -> Self {
        TraceConfig {
            buffers: vec![BufferConfig {
                size_kb: Some(size_kb),
                fill_policy: Some(fill_policy as i32),
            }],
            data_sources: vec![DataSource {
                config: Some(DataSourceConfig {
                    name: Some("track_event".into()),
                    target_buffer: Some(0),
                    track_event_config: Some(TrackEventConfig {
                        disabled_categories: vec![],
                        enabled_categories: categories.iter().map(|c| c.to_string()).collect(),
                    }),
                    legacy_config: None,
                }),
            }],
            ..Default::default()
        }
    }
}

/// Serializes a config to the bytes a consumer hands to EnableTracing.
pub fn encode(config: &TraceConfig) -> Vec<u8> {
    config.encode_to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_field_numbers_of_trace_config_proto() {
        let mut config = TraceConfig::track_event(1024, FillPolicy::Discard, &["a"]);
        config.duration_ms = Some(2000);
        config.incremental_state_config = Some(IncrementalStateConfig {
            clear_period_ms: Some(100),
        });
        let bytes = encode(&config);
        let expected: &[u8] = &[
            0x0a, 0x05, 0x08, 0x80, 0x08, 0x20, 0x02, // buffers { size_kb 1024 fill DISCARD }
            0x12, 0x17, 0x0a, 0x15, // data_sources { config {
            0x0a, 0x0b, b't', b'r', b'a', b'c', b'k', b'_', b'e', b'v', b'e', b'n', b't', 0x10,
            0x00, // target_buffer 0
            0x8a, 0x07, 0x03, 0x12, 0x01,
            b'a', // track_event_config (113) { enabled "a" } } }
            0x18, 0xd0, 0x0f, // duration_ms 2000
            0xaa, 0x01, 0x02, 0x08,
            0x64, // incremental_state_config (21) { clear_period_ms 100 }
        ];
        assert_eq!(bytes, expected);
    }
}
