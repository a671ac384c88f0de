//! Test model shared by the round-trip proptests (`abi/tests/roundtrip.rs`)
//! and the `writer_roundtrip` fuzz target (`fuzz/`, which includes this file
//! by path): a protobuf value tree, a writer for it, an exact checker for
//! what comes back, and a minimal service that moves chunks out of the SMB,
//! applies patches and reassembles packets.
//!
//! The checker is exact except for one degree of freedom the ABI allows: a
//! nested message's size may be a 1-byte varint (compacted, <= 127) or a
//! 4-byte redundant varint (it spanned chunks, or was not compacted). Every
//! other byte — tags, values, lengths, payloads, field order — must be the
//! canonical encoding of the model, with nothing left over.

#![allow(dead_code)] // each includer uses a different subset

use std::collections::BTreeMap;

use shmtrace_abi::layout::{ChunkFlags, Packets};
use shmtrace_abi::proto::{Message, Sink, MAX_DEPTH};
use shmtrace_abi::reader::{apply_patch, FragmentEvent, Fragments};
use shmtrace_abi::region::{Record, RegionReader};

/// The buffer id every test writer commits to.
pub const TARGET_BUFFER: u16 = 5;

/// A protobuf field value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// `uint64`.
    Varint(u64),
    /// `fixed64`.
    Fixed64(u64),
    /// `fixed32`.
    Fixed32(u32),
    /// `bytes`.
    Bytes(Vec<u8>),
    /// A nested message.
    Nested(Vec<(u32, Value)>),
}

/// A message: fields in order.
pub type Fields = Vec<(u32, Value)>;

/// Writes `fields` into `m`, calling `tick` after every leaf field (the
/// service gets to run between fields, as it would concurrently).
pub fn write_fields<S: Sink>(m: &mut Message<'_, S>, fields: &Fields, tick: &mut dyn FnMut()) {
    for (field, value) in fields {
        match value {
            Value::Varint(v) => m.uint64(*field, *v),
            Value::Fixed64(v) => m.fixed64(*field, *v),
            Value::Fixed32(v) => m.fixed32(*field, *v),
            Value::Bytes(b) => m.bytes(*field, b),
            Value::Nested(children) => m.nested(*field, |c| write_fields(c, children, tick)),
        }
        tick();
    }
}

pub fn read_varint(buf: &[u8]) -> Result<(u64, usize), String> {
    let mut v = 0u64;
    for (i, &b) in buf.iter().enumerate().take(10) {
        v |= u64::from(b & 0x7F) << (7 * i);
        if b & 0x80 == 0 {
            return Ok((v, i + 1));
        }
    }
    Err(format!("bad varint at {:02x?}", &buf[..buf.len().min(10)]))
}

pub fn varint_len(v: u64) -> usize {
    let bits = 64 - (v | 1).leading_zeros() as usize;
    bits.div_ceil(7)
}

/// Checks that `buf` is exactly the encoding of `expected` (see the module
/// docs for the one allowed variation).
pub fn check_message(mut buf: &[u8], expected: &Fields) -> Result<(), String> {
    for (field, value) in expected {
        let wire_type = match value {
            Value::Varint(_) => 0,
            Value::Fixed64(_) => 1,
            Value::Bytes(_) | Value::Nested(_) => 2,
            Value::Fixed32(_) => 5,
        };
        let (tag, n) = read_varint(buf)?;
        let want = (u64::from(*field) << 3) | wire_type;
        if tag != want || n != varint_len(want) {
            return Err(format!(
                "field {field}: tag {tag:#x} ({n} bytes), expected {want:#x}"
            ));
        }
        buf = &buf[n..];
        match value {
            Value::Varint(v) => {
                let (got, n) = read_varint(buf)?;
                if got != *v || n != varint_len(*v) {
                    return Err(format!(
                        "field {field}: varint {got} ({n} bytes), expected {v}"
                    ));
                }
                buf = &buf[n..];
            }
            Value::Fixed64(v) => {
                let got = buf.get(..8).ok_or("truncated fixed64")?;
                if got != v.to_le_bytes() {
                    return Err(format!("field {field}: fixed64 {got:02x?}"));
                }
                buf = &buf[8..];
            }
            Value::Fixed32(v) => {
                let got = buf.get(..4).ok_or("truncated fixed32")?;
                if got != v.to_le_bytes() {
                    return Err(format!("field {field}: fixed32 {got:02x?}"));
                }
                buf = &buf[4..];
            }
            Value::Bytes(b) => {
                let (len, n) = read_varint(buf)?;
                if len != b.len() as u64 || n != varint_len(len) {
                    return Err(format!(
                        "field {field}: length {len} ({n} bytes), expected {}",
                        b.len()
                    ));
                }
                let got = buf.get(n..n + b.len()).ok_or("truncated bytes")?;
                if got != &b[..] {
                    return Err(format!("field {field}: payload differs"));
                }
                buf = &buf[n + b.len()..];
            }
            Value::Nested(children) => {
                let (len, n) = read_varint(buf)?;
                let compacted = n == 1 && len <= 127;
                let redundant = n == 4 && buf[..3].iter().all(|b| b & 0x80 != 0);
                if !compacted && !redundant {
                    return Err(format!(
                        "field {field}: nested size {len} encoded in {n} bytes"
                    ));
                }
                let body = buf
                    .get(n..n + len as usize)
                    .ok_or("truncated nested message")?;
                check_message(body, children).map_err(|e| format!("in field {field}: {e}"))?;
                buf = &buf[n + len as usize..];
            }
        }
    }
    if buf.is_empty() {
        Ok(())
    } else {
        Err(format!("{} trailing bytes", buf.len()))
    }
}

