//! A trace file's packets, decoded with prost as a message type that names
//! only the `TracePacket` fields its reader needs (prost skips the others).
//!
//! A trace file is a serialized `perfetto.protos.Trace`: field 1, one
//! length-delimited record per packet, and nothing else.

use std::collections::{BTreeMap, BTreeSet};
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

/// `perfetto.protos.TracePacket`: where a packet came from, and whether it
/// is a track event.
#[derive(Clone, PartialEq, Message)]
struct PacketOrigin {
    #[prost(uint32, optional, tag = "10")]
    trusted_packet_sequence_id: Option<u32>,
    #[prost(bytes = "vec", optional, tag = "11")]
    track_event: Option<Vec<u8>>,
    #[prost(int32, optional, tag = "79")]
    trusted_pid: Option<i32>,
}

/// The sequences (`trusted_packet_sequence_id`) that carry track events in
/// the trace file at `path`, per producer pid (`trusted_pid`).
pub fn track_event_sequences(path: &Path) -> Result<BTreeMap<u32, BTreeSet<u32>>> {
    let mut sequences: BTreeMap<u32, BTreeSet<u32>> = BTreeMap::new();
    for packet in packets::<PacketOrigin>(path)? {
        if packet.track_event.is_none() {
            continue;
        }
        if let (Some(pid), Some(sequence)) = (
            packet.trusted_pid.and_then(|p| u32::try_from(p).ok()),
            packet.trusted_packet_sequence_id,
        ) {
            sequences.entry(pid).or_default().insert(sequence);
        }
    }
    Ok(sequences)
}
