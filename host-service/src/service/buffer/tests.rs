//! Unit tests and property tests of the trace buffer.

use super::*;
use crate::service::fuzzing::commit_in_place;
use shmtrace_abi::proto::wire::redundant_varint4;

const P: ProducerId = 1;
const W: WriterId = 1;

/// A fragment: `varint(len)` then `data` (1-byte size when it fits, like
/// the C++ writer's compaction; 4-byte redundant varint otherwise).
fn frag(out: &mut Vec<u8>, data: &[u8]) {
    let len = data.len() as u32;
    if len < 128 {
        out.push(len as u8);
    } else {
        out.extend_from_slice(&redundant_varint4(len));
    }
    out.extend_from_slice(data);
}

fn payload(frags: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    for f in frags {
        frag(&mut out, f);
    }
    // Unused tail of a real chunk: garbage the parser must ignore.
    out.extend_from_slice(&[0xEE; 7]);
    out
}

fn flags(bits: u8) -> ChunkFlags {
    ChunkFlags::from_bits_retain(bits)
}

struct Chunk {
    producer: ProducerId,
    writer: WriterId,
    id: u32,
    count: u16,
    flags: u8,
    payload: Vec<u8>,
    complete: bool,
}

fn chunk(id: u32, frags: &[&[u8]], flag_bits: u8) -> Chunk {
    Chunk {
        producer: P,
        writer: W,
        id,
        count: frags.len() as u16,
        flags: flag_bits,
        payload: payload(frags),
        complete: true,
    }
}

