//! Region tests with exact bytes, resets and hostile memory.

use std::boxed::Box;
use std::string::String;
use std::vec::Vec;

use super::*;
use crate::layout::{PageLayout, PageSize};
use crate::sync::AtomicWord32;
use crate::writer::{PacketOutcome, TraceWriter};

fn config() -> RegionConfig<'static> {
    let mut c = RegionConfig::new("fw.te");
    c.producer = "board";
    c.boot_id = 7;
    c
}

/// The region's bytes as they are now (atomic word loads).
fn bytes<const S: usize, const N: usize>(storage: &RegionStorage<S, N>) -> Vec<u8> {
    let base = core::ptr::NonNull::new(storage_ptr(storage)).unwrap();
    // SAFETY: the storage's memory, accessed only atomically here.
    let mem = unsafe { raw::Mem::new(base, RegionStorage::<S, N>::REGION_SIZE) };
    (0..RegionStorage::<S, N>::REGION_SIZE / 4)
        .flat_map(|i| {
            mem.word(4 * i)
                .unwrap()
                .load(core::sync::atomic::Ordering::Relaxed)
                .to_le_bytes()
        })
        .collect()
}

fn storage_ptr<const S: usize, const N: usize>(storage: &RegionStorage<S, N>) -> *mut u8 {
    storage.bytes_ptr()
}

#[test]
fn the_header_has_the_documented_bytes() {
    let mut storage = Box::new(RegionStorage::<8192, 4>::new());
    let handles = storage.init(&config()).unwrap();
    assert_eq!(handles.header.boot_id, 7);
    let _ = handles;
    let b = bytes(&storage);
    assert_eq!(b.len(), 256 + 4 * 32 + 8192);
    #[rustfmt::skip]
    let expected: [u8; 0x40] = [
        0x73, 0x68, 0x6d, 0x74, 0x72, 0x61, 0x63, 0x65, // magic
        0x01, 0x00, 0x00, 0x01, // version 1, header_size 256
        0x80, 0x21, 0x00, 0x00, // region_size 8576
        0x07, 0x00, 0x00, 0x00, // boot_id
        0x00, 0x00, 0x00, 0x00, // flags
        0x00, 0x01, 0x00, 0x00, // ring_offset 256
        0x04, 0x00, 0x00, 0x00, // ring_slots
        0x20, 0x00, 0x00, 0x00, // slot_size
        0x80, 0x01, 0x00, 0x00, // smb_offset 384
        0x00, 0x20, 0x00, 0x00, // smb_size 8192
        0x00, 0x10, 0x00, 0x00, // page_size
        0x41, 0x00, 0x00, 0x00, // clock_id 65
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // reserved
    ];
    assert_eq!(&b[..0x40], &expected);
    assert_eq!(&b[0x40..0x46], b"fw.te\0");
    assert!(b[0x45..0x80].iter().all(|&x| x == 0));
    assert_eq!(&b[0x80..0x86], b"board\0");
    // Control words: trace_enabled = 1, everything else 0.
    let mut control = [0u8; 64];
    control[8] = 1;
    assert_eq!(&b[0xC0..0x100], &control);
    // Ring: seq = index, bodies zero.
    for i in 0..4usize {
        let slot = &b[256 + 32 * i..256 + 32 * (i + 1)];
        assert_eq!(&slot[..4], &(i as u32).to_le_bytes());
        assert!(slot[4..].iter().all(|&x| x == 0));
    }
    // And it parses back.
    let parsed = HeaderRepr::parse(&b[..256], b.len()).unwrap();
    assert_eq!(parsed.data_source.as_str(), "fw.te");
    assert_eq!(parsed.producer.as_str(), "board");
    assert_eq!(parsed.smb.page_size, PageSize::DEFAULT);
    assert!(!parsed.stream_mode());
}

