//! Region dumps: a region written by abi's `TraceWriter` in a file, read
//! back as the file's bytes.

use shmtrace_abi::layout::{ChunkHeader, PageLayout};
use shmtrace_abi::region::{RegionArbiter, RegionConfig};
use shmtrace_abi::writer::TraceWriter;

use super::*;
use crate::bridge::testing::{create, file, Firmware, OFFSET};

fn drain(source: &mut DumpSource) -> Vec<FirmwareEvent> {
    std::iter::from_fn(|| source.poll(Duration::ZERO).ok().flatten()).collect()
}

/// `(writer, chunk id, fragments, payload length)` of each chunk event,
/// `patches CHUNK N` of each patch group.
fn summary(events: &[FirmwareEvent]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match e {
            FirmwareEvent::Chunk(b) => {
                let h = ChunkHeader::new_checked(&b[..]).unwrap();
                Some(format!(
                    "w{} c{} n{} {}",
                    h.writer_id(),
                    h.chunk_id(),
                    h.packets().count(),
                    b.len() - CHUNK_HEADER_SIZE
                ))
            }
            FirmwareEvent::Patches(g) => Some(format!(
                "patches c{} {}{}",
                g.chunk_id,
                g.patches.len(),
                if g.has_more { " more" } else { "" }
            )),
            _ => None,
        })
        .collect()
}

