//! Property test: random interleavings of commits, patches, scrapes, lost
//! chunks and reads, against a model writer that fragments packets and
//! patches nested lengths like the C++ `TraceWriter`.
//!
//! Checked on every run:
//! * every packet read is byte-for-byte a packet that was written, by that
//!   writer (patched bytes included: an unpatched packet is never returned);
//! * per sequence, packets come out in write order, each at most once;
//! * every missing packet is accounted for: a packet read after one that was
//!   not read carries a non-zero loss, and after the final drain every chunk
//!   written is counted as read or overwritten;
//! * with a buffer large enough and nothing lost, everything is read with
//!   no loss reported.

use proptest::prelude::*;
use shmtrace_abi::proto::wire::redundant_varint4;

use super::super::*;

/// A chunk built by the model writer.
#[derive(Debug, Clone)]
struct BuiltChunk {
    id: u32,
    count: u16,
    flags: u8,
    /// Payload as committed (patch placeholders zeroed).
    payload: Vec<u8>,
    /// End offset of each fragment, for scrapes.
    frag_ends: Vec<usize>,
    patches: Vec<(u32, [u8; 4])>,
}

/// Packet bytes: a 4-byte identity, then filler.
fn packet_bytes(writer: u16, index: u32, len: usize) -> Vec<u8> {
    let mut p = vec![writer as u8, (index & 0xFF) as u8, (index >> 8) as u8, 0xA5];
    p.extend((0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(index as u8)));
    p
}

fn put_size4(out: &mut Vec<u8>, len: usize) {
    out.extend_from_slice(&redundant_varint4(len as u32));
}

/// Splits packets into chunks of `cap` payload bytes the way the C++ writer
/// does: 1-byte sizes for small whole packets, 4-byte sizes otherwise,
/// continuation flags across chunks, and the first 4 bytes of a fragment
/// that continues sent as a patch (flag 0x4).
fn build_chunks(packets: &[Vec<u8>], cap: usize, first_id: u32) -> Vec<BuiltChunk> {
    let mut chunks = Vec::new();
    let mut cur = BuiltChunk {
        id: first_id,
        count: 0,
        flags: 0,
        payload: Vec::new(),
        frag_ends: Vec::new(),
        patches: Vec::new(),
    };
    for p in packets {
        let mut rest: &[u8] = p;
        let mut first = true;
        loop {
            let space = cap - cur.payload.len();
            if first && rest.len() < 128 && rest.len() < space {
                cur.payload.push(rest.len() as u8);
                cur.payload.extend_from_slice(rest);
                cur.count += 1;
                cur.frag_ends.push(cur.payload.len());
                break;
            }
            if space < 5 {
                let next_id = cur.id.wrapping_add(1);
                chunks.push(std::mem::replace(
                    &mut cur,
                    BuiltChunk {
                        id: next_id,
                        count: 0,
                        flags: 0,
                        payload: Vec::new(),
                        frag_ends: Vec::new(),
                        patches: Vec::new(),
                    },
                ));
                if !first {
                    cur.flags |= 0x1;
                }
                continue;
            }
            let n = rest.len().min(space - 4);
            put_size4(&mut cur.payload, n);
            let data_start = cur.payload.len();
            cur.payload.extend_from_slice(&rest[..n]);
            cur.count += 1;
            cur.frag_ends.push(cur.payload.len());
            rest = &rest[n..];
            if rest.is_empty() {
                break;
            }
            cur.flags |= 0x2;
            if n >= 4 {
                let mut real = [0u8; 4];
                real.copy_from_slice(&cur.payload[data_start..data_start + 4]);
                cur.payload[data_start..data_start + 4].fill(0);
                cur.patches.push((data_start as u32, real));
                cur.flags |= 0x4;
            }
            let next_id = cur.id.wrapping_add(1);
            chunks.push(std::mem::replace(
                &mut cur,
                BuiltChunk {
                    id: next_id,
                    count: 0,
                    flags: 0x1,
                    payload: Vec::new(),
                    frag_ends: Vec::new(),
                    patches: Vec::new(),
                },
            ));
            first = false;
        }
    }
    if cur.count > 0 {
        chunks.push(cur);
    }
    for c in &mut chunks {
        if c.patches.is_empty() {
            c.flags &= !0x4;
        }
        // Unused chunk tail.
        c.payload.resize(cap, 0xEE);
    }
    chunks
}

