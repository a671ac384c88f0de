//! Round trip: random packet streams written by `TraceWriter` into a real
//! region, moved out by its `RegionReader` (ring records; acquire for
//! reading, copy, free),
//! patched, reassembled from fragments, and compared with what was written
//! (exactly, see `support/model.rs`).

mod support;

use proptest::prelude::*;
use shmtrace_abi::layout::{PageLayout, PageSize};
use shmtrace_abi::region::{RegionArbiter, RegionConfig, RegionReader, RegionStorage};
use shmtrace_abi::writer::{PacketOutcome, TraceWriter, DEFAULT_PATCH_CAPACITY};
use support::model::{
    check_message, expected_packet, write_fields, Fields, Item, Service, Value, TARGET_BUFFER,
};

// -------------------------------------------------------------- strategies

fn field_number() -> impl Strategy<Value = u32> {
    prop_oneof![8 => 1u32..=40, 1 => 41u32..=41, 1 => 100u32..=20_000, 1 => Just((1 << 29) - 1)]
}

fn blob(max_large: usize) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        6 => proptest::collection::vec(any::<u8>(), 0..64),
        3 => proptest::collection::vec(any::<u8>(), 64..600),
        1 => (600..max_large.max(601)).prop_map(|n| (0..n).map(|i| (i * 7 + n) as u8).collect()),
    ]
}

fn leaf(max_large: usize) -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<u64>().prop_map(Value::Varint),
        (0u64..300).prop_map(Value::Varint),
        any::<u64>().prop_map(Value::Fixed64),
        any::<u32>().prop_map(Value::Fixed32),
        blob(max_large).prop_map(Value::Bytes),
    ]
}

fn fields(max_large: usize, depth: u32) -> impl Strategy<Value = Fields> {
    let value = leaf(max_large).prop_recursive(depth, 24, 5, move |inner| {
        proptest::collection::vec((field_number(), inner), 0..5).prop_map(Value::Nested)
    });
    proptest::collection::vec((field_number(), value), 1..6)
}

fn layout() -> impl Strategy<Value = PageLayout> {
    prop::sample::select(PageLayout::PARTITIONED.to_vec())
}

#[cfg(not(miri))]
mod limits {
    pub const CASES: u32 = 64;
    pub const PAGE_SIZES: &[usize] = &[4096, 8192, 16384, 32768];
    pub const MAX_LARGE: usize = 20_000;
    pub const PACKETS: usize = 24;
}

