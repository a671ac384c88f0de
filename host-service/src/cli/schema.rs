//! The protocol schema as run-time descriptors, in upstream's shape.
//!
//! The `shmtrace-ipc` build script compiles its `proto/` once; its
//! `FileDescriptorSet` ([`FILE_DESCRIPTOR_SET`]) is loaded here into a
//! [`DescriptorPool`] for prost-reflect (text-format configs, pretty-printing
//! the config a trace carries, editing traces in tests).
//!
//! The IPC layer declares a few sub-messages as raw `bytes` so that the
//! service passes them through untouched (see [`crate::protos`]). The wire
//! format is the same either way, but a person writing a text-format config
//! writes them as messages (`config { track_event_config { ... } }`). So
//! before loading, [`UPSTREAM_MESSAGE_FIELDS`] turns those fields back into
//! the sub-messages upstream declares. Fields left as `bytes` are the
//! data-source configs whose schema this project does not carry; see
//! [`opaque_config_field`].

use std::sync::OnceLock;

use prost_reflect::prost::Message as _;
use prost_reflect::prost_types::field_descriptor_proto::Type;
use prost_reflect::prost_types::{DescriptorProto, FileDescriptorSet};
use prost_reflect::{DescriptorPool, MessageDescriptor};

use crate::protos::FILE_DESCRIPTOR_SET;

/// The proto package of every message.
pub const PACKAGE: &str = "perfetto.protos";

/// `(message, field, upstream message type)`: fields the IPC layer keeps as
/// `bytes` that upstream declares as sub-messages.
pub const UPSTREAM_MESSAGE_FIELDS: &[(&str, &str, &str)] = &[
    ("TraceConfig.DataSource", "config", "DataSourceConfig"),
    ("DataSourceConfig", "track_event_config", "TrackEventConfig"),
    ("TracePacket", "trace_config", "TraceConfig"),
    (
        "DataSourceDescriptor",
        "track_event_descriptor",
        "TrackEventDescriptor",
    ),
    ("EnableTracingRequest", "trace_config", "TraceConfig"),
    ("ChangeTraceConfigRequest", "trace_config", "TraceConfig"),
    ("AttachResponse", "trace_config", "TraceConfig"),
];

/// The descriptor pool, loaded once.
pub fn pool() -> &'static DescriptorPool {
    static POOL: OnceLock<DescriptorPool> = OnceLock::new();
    POOL.get_or_init(|| {
        // Both steps only fail if the build script wrote a broken descriptor
        // set, which `tests::pool_loads` rules out for every build.
        let mut fds = FileDescriptorSet::decode(FILE_DESCRIPTOR_SET)
            .expect("the embedded FileDescriptorSet decodes");
        for &(message, field, ty) in UPSTREAM_MESSAGE_FIELDS {
            retype_field(&mut fds, message, field, ty);
        }
        DescriptorPool::from_file_descriptor_set(fds)
            .expect("the embedded FileDescriptorSet is consistent")
    })
}

/// The descriptor of `perfetto.protos.<name>`.
pub fn message(name: &str) -> MessageDescriptor {
    pool()
        .get_message_by_name(&format!("{PACKAGE}.{name}"))
        .unwrap_or_else(|| panic!("{PACKAGE}.{name} is compiled into the schema"))
}

/// `TraceConfig`.
pub fn trace_config() -> MessageDescriptor {
    message("TraceConfig")
}

/// Whether `message.field` is a data-source config this project only knows
/// as opaque bytes (for example `DataSourceConfig.ftrace_config`): it cannot
/// be written in text format.
pub fn opaque_config_field(message: &MessageDescriptor, field: &str) -> bool {
    message.full_name() == format!("{PACKAGE}.DataSourceConfig")
        && message
            .get_field_by_name(field)
            .is_some_and(|f| f.number() >= 100 && matches!(f.kind(), prost_reflect::Kind::Bytes))
}

/// Declares `message.field` (names relative to the package) as a `ty`
/// sub-message, importing the file that defines `ty`. The table above is
/// checked by the tests; a missing entry is a programming error.
fn retype_field(fds: &mut FileDescriptorSet, message: &str, field: &str, ty: &str) {
    let ty_top = ty.split('.').next().unwrap_or_default();
    let ty_file = fds
        .file
        .iter()
        .find(|f| f.package() == PACKAGE && f.message_type.iter().any(|m| m.name() == ty_top))
        .map(|f| f.name().to_owned())
        .unwrap_or_else(|| panic!("UPSTREAM_MESSAGE_FIELDS: no message {ty}"));
    let mut path = message.split('.');
    let top = path.next().unwrap_or_default();
    let file = fds
        .file
        .iter_mut()
        .find(|f| f.package() == PACKAGE && f.message_type.iter().any(|m| m.name() == top))
        .unwrap_or_else(|| panic!("UPSTREAM_MESSAGE_FIELDS: no message {message}"));
    if file.name() != ty_file && !file.dependency.contains(&ty_file) {
        file.dependency.push(ty_file);
    }
    let msg = file
        .message_type
        .iter_mut()
        .find(|m| m.name() == top)
        .and_then(|m| path.try_fold(m, nested))
        .unwrap_or_else(|| panic!("UPSTREAM_MESSAGE_FIELDS: no message {message}"));
    let f = msg
        .field
        .iter_mut()
        .find(|f| f.name() == field)
        .unwrap_or_else(|| panic!("UPSTREAM_MESSAGE_FIELDS: no field {message}.{field}"));
    assert_eq!(
        f.r#type(),
        Type::Bytes,
        "UPSTREAM_MESSAGE_FIELDS: {message}.{field} is not bytes"
    );
    f.set_type(Type::Message);
    f.type_name = Some(format!(".{PACKAGE}.{ty}"));
}

fn nested<'a>(msg: &'a mut DescriptorProto, name: &str) -> Option<&'a mut DescriptorProto> {
    msg.nested_type.iter_mut().find(|m| m.name() == name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost_reflect::Kind;

    #[test]
    fn pool_loads() {
        let config = trace_config();
        assert_eq!(config.full_name(), "perfetto.protos.TraceConfig");
        assert_eq!(config.get_field_by_name("buffers").unwrap().number(), 1);
    }

    #[test]
    fn raw_fields_become_upstream_messages() {
        for &(message, field, ty) in UPSTREAM_MESSAGE_FIELDS {
            let desc = super::message(message);
            let f = desc.get_field_by_name(field).unwrap();
            match f.kind() {
                Kind::Message(m) => assert_eq!(m.full_name(), format!("{PACKAGE}.{ty}")),
                other => panic!("{message}.{field} is {other:?}"),
            }
        }
    }

    #[test]
    fn unknown_data_source_configs_stay_opaque() {
        let ds = message("DataSourceConfig");
        assert!(opaque_config_field(&ds, "ftrace_config"));
        assert!(!opaque_config_field(&ds, "track_event_config"));
        assert!(!opaque_config_field(&ds, "name"));
        assert!(!opaque_config_field(&trace_config(), "buffers"));
    }
}
