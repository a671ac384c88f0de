//! Fuzz entry points for `shmtrace-abi`. Each `fuzz_targets/<name>.rs` is a
//! one-line shim over the function of the same name, so the logic can also
//! be run from a test or a debugger.
//!
//! * [`chunk_reader`]: arbitrary bytes as a copied chunk (8-byte header +
//!   payload), parsed as complete and as scraped-incomplete; every fragment
//!   must be consistent with the bytes it came from.
//! * [`patch_apply`]: arbitrary patch groups against a payload, compared
//!   with a straightforward model of the service's rules.
//! * [`writer_roundtrip`]: packets, flushes and service drains chosen by the
//!   input, written through a `TraceWriter` into a real region (its commit
//!   ring of 16 slots overflows too); what the service reassembles must be
//!   exactly the packets the writer reported as written, marked after every
//!   loss.
//! * [`region_reader`]: a region built from arbitrary bytes (a valid header
//!   most of the time, so the ring and SMB get reached), changed between
//!   polls as a scribbling firmware would; the reader must never panic,
//!   loop or return a record that breaks its own rules.
//! * [`frame_decoder`]: an arbitrary byte stream in arbitrary pieces into a
//!   `FrameDecoder`; every byte is accounted for and every frame delivered
//!   has a good CRC and parses or is refused with a typed error.

use std::cell::RefCell;

use libfuzzer_sys::arbitrary::{Result as ArbResult, Unstructured};
use shmtrace_abi::frame::{FrameDecoder, CRC_LEN, HEADER_LEN};
use shmtrace_abi::layout::{ChunkFlags, PageLayout, PageSize};
use shmtrace_abi::reader::{
    apply_patches, FragmentEvent, Fragments, PatchError, MAX_PATCHES_PER_GROUP,
};
use shmtrace_abi::region::{
    HeaderRepr, Name, Record, RegionArbiter, RegionConfig, RegionReader, RegionStorage,
    RingGeometry, SmbGeometry, HEADER_SIZE, SLOT_SIZE,
};
use shmtrace_abi::writer::{PacketOutcome, TraceWriter};

#[path = "../../abi/tests/support/model.rs"]
pub mod model;

use model::{
    check_message, expected_packet, prune, too_deep, Fields, Item, Service, Value, TARGET_BUFFER,
};

// ------------------------------------------------------------ chunk_reader

/// Parses `data` as a copied chunk; panics on any inconsistency.
pub fn chunk_reader(data: &[u8]) {
    let Ok((header, complete)) = Fragments::from_chunk(data) else {
        assert!(data.len() < 8, "header of {} bytes refused", data.len());
        return;
    };
    let payload = &data[8..];
    check_fragments(
        payload,
        header.packets.count(),
        header.packets.flags(),
        complete,
    );
    let incomplete = Fragments::new_incomplete(payload, header.packets);
    let flags = incomplete.flags();
    assert!(!flags.contains(ChunkFlags::LAST_PACKET_CONTINUES_ON_NEXT_CHUNK));
    assert!(!flags.contains(ChunkFlags::CHUNK_NEEDS_PATCHING));
    check_fragments(
        payload,
        header.packets.count().saturating_sub(1),
        flags,
        incomplete,
    );
}

fn check_fragments(payload: &[u8], count: u16, flags: ChunkFlags, mut it: Fragments<'_>) {
    let base = payload.as_ptr() as usize;
    let mut items = 0u16;
    let mut next_index = 0u16;
    let mut last_end = 0usize;
    let mut done = false;
    while let Some(item) = it.next() {
        assert!(!done, "items after the end");
        items += 1;
        assert!(items <= count, "more items than counted fragments");
        match item {
            Ok(FragmentEvent::Data(f)) => {
                assert!(f.index >= next_index && f.index < count);
                assert!(f.offset >= last_end);
                assert!(!f.data.is_empty());
                let start = f.data.as_ptr() as usize - base;
                assert!(start > f.offset && start <= f.offset + 4);
                assert_eq!(size_at(payload, f.offset, start), f.data.len());
                assert!(start + f.data.len() <= payload.len());
                assert_eq!(
                    f.continues_from_prev,
                    f.index == 0
                        && flags.contains(ChunkFlags::FIRST_PACKET_CONTINUES_FROM_PREV_CHUNK)
                );
                assert_eq!(
                    f.continues_on_next,
                    f.index + 1 == count
                        && flags.contains(ChunkFlags::LAST_PACKET_CONTINUES_ON_NEXT_CHUNK)
                );
                next_index = f.index + 1;
                last_end = start + f.data.len();
                assert_eq!(it.consumed(), last_end);
            }
            Ok(FragmentEvent::Dropped(d)) => {
                assert!(d.index >= next_index && d.index < count && d.offset >= last_end);
                assert_eq!(
                    payload.get(d.offset..d.offset + 4),
                    Some(&[0xFF, 0xFF, 0xFF, 0x7F][..])
                );
                done = true;
            }
            Err(_) => done = true,
        }
    }
    assert!(it.next().is_none(), "iterator not fused");
}