#[test]
fn slots_have_the_documented_bytes() {
    let chunk = SlotRepr::Chunk(ChunkSlot {
        writer_id: 0x0102,
        chunk_id: 0x0A0B_0C0D,
        page: 0x0304,
        chunk: 5,
        used: 0x0000_0F0E,
    });
    #[rustfmt::skip]
    assert_eq!(chunk.to_bytes(9), [
        9, 0, 0, 0, 1, 0, 0x02, 0x01, 0x0D, 0x0C, 0x0B, 0x0A, 0x04, 0x03, 5, 0,
        0x0E, 0x0F, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ]);
    let patch = SlotRepr::Patch(PatchSlot {
        writer_id: 3,
        chunk_id: 4,
        has_more: true,
        offset: 0x0123,
        data: [0x81, 0x82, 0x83, 0x04],
    });
    #[rustfmt::skip]
    assert_eq!(patch.to_bytes(1), [
        1, 0, 0, 0, 2, 1, 3, 0, 4, 0, 0, 0, 0x23, 0x01, 0, 0,
        0x81, 0x82, 0x83, 0x04, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ]);
    for s in [chunk, patch] {
        let bytes = s.to_bytes(77);
        assert_eq!(SlotRepr::from_bytes(&bytes), (77, Ok(s)));
        let view = Slot::new_checked(&bytes[..]).unwrap();
        let w = view.wire().unwrap();
        assert_eq!(w.seq.get(), 77);
        assert_eq!(w.chunk_id.get(), s.to_body()[1]);
    }
    let mut bad = chunk.to_bytes(0);
    bad[4] = 3;
    assert_eq!(SlotRepr::from_bytes(&bad).1, Err(SlotError::UnknownKind(3)));
    assert_eq!(
        Slot::new_checked(&bad[..31]).err(),
        Some(Truncated {
            needed: 32,
            got: 31
        })
    );
}

#[test]
fn header_validation_names_the_field() {
    let mut storage = Box::new(RegionStorage::<8192, 4>::new());
    let _ = storage.init(&config()).unwrap();
    let good = bytes(&storage);
    let len = good.len();
    let check = |patch: &dyn Fn(&mut [u8]), mapped: usize| {
        let mut b = good.clone();
        patch(&mut b);
        HeaderRepr::parse(&b[..256], mapped).err()
    };
    let set32 =
        |at: usize, v: u32| move |b: &mut [u8]| b[at..at + 4].copy_from_slice(&v.to_le_bytes());
    assert_eq!(check(&|_| {}, len), None);
    assert_eq!(
        check(&|b| b[0] = 0, len),
        Some(HeaderError::BadMagic(*b"\0hmtrace"))
    );
    assert_eq!(
        check(&|b| b[8] = 2, len),
        Some(HeaderError::UnsupportedVersion(2))
    );
    assert_eq!(
        check(&|b| b[0xA] = 4, len),
        Some(HeaderError::BadHeaderSize(260))
    );
    assert_eq!(
        check(&|_| {}, len - 1),
        Some(HeaderError::RegionTooLarge {
            region_size: len as u32,
            mapped: len - 1
        })
    );
    assert_eq!(
        check(&set32(0x1C, 3), len),
        Some(HeaderError::BadRingSlots(3))
    );
    assert_eq!(
        check(&set32(0x1C, 1), len),
        Some(HeaderError::BadRingSlots(1))
    );
    assert_eq!(
        check(&set32(0x20, 36), len),
        Some(HeaderError::BadSlotSize(36))
    );
    // A slot size whose ring would wrap a 32-bit length: out of range.
    assert!(matches!(
        check(&set32(0x20, 0xFFFF_FFF8), len),
        Some(HeaderError::OutOfRange {
            part: Part::Ring,
            ..
        })
    ));
    assert_eq!(
        check(&set32(0x18, 0x104), len),
        Some(HeaderError::Misaligned {
            part: Part::Ring,
            offset: 0x104
        })
    );
    assert_eq!(
        check(&set32(0x18, 0x80), len),
        Some(HeaderError::Overlap(Part::Header, Part::Ring))
    );
    assert_eq!(
        check(&set32(0x24, 0x100), len),
        Some(HeaderError::Overlap(Part::Ring, Part::Smb))
    );
    assert_eq!(
        check(&set32(0x24, 0x188), len),
        Some(HeaderError::OutOfRange {
            part: Part::Smb,
            offset: 0x188,
            len: 8192,
            region_size: len as u32
        })
    );
    assert_eq!(
        check(&set32(0x28, 6000), len),
        Some(HeaderError::BadSmbSize {
            smb_size: 6000,
            page_size: 4096
        })
    );
    assert!(matches!(
        check(&set32(0x2C, 100), len),
        Some(HeaderError::BadPageSize(_))
    ));
    assert_eq!(
        check(&set32(0x30, 128), len),
        Some(HeaderError::BadClockId(128))
    );
    assert_eq!(
        check(&set32(0x30, 0), len),
        Some(HeaderError::BadClockId(0))
    );
    assert_eq!(
        check(&|b| b[0x40] = 0, len),
        Some(HeaderError::DataSourceName(NameError::Empty))
    );
    assert_eq!(
        check(&|b| b[0x41] = 0xFF, len),
        Some(HeaderError::DataSourceName(NameError::NotUtf8))
    );
    assert_eq!(
        check(&|b| b[0x80] = 0xC3, len),
        Some(HeaderError::ProducerName(NameError::NotUtf8))
    );
    // A 64-byte name fills the field with no NUL.
    assert_eq!(check(&|b| b[0x40..0x80].fill(b'x'), len), None);
}

