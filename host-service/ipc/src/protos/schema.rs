//! Per-message field tables generated from the `.proto` files.
//!
//! prost encodes fields in field-number order; the real Perfetto encodes them
//! in declaration order and sizes nested messages its own way. The tables here
//! (one [`MessageSchema`] per message, written by `build.rs`) are what
//! [`canonical`](super::canonical) needs to reproduce Perfetto's bytes: the
//! declaration order of the fields, and which fields are sub-messages.

/// How the canonical encoder treats a field.
#[derive(Debug, Clone, Copy)]
pub enum FieldKind {
    /// A scalar, string, bytes or packed field: copied as encoded.
    Scalar,
    /// A sub-message: re-encoded recursively, length-prefixed like protozero.
    Message(&'static MessageSchema),
    /// A `bytes` field holding a whole serialized message (a config passed
    /// through verbatim): content copied as is, length-prefixed like protozero.
    RawMessage,
}

/// One declared field.
#[derive(Debug)]
pub struct FieldSchema {
    /// Field number.
    pub number: u32,
    /// Field name in the `.proto` file.
    pub name: &'static str,
    /// How the field is encoded.
    pub kind: FieldKind,
}

/// The declared fields of one message.
#[derive(Debug)]
pub struct MessageSchema {
    /// Fully qualified proto name, e.g. `perfetto.protos.TraceConfig`.
    pub name: &'static str,
    /// Fields in declaration order.
    pub fields: &'static [FieldSchema],
    /// `(field number, index into fields)`, sorted by field number.
    pub by_number: &'static [(u32, usize)],
}

impl MessageSchema {
    /// The declaration index and schema of field `number`, if declared.
    pub fn field(&self, number: u32) -> Option<(usize, &'static FieldSchema)> {
        let pos = self
            .by_number
            .binary_search_by_key(&number, |&(n, _)| n)
            .ok()?;
        let &(_, index) = self.by_number.get(pos)?;
        Some((index, self.fields.get(index)?))
    }
}

/// A generated message type together with its field table.
pub trait ProtoSchema: prost::Message + Default {
    /// The field table of this message.
    fn schema() -> &'static MessageSchema;
}

include!(concat!(env!("OUT_DIR"), "/schema.rs"));

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protos::DataSourceConfig;

    #[test]
    fn data_source_config_fields_follow_upstream_declaration_order() {
        let s = DataSourceConfig::schema();
        assert_eq!(s.name, "perfetto.protos.DataSourceConfig");
        let first: Vec<u32> = s.fields.iter().take(9).map(|f| f.number).collect();
        assert_eq!(first, [1, 2, 11, 3, 122, 7, 6, 8, 4]);
        let (index, field) = s.field(113).unwrap();
        assert_eq!(field.name, "track_event_config");
        assert_eq!(s.fields[index].number, 113);
        assert!(matches!(
            s.field(101).unwrap().1.kind,
            FieldKind::RawMessage
        ));
        assert!(
            matches!(s.field(10).unwrap().1.kind, FieldKind::Message(m) if m.name == "perfetto.protos.PriorityBoostConfig")
        );
        assert!(s.field(9999).is_none());
    }
}