#[derive(Debug, Clone)]
enum Op {
    /// Commit writer `w`'s next chunk (or, with `skip`, the one after it).
    Commit { w: usize, skip: bool },
    /// Send the patches of one of writer `w`'s chunks.
    Patch { w: usize, pick: usize },
    /// Scrape writer `w`'s next chunk with `m` finished fragments.
    Scrape { w: usize, m: usize },
    /// Writer `w`'s next chunk is lost (never committed).
    Lose { w: usize },
    /// A live read pass with a byte budget per call.
    Read { budget: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..3usize, prop::bool::weighted(0.1)).prop_map(|(w, skip)| Op::Commit { w, skip }),
        2 => (0..3usize, any::<usize>()).prop_map(|(w, pick)| Op::Patch { w, pick }),
        1 => (0..3usize, 0..6usize).prop_map(|(w, m)| Op::Scrape { w, m }),
        1 => (0..3usize).prop_map(|w| Op::Lose { w }),
        2 => (1..2000usize).prop_map(|budget| Op::Read { budget }),
    ]
}

struct ModelWriter {
    producer: ProducerId,
    writer: WriterId,
    packets: Vec<Vec<u8>>,
    chunks: Vec<BuiltChunk>,
    committed: Vec<bool>,
    lost: Vec<bool>,
    patched: Vec<bool>,
    /// Commits go through [`TraceBuffer::reserve`].
    in_place: bool,
}

impl ModelWriter {
    fn next_pending(&self, from: usize) -> Option<usize> {
        (from..self.chunks.len()).find(|&i| !self.committed[i] && !self.lost[i])
    }

    fn commit(&mut self, buf: &mut TraceBuffer, i: usize) {
        let c = &self.chunks[i];
        self.store(buf, c.id, (c.count, c.flags), &c.payload, true);
        self.committed[i] = true;
    }

    /// Stores a chunk through a reservation (as chunks from an SMB) or a
    /// private copy.
    fn store(
        &self,
        buf: &mut TraceBuffer,
        chunk_id: u32,
        (count, flags): (u16, u8),
        payload: &[u8],
        complete: bool,
    ) {
        let c = ChunkCommit {
            producer: self.producer,
            writer: self.writer,
            chunk_id,
            packets: Packets::new(count, ChunkFlags::from_bits_retain(flags)).expect("count"),
            payload,
            complete,
        };
        if self.in_place {
            // Some chunks are reserved larger than their payload, as SMB
            // chunks are: the rest of the reservation must cost nothing.
            let slack = (chunk_id % 3) as usize * 200;
            crate::service::fuzzing::commit_in_place(buf, &c, payload.len() + slack);
        } else {
            buf.commit(&c);
        }
    }

    fn patch(&mut self, buf: &mut TraceBuffer, i: usize) {
        if self.patched[i] || self.chunks[i].patches.is_empty() {
            return;
        }
        let c = &self.chunks[i];
        let patches: Vec<(u32, &[u8])> = c.patches.iter().map(|(o, d)| (*o, &d[..])).collect();
        buf.patch(self.producer, self.writer, c.id, &patches, false);
        self.patched[i] = true;
    }

    fn scrape(&self, buf: &mut TraceBuffer, i: usize, m: usize) {
        let c = &self.chunks[i];
        // A fragment that continues on the next chunk is only finished when
        // the chunk is (then it is Complete, not scraped as unfinished).
        let finishable = if c.flags & 0x2 != 0 {
            c.count as usize - 1
        } else {
            c.count as usize
        };
        let m = m.min(finishable);
        // Fragments 0..m are finished; fragment m is being written (its
        // bytes are not final yet: garbage).
        let end = if m == 0 { 0 } else { c.frag_ends[m - 1] };
        let mut payload = c.payload[..end].to_vec();
        payload.resize(c.payload.len(), 0x5A);
        // Patched bytes are only ever in a continuing last fragment, which
        // a scrape never trusts; the writer has not set 0x2/0x4 yet.
        self.store(buf, c.id, (m as u16 + 1, c.flags & 0x1), &payload, false);
    }
}