#[test]
fn configurations_that_make_no_region_are_refused() {
    let mut s = Box::new(RegionStorage::<6000, 4>::new());
    assert!(matches!(
        s.init(&config()),
        Err(TakeError::Invalid(HeaderError::BadSmbSize { .. }))
    ));
    let mut s = Box::new(RegionStorage::<4096, 3>::new());
    assert_eq!(
        s.init(&config()).err(),
        Some(TakeError::Invalid(HeaderError::BadRingSlots(3)))
    );
    let mut s = Box::new(RegionStorage::<4096, 4>::new());
    let mut c = config();
    c.clock_id = 200;
    assert_eq!(
        s.init(&c).err(),
        Some(TakeError::Invalid(HeaderError::BadClockId(200)))
    );
    c = config();
    c.data_source = "";
    assert_eq!(
        s.init(&c).err(),
        Some(TakeError::Invalid(HeaderError::DataSourceName(
            NameError::Empty
        )))
    );
    c.data_source = "a\0b";
    assert_eq!(
        s.init(&c).err(),
        Some(TakeError::Invalid(HeaderError::DataSourceName(
            NameError::ContainsNul
        )))
    );
    let long = [b'n'; 65];
    c.data_source = core::str::from_utf8(&long).unwrap();
    assert_eq!(
        s.init(&c).err(),
        Some(TakeError::Invalid(HeaderError::DataSourceName(
            NameError::TooLong(65)
        )))
    );
}

#[test]
fn take_succeeds_once_per_program() {
    // The only test of this binary that calls `take`.
    static REGION: RegionStorage<4096, 2> = RegionStorage::new();
    static OTHER: RegionStorage<4096, 2> = RegionStorage::new();
    let bad = RegionConfig::new("");
    assert!(
        matches!(REGION.take(&bad), Err(TakeError::Invalid(_))),
        "a bad config takes nothing"
    );
    let handles = REGION.take(&config()).unwrap();
    assert_eq!(handles.smb.num_pages(), 1);
    assert_eq!(REGION.take(&config()).err(), Some(TakeError::AlreadyTaken));
    assert_eq!(OTHER.take(&config()).err(), Some(TakeError::AlreadyTaken));
    let header = RegionHeader::new(&config()).unwrap();
    assert_eq!(
        OTHER.take_header(&header).err(),
        Some(TakeError::AlreadyTaken)
    );
}

/// `config()` as a constant.
const CONST_CONFIG: RegionConfig<'static> = RegionConfig {
    producer: "board",
    boot_id: 7,
    ..RegionConfig::new("fw.te")
};