impl Chunk {
    fn commit(&self, buf: &mut TraceBuffer) -> CommitOutcome {
        buf.commit(&ChunkCommit {
            producer: self.producer,
            writer: self.writer,
            chunk_id: self.id,
            packets: Packets::new(self.count, flags(self.flags)).expect("count"),
            payload: &self.payload,
            complete: self.complete,
        })
    }
    fn commit_in_place(&self, buf: &mut TraceBuffer, chunk_size: usize) -> CommitOutcome {
        let packets = Packets::new(self.count, flags(self.flags)).expect("count");
        let c = ChunkCommit {
            producer: self.producer,
            writer: self.writer,
            chunk_id: self.id,
            packets,
            payload: &self.payload,
            complete: self.complete,
        };
        commit_in_place(buf, &c, chunk_size)
    }
    fn writer(mut self, producer: ProducerId, writer: WriterId) -> Self {
        self.producer = producer;
        self.writer = writer;
        self
    }
    fn incomplete(mut self) -> Self {
        self.complete = false;
        self
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Read {
    producer: ProducerId,
    writer: WriterId,
    loss: u32,
    data: Vec<u8>,
}

fn read_all(buf: &mut TraceBuffer, mode: ReadMode) -> Vec<Read> {
    let mut out = Vec::new();
    buf.begin_read(mode);
    while buf.read(usize::MAX, |p| {
        out.push(Read {
            producer: p.producer,
            writer: p.writer,
            loss: p.loss.bits(),
            data: p.to_vec(),
        })
    }) == ReadStatus::More
    {}
    out
}

fn datas(reads: &[Read]) -> Vec<Vec<u8>> {
    reads.iter().map(|r| r.data.clone()).collect()
}

fn losses(reads: &[Read]) -> Vec<u32> {
    reads.iter().map(|r| r.loss).collect()
}

fn buffer(size: usize) -> TraceBuffer {
    TraceBuffer::new(size, FillPolicy::RingBuffer).expect("size")
}

#[test]
fn reads_whole_packets_in_order_without_loss() {
    let mut buf = buffer(64 * 1024);
    assert_eq!(
        chunk(0, &[b"a", b"bb"], 0).commit(&mut buf),
        CommitOutcome::Stored
    );
    assert_eq!(
        chunk(1, &[b"ccc"], 0).commit(&mut buf),
        CommitOutcome::Stored
    );
    let reads = read_all(&mut buf, ReadMode::Live);
    assert_eq!(
        datas(&reads),
        [b"a".to_vec(), b"bb".to_vec(), b"ccc".to_vec()]
    );
    assert_eq!(losses(&reads), [0, 0, 0]);
    let s = buf.stats();
    assert_eq!((s.chunks_written, s.chunks_read), (2, 2));
    // Payloads of 4 and 4 bytes: 16 + 16 overhead each.
    assert_eq!((s.bytes_written, s.bytes_read), (64, 64));
    // Reads are destructive.
    assert!(read_all(&mut buf, ReadMode::Live).is_empty());
}

#[test]
fn reassembles_a_packet_spanning_three_chunks() {
    let mut buf = buffer(64 * 1024);
    chunk(0, &[b"x", b"hello "], 0x2).commit(&mut buf);
    chunk(1, &[b"big "], 0x3).commit(&mut buf);
    chunk(2, &[b"world", b"y"], 0x1).commit(&mut buf);
    let reads = read_all(&mut buf, ReadMode::Live);
    assert_eq!(
        datas(&reads),
        [b"x".to_vec(), b"hello big world".to_vec(), b"y".to_vec()]
    );
    assert_eq!(losses(&reads), [0, 0, 0]);
    assert_eq!(buf.stats().readaheads_succeeded, 1);
    assert_eq!(buf.stats().chunks_read, 3);
}

#[test]
fn a_spanning_packet_waits_for_its_next_chunk_in_live_reads_only() {
    let mut buf = buffer(64 * 1024);
    chunk(0, &[b"x", b"hel"], 0x2).commit(&mut buf);
    assert_eq!(datas(&read_all(&mut buf, ReadMode::Live)), [b"x".to_vec()]);
    chunk(1, &[b"lo"], 0x1).commit(&mut buf);
    assert_eq!(
        datas(&read_all(&mut buf, ReadMode::Live)),
        [b"hello".to_vec()]
    );

    chunk(2, &[b"z", b"lost"], 0x2).commit(&mut buf);
    let reads = read_all(&mut buf, ReadMode::Drain);
    // A live writer's sequence: no mark of its own at the drain.
    assert_eq!(datas(&reads), [b"z".to_vec()]);
    assert_eq!(buf.stats().readaheads_failed, 1);
    // The loss is reported on the sequence's next packet.
    chunk(4, &[b"next"], 0).commit(&mut buf);
    let reads = read_all(&mut buf, ReadMode::Live);
    assert_eq!(datas(&reads), [b"next".to_vec()]);
    let loss = DataLoss::because(DataLoss::REASSEMBLY_GAP) | DataLoss::READ_GAP;
    assert_eq!(losses(&reads), [loss.bits()]);
}

#[test]
fn out_of_order_chunks_are_read_in_id_order() {
    let mut buf = buffer(64 * 1024);
    chunk(1, &[b"second"], 0).commit(&mut buf);
    chunk(0, &[b"first"], 0).commit(&mut buf);
    let reads = read_all(&mut buf, ReadMode::Live);
    assert_eq!(datas(&reads), [b"first".to_vec(), b"second".to_vec()]);
    assert_eq!(losses(&reads), [0, 0]);
    assert_eq!(buf.stats().chunks_committed_out_of_order, 1);
}

#[test]
fn chunk_ids_wrap_at_u32() {
    let mut buf = buffer(64 * 1024);
    chunk(u32::MAX - 1, &[b"a"], 0).commit(&mut buf);
    chunk(u32::MAX, &[b"b", b"sp"], 0x2).commit(&mut buf);
    chunk(0, &[b"an", b"c"], 0x1).commit(&mut buf);
    chunk(1, &[b"d"], 0).commit(&mut buf);
    let reads = read_all(&mut buf, ReadMode::Live);
    assert_eq!(
        datas(&reads),
        [
            b"a".to_vec(),
            b"b".to_vec(),
            b"span".to_vec(),
            b"c".to_vec(),
            b"d".to_vec()
        ]
    );
    // The sequence's first chunk read is not chunk 0: the ids before it are
    // reported missing, nothing else.
    assert_eq!(losses(&reads), [3, 0, 0, 0, 0]);
    assert_eq!(buf.stats().chunks_committed_out_of_order, 0);
}

#[test]
fn a_gap_is_reported_and_skipped_and_the_late_chunk_refused() {
    let mut buf = buffer(64 * 1024);
    chunk(0, &[b"a"], 0).commit(&mut buf);
    chunk(2, &[b"c"], 0).commit(&mut buf);
    let reads = read_all(&mut buf, ReadMode::Live);
    assert_eq!(datas(&reads), [b"a".to_vec(), b"c".to_vec()]);
    assert_eq!(
        losses(&reads),
        [0, DataLoss::because(DataLoss::READ_GAP).bits()]
    );
    assert_eq!(
        chunk(1, &[b"b"], 0).commit(&mut buf),
        CommitOutcome::Refused(Refusal::Stale)
    );
    assert_eq!(buf.stats().chunks_discarded, 1);
}

#[test]
fn a_gap_with_a_continuation_reports_the_orphan() {
    let mut buf = buffer(64 * 1024);
    chunk(0, &[b"a"], 0).commit(&mut buf);
    chunk(2, &[b"tail", b"c"], 0x1).commit(&mut buf);
    let reads = read_all(&mut buf, ReadMode::Live);
    assert_eq!(datas(&reads), [b"a".to_vec(), b"c".to_vec()]);
    let loss = DataLoss::because(DataLoss::READ_GAP) | DataLoss::ORPHAN_CONTINUATION;
    assert_eq!(losses(&reads), [0, loss.bits()]);
}

#[test]
fn ring_wrap_evicts_the_oldest_chunks_with_exact_stats() {
    // 8 KiB ring; each chunk has a 1000-byte packet: payload 1002 bytes,
    // footprint 1008 + 16 = 1024. Eight fit exactly.
    let mut buf = buffer(8192);
    let data: Vec<Vec<u8>> = (0..12u8).map(|i| vec![i; 1000]).collect();
    for (i, d) in data.iter().enumerate() {
        chunk(i as u32, &[d], 0).commit(&mut buf);
    }
    let s = *buf.stats();
    assert_eq!(s.chunks_written, 12);
    assert_eq!(s.chunks_overwritten, 4);
    assert_eq!(s.bytes_overwritten, 4 * 1024);
    assert_eq!(s.write_wrap_count, 1);
    assert_eq!(s.padding_bytes_written, 0);
    assert_eq!(s.bytes_written, 12 * 1024);
    let reads = read_all(&mut buf, ReadMode::Live);
    assert_eq!(datas(&reads), data[4..].to_vec());
    let mut expect = vec![0; 8];
    expect[0] = DataLoss::because(DataLoss::OVERWRITE).bits();
    assert_eq!(losses(&reads), expect);
    assert_eq!(buf.stats().chunks_read, 8);
    // Overwriting read data is not an overwrite.
    chunk(12, &[&data[0]], 0).commit(&mut buf);
    assert_eq!(buf.stats().chunks_overwritten, 4);
}

#[test]
fn wrap_leaves_padding_and_counts_it() {
    // Footprints of 1024 and 2048 in a 4160-byte ring.
    let mut buf = buffer(4160);
    chunk(0, &[&[1u8; 1000]], 0).commit(&mut buf);
    chunk(1, &[&[2u8; 1000]], 0).commit(&mut buf);
    chunk(2, &[&[3u8; 2000]], 0).commit(&mut buf); // 2000+2 → 2016+16 = 2032
                                                   // 1024+1024+2032 = 4080; 80 bytes left: the next 1024 wraps.
    chunk(3, &[&[4u8; 1000]], 0).commit(&mut buf);
    let s = *buf.stats();
    assert_eq!(s.padding_bytes_written, 80);
    assert_eq!(s.write_wrap_count, 1);
    assert_eq!(s.chunks_overwritten, 1);
    assert_eq!(s.bytes_written, 1024 * 3 + 2032 + 80);
}

#[test]
fn discard_policy_keeps_the_beginning() {
    let mut buf = TraceBuffer::new(4096 + 32, FillPolicy::Discard).expect("size");
    chunk(0, &[&[1u8; 1000]], 0).commit(&mut buf);
    chunk(1, &[&[2u8; 1000]], 0).commit(&mut buf);
    chunk(2, &[&[3u8; 1000]], 0).commit(&mut buf);
    chunk(3, &[&[4u8; 1000]], 0).commit(&mut buf);
    assert_eq!(
        chunk(4, &[&[5u8; 1000]], 0).commit(&mut buf),
        CommitOutcome::Refused(Refusal::Full)
    );
    // Latched: even after reading, new chunks are refused.
    assert_eq!(read_all(&mut buf, ReadMode::Live).len(), 4);
    assert_eq!(
        chunk(5, &[b"x"], 0).commit(&mut buf),
        CommitOutcome::Refused(Refusal::Full)
    );
    let s = buf.stats();
    assert_eq!(
        (s.chunks_discarded, s.chunks_overwritten, s.chunks_read),
        (2, 0, 4)
    );
}

#[test]
fn patches_apply_only_to_a_stored_chunk_of_the_same_producer() {
    let mut buf = buffer(64 * 1024);
    // A packet whose nested length (4 bytes at payload offset 3) is patched.
    let first = [0x0A, 0x00, 0x00, 0x00, 0x00, b'h'];
    let patch: &[u8] = &[0x85, 0x80, 0x80, 0x00];
    // Before the chunk exists: fails.
    assert_eq!(
        buf.patch(P, W, 0, &[(3, patch)], false),
        PatchResult::ChunkNotFound
    );
    assert_eq!(buf.stats().patches_failed, 1);
    chunk(0, &[b"a", &first], 0x2 | 0x4).commit(&mut buf);
    chunk(1, &[b"ello"], 0x1).commit(&mut buf);
    // Needs patching: only the whole packet is readable.
    assert_eq!(datas(&read_all(&mut buf, ReadMode::Live)), [b"a".to_vec()]);
    // A forged patch from another producer finds nothing.
    assert_eq!(
        buf.patch(2, W, 0, &[(3, &[9, 9, 9, 9])], false),
        PatchResult::ChunkNotFound
    );
    // The real one: "a" took payload bytes 0..2, the fragment's size byte
    // is at 2, its data (0x0A then the placeholder) at 3.
    match buf.patch(P, W, 0, &[(4, patch)], false) {
        PatchResult::Applied(o) => assert_eq!((o.applied, o.failed), (1, None)),
        other => panic!("{other:?}"),
    }
    let reads = read_all(&mut buf, ReadMode::Live);
    assert_eq!(
        datas(&reads),
        [vec![
            0x0A, 0x85, 0x80, 0x80, 0x00, b'h', b'e', b'l', b'l', b'o'
        ]]
    );
    assert_eq!(losses(&reads), [0]);
    // The chunk is gone now: patching it fails.
    assert_eq!(
        buf.patch(P, W, 0, &[(4, patch)], false),
        PatchResult::ChunkNotFound
    );
    assert_eq!(buf.stats().patches_succeeded, 1);
    assert_eq!(buf.stats().patches_failed, 3);
}

#[test]
fn has_more_patches_keeps_the_chunk_waiting() {
    let mut buf = buffer(64 * 1024);
    // One 9-byte fragment (size byte at 0, data at 1..10) that continues.
    chunk(0, &[&[0u8; 9]], 0x2 | 0x4).commit(&mut buf);
    chunk(1, &[b"!"], 0x1).commit(&mut buf);
    buf.patch(P, W, 0, &[(1, &[1, 2, 3, 4])], true);
    assert!(read_all(&mut buf, ReadMode::Live).is_empty());
    buf.patch(P, W, 0, &[(5, &[5, 6, 7, 8])], false);
    let reads = read_all(&mut buf, ReadMode::Live);
    assert_eq!(datas(&reads), [vec![1, 2, 3, 4, 5, 6, 7, 8, 0, b'!']]);
    assert_eq!(buf.stats().patches_succeeded, 2);
}

#[test]
fn a_patch_out_of_bounds_fails_and_keeps_the_chunk_waiting_until_drain() {
    let mut buf = buffer(64 * 1024);
    chunk(0, &[&[0u8; 6]], 0x2 | 0x4).commit(&mut buf);
    chunk(1, &[b"end"], 0x1).commit(&mut buf);
    match buf.patch(P, W, 0, &[(5, &[1, 1, 1, 1])], false) {
        PatchResult::Applied(o) => assert!(o.failed.is_some()),
        other => panic!("{other:?}"),
    }
    assert!(read_all(&mut buf, ReadMode::Live).is_empty());
    assert!(read_all(&mut buf, ReadMode::Drain).is_empty());
    assert_eq!(buf.stats().readaheads_failed, 1);
}

#[test]
fn recommit_after_scrape_replaces_the_copy_without_duplicates() {
    let mut buf = buffer(64 * 1024);
    // Scraped while being written: 3 counted, the third unfinished.
    let scraped = Chunk {
        payload: payload(&[b"p1", b"p2", b"unfinished"]),
        ..chunk(0, &[b"p1", b"p2", b"p3"], 0)
    }
    .incomplete();
    assert_eq!(scraped.commit(&mut buf), CommitOutcome::Stored);
    let reads = read_all(&mut buf, ReadMode::Live);
    assert_eq!(datas(&reads), [b"p1".to_vec(), b"p2".to_vec()]);
    // Scraped again, unchanged: a no-op.
    assert_eq!(scraped.commit(&mut buf), CommitOutcome::Duplicate);
    // The real commit: grows, read resumes after what was read.
    let p4: &[u8] = b"p4, longer than the scraped copy's footprint";
    assert_eq!(
        chunk(0, &[b"p1", b"p2", b"p3", p4], 0).commit(&mut buf),
        CommitOutcome::Rewritten
    );
    let reads = read_all(&mut buf, ReadMode::Live);
    assert_eq!(datas(&reads), [b"p3".to_vec(), p4.to_vec()]);
    assert_eq!(losses(&reads), [0, 0]);
    let s = buf.stats();
    assert_eq!(
        (
            s.chunks_written,
            s.chunks_rewritten,
            s.chunks_relocated,
            s.chunks_read
        ),
        (1, 1, 1, 1)
    );
    // A duplicate of the consumed chunk is recognized.
    assert_eq!(
        chunk(0, &[b"p1", b"p2", b"p3", p4], 0).commit(&mut buf),
        CommitOutcome::Duplicate
    );
}

/// Commits and reads chunks of 1000-byte packets of writer 2 until the
/// ring has wrapped over everything stored before (an 8 KiB ring holds
/// eight), reading each so none is overwritten unread.
fn wrap_with_other_writer(buf: &mut TraceBuffer) {
    for id in 0..9 {
        let c = chunk(id, &[&[id as u8; 1000]], 0).writer(P, 2);
        assert_eq!(c.commit(buf), CommitOutcome::Stored);
        assert_eq!(read_all(buf, ReadMode::Live).len(), 1);
    }
    assert!(buf.stats().write_wrap_count >= 1);
}

#[test]
fn a_late_commit_of_a_scraped_chunk_read_and_evicted_reads_only_its_new_fragments() {
    for in_place in [false, true] {
        let mut buf = buffer(8192);
        let commit = |c: Chunk, buf: &mut TraceBuffer| {
            if in_place {
                c.commit_in_place(buf, 4096)
            } else {
                c.commit(buf)
            }
        };
        // Scraped while being written: "p1" and "p2" finished.
        let scraped = Chunk {
            payload: payload(&[b"p1", b"p2", b"unfini"]),
            ..chunk(0, &[b"p1", b"p2", b"p3"], 0)
        }
        .incomplete();
        assert_eq!(commit(scraped, &mut buf), CommitOutcome::Stored);
        let reads = read_all(&mut buf, ReadMode::Live);
        assert_eq!(datas(&reads), [b"p1".to_vec(), b"p2".to_vec()]);
        // Another writer's chunks wrap the ring over the scraped copy.
        wrap_with_other_writer(&mut buf);
        let stats = *buf.stats();
        assert_eq!((stats.chunks_overwritten, stats.chunks_discarded), (0, 0));
        // Scraped again with nothing new: a no-op; with fewer fragments than
        // were read: a violation.
        let again = Chunk {
            payload: payload(&[b"p1", b"p2", b"unfinished"]),
            ..chunk(0, &[b"p1", b"p2", b"p3"], 0)
        }
        .incomplete();
        assert_eq!(commit(again, &mut buf), CommitOutcome::Duplicate);
        assert_eq!(
            commit(chunk(0, &[b"p1"], 0), &mut buf),
            CommitOutcome::Refused(Refusal::InvalidRecommit)
        );
        // The producer commits the chunk, grown: stored, and only the new
        // packets are read, without a loss mark.
        let late = chunk(0, &[b"p1", b"p2", b"p3", b"p4"], 0);
        assert_eq!(commit(late, &mut buf), CommitOutcome::Stored, "{in_place}");
        let reads = read_all(&mut buf, ReadMode::Live);
        assert_eq!(datas(&reads), [b"p3".to_vec(), b"p4".to_vec()]);
        assert_eq!(losses(&reads), [0, 0]);
        // The sequence goes on without a gap; the consumed chunk's duplicate
        // is recognized.
        assert_eq!(
            commit(chunk(0, &[b"p1", b"p2", b"p3", b"p4"], 0), &mut buf),
            CommitOutcome::Duplicate
        );
        assert_eq!(
            commit(chunk(1, &[b"p5"], 0), &mut buf),
            CommitOutcome::Stored
        );
        let reads = read_all(&mut buf, ReadMode::Live);
        assert_eq!(
            (datas(&reads), losses(&reads)),
            (vec![b"p5".to_vec()], vec![0])
        );
        let s = buf.stats();
        assert_eq!(
            (s.chunks_discarded, s.abi_violations, s.chunks_overwritten),
            (0, 1, 0)
        );
    }
}

#[test]
fn a_scraped_chunk_evicted_whose_commit_never_comes_is_reported_lost() {
    let mut buf = buffer(8192);
    let scraped = Chunk {
        payload: payload(&[b"p1", b"p2", b"unfini"]),
        ..chunk(0, &[b"p1", b"p2", b"p3"], 0)
    }
    .incomplete();
    scraped.commit(&mut buf);
    assert_eq!(read_all(&mut buf, ReadMode::Live).len(), 2);
    wrap_with_other_writer(&mut buf);
    // The next chunk comes instead: the rest of chunk 0 is lost, and said
    // so; chunk 0 arriving after that is stale.
    chunk(1, &[b"p5"], 0).commit(&mut buf);
    let reads = read_all(&mut buf, ReadMode::Live);
    assert_eq!(datas(&reads), [b"p5".to_vec()]);
    assert_ne!(losses(&reads), [0]);
    assert_eq!(
        chunk(0, &[b"p1", b"p2", b"p3"], 0).commit(&mut buf),
        CommitOutcome::Refused(Refusal::Stale)
    );
}

#[test]
fn recommits_that_shrink_or_drop_flags_are_violations() {
    let mut buf = buffer(64 * 1024);
    chunk(0, &[b"a", b"b"], 0x2).commit(&mut buf);
    assert_eq!(
        chunk(0, &[b"a"], 0x2).commit(&mut buf),
        CommitOutcome::Refused(Refusal::InvalidRecommit)
    );
    assert_eq!(
        chunk(0, &[b"a", b"b", b"c"], 0).commit(&mut buf),
        CommitOutcome::Refused(Refusal::InvalidRecommit)
    );
    assert_eq!(
        chunk(0, &[b"a", b"b"], 0x2).incomplete().commit(&mut buf),
        CommitOutcome::Refused(Refusal::InvalidRecommit)
    );
    assert_eq!(buf.stats().abi_violations, 3);
}

#[test]
fn incomplete_heads_wait_in_live_reads_and_are_drained_at_the_end() {
    let mut buf = buffer(64 * 1024);
    chunk(0, &[b"a", b"b", b"c"], 0)
        .incomplete()
        .commit(&mut buf);
    chunk(1, &[b"d"], 0).commit(&mut buf);
    assert_eq!(
        datas(&read_all(&mut buf, ReadMode::Live)),
        [b"a".to_vec(), b"b".to_vec()]
    );
    let reads = read_all(&mut buf, ReadMode::Drain);
    assert_eq!(datas(&reads), [b"d".to_vec()]);
    // Packet "c" was never finished, and something follows it.
    assert_eq!(
        losses(&reads),
        [DataLoss::because(DataLoss::READ_GAP).bits()]
    );
}

#[test]
fn closed_sequences_never_wait() {
    let mut buf = buffer(64 * 1024);
    chunk(0, &[b"a", b"b"], 0).incomplete().commit(&mut buf);
    chunk(0, &[b"x", b"sp"], 0x2).writer(2, 5).commit(&mut buf);
    buf.producer_gone(P);
    let reads = read_all(&mut buf, ReadMode::Live);
    // The unfinished rest of P's scraped chunk is given up on unmarked:
    // a writer's count includes the slot of a packet it has not begun.
    assert_eq!(datas(&reads), [b"a".to_vec(), b"x".to_vec()]);
    assert_eq!(losses(&reads), [0, 0]);
    buf.producer_gone(2);
    // The packet writer 5 began, whose end never came: a producer gone
    // mid-packet gets a loss mark of its own, as nothing follows it.
    let reads = read_all(&mut buf, ReadMode::Live);
    assert_eq!(datas(&reads), [Vec::<u8>::new()]);
    assert_eq!(
        reads
            .iter()
            .map(|r| (r.producer, r.writer))
            .collect::<Vec<_>>(),
        [(2, 5)]
    );
    let gap = DataLoss::because(DataLoss::REASSEMBLY_GAP);
    assert_eq!(losses(&reads), [gap.bits()]);
    assert!(read_all(&mut buf, ReadMode::Drain).is_empty(), "once");
    assert_eq!(buf.stats().readaheads_failed, 1);
}

#[test]
fn a_reused_writer_id_starts_a_new_sequence() {
    let mut buf = buffer(64 * 1024);
    chunk(0, &[b"a"], 0).commit(&mut buf);
    chunk(1, &[b"b"], 0).commit(&mut buf);
    assert_eq!(read_all(&mut buf, ReadMode::Live).len(), 2);
    buf.writer_unregistered(P, W);
    // The new writer starts at chunk 0 again.
    assert_eq!(
        chunk(0, &[b"new"], 0).commit(&mut buf),
        CommitOutcome::Stored
    );
    let reads = read_all(&mut buf, ReadMode::Live);
    assert_eq!(datas(&reads), [b"new".to_vec()]);
    assert_eq!(losses(&reads), [0]);
}

#[test]
fn sentinels_and_corrupt_chunks_are_reported_where_they_happen() {
    let mut buf = buffer(64 * 1024);
    let mut sentinel = payload(&[b"a"]);
    sentinel.truncate(2);
    sentinel.extend_from_slice(&[0xFF, 0xFF, 0xFF, 0x7F, 1, b'z']);
    Chunk {
        count: 3,
        payload: sentinel,
        ..chunk(0, &[], 0)
    }
    .commit(&mut buf);
    chunk(1, &[b"b"], 0).commit(&mut buf);
    // Count 3 but only one fragment and then garbage size.
    Chunk {
        count: 3,
        payload: vec![1, b'c', 0x7F, 1],
        ..chunk(2, &[], 0)
    }
    .commit(&mut buf);
    chunk(3, &[b"d"], 0).commit(&mut buf);
    assert_eq!(buf.stats().trace_writer_packet_loss, 1);
    assert_eq!(buf.stats().abi_violations, 1);
    let reads = read_all(&mut buf, ReadMode::Live);
    assert_eq!(
        datas(&reads),
        [b"a".to_vec(), b"b".to_vec(), b"c".to_vec(), b"d".to_vec()]
    );
    let abort = DataLoss::because(DataLoss::WRITER_ABORT).bits();
    let corrupt = DataLoss::because(DataLoss::CHUNK_CORRUPTED).bits();
    assert_eq!(losses(&reads), [0, abort, 0, corrupt]);
}

#[test]
fn a_chunk_larger_than_the_buffer_is_an_abi_violation() {
    let mut buf = buffer(TraceBuffer::MIN_SIZE);
    let big = vec![7u8; 5000];
    assert!(matches!(
        chunk(0, &[&big], 0).commit(&mut buf),
        CommitOutcome::Refused(Refusal::TooLarge { .. })
    ));
    assert_eq!(buf.stats().abi_violations, 1);
    assert!(matches!(
        TraceBuffer::new(100, FillPolicy::RingBuffer),
        Err(BufferError::TooSmall { .. })
    ));
}

#[test]
fn reads_resume_within_a_pass_when_the_budget_runs_out() {
    let mut buf = buffer(64 * 1024);
    for i in 0..10u32 {
        chunk(i, &[&[i as u8; 100]], 0)
            .writer(1, (i % 3 + 1) as u16)
            .commit(&mut buf);
    }
    buf.begin_read(ReadMode::Live);
    let mut got = Vec::new();
    let mut calls = 0;
    while buf.read(250, |p| got.push(p.to_vec())) == ReadStatus::More {
        calls += 1;
    }
    assert_eq!(got.len(), 10);
    assert!(calls >= 3);
    // Write order across sequences is approximated.
    assert_eq!(
        got.iter().map(|d| d[0]).collect::<Vec<_>>(),
        (0..10).collect::<Vec<u8>>()
    );
}

#[test]
fn a_zero_budget_still_makes_progress() {
    let mut buf = buffer(64 * 1024);
    chunk(0, &[b"a", b"b"], 0).commit(&mut buf);
    buf.begin_read(ReadMode::Live);
    let mut got = Vec::new();
    let mut calls = 0;
    while buf.read(0, |p| got.push(p.to_vec())) == ReadStatus::More {
        calls += 1;
        assert!(calls < 10, "no progress");
    }
    assert_eq!(got, [b"a".to_vec(), b"b".to_vec()]);
}

#[test]
fn a_chunk_committed_in_place_keeps_only_its_valid_prefix() {
    let mut buf = buffer(8192);
    let c = chunk(0, &[&[1u8; 1000]], 0);
    // A whole 4 KiB-page chunk is reserved (4088 bytes of payload).
    assert_eq!(c.commit_in_place(&mut buf, 4096), CommitOutcome::Stored);
    // A 1004-byte fragment → footprint 1024, not 4088 + 8 + 16.
    let s = *buf.stats();
    assert_eq!((s.chunks_written, s.bytes_written), (1, 1024));
    // The rest of the reservation went back: seven more 1024-byte records
    // fit before the ring wraps.
    for id in 1..8 {
        chunk(id, &[&[id as u8; 1000]], 0).commit(&mut buf);
    }
    let s = *buf.stats();
    assert_eq!(
        (s.write_wrap_count, s.chunks_overwritten, s.bytes_written),
        (0, 0, 8192)
    );
    let reads = read_all(&mut buf, ReadMode::Live);
    assert_eq!(reads[0].data, vec![1u8; 1000]);
    assert_eq!(reads[7].data, vec![7u8; 1000]);
    assert_eq!(losses(&reads), [0; 8]);
}

#[test]
fn a_dropped_reservation_gives_its_room_back() {
    let mut buf = buffer(8192);
    let r = buf.reserve(4096).expect("room");
    drop(r);
    assert_eq!(buf.stats().bytes_written, 0);
    for id in 0..8 {
        chunk(id, &[&[id as u8; 1000]], 0).commit(&mut buf);
    }
    let s = *buf.stats();
    assert_eq!((s.write_wrap_count, s.chunks_overwritten), (0, 0));
    assert_eq!(read_all(&mut buf, ReadMode::Live).len(), 8);
}

#[test]
fn in_place_recommits_and_stale_chunks_take_the_usual_path() {
    let mut buf = buffer(64 * 1024);
    let scraped = Chunk {
        payload: payload(&[b"p1", b"unfinished"]),
        ..chunk(0, &[b"p1", b"p2"], 0)
    }
    .incomplete();
    assert_eq!(
        scraped.commit_in_place(&mut buf, 512),
        CommitOutcome::Stored
    );
    assert_eq!(
        chunk(0, &[b"p1", b"p2"], 0).commit_in_place(&mut buf, 512),
        CommitOutcome::Rewritten
    );
    assert_eq!(
        chunk(0, &[b"p1", b"p2"], 0).commit_in_place(&mut buf, 512),
        CommitOutcome::Duplicate
    );
    let reads = read_all(&mut buf, ReadMode::Live);
    assert_eq!(datas(&reads), [b"p1".to_vec(), b"p2".to_vec()]);
    // Chunk 2 read, then chunk 1 arrives: stale, refused and counted.
    chunk(2, &[b"p4"], 0).commit_in_place(&mut buf, 512);
    assert_eq!(read_all(&mut buf, ReadMode::Live).len(), 1);
    assert_eq!(
        chunk(1, &[b"p3"], 0).commit_in_place(&mut buf, 512),
        CommitOutcome::Refused(Refusal::Stale)
    );
    let s = *buf.stats();
    assert_eq!(
        (s.chunks_written, s.chunks_rewritten, s.chunks_discarded),
        (2, 1, 1)
    );
    // Two 32-byte records (the re-commit fit its old one): every
    // reservation that was not kept went back.
    assert_eq!(s.bytes_written, 64);
}

#[test]
fn a_discard_buffer_reserves_nothing_that_would_evict_unread_data() {
    let mut buf = TraceBuffer::new(4096 + 32, FillPolicy::Discard).expect("size");
    for id in 0..4 {
        assert_eq!(
            chunk(id, &[&[1u8; 1000]], 0).commit_in_place(&mut buf, 1024),
            CommitOutcome::Stored
        );
    }
    assert!(buf.reserve(1024).is_none(), "would evict unread chunk 0");
    // The usual path then latches the buffer, exactly as without reservations.
    assert_eq!(
        chunk(4, &[&[5u8; 1000]], 0).commit_in_place(&mut buf, 1024),
        CommitOutcome::Refused(Refusal::Full)
    );
    assert_eq!(read_all(&mut buf, ReadMode::Live).len(), 4);
    assert!(buf.reserve(1024).is_none(), "latched");
    // A ring buffer reserves only over data already read.
    let mut ring = buffer(4096 + 32);
    for id in 0..4 {
        chunk(id, &[&[1u8; 1000]], 0).commit(&mut ring);
    }
    assert!(ring.reserve(1024).is_none(), "unread chunk 0 is in the way");
    assert_eq!(read_all(&mut ring, ReadMode::Live).len(), 4);
    assert!(ring.reserve(1024).is_some(), "chunk 0 was read");
}

#[test]
fn a_given_back_reservation_leaves_no_trace_even_after_a_wrap() {
    // Four 1 KiB records fill [0, 4096) of 4128 bytes; all read: dead space.
    let mut buf = buffer(4096 + 32);
    for id in 0..4 {
        chunk(id, &[&[1u8; 1000]], 0).commit(&mut buf);
    }
    assert_eq!(read_all(&mut buf, ReadMode::Live).len(), 4);
    let before = *buf.stats();
    // 1024 bytes do not fit in the 32-byte tail: this one wraps, leaving
    // padding, and evicts read chunk 0.
    let r = buf.reserve(1024).expect("only read data in the way");
    drop(r);
    let after = *buf.stats();
    assert_eq!(after, before, "stats unchanged");
    // A chunk committed now goes exactly where it would have gone.
    chunk(4, &[&[5u8; 1000]], 0).commit(&mut buf);
    let s = *buf.stats();
    assert_eq!((s.write_wrap_count, s.padding_bytes_written), (1, 32));
    assert_eq!(
        datas(&read_all(&mut buf, ReadMode::Live)),
        [vec![5u8; 1000]]
    );
}

#[test]
fn zero_length_fragments_are_skipped() {
    let mut buf = buffer(64 * 1024);
    chunk(0, &[b"a", b"", b"b", b""], 0).commit(&mut buf);
    assert_eq!(
        datas(&read_all(&mut buf, ReadMode::Live)),
        [b"a".to_vec(), b"b".to_vec()]
    );
}

mod props;

#[test]
fn a_read_only_clone_reads_what_the_source_would_and_takes_no_writes() {
    // A wrapped ring, read in part, with a packet spanning into a chunk not
    // yet committed and a patch still due: the clone carries all of it.
    let mut buf = buffer(8192);
    let data: Vec<Vec<u8>> = (0..10u8).map(|i| vec![i; 1000]).collect();
    for (i, d) in data.iter().enumerate() {
        chunk(i as u32, &[d], 0).commit(&mut buf);
    }
    let mut first = Vec::new();
    buf.begin_read(ReadMode::Live);
    buf.read(1, |p| first.push(p.to_vec()));
    assert_eq!(first, vec![data[2].clone()]);
    let other = chunk(0, &[b"head"], 0x02).writer(P, 2);
    other.commit(&mut buf);
    let before = *buf.stats();
    assert!(before.chunks_read > 0 && before.bytes_read > 0);
    // The copy's read counters count its own reads only.
    let unread = before.without_reads();

    let mut copy = buf.clone_read_only();
    assert_eq!(*copy.stats(), unread);
    assert_eq!(copy.writers_seen(), buf.writers_seen());
    // Writes to the copy are refused and change nothing.
    assert_eq!(
        chunk(10, &[&data[0]], 0).commit(&mut copy),
        CommitOutcome::Refused(Refusal::ReadOnly)
    );
    assert!(copy.reserve(4096).is_none());
    assert_eq!(
        copy.patch(P, 2, 0, &[(0, &[1, 2, 3, 4])], false),
        PatchResult::ChunkNotFound
    );
    assert_eq!(*copy.stats(), unread);

    let from_copy = read_all(&mut copy, ReadMode::Live);
    let from_source = read_all(&mut buf, ReadMode::Live);
    assert_eq!(from_copy, from_source);
    assert_eq!(datas(&from_copy), data[3..].to_vec());
    let (c, s) = (copy.stats(), buf.stats());
    assert_eq!(c.chunks_read, s.chunks_read - before.chunks_read);
    assert_eq!(c.bytes_read, s.bytes_read - before.bytes_read);
    assert_eq!(c.without_reads(), s.without_reads());
    // The source still takes writes; the copy does not see them.
    assert_eq!(
        chunk(10, &[&data[0]], 0).commit(&mut buf),
        CommitOutcome::Stored
    );
    assert!(read_all(&mut copy, ReadMode::Drain)
        .iter()
        .all(|r| r.writer == 2));
    assert!(copy.has_data() && buf.has_data() && !buffer(8192).has_data());
}
