//! A trace file's packets, decoded with prost as a message type that names
//! only the `TracePacket` fields its reader needs (prost skips the others).
//!
//! A trace file is a serialized `perfetto.protos.Trace`: field 1, one
//! length-delimited record per packet, and nothing else.

use std::path::Path;

use prost::bytes::Buf;
use prost::encoding::{decode_key, decode_varint, WireType};
use prost::Message;

use crate::error::{HarnessError, Result};

/// `Trace.packet`.
const PACKET_FIELD: u32 = 1;

/// Decodes every packet of the trace file at `path` as a `P`, in order.
pub fn packets<P: Message + Default>(path: &Path) -> Result<Vec<P>> {
    let bytes = std::fs::read(path).map_err(|source| HarnessError::Io {
        action: "read",
        path: path.into(),
        source,
    })?;
    let bad =
        |what: String| HarnessError::Checker(format!("{}: not a trace: {what}", path.display()));
    let mut rest = bytes.as_slice();
    let mut packets = Vec::new();
    while rest.has_remaining() {
        let (tag, wire_type) = decode_key(&mut rest).map_err(|e| bad(e.to_string()))?;
        if tag != PACKET_FIELD || wire_type != WireType::LengthDelimited {
            return Err(bad(format!(
                "field {tag} ({wire_type:?}) among the packets"
            )));
        }
        let len = decode_varint(&mut rest).map_err(|e| bad(e.to_string()))?;
        let len = usize::try_from(len)
            .ok()
            .filter(|&len| len <= rest.len())
            .ok_or_else(|| bad(format!("packet {} runs past the end", packets.len())))?;
        let (packet, after) = rest.split_at(len);
        let packet =
            P::decode(packet).map_err(|e| bad(format!("packet {}: {e}", packets.len())))?;
        packets.push(packet);
        rest = after;
    }
    Ok(packets)
}