#[test]
fn a_header_built_at_compile_time_is_the_one_init_writes() {
    const HEADER: Result<RegionHeader<8192, 4>, TakeError> = RegionHeader::new(&CONST_CONFIG);
    assert_eq!(CONST_CONFIG, config());
    let header = HEADER.unwrap();
    assert_eq!(Ok(header), RegionHeader::new(&config()));
    let mut storage = Box::new(RegionStorage::<8192, 4>::new());
    let handles = storage.init(&config()).unwrap();
    assert_eq!(header.repr(7), handles.header);
    let _ = handles;
    // Its words are the header's bytes after initialization: magic,
    // static part, control words (trace_enabled 1).
    let b = bytes(&storage);
    let words: Vec<u8> = header.words.iter().flat_map(|w| w.to_le_bytes()).collect();
    assert_eq!(&words[..], &b[..HEADER_SIZE]);
    assert_eq!(&b[0xC8..0xCC], &[1, 0, 0, 0]);
    // A second boot over the same memory: a new boot id, the same words
    // otherwise.
    let handles = storage.init(&config()).unwrap();
    assert_eq!(handles.header, header.repr(8));
    let _ = handles;
    let b = bytes(&storage);
    assert_eq!(&b[0x10..0x14], &8u32.to_le_bytes());
    assert_eq!(&words[..0x10], &b[..0x10]);
    assert_eq!(&words[0x14..], &b[0x14..HEADER_SIZE]);

    // Refused at compile time with the errors `init` returns at run time.
    const BAD_SLOTS: Result<RegionHeader<4096, 3>, TakeError> = RegionHeader::new(&CONST_CONFIG);
    assert_eq!(
        BAD_SLOTS.err(),
        Some(TakeError::Invalid(HeaderError::BadRingSlots(3)))
    );
    const BAD_SMB: Result<RegionHeader<6000, 4>, TakeError> = RegionHeader::new(&CONST_CONFIG);
    assert!(matches!(
        BAD_SMB,
        Err(TakeError::Invalid(HeaderError::BadSmbSize {
            smb_size: 6000,
            page_size: 4096
        }))
    ));
    const NO_NAME: Result<RegionHeader<4096, 4>, TakeError> =
        RegionHeader::new(&RegionConfig::new(""));
    assert_eq!(
        NO_NAME.err(),
        Some(TakeError::Invalid(HeaderError::DataSourceName(
            NameError::Empty
        )))
    );
}

#[test]
fn a_reinitialization_resets_ring_and_page_headers_whatever_they_held() {
    let mut storage = Box::new(RegionStorage::<8192, 4>::new());
    let handles = storage.init(&config()).unwrap();
    let arbiter = RegionArbiter::new(&handles, PageLayout::Div4).unwrap();
    let mut writer: TraceWriter<_> = TraceWriter::new(arbiter, 3, 0).unwrap();
    for _ in 0..2 {
        assert_eq!(
            writer.write_packet(|p| p.uint64(8, 100)),
            PacketOutcome::Written
        );
        writer.flush();
    }
    drop(writer);
    let _ = handles;
    let b = bytes(&storage);
    // Two CHUNK slots published (their bodies hold the writer id), ring
    // head 2, a partitioned page.
    assert_eq!(&b[0xC0..0xC4], &2u32.to_le_bytes());
    assert_eq!(&b[256 + 4..256 + 8], &[1, 0, 3, 0]);
    assert_eq!(&b[256 + 32 + 4..256 + 32 + 8], &[1, 0, 3, 0]);
    assert_ne!(&b[384..392], &[0; 8]);

    let _ = storage.init(&config()).unwrap();
    let b = bytes(&storage);
    assert_eq!(&b[0xC0..0xC8], &[0; 8], "ring_head, ring_tail");
    for i in 0..4usize {
        let slot = &b[256 + 32 * i..256 + 32 * (i + 1)];
        assert_eq!(&slot[..4], &(i as u32).to_le_bytes());
        assert!(slot[4..].iter().all(|&x| x == 0), "slot {i}: {slot:?}");
    }
    for page in [384, 384 + 4096] {
        assert_eq!(&b[page..page + 8], &[0; 8], "page header at {page}");
    }
}

/// Storage a host-style reader can keep a pointer into while the test
/// reinitializes it: the pointer is the allocation's own (`bytes` is at
/// offset 0), so the `&mut` borrows of `init` do not invalidate it. Free it
/// with `Box::from_raw`.
fn leaked_storage<const S: usize, const N: usize>() -> (*mut RegionStorage<S, N>, *mut u8) {
    let raw = Box::into_raw(Box::new(RegionStorage::<S, N>::new()));
    (raw, raw.cast::<u8>())
}