/// The size varint spanning `payload[offset..end]`.
fn size_at(payload: &[u8], offset: usize, end: usize) -> usize {
    payload[offset..end]
        .iter()
        .enumerate()
        .map(|(i, b)| usize::from(b & 0x7F) << (7 * i))
        .sum()
}

// ------------------------------------------------------------- patch_apply

/// Applies the patch group encoded in `data` (payload length u16 LE, then
/// `offset: u32 LE, len: u8, data[len]` repeated) and compares the result
/// with a model of the service's rules.
pub fn patch_apply(data: &[u8]) {
    let Some((len, mut rest)) = data.split_first_chunk::<2>() else {
        return;
    };
    let len = usize::from(u16::from_le_bytes(*len));
    let mut patches = Vec::new();
    while let Some((head, tail)) = rest.split_first_chunk::<5>() {
        let offset = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
        let n = usize::from(head[4] % 8);
        let Some(bytes) = tail.get(..n) else { break };
        patches.push((offset, bytes));
        rest = &tail[n..];
    }
    // Large groups from a short input: repeat the group.
    if rest.first().is_some_and(|&b| b == 0xAA) && !patches.is_empty() {
        let group = patches.clone();
        while patches.len() <= MAX_PATCHES_PER_GROUP {
            patches.extend_from_slice(&group);
        }
    }
    let mut payload: Vec<u8> = (0..len).map(|i| i as u8).collect();
    let mut model = payload.clone();
    let outcome = apply_patches(&mut payload, patches.iter().copied());
    if patches.len() > MAX_PATCHES_PER_GROUP {
        assert!(outcome.is_err());
        assert_eq!(payload, model);
        return;
    }
    let outcome = outcome.expect("group within the limit");
    let (mut applied, mut discarded, mut failed) = (0, 0, None);
    for (i, (offset, bytes)) in patches.iter().enumerate() {
        if bytes.len() != 4 {
            discarded += 1;
        } else if (*offset as usize)
            .checked_add(4)
            .is_none_or(|end| end > len)
        {
            failed = Some(i);
            break;
        } else {
            let at = *offset as usize;
            model[at..at + 4].copy_from_slice(bytes);
            applied += 1;
        }
    }
    assert_eq!((outcome.applied, outcome.discarded), (applied, discarded));
    assert_eq!(outcome.failed.map(|f| f.index), failed);
    if let Some(f) = outcome.failed {
        assert!(matches!(f.error, PatchError::OffsetOutOfRange { .. }));
    }
    assert_eq!(payload, model);
}

// -------------------------------------------------------- writer_roundtrip

/// Runs the writer/service round trip the input describes; panics if the
/// service does not get back exactly the written packets.
pub fn writer_roundtrip(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok(pages) = u.int_in_range(1u8..=3) else {
        return;
    };
    let _ = match pages {
        1 => run::<8192>(&mut u),
        2 => run::<16384>(&mut u),
        _ => run::<32768>(&mut u),
    };
}