#[test]
fn a_dump_yields_every_chunk_in_id_order_with_the_ring_s_patches() {
    let path = file("dump-overflow");
    create(&path);
    let mut fw = Firmware::map(&path);
    let mut config = RegionConfig::new("fw.dumped");
    config.boot_id = 9;
    let handles = fw.boot(&config);
    let arbiter = || RegionArbiter::new(&handles, PageLayout::Div4).unwrap();
    let mut w: TraceWriter<_> = TraceWriter::new(arbiter(), 1, 0).unwrap();
    // A packet over chunks 0..=2 (a patch for chunk 0), then one small
    // packet per chunk until the 16-slot ring overflows.
    let _ = w.write_packet(|p| p.nested(11, |e| e.bytes(4, &[7u8; 2500])));
    for i in 0..14u64 {
        let _ = w.write_packet(|p| p.uint64(8, i));
        w.flush();
    }
    assert_eq!(handles.control.counters().ring_overflows, 1);
    let written = w.stats().chunks_committed;
    assert_eq!(written, 16);
    drop(w);

    let mut source = DumpSource::open(&path, OFFSET).unwrap();
    assert_eq!(
        source.describe(),
        format!("region dump {}@0x2000", path.display())
    );
    let events = drain(&mut source);
    assert!(matches!(
        &events[0],
        FirmwareEvent::Hello(h) if h.boot_id == 9 && h.data_source == "fw.dumped" && h.clock_id == 65
    ));
    let got = summary(&events);
    // Chunk 0 (whole payload in use: 1012 bytes), its patch group, chunks
    // 1 and 2 of the packet (2 also holds the first small packet and the
    // empty fragment that ends an inflated count), then the small ones
    // trimmed to what their slot announced, except the last: its commit
    // found the ring full, so its whole payload comes.
    let mut want = vec![
        "w1 c0 n1 1012".to_string(),
        "patches c0 1".into(),
        "w1 c1 n1 1012".into(),
        "w1 c2 n3 503".into(),
    ];
    want.extend((3..15).map(|c| format!("w1 c{c} n2 4")));
    want.push("w1 c15 n2 1012".into());
    assert_eq!(got, want);
    assert_eq!(
        events.last(),
        Some(&FirmwareEvent::Stats(vec![
            ("packets_dropped".into(), 0),
            ("ring_overflows".into(), 1),
            ("chunks_lost".into(), 0),
        ]))
    );
    assert_eq!(
        source.stats(),
        DumpStats {
            chunks_complete: 16,
            ring_records: 16,
            ..Default::default()
        }
    );
    assert_eq!(
        source.poll(Duration::ZERO).unwrap_err().to_string(),
        "the input ended"
    );
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn open_chunks_are_scraped_and_broken_parts_counted() {
    let path = file("dump-scrape");
    create(&path);
    let mut fw = Firmware::map(&path);
    let handles = fw.boot(&RegionConfig::new("fw.dumped"));
    let ring = handles.header.ring.offset as usize;
    let smb = handles.header.smb.offset as usize;
    let arbiter = || RegionArbiter::new(&handles, PageLayout::Div4).unwrap();
    // Writer 1: one committed chunk. Writer 2: three packets in a chunk it
    // still holds; writer 3: one packet in a chunk it holds.
    let mut w1: TraceWriter<_> = TraceWriter::new(arbiter(), 1, 0).unwrap();
    let _ = w1.write_packet(|p| p.uint64(8, 1));
    w1.flush();
    let mut w2: TraceWriter<_> = TraceWriter::new(arbiter(), 2, 0).unwrap();
    for i in 0..3 {
        let _ = w2.write_packet(|p| p.uint64(8, i));
    }
    let mut w3: TraceWriter<_> = TraceWriter::new(arbiter(), 3, 0).unwrap();
    let _ = w3.write_packet(|p| p.uint64(8, 1));
    // A patch slot for a chunk the dump does not hold, and a slot of an
    // unknown kind: published by hand after writer 1's.
    use shmtrace_abi::region::{PatchSlot, SlotRepr};
    handles
        .control
        .ring()
        .push(&SlotRepr::Patch(PatchSlot {
            writer_id: 5,
            chunk_id: 0,
            has_more: false,
            offset: 0,
            data: [0; 4],
        }))
        .unwrap();
    handles
        .control
        .ring()
        .push(&SlotRepr::Patch(PatchSlot {
            writer_id: 5,
            chunk_id: 1,
            has_more: false,
            offset: 0,
            data: [0; 4],
        }))
        .unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let region = &bytes[OFFSET as usize..];
    let mut copy = region.to_vec();
    copy[ring + 2 * 32 + 4] = 9; // the second patch's kind
    let mut source = DumpSource::from_bytes(&copy, "copy".into()).unwrap();
    let got = summary(&drain(&mut source));
    // Writer 1's packet (it carries first_packet_on_sequence) and the empty
    // fragment that ends its inflated count. The open chunks count every
    // finished packet plus one (inflated, for scrapers): the last counted
    // fragment is dropped, the finished packets stay.
    assert_eq!(got, ["w1 c0 n2 7", "w2 c0 n3 1012", "w3 c0 n1 1012"]);
    let count = |chunk: usize, bytes: &[u8]| {
        let at = smb + 8 + chunk * 1020;
        ChunkHeader::new_checked(&bytes[at..at + 8])
            .unwrap()
            .packets()
            .count()
    };
    assert_eq!((count(1, &copy), count(2, &copy)), (4, 2));
    let s = source.stats();
    assert_eq!(
        (s.chunks_complete, s.chunks_scraped, s.chunks_not_scraped),
        (1, 2, 0)
    );
    assert_eq!((s.bad_slots, s.patches_without_chunk), (1, 1));

    // An open chunk with one fragment counted (it may be unfinished): left
    // out, counted.
    copy[smb + 8 + 2 * 1020 + 6] = 1;
    let mut source = DumpSource::from_bytes(&copy, "copy".into()).unwrap();
    assert_eq!(summary(&drain(&mut source)).len(), 2);
    assert_eq!(source.stats().chunks_not_scraped, 1);

    // A chunk whose header says writer 0: invalid, counted.
    copy[smb + 8 + 4] = 0;
    copy[smb + 8 + 5] = 0;
    let mut source = DumpSource::from_bytes(&copy, "copy".into()).unwrap();
    let got = summary(&drain(&mut source));
    assert!(got[0].starts_with("w2 "), "{got:?}");
    assert_eq!(source.stats().chunks_invalid, 1);
    assert_eq!(source.transport_loss()[0], ("chunks_invalid", 1));

    // No region at the offset; a file too short for one.
    match DumpSource::open(&path, 0) {
        Err(e @ DumpError::Header { .. }) => {
            assert!(e.to_string().contains("is the offset right?"), "{e}")
        }
        other => panic!("{other:?}"),
    }
    let short = file("dump-short");
    std::fs::write(&short, [0u8; 100]).unwrap();
    assert!(matches!(
        DumpSource::open(&short, 0),
        Err(DumpError::TooShort { len: 100, .. })
    ));
    drop((w1, w2, w3));
    std::fs::remove_file(&path).unwrap();
    std::fs::remove_file(&short).unwrap();
}

#[test]
fn chunk_ids_that_wrap_keep_their_order() {
    let chunk = |id: u32| Chunk {
        chunk_id: id,
        bytes: Vec::new(),
    };
    let ids = |l: Vec<Chunk>| l.iter().map(|c| c.chunk_id).collect::<Vec<_>>();
    let wrapped = vec![chunk(1), chunk(u32::MAX), chunk(0), chunk(u32::MAX - 1)];
    assert_eq!(ids(in_id_order(wrapped)), [u32::MAX - 1, u32::MAX, 0, 1]);
    let plain = vec![chunk(7), chunk(3), chunk(5)];
    assert_eq!(ids(in_id_order(plain)), [3, 5, 7]);
}

/// Whatever a dump holds, reading it never panics and yields at most one
/// event per chunk slot, ring slot and hello/stats: a real dump with bytes
/// overwritten at random.
#[test]
fn scribbled_dumps_never_panic() {
    use proptest::prelude::*;
    let path = file("dump-fuzz");
    create(&path);
    let mut fw = Firmware::map(&path);
    let handles = fw.boot(&RegionConfig::new("fw.dumped"));
    let mut w: TraceWriter<_> = TraceWriter::new(
        RegionArbiter::new(&handles, PageLayout::Div7).unwrap(),
        1,
        0,
    )
    .unwrap();
    let _ = w.write_packet(|p| p.nested(11, |e| e.bytes(4, &[7u8; 1500])));
    for i in 0..20u64 {
        let _ = w.write_packet(|p| p.uint64(8, i));
    }
    w.flush();
    drop(w);
    let bytes = std::fs::read(&path).unwrap()[OFFSET as usize..].to_vec();
    let len = bytes.len();
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 128,
        ..ProptestConfig::default()
    });
    runner
        .run(
            &proptest::collection::vec((0..len, any::<u8>()), 1..64),
            |writes| {
                let mut copy = bytes.clone();
                for (at, b) in writes {
                    copy[at] = b;
                }
                if let Ok(mut source) = DumpSource::from_bytes(&copy, "fuzz".into()) {
                    let events = drain(&mut source);
                    prop_assert!(events.len() <= 2 + 16 * 14 + 16);
                }
                Ok(())
            },
        )
        .unwrap();
    std::fs::remove_file(&path).unwrap();
}