#[test]
fn a_reinitialization_is_a_reset_with_a_new_boot_id() {
    let (raw, ptr) = leaked_storage::<8192, 4>();
    // SAFETY: `raw` is a live allocation only this test uses; each `init`
    // borrow ends before the reader touches the memory again.
    let storage = || unsafe { &mut *raw };
    let len = RegionStorage::<8192, 4>::REGION_SIZE;
    let _ = storage().init(&config()).unwrap();
    // SAFETY: the storage outlives the reader and is accessed through
    // region values only; `init` below runs while the reader is alive but
    // idle, as a firmware reset would.
    let mut reader = unsafe { RegionReader::from_raw_parts(ptr, len) }.unwrap();
    let mut buf = std::vec![0u8; reader.chunk_buffer_len()];
    assert!(reader.poll(&mut buf).unwrap().is_none());
    assert_eq!(reader.header().unwrap().boot_id, 7);
    {
        let handles = storage().init(&config()).unwrap();
        assert_eq!(handles.header.boot_id, 8, "old header valid: boot_id + 1");
        let mut w: TraceWriter<_> = TraceWriter::new(
            RegionArbiter::new(&handles, PageLayout::Div2).unwrap(),
            1,
            0,
        )
        .unwrap();
        assert_eq!(w.write_packet(|p| p.uint64(8, 1)), PacketOutcome::Written);
        w.flush();
    }
    let Some(Record::Reset(h)) = reader.poll(&mut buf).unwrap() else {
        panic!("expected a reset")
    };
    assert_eq!(h.boot_id, 8);
    let Some(Record::Chunk(c)) = reader.poll(&mut buf).unwrap() else {
        panic!("expected the new boot's chunk")
    };
    assert_eq!((c.header.writer_id, c.header.chunk_id), (1, 0));
    assert_eq!(reader.stats().resets, 1);
    // Magic cleared (a reset in progress): an error, then a reset once
    // it is back, even with the same boot id.
    // SAFETY: the storage's memory, accessed atomically.
    let mem = unsafe { raw::Mem::new(core::ptr::NonNull::new(ptr).unwrap(), len) };
    let magic = mem.word(0).unwrap();
    magic.store(0, core::sync::atomic::Ordering::Relaxed);
    assert!(matches!(
        reader.poll(&mut buf),
        Err(ReaderError::Header(HeaderError::BadMagic(_)))
    ));
    assert!(reader.header().is_none());
    magic.store(wire::MAGIC_WORDS[0], core::sync::atomic::Ordering::Release);
    assert!(matches!(reader.poll(&mut buf), Ok(Some(Record::Reset(h))) if h.boot_id == 8));
    assert!(reader.poll(&mut buf).unwrap().is_none());
    // SAFETY: from `Box::into_raw`, no longer used.
    drop(unsafe { Box::from_raw(raw) });
}

/// A reset that zeroes the region's RAM (QEMU zero-fills the firmware's
/// `NOLOAD` region segment at every reset) repeats `boot_id`: the reader
/// still reports it, from the `ring_tail` it stored being gone, and the
/// new boot's chunk, whose writer and chunk ids repeat the old boot's,
/// comes after the reset.
#[test]
fn a_reset_that_zeroed_the_ram_is_a_reset_with_the_same_boot_id() {
    let (raw, ptr) = leaked_storage::<8192, 4>();
    // SAFETY: as in `a_reinitialization_is_a_reset_with_a_new_boot_id`.
    let storage = || unsafe { &mut *raw };
    let len = RegionStorage::<8192, 4>::REGION_SIZE;
    let boot = |zero: bool| {
        if zero {
            // SAFETY: the storage's bytes; the reader is idle and holds no
            // reference into them.
            unsafe { core::ptr::write_bytes(ptr, 0, len) };
        }
        let handles = storage().init(&config()).unwrap();
        assert_eq!(handles.header.boot_id, 7, "no old header: the config's");
        let mut w: TraceWriter<_> = TraceWriter::new(
            RegionArbiter::new(&handles, PageLayout::Div2).unwrap(),
            1,
            0,
        )
        .unwrap();
        assert_eq!(w.write_packet(|p| p.uint64(8, 1)), PacketOutcome::Written);
        w.flush();
    };
    boot(false);
    // SAFETY: as in `a_reinitialization_is_a_reset_with_a_new_boot_id`.
    let mut reader = unsafe { RegionReader::from_raw_parts(ptr, len) }.unwrap();
    let mut buf = std::vec![0u8; reader.chunk_buffer_len()];
    let Some(Record::Chunk(c)) = reader.poll(&mut buf).unwrap() else {
        panic!("expected the first boot's chunk")
    };
    assert_eq!((c.header.writer_id, c.header.chunk_id), (1, 0));
    assert!(reader.poll(&mut buf).unwrap().is_none());
    boot(true);
    assert!(
        matches!(reader.poll(&mut buf), Ok(Some(Record::Reset(h))) if h.boot_id == 7),
        "the zeroed, reinitialized region is a reset"
    );
    let Some(Record::Chunk(c)) = reader.poll(&mut buf).unwrap() else {
        panic!("expected the new boot's chunk")
    };
    assert_eq!((c.header.writer_id, c.header.chunk_id), (1, 0));
    assert!(reader.poll(&mut buf).unwrap().is_none());
    let stats = reader.stats();
    assert_eq!((stats.resets, stats.chunks, stats.bad_slots), (1, 2, 0));
    // SAFETY: from `Box::into_raw`, no longer used.
    drop(unsafe { Box::from_raw(raw) });
}

