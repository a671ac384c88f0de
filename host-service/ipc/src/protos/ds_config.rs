//! Passing a consumer's `DataSourceConfig` through the service to a producer.
//!
//! The consumer's config travels as raw bytes (`TraceConfig.DataSource.config`)
//! and must reach the producer with every field the consumer wrote, including
//! fields this project has no message for (a Chrome consumer's
//! `chrome_config`, an out-of-tree extension, a field newer than this code).
//! The service only owns a handful of fields ([`ServiceFields`]).
//!
//! [`rewrite`] therefore never decodes the config into a struct: it splits
//! the bytes into fields, drops the consumer's values of the service-owned
//! fields, adds the service's values, and writes the fields back in
//! `DataSourceConfig` declaration order with unknown fields last — the order
//! Perfetto's own service produces, so the producer sees the same bytes a
//! real `traced` would send. Every other field is copied byte for byte.

use std::borrow::Cow;

use bytes::Bytes;

use super::schema::ProtoSchema;
use super::wire::{put_tag, put_varint, Fields, WireError, WireType};
use super::DataSourceConfig;

/// Field numbers of `DataSourceConfig` the service owns.
mod field {
    pub const TARGET_BUFFER: u32 = 2;
    pub const TRACE_DURATION_MS: u32 = 3;
    pub const TRACING_SESSION_ID: u32 = 4;
    pub const ENABLE_EXTRA_GUARDRAILS: u32 = 6;
    pub const STOP_TIMEOUT_MS: u32 = 7;
    pub const SESSION_INITIATOR: u32 = 8;
    pub const PREFER_SUSPEND_CLOCK_FOR_DURATION: u32 = 122;
    pub const SUPPORTS_TRACING_V2: u32 = 147;
}

/// The values the service writes into every data source config it sends.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServiceFields {
    /// The global buffer id (replaces the consumer's buffer index).
    pub target_buffer: u32,
    /// `TraceConfig.duration_ms`.
    pub trace_duration_ms: u32,
    /// `TraceConfig.prefer_suspend_clock_for_duration`; written only when
    /// true (a consumer-written value is otherwise left alone).
    pub prefer_suspend_clock_for_duration: bool,
    /// The session's data source stop timeout.
    pub stop_timeout_ms: u32,
    /// `TraceConfig.enable_extra_guardrails`.
    pub enable_extra_guardrails: bool,
    /// `DataSourceConfig.SessionInitiator` value; always overwritten so a
    /// producer can trust it.
    pub session_initiator: i32,
    /// The tracing session id.
    pub tracing_session_id: u64,
    /// Whether the producer may use tracing v2 for this instance; written
    /// when true or when the consumer wrote the field.
    pub supports_tracing_v2: bool,
}

/// Rewrites the service-owned fields of the serialized `DataSourceConfig`
/// `raw`, keeping every other field byte for byte.
///
/// Fails only if `raw` is not well-formed protobuf.
pub fn rewrite(raw: &[u8], set: &ServiceFields) -> Result<Bytes, WireError> {
    let schema = DataSourceConfig::schema();
    let order = |number: u32| schema.field(number).map_or(usize::MAX, |(index, _)| index);

    let mut had_v2 = false;
    let mut overrides: Vec<(u32, u64)> = vec![
        (field::TARGET_BUFFER, u64::from(set.target_buffer)),
        (field::TRACE_DURATION_MS, u64::from(set.trace_duration_ms)),
        (field::STOP_TIMEOUT_MS, u64::from(set.stop_timeout_ms)),
        (
            field::ENABLE_EXTRA_GUARDRAILS,
            u64::from(set.enable_extra_guardrails),
        ),
        // Enums are sign-extended int32 varints.
        (
            field::SESSION_INITIATOR,
            i64::from(set.session_initiator) as u64,
        ),
        (field::TRACING_SESSION_ID, set.tracing_session_id),
    ];
    if set.prefer_suspend_clock_for_duration {
        overrides.push((field::PREFER_SUSPEND_CLOCK_FOR_DURATION, 1));
    }

    let mut pieces: Vec<(usize, Cow<'_, [u8]>)> = Vec::new();
    for f in Fields::new(raw) {
        let f = f?;
        if f.number == field::SUPPORTS_TRACING_V2 {
            had_v2 = true;
            continue;
        }
        if overrides.iter().any(|&(n, _)| n == f.number) {
            continue;
        }
        pieces.push((order(f.number), Cow::Borrowed(f.bytes)));
    }
    if set.supports_tracing_v2 || had_v2 {
        overrides.push((
            field::SUPPORTS_TRACING_V2,
            u64::from(set.supports_tracing_v2),
        ));
    }
    for (number, value) in overrides {
        let mut bytes = Vec::with_capacity(12);
        put_tag(&mut bytes, number, WireType::Varint);
        put_varint(&mut bytes, value);
        pieces.push((order(number), Cow::Owned(bytes)));
    }
    pieces.sort_by_key(|(order, _)| *order);

    let mut out = Vec::with_capacity(raw.len() + 32);
    for (_, bytes) in &pieces {
        out.extend_from_slice(bytes);
    }
    Ok(out.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn reproduces_perfettos_setup_data_source_config() {
        // The consumer's config and the service's from the golden capture.
        let consumer = b"\x0a\x0btrack_event\x10\x00\x8a\x07\x03\x12\x01*";
        let set = ServiceFields {
            target_buffer: 1,
            trace_duration_ms: 2000,
            stop_timeout_ms: 5000,
            tracing_session_id: 1,
            ..Default::default()
        };
        let out = rewrite(consumer, &set).unwrap();
        assert_eq!(
            &out[..],
            b"\x0a\x0btrack_event\x10\x01\x18\xd0\x0f\x38\x88\x27\x30\x00\x40\x00\x20\x01\x8a\x07\x03\x12\x01*"
        );
    }

    #[test]
    fn consumer_cannot_forge_service_fields() {
        let consumer = DataSourceConfig {
            name: Some("x".into()),
            session_initiator: Some(1),
            tracing_session_id: Some(99),
            supports_tracing_v2: Some(true),
            ..Default::default()
        }
        .encode_to_vec();
        let out = rewrite(&consumer, &ServiceFields::default()).unwrap();
        let got = DataSourceConfig::decode(out).unwrap();
        assert_eq!(got.session_initiator, Some(0));
        assert_eq!(got.tracing_session_id, Some(0));
        assert_eq!(got.supports_tracing_v2, Some(false));
        assert_eq!(got.prefer_suspend_clock_for_duration, None);
    }

    #[test]
    fn optional_fields_are_written_only_when_due() {
        let set = ServiceFields {
            prefer_suspend_clock_for_duration: true,
            supports_tracing_v2: true,
            session_initiator: -1,
            ..Default::default()
        };
        let got = DataSourceConfig::decode(rewrite(b"", &set).unwrap()).unwrap();
        assert_eq!(got.prefer_suspend_clock_for_duration, Some(true));
        assert_eq!(got.supports_tracing_v2, Some(true));
        assert_eq!(got.session_initiator, Some(-1));
    }

    #[test]
    fn malformed_configs_are_rejected() {
        assert_eq!(
            rewrite(b"\x0a\x05ab", &ServiceFields::default()),
            Err(WireError::Truncated)
        );
    }
}