fn run<const N: usize>(u: &mut Unstructured<'_>) -> ArbResult<()> {
    let page_size = if N > 8192 && u.arbitrary()? {
        8192
    } else {
        4096
    };
    let layout = *u.choose(&PageLayout::PARTITIONED)?;
    let writer_id = u.int_in_range(1u16..=32767)?;
    let mut storage = Box::new(RegionStorage::<N, 16>::new());
    let mut config = RegionConfig::new("fuzz");
    config.page_size = PageSize::new(page_size).expect("valid page size");
    let handles = storage.init(&config).expect("valid region");
    let rx = RefCell::new(RegionReader::attach(&handles).expect("valid region"));
    let service = RefCell::new(Service::default());
    let arbiter = RegionArbiter::new(&handles, layout).expect("valid arbiter");
    // A small patch FIFO, so running out of it happens too.
    let mut writer: TraceWriter<_, 4> =
        TraceWriter::new(arbiter, writer_id, TARGET_BUFFER).expect("valid id");
    let drain = || service.borrow_mut().drain(&mut rx.borrow_mut(), writer_id);

    let mut expected: Vec<Fields> = Vec::new();
    let (mut loss, mut first, mut drops) = (0u32, true, 0u64);
    for _ in 0..u.int_in_range(1u8..=48)? {
        match u.int_in_range(0u8..=9)? {
            0 => drain(),
            1 => writer.flush(),
            _ => {
                let model = gen_fields(u, 0, &mut 24)?;
                let ticks: u64 = u.arbitrary()?;
                let mut n = 0u32;
                let mut tick = || {
                    n = (n + 1) % 64;
                    if ticks >> n & 1 == 1 {
                        drain();
                    }
                };
                let outcome = writer.write_packet(|p| model::write_fields(p, &model, &mut tick));
                match outcome {
                    PacketOutcome::Written | PacketOutcome::Incomplete(_) => {
                        assert_eq!(
                            matches!(outcome, PacketOutcome::Incomplete(_)),
                            too_deep(&model, 0)
                        );
                        expected.push(expected_packet(first, loss, &prune(&model, 0)));
                        first = false;
                        loss = 0;
                    }
                    PacketOutcome::Dropped(reason) => {
                        loss |= reason.loss_bits();
                        drops += 1;
                    }
                }
            }
        }
    }
    for _ in 0..2 {
        writer.flush();
        drain();
    }
    assert_eq!(writer.pending_patches(), 0);
    assert_eq!(writer.stats().packets_dropped(), drops);
    let items = service.borrow().reassemble();
    let survivors: Vec<&Vec<u8>> = items
        .iter()
        .filter_map(|i| {
            if let Item::Packet(b) = i {
                Some(b)
            } else {
                None
            }
        })
        .collect();
    assert!((items.len() - survivors.len()) as u64 <= drops);
    assert_eq!(survivors.len(), expected.len());
    for (i, (bytes, want)) in survivors.iter().zip(&expected).enumerate() {
        if let Err(e) = check_message(bytes, want) {
            panic!("packet {i}: {e}\nexpected {want:?}\ngot {bytes:02x?}");
        }
    }
    Ok(())
}

/// A random message: up to 5 fields, nested up to 20 deep (past the
/// writer's limit), leaf bytes up to 3000, at most `budget` fields in all.
fn gen_fields(u: &mut Unstructured<'_>, depth: u32, budget: &mut u32) -> ArbResult<Fields> {
    let mut fields = Vec::new();
    let n = u.int_in_range(if depth == 0 { 1 } else { 0 }..=5u8)?;
    for _ in 0..n {
        if *budget == 0 {
            break;
        }
        *budget -= 1;
        let field = if u.ratio(1, 8)? {
            u.int_in_range(16..=(1u32 << 29) - 1)?
        } else {
            u.int_in_range(1..=15)?
        };
        let value = match u.int_in_range(0u8..=5)? {
            0 => Value::Varint(u.arbitrary()?),
            1 => Value::Fixed64(u.arbitrary()?),
            2 => Value::Fixed32(u.arbitrary()?),
            3 => {
                let len = if u.ratio(1, 6)? {
                    u.int_in_range(0..=3000)?
                } else {
                    u.int_in_range(0..=40)?
                };
                Value::Bytes((0..len).map(|i: u32| (i * 31 + len) as u8).collect())
            }
            _ if depth < 20 => Value::Nested(gen_fields(u, depth + 1, budget)?),
            _ => Value::Varint(0),
        };
        fields.push((field, value));
    }
    Ok(fields)
}

// ------------------------------------------------------------ region_reader

/// Polls a region made of arbitrary bytes, mutated between polls; panics on
/// any broken reader rule.
pub fn region_reader(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let _ = run_region(&mut u);
}

/// One word-aligned region: 8 KiB SMB of 4 KiB pages, 8 slots.
const RING_AT: usize = HEADER_SIZE;
const SMB_AT: usize = RING_AT + 8 * SLOT_SIZE;
const REGION_LEN: usize = SMB_AT + 8192;