#[test]
fn a_stream_mode_region_is_refused_to_hosts() {
    let (raw, ptr) = leaked_storage::<4096, 4>();
    let mut c = config();
    c.stream_mode = true;
    // SAFETY: `raw` is a live allocation only this test uses.
    let handles = unsafe { &mut *raw }.init(&c).unwrap();
    assert!(
        RegionReader::attach(&handles).is_ok(),
        "the firmware itself may"
    );
    // SAFETY: as above.
    let host = unsafe { RegionReader::from_raw_parts(ptr, RegionStorage::<4096, 4>::REGION_SIZE) };
    assert_eq!(host.err(), Some(ReaderError::StreamMode));
    // SAFETY: from `Box::into_raw`, no longer used.
    drop(unsafe { Box::from_raw(raw) });
}

#[test]
fn garbage_slots_cost_their_record_and_are_counted() {
    let mut storage = Box::new(RegionStorage::<8192, 4>::new());
    let handles = storage.init(&config()).unwrap();
    let mut w: TraceWriter<_> = TraceWriter::new(
        RegionArbiter::new(&handles, PageLayout::Div4).unwrap(),
        2,
        0,
    )
    .unwrap();
    let mut reader = RegionReader::attach(&handles).unwrap();
    let mut buf = std::vec![0u8; reader.chunk_buffer_len()];
    let ring = *handles.control.ring();
    let seq = |i: u32| ring::RingWords::seq(&ring, i).unwrap();
    let ord = core::sync::atomic::Ordering::Relaxed;
    // Slot 0: a nonsense sequence word. Slot 1: published, unknown kind.
    // Slot 2: a CHUNK slot for a chunk that is not Complete.
    seq(0).store(0xDEAD, ord);
    ring::RingWords::head(&ring).store(3, ord);
    ring::RingWords::write_body(&ring, 1, &[9, 0, 0, 0, 0, 0, 0]);
    seq(1).store(2, ord);
    let stale = SlotRepr::Chunk(ChunkSlot {
        writer_id: 2,
        chunk_id: 0,
        page: 1,
        chunk: 3,
        used: 8,
    });
    ring::RingWords::write_body(&ring, 2, &stale.to_body());
    seq(2).store(3, ord);
    assert!(reader.poll(&mut buf).unwrap().is_none());
    let stats = reader.stats();
    assert_eq!((stats.bad_slots, stats.stale_commits), (2, 1));
    // The slots were handed back: the writer's commits get through.
    assert_eq!(handles.control.counters().ring_tail, 3);
    assert_eq!(w.write_packet(|p| p.uint64(8, 5)), PacketOutcome::Written);
    w.flush();
    assert!(matches!(reader.poll(&mut buf), Ok(Some(Record::Chunk(c))) if c.header.writer_id == 2));
    assert_eq!(handles.control.counters().ring_overflows, 0);
    // A short buffer is refused before anything is consumed.
    assert_eq!(
        reader.poll(&mut buf[..100]).err(),
        Some(ReaderError::BufferTooSmall {
            needed: 4088,
            got: 100
        })
    );
}