fn writers(sizes: &[Vec<usize>], cap: usize, first_ids: &[u32]) -> Vec<ModelWriter> {
    sizes
        .iter()
        .enumerate()
        .map(|(w, lens)| {
            let writer = w as u16 + 1;
            let packets: Vec<Vec<u8>> = lens
                .iter()
                .enumerate()
                .map(|(i, &len)| packet_bytes(writer, i as u32, len))
                .collect();
            let chunks = build_chunks(&packets, cap, first_ids[w]);
            let n = chunks.len();
            ModelWriter {
                producer: 1 + (w % 2) as u16,
                writer,
                packets,
                chunks,
                committed: vec![false; n],
                lost: vec![false; n],
                patched: vec![false; n],
                in_place: false,
            }
        })
        .collect()
}

/// Reads with `budget`-byte calls until the pass is over.
fn read_pass(
    buf: &mut TraceBuffer,
    mode: ReadMode,
    budget: usize,
    out: &mut Vec<(ProducerId, WriterId, u32, Vec<u8>)>,
) {
    buf.begin_read(mode);
    while buf.read(budget, |p| {
        out.push((p.producer, p.writer, p.loss.bits(), p.to_vec()))
    }) == ReadStatus::More
    {}
}

/// Checks the invariants of the module docs over everything read.
fn check_reads(
    model: &[ModelWriter],
    reads: &[(ProducerId, WriterId, u32, Vec<u8>)],
) -> Result<Vec<usize>, TestCaseError> {
    let mut last: Vec<Option<u32>> = vec![None; model.len()];
    let mut counts = vec![0; model.len()];
    // A loss mark (an empty packet) was read since the writer's last packet.
    let mut marked = vec![false; model.len()];
    for (producer, writer, loss, data) in reads {
        let w = model
            .iter()
            .position(|m| m.producer == *producer && m.writer == *writer)
            .ok_or_else(|| {
                TestCaseError::fail(format!("packet from unknown writer {producer}/{writer}"))
            })?;
        if data.is_empty() {
            prop_assert!(*loss != 0, "an empty packet without a loss");
            marked[w] = true;
            continue;
        }
        prop_assert!(data.len() >= 4, "packet too short: {data:?}");
        prop_assert_eq!(data[0] as u16, *writer, "packet of another writer");
        let index = u32::from(data[1]) | u32::from(data[2]) << 8;
        let written = model[w].packets.get(index as usize);
        prop_assert_eq!(
            Some(data),
            written,
            "packet {} of writer {} differs from what was written",
            index,
            writer
        );
        let expected_next = last[w].map_or(0, |l| l + 1);
        prop_assert!(
            last[w].is_none_or(|l| index > l),
            "sequence reordered or duplicated: {:?} then {}",
            last[w],
            index
        );
        // A writer that starts at chunk 0 (as real ones do) lets the buffer
        // see losses at its very beginning; one started mid-way cannot.
        let knows_start = last[w].is_some() || model[w].chunks.first().is_some_and(|c| c.id == 0);
        if index != expected_next && knows_start {
            prop_assert!(
                *loss != 0 || marked[w],
                "packet {} of writer {} follows a missing packet without a loss flag",
                index,
                writer
            );
        }
        last[w] = Some(index);
        marked[w] = false;
        counts[w] += 1;
    }
    Ok(counts)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn random_interleavings_keep_the_invariants(
        sizes in prop::collection::vec(prop::collection::vec(0..400usize, 1..40), 3),
        cap in 24..200usize,
        near_wrap in any::<bool>(),
        small in any::<bool>(),
        discard in prop::bool::weighted(0.2),
        in_place in any::<bool>(),
        ops in prop::collection::vec(op(), 0..200),
    ) {
        let first_ids: Vec<u32> = if near_wrap { vec![u32::MAX - 3; 3] } else { vec![0; 3] };
        let mut model = writers(&sizes, cap, &first_ids);
        for m in &mut model {
            m.in_place = in_place;
        }
        let size = if small { TraceBuffer::MIN_SIZE + 512 } else { 1 << 20 };
        let policy = if discard { FillPolicy::Discard } else { FillPolicy::RingBuffer };
        let mut buf = TraceBuffer::new(size, policy).expect("size");
        let mut reads = Vec::new();
        for op in ops {
            match op {
                Op::Commit { w, skip } => {
                    let m = &mut model[w];
                    if let Some(i) = m.next_pending(0) {
                        let i = if skip { m.next_pending(i + 1).unwrap_or(i) } else { i };
                        m.commit(&mut buf, i);
                    }
                }
                Op::Patch { w, pick } => {
                    let m = &mut model[w];
                    let n = m.chunks.len();
                    m.patch(&mut buf, pick % n);
                }
                Op::Scrape { w, m: frags } => {
                    let m = &model[w];
                    if let Some(i) = m.next_pending(0) {
                        m.scrape(&mut buf, i, frags);
                    }
                }
                Op::Lose { w } => {
                    let m = &mut model[w];
                    if let Some(i) = m.next_pending(0) {
                        m.lost[i] = true;
                    }
                }
                Op::Read { budget } => read_pass(&mut buf, ReadMode::Live, budget, &mut reads),
            }
        }
        // The end of the session: everything still pending is committed and
        // patched, then the final drain.
        for m in &mut model {
            while let Some(i) = m.next_pending(0) {
                m.commit(&mut buf, i);
            }
            for i in 0..m.chunks.len() {
                m.patch(&mut buf, i);
            }
        }
        read_pass(&mut buf, ReadMode::Drain, usize::MAX, &mut reads);
        check_reads(&model, &reads)?;
        let s = *buf.stats();
        prop_assert_eq!(s.chunks_written, s.chunks_read + s.chunks_overwritten, "stats: {:?}", s);
        prop_assert!(read_all_empty(&mut buf));
    }

    #[test]
    fn in_order_commits_lose_nothing(
        sizes in prop::collection::vec(prop::collection::vec(0..2000usize, 1..60), 3),
        cap in 24..4088usize,
        near_wrap in any::<bool>(),
        read_every in 1..20usize,
        in_place in any::<bool>(),
    ) {
        let first_ids: Vec<u32> = if near_wrap { vec![u32::MAX - 2, 0, u32::MAX] } else { vec![0; 3] };
        let mut model = writers(&sizes, cap, &first_ids);
        for m in &mut model {
            m.in_place = in_place;
        }
        let mut buf = TraceBuffer::new(64 << 20, FillPolicy::RingBuffer).expect("size");
        let mut reads = Vec::new();
        let most = model.iter().map(|m| m.chunks.len()).max().unwrap_or(0);
        for i in 0..most {
            for m in &mut model {
                if i < m.chunks.len() {
                    m.commit(&mut buf, i);
                    m.patch(&mut buf, i);
                }
            }
            if i % read_every == 0 {
                read_pass(&mut buf, ReadMode::Live, 4096, &mut reads);
            }
        }
        read_pass(&mut buf, ReadMode::Drain, usize::MAX, &mut reads);
        let counts = check_reads(&model, &reads)?;
        for (w, m) in model.iter().enumerate() {
            prop_assert_eq!(counts[w], m.packets.len(), "writer {} lost packets", w);
        }
        for (w, (_, _, loss, data)) in reads.iter().enumerate() {
            let index = u32::from(data[1]) | u32::from(data[2]) << 8;
            let started_at_zero = model.iter().any(|m| m.writer == u16::from(data[0]) && m.chunks[0].id == 0);
            if index > 0 || started_at_zero {
                prop_assert_eq!(*loss, 0, "spurious loss on read {}", w);
            }
        }
        prop_assert_eq!(buf.stats().chunks_read, buf.stats().chunks_written);
    }
}

fn read_all_empty(buf: &mut TraceBuffer) -> bool {
    let mut any = false;
    buf.begin_read(ReadMode::Drain);
    while buf.read(usize::MAX, |_| any = true) == ReadStatus::More {}
    !any
}