fn run_region(u: &mut Unstructured<'_>) -> ArbResult<()> {
    // The choices come first, from the front of the input, and the
    // region's bytes from the rest: the region is larger than most inputs,
    // and choices drawn after it would all be taken from an exhausted input
    // (their defaults: one poll, no scribbles).
    let valid_header = u.ratio(7, 8)?;
    let boot_id: u32 = u.arbitrary()?;
    let plausible_ring = u.arbitrary::<bool>()?;
    let mut steps = Vec::new();
    for _ in 0..u.int_in_range(1..=24)? {
        // The firmware scribbles after each poll: a few bytes anywhere.
        let mut scribbles = Vec::new();
        for _ in 0..u.int_in_range(0..=4)? {
            scribbles.push((u.int_in_range(0..=REGION_LEN - 1)?, u.arbitrary::<u8>()?));
        }
        steps.push(scribbles);
    }
    let mut seq_steps = [0u32; 8];
    for step in &mut seq_steps {
        *step = u.int_in_range(0..=1)?;
    }
    let mut kinds = [1u8; 8];
    for kind in &mut kinds {
        *kind = u.int_in_range(1..=2)?;
    }
    // u64 words: the region base is 8-aligned.
    let mut mem = vec![0u64; REGION_LEN / 8];
    let bytes = words_as_bytes(&mut mem);
    u.fill_buffer(bytes)?;
    if valid_header {
        let header = HeaderRepr {
            header_size: HEADER_SIZE as u16,
            region_size: REGION_LEN as u32,
            boot_id,
            flags: 0,
            ring: RingGeometry {
                offset: RING_AT as u32,
                slots: 8,
                slot_size: SLOT_SIZE as u32,
            },
            smb: SmbGeometry {
                offset: SMB_AT as u32,
                size: 8192,
                page_size: PageSize::DEFAULT,
            },
            clock_id: 65,
            data_source: Name::new("fuzz").expect("valid name"),
            producer: Name::EMPTY,
        };
        header.emit(&mut bytes[..HEADER_SIZE]).expect("header fits");
        if plausible_ring {
            // A plausible ring: seq words around the tail.
            let tail = u32::from_le_bytes(bytes[0xC4..0xC8].try_into().expect("4 bytes"));
            for (i, (step, kind)) in seq_steps.iter().zip(kinds).enumerate() {
                let at = RING_AT + i * SLOT_SIZE;
                let seq = tail.wrapping_add(i as u32).wrapping_add(*step);
                bytes[at..at + 4].copy_from_slice(&seq.to_le_bytes());
                bytes[at + 4] = kind;
            }
        }
    }
    let base = mem.as_mut_ptr().cast::<u8>();
    // SAFETY: `mem` outlives the reader, which is dropped at the end of
    // this function; between polls the bytes are changed only through
    // `base` with no reference alive and no poll running (one thread).
    let Ok(mut reader) = (unsafe { RegionReader::from_raw_parts(base, REGION_LEN) }) else {
        return Ok(());
    };
    let mut buf = vec![0u8; 4088];
    for scribbles in steps {
        match reader.poll(&mut buf) {
            Ok(Some(Record::Chunk(c))) => {
                assert!(c.bytes.len() >= 8 && c.bytes.len() <= 4088);
                assert!(c.header.validate().is_ok());
                assert!(c.location.page < 2 && c.location.chunk < 14);
            }
            Ok(Some(Record::Patch(_))) | Ok(None) | Err(_) => {}
            Ok(Some(Record::Reset(h))) => assert_eq!(h.region_size as usize, REGION_LEN),
        }
        let stats = reader.stats();
        assert!(stats.chunks_scanned <= stats.chunks);
        for (at, value) in scribbles {
            // SAFETY: `at` < REGION_LEN, in bounds of `mem`; no reference to
            // it is alive and the reader is not running (see above).
            unsafe { base.add(at).write_volatile(value) };
        }
    }
    Ok(())
}

fn words_as_bytes(words: &mut [u64]) -> &mut [u8] {
    let len = words.len() * 8;
    // SAFETY: `u64` has no padding and every byte pattern is a valid `u8`;
    // the slice covers exactly the words' memory and borrows it mutably.
    unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u8>(), len) }
}

// ------------------------------------------------------------ frame_decoder

/// Feeds `data` to a frame decoder in pieces the input chooses.
pub fn frame_decoder(data: &[u8]) {
    let Some((&sizes, stream)) = data.split_first() else {
        return;
    };
    let buf_len = 16 + usize::from(sizes) * 8;
    let mut dec = FrameDecoder::new(vec![0u8; buf_len]);
    let mut frames = 0u64;
    let mut check = |f: shmtrace_abi::frame::RawFrame<'_>| {
        assert!(f.payload.len() + HEADER_LEN + CRC_LEN <= buf_len);
        let _ = f.parse();
        frames += 1;
    };
    let mut rest = stream;
    let mut step = 1 + usize::from(sizes % 13);
    while !rest.is_empty() {
        let (piece, tail) = rest.split_at(step.min(rest.len()));
        rest = tail;
        step = step * 7 % 31 + 1;
        let mut input = piece;
        while !input.is_empty() {
            let (used, frame) = dec.push(input);
            assert!(used <= input.len());
            input = &input[used..];
            match frame {
                Some(f) => check(f),
                None => assert!(input.is_empty()),
            }
        }
    }
    while let Some(f) = dec.finish() {
        check(f);
    }
    let stats = dec.stats();
    assert_eq!(stats.frames, frames);
    assert!(stats.garbage_bytes <= stream.len() as u64);
}