#[test]
fn control_words_round_trip_between_host_and_firmware() {
    let mut storage = Box::new(RegionStorage::<4096, 2>::new());
    let handles = storage.init(&config()).unwrap();
    let host = RegionReader::attach(&handles).unwrap().control().unwrap();
    let fw = handles.control;
    assert!(fw.trace_enabled());
    host.set_trace_enabled(false);
    assert!(!fw.trace_enabled());
    assert_eq!(host.request_clear(), 1);
    assert_eq!(fw.clear_request(), 1);
    let id = host.request_flush();
    assert_eq!((fw.flush_request(), fw.flush_ack()), (1, 0));
    fw.ack_flush(id);
    assert_eq!(host.flush_ack(), id);
    assert_eq!(host.sync_response(), None);
    assert!(!fw.answer_sync(|| unreachable!("no request yet")));
    host.request_sync(42);
    assert!(fw.answer_sync(|| 0x1_0000_0002));
    assert!(!fw.answer_sync(|| unreachable!("answered once per nonce")));
    assert_eq!(host.sync_response(), Some((42, 0x1_0000_0002)));
    fw.count_packets_dropped(3);
    fw.count_chunk_lost();
    fw.beat();
    let c = host.counters();
    assert_eq!((c.packets_dropped, c.chunks_lost, c.heartbeat), (3, 1, 1));
}

#[test]
fn patches_need_room_for_the_whole_group() {
    let mut storage = Box::new(RegionStorage::<4096, 2>::new());
    let handles = storage.init(&config()).unwrap();
    let mut arbiter = RegionArbiter::new(&handles, PageLayout::Div14).unwrap();
    // A writer whose packet spans three chunks with two open nested
    // messages: its patch groups need 2 slots while chunk commits take
    // them too.
    let mut w: TraceWriter<_> = TraceWriter::new(&mut arbiter, 1, 0).unwrap();
    let blob = [7u8; 600];
    assert_eq!(
        w.write_packet(|p| p.nested(1, |a| a.nested(2, |b| b.bytes(3, &blob)))),
        PacketOutcome::Written
    );
    w.flush();
    assert!(w.stats().patch_deliveries_deferred > 0, "{:?}", w.stats());
    assert!(w.pending_patches() > 0);
    // Drained, the ring takes the group on the next flush.
    let mut reader = RegionReader::attach(&handles).unwrap();
    let mut buf = std::vec![0u8; reader.chunk_buffer_len()];
    let mut records = Vec::new();
    for _ in 0..4 {
        while let Some(r) = reader.poll(&mut buf).unwrap() {
            records.push(match r {
                Record::Chunk(c) => std::format!("C{}", c.header.chunk_id),
                Record::Patch(p) => {
                    std::format!("P{}{}", p.chunk_id, if p.has_more { "+" } else { "" })
                }
                Record::Reset(_) => panic!(),
            });
        }
        w.flush();
    }
    assert_eq!(w.pending_patches(), 0);
    let patches: Vec<_> = records.iter().filter(|r| r.starts_with('P')).collect();
    assert_eq!(patches, ["P0+", "P0"], "{records:?}");
    let first_patch = records.iter().position(|r| r.starts_with('P')).unwrap();
    assert!(
        records[..first_patch].contains(&"C0".into()),
        "a chunk precedes its patches: {records:?}"
    );
}