// ---------------------------------------------------------------- service

/// The service side of the test: stores copied chunks by id, applies
/// patches, reassembles packets.
#[derive(Default)]
pub struct Service {
    /// Copied chunks by id: header word, payload.
    pub chunks: BTreeMap<u32, (Packets, Vec<u8>)>,
    /// Patches applied so far.
    pub patches_applied: usize,
}

/// What reassembly found, in order.
#[derive(Debug, PartialEq)]
pub enum Item {
    Packet(Vec<u8>),
    /// A drop sentinel.
    Lost,
}

impl Service {
    /// Moves every committed chunk out of the region and applies every
    /// patch.
    pub fn drain(&mut self, rx: &mut RegionReader<'_>, writer_id: u16) {
        let mut buf = vec![0u8; rx.chunk_buffer_len()];
        while let Some(record) = rx.poll(&mut buf).expect("valid region") {
            self.take(&record, writer_id);
        }
        check_reader(rx);
    }

    /// Stores a chunk or applies a patch of writer `writer_id`.
    pub fn take(&mut self, record: &Record<'_>, writer_id: u16) {
        match record {
            Record::Chunk(c) => {
                assert_eq!(c.header.writer_id, writer_id);
                let old = self
                    .chunks
                    .insert(c.header.chunk_id, (c.header.packets, c.bytes[8..].to_vec()));
                assert!(old.is_none(), "chunk {} committed twice", c.header.chunk_id);
            }
            Record::Patch(p) => {
                assert_eq!(p.writer_id, writer_id);
                let (packets, payload) = self
                    .chunks
                    .get_mut(&p.chunk_id)
                    .unwrap_or_else(|| panic!("patch for unknown chunk {}", p.chunk_id));
                assert!(packets.flags().contains(ChunkFlags::CHUNK_NEEDS_PATCHING));
                apply_patch(payload, u32::from(p.offset), &p.data).expect("patch in bounds");
                self.patches_applied += 1;
                if !p.has_more {
                    *packets = packets
                        .with_flags(packets.flags().difference(ChunkFlags::CHUNK_NEEDS_PATCHING));
                }
            }
            Record::Reset(h) => panic!("unexpected reset {h:?}"),
        }
    }

    /// Reassembles every stored chunk in id order.
    pub fn reassemble(&self) -> Vec<Item> {
        let mut out = Vec::new();
        let mut partial: Option<Vec<u8>> = None;
        let mut expected_id = 0u32;
        for (&id, (packets, payload)) in &self.chunks {
            assert_eq!(id, expected_id, "chunk ids are contiguous");
            expected_id = id.wrapping_add(1);
            assert!(
                !packets.flags().contains(ChunkFlags::CHUNK_NEEDS_PATCHING),
                "chunk {id} still needs patching"
            );
            for item in Fragments::new(payload, *packets) {
                match item.unwrap_or_else(|e| panic!("chunk {id}: {e}")) {
                    FragmentEvent::Data(f) => {
                        let mut bytes = if f.continues_from_prev {
                            partial
                                .take()
                                .unwrap_or_else(|| panic!("chunk {id}: orphan continuation"))
                        } else {
                            assert!(
                                partial.is_none(),
                                "chunk {id}: unfinished packet before {f:?}"
                            );
                            Vec::new()
                        };
                        bytes.extend_from_slice(f.data);
                        if f.continues_on_next {
                            partial = Some(bytes);
                        } else {
                            out.push(Item::Packet(bytes));
                        }
                    }
                    FragmentEvent::Dropped(d) => {
                        assert_eq!(d.continues_from_prev, partial.is_some());
                        partial = None;
                        out.push(Item::Lost);
                    }
                }
            }
        }
        assert!(partial.is_none(), "stream ends inside a packet");
        out
    }
}

/// Expected packet: the writer's own fields, then the model's.
pub fn expected_packet(first: bool, loss: u32, model: &Fields) -> Fields {
    let mut f = Vec::new();
    if loss != 0 {
        f.push((42, Value::Varint(u64::from(loss))));
    }
    if first {
        f.push((87, Value::Varint(1)));
    }
    f.extend(model.iter().cloned());
    f
}

/// `fields` as the writer stores them when nesting is limited to
/// [`MAX_DEPTH`]: nested messages opened at that depth are left out whole.
pub fn prune(fields: &Fields, depth: usize) -> Fields {
    fields
        .iter()
        .filter_map(|(f, v)| match v {
            Value::Nested(_) if depth >= MAX_DEPTH => None,
            Value::Nested(children) => Some((*f, Value::Nested(prune(children, depth + 1)))),
            other => Some((*f, other.clone())),
        })
        .collect()
}

/// `true` if `fields` nests deeper than the writer keeps.
pub fn too_deep(fields: &Fields, depth: usize) -> bool {
    fields.iter().any(|(_, v)| match v {
        Value::Nested(_) if depth >= MAX_DEPTH => true,
        Value::Nested(children) => too_deep(children, depth + 1),
        _ => false,
    })
}

/// A reader of a region written by correct writers lost nothing: no bad
/// slot or chunk, and a commit found its chunk gone only where an overflow
/// scan took it.
pub fn check_reader(rx: &RegionReader<'_>) {
    let stats = rx.stats();
    assert_eq!(
        stats.bad_slots + stats.invalid_chunks + stats.release_failures,
        0,
        "{stats:?}"
    );
    assert!(stats.stale_commits <= stats.chunks_scanned, "{stats:?}");
}