#[cfg(miri)]
mod limits {
    pub const CASES: u32 = 2;
    pub const PAGE_SIZES: &[usize] = &[4096];
    pub const MAX_LARGE: usize = 1_500;
    pub const PACKETS: usize = 4;
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: limits::CASES,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

const SMB_BYTES: usize = 128 * 1024;

// ------------------------------------------------------------------ tests

proptest! {
    #![proptest_config(config())]

    /// A draining service gets every packet back, whatever the page size,
    /// layout, packet sizes and nesting.
    #[test]
    fn packets_survive_the_round_trip(
        page_size in prop::sample::select(limits::PAGE_SIZES.to_vec()),
        layout in layout(),
        writer_id in 1u16..=32767,
        packets in proptest::collection::vec(fields(limits::MAX_LARGE, 4), 1..=limits::PACKETS),
    ) {
        let mut storage = Box::new(RegionStorage::<SMB_BYTES, 512>::new());
        let mut config = RegionConfig::new("roundtrip");
        config.page_size = PageSize::new(page_size).unwrap();
        let handles = storage.init(&config).unwrap();
        let rx = std::cell::RefCell::new(RegionReader::attach(&handles).unwrap());
        let service = std::cell::RefCell::new(Service::default());
        let arbiter = RegionArbiter::new(&handles, layout).unwrap();
        let mut writer: TraceWriter<_, 128> = TraceWriter::new(arbiter, writer_id, TARGET_BUFFER).unwrap();
        let mut tick = || service.borrow_mut().drain(&mut rx.borrow_mut(), writer_id);
        for model in &packets {
            let outcome = writer.write_packet(|p| write_fields(p, model, &mut tick));
            prop_assert_eq!(outcome, PacketOutcome::Written);
            tick();
        }
        writer.flush();
        tick();
        let stats = writer.stats();
        prop_assert_eq!(stats.packets_written, packets.len() as u64);
        prop_assert_eq!(stats.packets_dropped(), 0);
        prop_assert_eq!(writer.pending_patches(), 0);
        let service = service.into_inner();
        prop_assert_eq!(stats.chunks_committed, service.chunks.len() as u64);
        let items = service.reassemble();
        prop_assert_eq!(items.len(), packets.len());
        for (i, (item, model)) in items.iter().zip(&packets).enumerate() {
            let Item::Packet(bytes) = item else { panic!("packet {i} lost") };
            let expected = expected_packet(i == 0, 0, model);
            if let Err(e) = check_message(bytes, &expected) {
                panic!("packet {i}: {e}\nmodel: {model:?}\nbytes: {bytes:02x?}");
            }
        }
    }

    /// A tiny SMB and a service that drains only now and then: packets are
    /// lost whole, survivors are intact and in order, and the first
    /// survivor after a loss carries `previous_packet_dropped`.
    #[test]
    fn exhaustion_loses_whole_packets_and_marks_the_loss(
        layout in layout(),
        packets in proptest::collection::vec(
            (fields(3_000, 3), prop::bool::weighted(0.1)), 1..=limits::PACKETS * 2),
    ) {
        let mut storage = Box::new(RegionStorage::<8192, 16>::new());
        let handles = storage.init(&RegionConfig::new("roundtrip")).unwrap();
        let mut rx = RegionReader::attach(&handles).unwrap();
        let mut service = Service::default();
        let arbiter = RegionArbiter::new(&handles, layout).unwrap();
        let mut writer: TraceWriter<_> = TraceWriter::new(arbiter, 2, TARGET_BUFFER).unwrap();
        let mut expected = Vec::new();
        let mut loss = 0u32;
        let mut first = true;
        let mut drops = 0u64;
        for (model, drain_after) in &packets {
            match writer.write_packet(|p| write_fields(p, model, &mut || ())) {
                PacketOutcome::Written => {
                    expected.push(expected_packet(first, loss, model));
                    first = false;
                    loss = 0;
                }
                PacketOutcome::Dropped(reason) => {
                    loss |= reason.loss_bits();
                    drops += 1;
                }
                PacketOutcome::Incomplete(e) => panic!("unexpected {e:?}"),
            }
            if *drain_after {
                service.drain(&mut rx, 2);
            }
        }
        // Patches the full ring deferred go out on later flushes. The first
        // flush may find the ring full and deliver nothing; after each drain
        // the ring is empty, so every later flush delivers at least one of
        // the (at most DEFAULT_PATCH_CAPACITY) pending patches. Two fixed
        // rounds fell short when more than a ring of patches waited.
        for _ in 0..=DEFAULT_PATCH_CAPACITY {
            writer.flush();
            service.drain(&mut rx, 2);
            if writer.pending_patches() == 0 {
                break;
            }
        }
        prop_assert_eq!(writer.pending_patches(), 0);
        prop_assert_eq!(writer.stats().packets_dropped(), drops);
        let items = service.reassemble();
        let survivors: Vec<&Vec<u8>> = items
            .iter()
            .filter_map(|i| match i { Item::Packet(b) => Some(b), Item::Lost => None })
            .collect();
        let sentinels = items.len() - survivors.len();
        prop_assert!(sentinels as u64 <= drops);
        prop_assert_eq!(survivors.len(), expected.len());
        for (i, (bytes, want)) in survivors.iter().zip(&expected).enumerate() {
            if let Err(e) = check_message(bytes, want) {
                panic!("survivor {i}: {e}\nexpected: {want:?}\nbytes: {bytes:02x?}");
            }
        }
    }
}

/// One packet three times the size of the SMB, drained while it is written.
#[test]
fn a_packet_larger_than_the_smb() {
    let mut storage = Box::new(RegionStorage::<16384, 64>::new());
    let handles = storage.init(&RegionConfig::new("roundtrip")).unwrap();
    let rx = std::cell::RefCell::new(RegionReader::attach(&handles).unwrap());
    let service = std::cell::RefCell::new(Service::default());
    let arbiter = RegionArbiter::new(&handles, PageLayout::Div7).unwrap();
    let mut writer: TraceWriter<_> = TraceWriter::new(arbiter, 1, TARGET_BUFFER).unwrap();
    let chunk: Vec<u8> = (0..3000u32).map(|i| (i % 251) as u8).collect();
    let n = if cfg!(miri) { 6 } else { 20 };
    let model: Fields = vec![(
        11,
        Value::Nested(
            (0..n)
                .map(|i| (1 + i as u32 % 3, Value::Bytes(chunk.clone())))
                .collect(),
        ),
    )];
    let mut tick = || service.borrow_mut().drain(&mut rx.borrow_mut(), 1);
    let outcome = writer.write_packet(|p| write_fields(p, &model, &mut tick));
    assert_eq!(outcome, PacketOutcome::Written);
    writer.flush();
    tick();
    let service = service.into_inner();
    assert!(
        service.patches_applied >= 1,
        "the outer size arrived as a patch"
    );
    let items = service.reassemble();
    assert_eq!(items.len(), 1);
    let Item::Packet(bytes) = &items[0] else {
        panic!("lost")
    };
    assert!(bytes.len() > 3 * 16384 || cfg!(miri));
    check_message(bytes, &expected_packet(true, 0, &model)).unwrap();
}