#[test]
fn packets_the_writers_drop_are_counted_in_the_region() {
    let mut storage = Box::new(RegionStorage::<4096, 8>::new());
    let handles = storage.init(&config()).unwrap();
    // The general writer: a full SMB (nobody drains) drops packets.
    let mut w: TraceWriter<_> = TraceWriter::new(
        RegionArbiter::new(&handles, PageLayout::Div4).unwrap(),
        1,
        0,
    )
    .unwrap();
    let blob = [1u8; 500];
    let mut dropped = 0;
    for _ in 0..20 {
        if let PacketOutcome::Dropped(_) = w.write_packet(|p| p.bytes(3, &blob)) {
            dropped += 1;
        }
    }
    assert!(dropped > 0);
    assert_eq!(w.stats().packets_dropped(), dropped);
    assert_eq!(handles.control.counters().packets_dropped, dropped as u32);
    // The in-place writer: too long a packet, and no chunk left.
    let mut p = crate::writer::InPlaceWriter::new(
        RegionArbiter::new(&handles, PageLayout::Div4).unwrap(),
        2,
        0,
    )
    .unwrap();
    assert!(matches!(
        p.write(|c| c.bytes(&[2u8; 200])),
        PacketOutcome::Dropped(_)
    ));
    assert!(matches!(
        p.write(|c| c.bytes(&[2u8; 20])),
        PacketOutcome::Dropped(_)
    ));
    assert_eq!(p.stats().packets_dropped(), 2);
    assert_eq!(
        handles.control.counters().packets_dropped,
        dropped as u32 + 2
    );
}

#[test]
fn emit_writes_the_static_part_word_by_word_as_init_does() {
    // Names of 64 and 63 distinct bytes: a word placed or ordered wrongly
    // shows.
    let data_source: String = (0..64u8).map(|i| char::from(b'!' + i)).collect();
    let producer: String = (0..63u8).map(|i| char::from(b'A' + i % 26)).collect();
    let config = RegionConfig {
        data_source: &data_source,
        producer: &producer,
        ..config()
    };
    let mut storage = Box::new(RegionStorage::<8192, 4>::new());
    let header = storage.init(&config).unwrap().header;
    let b = bytes(&storage);
    assert_eq!(&b[0x40..0x80], data_source.as_bytes());
    assert_eq!(&b[0x80..0xBF], producer.as_bytes());
    assert_eq!(b[0xBF], 0);

    // `emit` writes the same static part and leaves the control words.
    let mut buf = [0xAAu8; 256];
    header.emit(&mut buf).unwrap();
    assert_eq!(&buf[..0xC0], &b[..0xC0]);
    assert!(buf[0xC0..].iter().all(|&x| x == 0xAA));
    assert_eq!(HeaderRepr::parse(&buf, b.len()).unwrap(), header);
    assert_eq!(
        header.emit(&mut [0u8; 255]),
        Err(Truncated {
            needed: 256,
            got: 255
        })
    );
}

#[test]
fn a_push_into_a_full_or_broken_ring_fails_and_moves_nothing() {
    let mut storage = Box::new(RegionStorage::<8192, 2>::new());
    let handles = storage.init(&config()).unwrap();
    let ring = *handles.control.ring();
    let ord = core::sync::atomic::Ordering::Relaxed;
    let seq = |i: u32| ring::RingWords::seq(&ring, i).unwrap().load(ord);
    let head = || ring::RingWords::head(&ring).load(ord);
    let record = |chunk_id| {
        SlotRepr::Chunk(ChunkSlot {
            writer_id: 1,
            chunk_id,
            page: 0,
            chunk: 0,
            used: 8,
        })
    };
    // Two slots: two records, then full (nobody consumed).
    assert_eq!(ring.push(&record(0)), Ok(()));
    assert_eq!(ring.push(&record(1)), Ok(()));
    assert_eq!((head(), seq(0), seq(1)), (2, 1, 2));
    assert_eq!(ring.push(&record(2)), Err(ring::RingFull));
    assert_eq!((head(), seq(0), seq(1)), (2, 1, 2));
    // Consumed: free again, the record lands in slot 0 for position 2.
    ring::release(&ring, 0);
    assert_eq!(ring.push(&record(2)), Ok(()));
    assert_eq!((head(), seq(0)), (3, 3));
    assert_eq!(ring::peek(&ring, 2), ring::Peek::Ready(record(2).to_body()));
    // A peer sets slot 1's sequence word ahead of `head` (3) as if another
    // producer had claimed position 3, but `head` never moves: the push
    // gives up as full after its bounded retries, claiming nothing.
    ring::RingWords::seq(&ring, 1).unwrap().store(7, ord);
    assert_eq!(ring.push(&record(3)), Err(ring::RingFull));
    assert_eq!((head(), seq(1)), (3, 7));
}
