//! The engine against a recording [`Output`].

use std::cell::RefCell;
use std::rc::Rc;

use shmtrace_abi::layout::{ChunkFlags, ChunkHeaderRepr, Packets};
use shmtrace_abi::reader::Fragments;
use shmtrace_producer::{ForwardError, ForwardPatch, Forwarded, RegisterError};

use super::*;
use crate::bridge::clock::{snapshot_packet, BOOTTIME};
use crate::bridge::{ClockSample, Hello, PatchGroup};

#[derive(Debug, Clone, PartialEq, Eq)]
enum Call {
    Register(String),
    New(u32, String),
    Inject(u32, Vec<u8>),
    Chunk(u32, u32),
    Patches(u32, u32, usize),
    Dropped(u32),
    /// A loss marked at the end of sequence `.0` in session `.1`.
    Loss(u32, Option<u64>),
}

type Log = Rc<RefCell<Vec<Call>>>;

struct Seq(u32, Log);

impl Drop for Seq {
    fn drop(&mut self) {
        self.1.borrow_mut().push(Call::Dropped(self.0));
    }
}

struct Fake {
    log: Log,
    next: u32,
    sessions: bool,
    refuse: Option<String>,
}

impl Output for Fake {
    type Sequence = Seq;

    fn register(&mut self, name: &str) -> Result<(), RegisterError> {
        if self.refuse.as_deref() == Some(name) {
            return Err(RegisterError::AlreadyRegistered(name.into()));
        }
        self.log.borrow_mut().push(Call::Register(name.into()));
        Ok(())
    }

    fn new_sequence(&mut self, name: &str) -> Option<Seq> {
        self.next += 1;
        self.log
            .borrow_mut()
            .push(Call::New(self.next, name.into()));
        Some(Seq(self.next, self.log.clone()))
    }

    fn forward_chunk(&mut self, seq: &mut Seq, chunk: &[u8]) -> Result<Forwarded, ForwardError> {
        let (header, fragments) = Fragments::from_chunk(chunk).map_err(ForwardError::Invalid)?;
        for f in fragments {
            f.map_err(ForwardError::Invalid)?;
        }
        if !self.sessions {
            return Err(ForwardError::NoSession);
        }
        self.log
            .borrow_mut()
            .push(Call::Chunk(seq.0, header.chunk_id));
        Ok(Forwarded {
            copies: 1,
            ..Default::default()
        })
    }

    fn forward_patches(
        &mut self,
        seq: &mut Seq,
        chunk_id: u32,
        patches: &[ForwardPatch],
        _has_more: bool,
    ) -> usize {
        self.log
            .borrow_mut()
            .push(Call::Patches(seq.0, chunk_id, patches.len()));
        patches.len()
    }

    fn set_injected_packet(&mut self, seq: &mut Seq, packet: &[u8]) {
        self.log
            .borrow_mut()
            .push(Call::Inject(seq.0, packet.to_vec()));
    }

    fn mark_loss(&mut self, seq: &mut Seq, instance_id: Option<u64>) -> usize {
        self.log.borrow_mut().push(Call::Loss(seq.0, instance_id));
        1
    }
}

fn engine() -> (Engine<Fake>, Log) {
    let log = Log::default();
    let fake = Fake {
        log: log.clone(),
        next: 0,
        sessions: true,
        refuse: None,
    };
    (Engine::new(fake), log)
}

fn hello(boot_id: u32, clock_id: u32) -> FirmwareEvent {
    FirmwareEvent::Hello(Hello {
        boot_id,
        data_source: "fw".into(),
        producer: "mcu".into(),
        clock_id,
    })
}

/// A chunk of `writer` with id `id` holding one 2-byte packet.
fn chunk(writer: u16, id: u32) -> FirmwareEvent {
    let header = ChunkHeaderRepr {
        chunk_id: id,
        writer_id: writer,
        packets: Packets::new(1, ChunkFlags::EMPTY).unwrap(),
    };
    let mut bytes = header.to_bytes().to_vec();
    bytes.extend_from_slice(&[2, 0x40, id as u8]);
    FirmwareEvent::Chunk(bytes)
}

fn take(log: &Log) -> Vec<Call> {
    std::mem::take(&mut *log.borrow_mut())
}

/// [`take`], sorted: the order of a boot's sequences in a map is none.
fn take_sorted(log: &Log) -> Vec<Call> {
    let mut calls = take(log);
    calls.sort_by_key(|c| format!("{c:?}"));
    calls
}

const MS: u64 = 1_000_000;

#[test]
fn chunks_go_into_one_sequence_per_writer_and_none_before_the_hello() {
    let (mut e, log) = engine();
    e.handle(chunk(1, 0), 0);
    assert_eq!(e.stats().chunks_before_hello, 1);
    // BOOTTIME firmware: no clock to relate, nothing held.
    e.handle(hello(7, BOOTTIME), 0);
    for (w, id) in [(1, 0), (2, 0), (1, 1)] {
        e.handle(chunk(w, id), 0);
    }
    assert_eq!(
        take(&log),
        [
            Call::Register("fw".into()),
            Call::New(1, "fw".into()),
            Call::Chunk(1, 0),
            Call::New(2, "fw".into()),
            Call::Chunk(2, 0),
            Call::Chunk(1, 1),
        ]
    );
    assert_eq!(
        (
            e.stats().chunks,
            e.stats().chunks_forwarded,
            e.stats().snapshots
        ),
        (4, 3, 0)
    );
}

#[test]
fn a_new_boot_never_mixes_with_the_old_one() {
    let (mut e, log) = engine();
    // A bridge that started after the firmware's first hello: its chunks
    // wait for the hello the firmware repeats (every second).
    e.handle(chunk(1, 4), 0);
    e.handle(hello(7, BOOTTIME), 0);
    e.handle(chunk(1, 5), 0);
    // The same boot announced again (the firmware's repeat, a transport
    // that re-attached): go on.
    e.handle(hello(7, BOOTTIME), 0);
    e.handle(chunk(1, 6), 0);
    // A reboot: same writer and chunk ids, a new sequence.
    e.handle(hello(8, BOOTTIME), 0);
    e.handle(chunk(1, 5), 0);
    e.handle(FirmwareEvent::Reset, 0);
    e.handle(chunk(1, 6), 0);
    assert_eq!(
        take(&log),
        [
            Call::Register("fw".into()),
            Call::New(1, "fw".into()),
            Call::Chunk(1, 5),
            Call::Chunk(1, 6),
            Call::Dropped(1),
            Call::Register("fw".into()),
            Call::New(2, "fw".into()),
            Call::Chunk(2, 5),
            Call::Dropped(2),
        ]
    );
    let s = e.stats();
    assert_eq!((s.boots, s.resets, s.chunks_before_hello), (2, 1, 2));
}

#[test]
fn bad_hellos_and_bad_chunks_are_refused_and_counted() {
    let (mut e, log) = engine();
    let nameless = || {
        FirmwareEvent::Hello(Hello {
            boot_id: 2,
            data_source: String::new(),
            producer: "p".into(),
            clock_id: 6,
        })
    };
    e.handle(hello(1, 128), 0);
    e.handle(nameless(), 0);
    assert_eq!(e.stats().hellos_refused, 2);
    assert_eq!(e.take_notes().len(), 2);
    assert!(e.hello().is_none());
    // The firmware repeats its hello every second: counted, noted once.
    e.handle(nameless(), 0);
    assert_eq!(e.stats().hellos_refused, 3);
    assert!(e.take_notes().is_empty());
    e.handle(hello(3, BOOTTIME), 0);
    e.handle(chunk(0, 1), 0); // writer id 0
    e.handle(FirmwareEvent::Chunk(vec![1, 2, 3]), 0); // no header
    let FirmwareEvent::Chunk(mut broken) = chunk(1, 1) else {
        unreachable!()
    };
    broken[8] = 9; // a fragment longer than the chunk
    e.handle(FirmwareEvent::Chunk(broken), 0);
    e.output_mut_for_test().sessions = false;
    e.handle(chunk(1, 2), 0);
    let s = e.stats();
    assert_eq!(
        (
            s.chunks,
            s.chunks_invalid,
            s.chunks_no_session,
            s.chunks_forwarded
        ),
        (4, 3, 1, 0)
    );
    // Patches of a writer with no chunk: dropped.
    e.handle(
        FirmwareEvent::Patches(PatchGroup {
            writer_id: 9,
            chunk_id: 0,
            has_more: false,
            patches: vec![],
        }),
        0,
    );
    assert_eq!(e.stats().patch_groups_dropped, 1);
    drop(take(&log));
}

impl Engine<Fake> {
    fn output_mut_for_test(&mut self) -> &mut Fake {
        &mut self.out
    }
}

#[test]
fn chunks_wait_for_the_first_clock_sample_then_follow_its_snapshot() {
    let (mut e, log) = engine();
    e.session_started(1);
    e.handle(hello(1, 65), 1000 * MS);
    e.handle(chunk(1, 0), 1000 * MS);
    e.handle(
        FirmwareEvent::Patches(PatchGroup {
            writer_id: 1,
            chunk_id: 0,
            has_more: false,
            patches: vec![ForwardPatch {
                offset: 0,
                data: [0x82, 0x80, 0x80, 0x00],
            }],
        }),
        1000 * MS,
    );
    assert_eq!(take(&log), [Call::Register("fw".into())], "held");
    // Two-way: the engine asks, the firmware answers 2 ms later.
    let requests = e.tick(1001 * MS, true);
    let [Request::Sync(nonce)] = requests[..] else {
        panic!("{requests:?}")
    };
    assert!(e.tick(1001 * MS + 1, true).is_empty(), "one per period");
    e.handle(
        FirmwareEvent::Clock(ClockSample {
            firmware_ns: 50 * MS,
            nonce: Some(nonce),
            transfer_ns: 0,
        }),
        1003 * MS,
    );
    // boot = firmware + (1002 - 50) ms, within ±1 ms, stated at the
    // host's time of the answer.
    let snapshot = snapshot_packet(65, 51 * MS, 1003 * MS);
    assert_eq!(
        take(&log),
        [
            Call::New(1, "fw".into()),
            Call::Inject(1, snapshot.clone()),
            Call::Chunk(1, 0),
            Call::Patches(1, 0, 1),
        ]
    );
    let status = e.clock(1003 * MS).unwrap();
    let est = status.estimate.unwrap();
    assert_eq!(
        (est.offset_ns, est.bound_ns, est.two_way),
        (952 * MS as i64, MS, true)
    );
    // New writers get the snapshot before their first chunk; a second
    // later every sequence gets a fresh one.
    e.handle(chunk(2, 0), 1004 * MS);
    e.tick(1500 * MS, false);
    let calls = take(&log);
    assert_eq!(
        calls[..3],
        [
            Call::New(2, "fw".into()),
            Call::Inject(2, snapshot),
            Call::Chunk(2, 0)
        ]
    );
    assert_eq!(calls.len(), 3, "not due yet: {calls:?}");
    e.tick(2004 * MS, false);
    let calls = take(&log);
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert!(calls.iter().all(|c| matches!(c, Call::Inject(..))));
    assert_eq!(e.stats().snapshots, 2);
    assert_eq!(e.stats().chunks_without_clock, 0);
}

#[test]
fn without_a_clock_sample_chunks_go_after_the_hold_and_are_counted() {
    let (mut e, log) = engine();
    e.session_started(1);
    e.handle(hello(1, 70), 0);
    e.handle(chunk(1, 0), 0);
    assert!(e.tick(HOLD_NS - 1, false).is_empty());
    assert_eq!(take(&log).len(), 1, "still held");
    e.tick(HOLD_NS, false);
    e.handle(chunk(1, 1), HOLD_NS);
    assert_eq!(
        take(&log),
        [
            Call::New(1, "fw".into()),
            Call::Chunk(1, 0),
            Call::Chunk(1, 1)
        ]
    );
    assert_eq!(e.stats().chunks_without_clock, 2);
    assert_eq!(e.take_notes().len(), 1);
    // A one-way sample later: the snapshot follows into the sequence.
    e.handle(
        FirmwareEvent::Clock(ClockSample {
            firmware_ns: 10,
            nonce: None,
            transfer_ns: 5,
        }),
        HOLD_NS + 100,
    );
    assert_eq!(
        take(&log),
        [Call::Inject(1, snapshot_packet(70, 15, HOLD_NS + 100))]
    );
}

#[test]
fn a_full_hold_goes_at_once() {
    let (mut e, log) = engine();
    e.session_started(1);
    e.handle(hello(1, 70), 0);
    for id in 0..HOLD_EVENTS as u32 {
        e.handle(chunk(1, id), 0);
    }
    assert_eq!(take(&log).len(), 1 + 1 + HOLD_EVENTS);
    assert_eq!(e.stats().chunks_forwarded, HOLD_EVENTS as u64);
}

#[test]
fn an_offline_import_uses_the_fixed_relation() {
    let log = Log::default();
    let fake = Fake {
        log: log.clone(),
        next: 0,
        sessions: true,
        refuse: None,
    };
    let mut e = Engine::with_fixed_clock(fake, 0);
    e.handle(hello(1, 65), 0);
    e.handle(chunk(1, 0), 0);
    assert!(e.tick(0, true).is_empty(), "never asks");
    assert_eq!(
        take(&log),
        [
            Call::Register("fw".into()),
            Call::New(1, "fw".into()),
            Call::Inject(1, snapshot_packet(65, 0, 0)),
            Call::Chunk(1, 0),
        ]
    );
}

#[test]
fn a_negative_fixed_offset_is_stated_where_boottime_reads_0() {
    let (_, log) = engine();
    let fake = Fake {
        log: log.clone(),
        next: 0,
        sessions: true,
        refuse: None,
    };
    // BOOTTIME = firmware - 5 s.
    let mut e = Engine::with_fixed_clock(fake, -5_000 * MS as i64);
    e.handle(hello(1, 65), 0);
    e.handle(chunk(1, 0), 0);
    assert_eq!(
        take(&log)[2],
        Call::Inject(1, snapshot_packet(65, 5_000 * MS, 0))
    );
}

/// Successive snapshots never move a clock back (a trace processor
/// refuses a snapshot that moves BOOTTIME back, and stops converting from
/// a clock that goes back): an estimate that jumps by more than the time
/// since the last snapshot waits until time catches up.
#[test]
fn snapshots_never_go_back_in_time() {
    let (mut e, log) = engine();
    e.session_started(1);
    e.handle(hello(1, 65), 0);
    e.handle(chunk(1, 0), 0);
    let sample = |e: &mut Engine<Fake>, asked: u64, fw: u64, answered: u64| {
        let [Request::Sync(nonce)] = e.tick(asked, true)[..] else {
            panic!("no sync asked at {asked}")
        };
        e.handle(
            FirmwareEvent::Clock(ClockSample {
                firmware_ns: fw,
                nonce: Some(nonce),
                transfer_ns: 0,
            }),
            answered,
        );
    };
    // offset 900 ms (firmware 100 ms at 1000 ms), bound 1 µs; stated at
    // the answer's time.
    sample(&mut e, 1000 * MS - 1_000, 100 * MS, 1000 * MS + 1_000);
    assert_eq!(
        take(&log)[2],
        Call::Inject(1, snapshot_packet(65, 100 * MS + 1_000, 1000 * MS + 1_000))
    );
    // A second later the firmware reads 50 ms: offset 1950 ms. Stated now
    // its clock would read 50 ms, before the last snapshot's 100 ms.
    sample(&mut e, 2000 * MS - 1_000, 50 * MS, 2000 * MS + 1_000);
    assert!(e.stats().snapshots_deferred >= 1, "{:?}", e.stats());
    assert!(take(&log).is_empty(), "nothing injected yet");
    // Time catches up: injected, both clocks past the last snapshot's.
    e.tick(2100 * MS, false);
    assert_eq!(
        take(&log),
        [Call::Inject(1, snapshot_packet(65, 150 * MS, 2100 * MS))]
    );
    assert_eq!(e.stats().snapshots, 2);
}

/// A new measurement that agrees with the stated relation (within its
/// bound) does not change the offset stated (a step back would reorder
/// the events around it); one that does not agrees moves it.
#[test]
fn the_stated_offset_stays_while_measurements_agree_with_it() {
    let (mut e, log) = engine();
    e.session_started(1);
    e.handle(hello(1, 65), 0);
    e.handle(chunk(1, 0), 0);
    let sample = |e: &mut Engine<Fake>, asked: u64, fw: u64, answered: u64| {
        let [Request::Sync(nonce)] = e.tick(asked, true)[..] else {
            panic!("no sync asked at {asked}")
        };
        e.handle(
            FirmwareEvent::Clock(ClockSample {
                firmware_ns: fw,
                nonce: Some(nonce),
                transfer_ns: 0,
            }),
            answered,
        );
    };
    // offset 900 ms, bound 1 ms.
    sample(&mut e, 999 * MS, 100 * MS, 1001 * MS);
    assert_eq!(
        take(&log)[2],
        Call::Inject(1, snapshot_packet(65, 101 * MS, 1001 * MS))
    );
    // offset 900.3 ms, bound 0.5 ms: agrees; a second later the relation
    // is stated again with the old offset.
    sample(&mut e, 2000 * MS, 1100 * MS - 300_000 + MS / 2, 2001 * MS);
    assert_eq!(
        take(&log),
        [Call::Inject(1, snapshot_packet(65, 1101 * MS, 2001 * MS))]
    );
    // offset 902 ms, bound 0.1 ms: the old one is out of its bound.
    sample(&mut e, 3000 * MS, 2098 * MS + 100_000, 3000 * MS + 200_000);
    assert_eq!(
        take(&log),
        [Call::Inject(
            1,
            snapshot_packet(65, 2098 * MS + 200_000, 3000 * MS + 200_000)
        )]
    );
}

/// A firmware clock that does not run at the host's rate (here an eighth
/// of it, as a guest's SysTick under QEMU's `-icount` measured): the user
/// is told once per boot, and the status says so; one at the host's rate
/// raises nothing.
#[test]
fn a_firmware_clock_at_another_rate_is_told_once_per_boot() {
    let run = |boot: u32, fw: fn(u64) -> u64| {
        let (mut e, _log) = engine();
        e.handle(hello(boot, 65), 0);
        e.handle(chunk(1, 0), 0);
        let mut notes = Vec::new();
        for i in 0..8 {
            let asked = 1000 * MS + i * 1000 * MS;
            let [Request::Sync(nonce)] = e.tick(asked, true)[..] else {
                panic!("no sync asked at {asked}")
            };
            e.handle(
                FirmwareEvent::Clock(ClockSample {
                    firmware_ns: fw(asked + 100_000),
                    nonce: Some(nonce),
                    transfer_ns: 0,
                }),
                asked + 200_000,
            );
            notes.extend(e.take_notes());
        }
        (notes, e.clock(9000 * MS).and_then(|c| c.rate))
    };
    let (notes, rate) = run(7, |t| t / 8);
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(
        notes[0].starts_with("the firmware's clock 65 (boot 0x7) runs at 0.1250x the host's"),
        "{}",
        notes[0]
    );
    let rate = rate.expect("measured");
    assert!(rate.beyond_drift);
    assert_eq!(rate.host_span_ns, 7000 * MS);
    assert_eq!(rate.firmware_span_ns, 7000 * MS / 8);
    let (notes, rate) = run(8, |t| 3 * MS + t);
    assert_eq!(notes, Vec::<String>::new());
    assert!(!rate.expect("measured").beyond_drift);
}

/// A chunk of `writer` whose one packet is stamped on clock `clock_id`
/// (`timestamp = 5`, `timestamp_clock_id`).
fn stamped_chunk(writer: u16, id: u32, clock_id: u8) -> FirmwareEvent {
    let header = ChunkHeaderRepr {
        chunk_id: id,
        writer_id: writer,
        packets: Packets::new(1, ChunkFlags::EMPTY).unwrap(),
    };
    let mut bytes = header.to_bytes().to_vec();
    // Field 8 (varint) 5, field 58 (varint, tag 0xD0 0x03) the clock.
    bytes.extend_from_slice(&[5, 0x40, 5, 0xD0, 0x03, clock_id]);
    FirmwareEvent::Chunk(bytes)
}

/// A writer that stamps a clock other than the one its region names (the
/// region set to clock 100, the writers left on the default 65): its
/// packets cannot be placed, and the user is told once per boot which
/// writer and what to change; writers on the region's clock, and packets
/// naming none, raise nothing.
#[test]
fn a_writer_on_another_clock_than_its_regions_is_told() {
    let (mut e, _log) = engine();
    e.handle(hello(3, 100), 0);
    let sync = |e: &mut Engine<Fake>, at: u64| {
        let [Request::Sync(nonce)] = e.tick(at, true)[..] else {
            panic!("no sync asked at {at}")
        };
        e.handle(
            FirmwareEvent::Clock(ClockSample {
                firmware_ns: 1_000,
                nonce: Some(nonce),
                transfer_ns: 0,
            }),
            at + 1_000,
        );
    };
    sync(&mut e, 1000 * MS);
    e.handle(chunk(1, 0), 1001 * MS);
    e.handle(stamped_chunk(2, 0, 100), 1001 * MS);
    assert_eq!(e.take_notes(), Vec::<String>::new());
    e.handle(stamped_chunk(3, 0, 65), 1001 * MS);
    e.handle(stamped_chunk(4, 0, 65), 1001 * MS);
    assert_eq!(
        e.take_notes(),
        [
            "writer 3 of the firmware (boot 0x3) stamps its packets on clock 65, but its region \
          says its clock is 100: the host relates only clock 100 to its own, so those packets \
          cannot be placed on the timeline. Give the writer's SequenceConfig \
          .with_clock_id(100), or the region the writers' clock id."
        ]
    );
    // The chunks went on all the same.
    assert_eq!(e.stats().chunks_forwarded, 4);
}

#[test]
fn firmware_counters_add_up_across_boots() {
    let (mut e, _log) = engine();
    e.handle(hello(1, BOOTTIME), 0);
    e.handle(FirmwareEvent::Stats(vec![("packets_dropped".into(), 3)]), 0);
    e.handle(FirmwareEvent::Stats(vec![("packets_dropped".into(), 5)]), 0);
    e.handle(hello(2, BOOTTIME), 0);
    e.handle(
        FirmwareEvent::Stats(vec![
            ("packets_dropped".into(), 1),
            ("ring_overflows".into(), 2),
        ]),
        0,
    );
    assert_eq!(
        e.firmware_counters(),
        [
            ("packets_dropped".to_string(), 6),
            ("ring_overflows".to_string(), 2)
        ]
    );
}

#[test]
fn a_data_source_the_producer_refuses_refuses_the_hello() {
    let log = Log::default();
    let fake = Fake {
        log,
        next: 0,
        sessions: true,
        refuse: Some("fw".into()),
    };
    let mut e = Engine::new(fake);
    e.handle(hello(1, BOOTTIME), 0);
    e.handle(chunk(1, 0), 0);
    assert_eq!(e.stats().hellos_refused, 1);
    assert_eq!(e.stats().chunks_before_hello, 1);
}

fn dropped(n: u64) -> FirmwareEvent {
    FirmwareEvent::Stats(vec![
        ("packets_dropped".into(), n),
        ("ring_overflows".into(), 0),
    ])
}

#[test]
fn drops_that_end_a_session_are_marked_on_every_sequence_of_the_boot() {
    let (mut e, log) = engine();
    e.handle(hello(1, BOOTTIME), 0);
    // Drops before the session are not its own.
    e.handle(dropped(4), 0);
    e.session_started(7);
    e.handle(chunk(1, 0), 0);
    e.handle(chunk(2, 0), 0);
    // The firmware's last action: more drops (no packet follows to carry
    // its writers' marks).
    e.handle(dropped(9), 0);
    take(&log);
    e.session_ending(7);
    assert_eq!(
        take_sorted(&log),
        [Call::Loss(1, Some(7)), Call::Loss(2, Some(7))]
    );
    assert_eq!(e.stats().trailing_losses_marked, 2);
    // Once only; a session in which the counters did not move: nothing.
    e.session_ending(7);
    e.session_started(8);
    e.handle(chunk(1, 1), 0);
    e.session_ending(8);
    e.finish(false);
    assert_eq!(take(&log), [Call::Chunk(1, 1)]);
}

#[test]
fn ring_overflows_alone_mark_nothing_and_the_end_of_input_marks_every_session() {
    let (mut e, log) = engine();
    e.handle(hello(1, BOOTTIME), 0);
    e.session_started(3);
    e.session_started(4);
    e.handle(chunk(1, 0), 0);
    e.handle(FirmwareEvent::Stats(vec![("ring_overflows".into(), 5)]), 0);
    take(&log);
    e.finish(false);
    assert_eq!(take(&log), []);
    e.handle(dropped(1), 0);
    e.finish(false);
    assert_eq!(
        take_sorted(&log),
        [Call::Loss(1, Some(3)), Call::Loss(1, Some(4))]
    );
}

#[test]
fn drops_that_end_a_boot_are_marked_before_its_sequences_go() {
    let (mut e, log) = engine();
    e.handle(hello(1, BOOTTIME), 0);
    e.session_started(5);
    e.handle(chunk(1, 0), 0);
    e.handle(dropped(2), 0);
    take(&log);
    e.handle(hello(2, BOOTTIME), 0);
    assert_eq!(take(&log)[..2], [Call::Loss(1, Some(5)), Call::Dropped(1)]);
    // The new boot's counters start at 0: the old boot's drops stay
    // counted (summed), and are not marked again.
    e.handle(chunk(1, 0), 0);
    e.handle(dropped(0), 0);
    take(&log);
    e.session_ending(5);
    assert_eq!(take(&log), []);
}

#[test]
fn link_losses_that_end_a_boot_or_a_session_are_marked_too() {
    let (mut e, log) = engine();
    // Link losses before the session are not its own.
    e.link_loss(40);
    e.handle(hello(1, BOOTTIME), 0);
    e.session_started(5);
    e.handle(chunk(1, 0), 0);
    e.handle(chunk(2, 0), 0);
    take(&log);
    // The board resets mid-frame: the stream says its last frame was cut
    // by the restart.
    e.link_loss(41);
    e.handle(FirmwareEvent::Reset, 0);
    assert_eq!(
        take_sorted(&log),
        [
            Call::Dropped(1),
            Call::Dropped(2),
            Call::Loss(1, Some(5)),
            Call::Loss(2, Some(5))
        ]
    );
    e.handle(hello(2, BOOTTIME), 0);
    e.handle(chunk(1, 0), 0);
    take(&log);
    // Not again; a flush given up on at the stop is marked at its end.
    e.session_ending(5);
    e.session_started(6);
    e.link_loss(42);
    e.session_ending(6);
    assert_eq!(take(&log), [Call::Loss(3, Some(6))]);
    assert_eq!(e.stats().trailing_losses_marked, 3);
}

/// A chunk of `writer` with id `id`, [`SNAPSHOT_PERIOD_BYTES`] / 16 bytes
/// long (header included), holding one packet.
fn kib_chunk(writer: u16, id: u32) -> FirmwareEvent {
    let header = ChunkHeaderRepr {
        chunk_id: id,
        writer_id: writer,
        packets: Packets::new(1, ChunkFlags::EMPTY).unwrap(),
    };
    let len = SNAPSHOT_PERIOD_BYTES as usize / 16;
    let mut bytes = header.to_bytes().to_vec();
    // A fragment of len - 8 - 2 bytes: its length is a 2-byte varint.
    let body = len - bytes.len() - 2;
    bytes.extend_from_slice(&[(body as u8) | 0x80, (body >> 7) as u8]);
    bytes.resize(len, 0x40);
    FirmwareEvent::Chunk(bytes)
}

/// The clocks `(id, timestamp)` of an injected packet, decoded as a
/// TracePacket.
fn snapshot_clocks(packet: &[u8]) -> Clocks {
    use prost::Message as _;
    use shmtrace_ipc::protos::trace_packet::Data;
    let packet = shmtrace_ipc::protos::TracePacket::decode(packet).unwrap();
    let Some(Data::ClockSnapshot(s)) = packet.data else {
        panic!("not a clock snapshot: {packet:?}")
    };
    s.clocks
        .iter()
        .map(|c| (c.clock_id.unwrap(), c.timestamp.unwrap()))
        .collect()
}

/// The clocks `(id, timestamp)` of a snapshot.
type Clocks = Vec<(u32, u64)>;

/// Where each sequence got a snapshot: `(sequence, chunk id of the chunk
/// it precedes, its clocks)`.
fn injections(calls: &[Call]) -> Vec<(u32, u32, Clocks)> {
    let mut out = Vec::new();
    let mut pending: Vec<(u32, Clocks)> = Vec::new();
    for c in calls {
        match c {
            Call::Inject(seq, p) => pending.push((*seq, snapshot_clocks(p))),
            Call::Chunk(seq, id) => {
                if let Some(i) = pending.iter().position(|(s, _)| s == seq) {
                    let (_, clocks) = pending.remove(i);
                    out.push((*seq, *id, clocks));
                }
            }
            _ => {}
        }
    }
    assert!(pending.is_empty(), "{pending:?}");
    out
}

/// Without a new relation, every sequence gets the one stated last again
/// (the same readings) before its first chunk after the boot forwarded
/// [`SNAPSHOT_PERIOD_BYTES`] since its last snapshot, so a ring buffer
/// that overwrote the first still holds one; a re-injection is not a new
/// relation, and a new relation restarts the count.
#[test]
fn the_relation_is_stated_again_every_period_of_bytes() {
    let (mut e, log) = engine();
    e.handle(hello(1, 65), 1000 * MS);
    let [Request::Sync(nonce)] = e.tick(1000 * MS, true)[..] else {
        panic!("no sync")
    };
    e.handle(
        FirmwareEvent::Clock(ClockSample {
            firmware_ns: 50 * MS,
            nonce: Some(nonce),
            transfer_ns: 0,
        }),
        1002 * MS,
    );
    let first = vec![(65, 51 * MS), (BOOTTIME, 1002 * MS)];
    // Writer 1 writes 1/16 of the period per chunk; writer 2 once at the
    // start and once after 40 of writer 1's chunks. The host clock does
    // not reach the next periodic snapshot.
    e.handle(kib_chunk(2, 0), 1003 * MS);
    for id in 0..60 {
        e.handle(kib_chunk(1, id), 1003 * MS + u64::from(id));
        if id == 40 {
            e.handle(kib_chunk(2, 1), 1003 * MS + u64::from(id));
        }
    }
    let calls = take(&log);
    let got = injections(&calls);
    // Writer 1 (sequence 2): at its start, then every 16 chunks of the
    // boot: before its chunks 16, 32 and (writer 2's second chunk among
    // them) 47. Writer 2 (sequence 1): at its start, and before its
    // second chunk (42 chunks of the boot since).
    let expected: Vec<_> = [(1, 0), (2, 0), (2, 16), (2, 32), (1, 1), (2, 47)]
        .into_iter()
        .map(|(s, id)| (s, id, first.clone()))
        .collect();
    assert_eq!(got, expected);
    let s = e.stats();
    assert_eq!((s.snapshots, s.snapshots_reinjected), (1, 4));
    assert_eq!(s.chunks_forwarded, 62);

    // A second later a new relation goes into every sequence at once and
    // restarts the count: writer 1 gets it again 16 chunks later.
    // Writer 2 carries it in its next chunk, 20 chunks of the boot later:
    // the count starts there, not at the statement.
    e.tick(2003 * MS, false);
    for id in 60..80 {
        e.handle(kib_chunk(1, id), 2004 * MS);
    }
    e.handle(kib_chunk(2, 2), 2004 * MS);
    let calls = take(&log);
    let second = vec![(65, 1052 * MS), (BOOTTIME, 2003 * MS)];
    assert_eq!(
        injections(&calls),
        [
            (2, 60, second.clone()),
            (2, 76, second.clone()),
            (1, 2, second)
        ]
    );
    let s = e.stats();
    assert_eq!((s.snapshots, s.snapshots_reinjected), (2, 5));
}

/// A boot's first sync requests go every 10 ms, then one a second: the
/// estimate narrows soon after the first, wide relation.
#[test]
fn syncs_are_frequent_at_the_start_of_a_boot_then_once_a_second() {
    let (mut e, _log) = engine();
    e.handle(hello(1, 65), 0);
    e.handle(chunk(1, 0), 0);
    let mut asked = Vec::new();
    // Ticks every millisecond for two and a half seconds; the firmware
    // answers each request 1 ms after it was asked.
    let mut answer = None;
    for ms in 0..2_500 {
        if let Some((nonce, at)) = answer {
            if at == ms {
                e.handle(clock_answer(ms * MS, nonce), ms * MS);
                answer = None;
            }
        }
        if let [Request::Sync(nonce)] = e.tick(ms * MS, true)[..] {
            asked.push(ms);
            answer = Some((nonce, ms + 1));
        }
    }
    let start: Vec<u64> = (0..u64::from(START_SYNCS)).map(|i| i * 10).collect();
    let last = start[start.len() - 1];
    let mut expected = start.clone();
    expected.extend([last + 1_000, last + 2_000]);
    assert_eq!(asked, expected);
    // A new boot starts over.
    e.handle(hello(2, 65), 3_000 * MS);
    let [Request::Sync(nonce)] = e.tick(3_000 * MS, true)[..] else {
        panic!("no sync")
    };
    e.handle(clock_answer(3_001 * MS, nonce), 3_001 * MS);
    assert!(matches!(e.tick(3_010 * MS, true)[..], [Request::Sync(_)]));
    // Nobody answers: one request in flight, the next after
    // SYNC_ANSWER_WAIT_NS.
    assert!(e.tick(3_020 * MS, true).is_empty());
    assert!(e
        .tick(3_010 * MS + SYNC_ANSWER_WAIT_NS - 1, true)
        .is_empty());
    assert!(matches!(
        e.tick(3_010 * MS + SYNC_ANSWER_WAIT_NS, true)[..],
        [Request::Sync(_)]
    ));
}

/// The firmware's answer to `nonce`, its clock reading `firmware_ns`.
fn clock_answer(firmware_ns: u64, nonce: u32) -> FirmwareEvent {
    FirmwareEvent::Clock(ClockSample {
        firmware_ns,
        nonce: Some(nonce),
        transfer_ns: 0,
    })
}

/// The replayed run (README's UART walk-through, the machine loaded): a
/// firmware busy for a second after its boot (its quieting flush, its
/// backlog through QEMU's UART) reads the requests queued meanwhile all at
/// once and answers them in a burst. Before: the engine asked eight start
/// requests 10 ms apart into that queue, all came back a second later
/// with bounds of about 0.5 s, and the next request went out a second
/// after the last (the start ones used up): the relation stated was 0.46 s
/// off for a second, and then stepped. Now one request is in flight at a
/// time, so one answer comes late, and the next request goes out 10 ms
/// after it, answered at once: a relation within a millisecond 10 ms
/// later.
#[test]
fn a_request_waits_for_the_answer_to_the_one_before() {
    let (mut e, log) = engine();
    e.session_started(1);
    // BOOTTIME = firmware + 1000 ms.
    let fw = |boot: u64| boot - 1000 * MS;
    e.handle(hello(1, 65), 1000 * MS);
    e.handle(chunk(1, 0), 1000 * MS);
    let mut queued = Vec::new();
    for ms in (1000..2000).step_by(10) {
        for r in e.tick(ms * MS, true) {
            let Request::Sync(nonce) = r else {
                panic!("{r:?}")
            };
            queued.push(nonce);
        }
    }
    assert_eq!(queued.len(), 1, "asked into a queue: {queued:?}");
    // At 2000 ms the firmware reads them, answers arrive 1 ms later.
    for nonce in queued {
        e.handle(clock_answer(fw(2000 * MS), nonce), 2001 * MS);
    }
    let loose = e.clock(2001 * MS).unwrap().estimate.unwrap();
    assert!(loose.bound_ns > 400 * MS, "{loose:?}");
    // The next one goes at once (the start period), and is answered
    // within a millisecond.
    let [Request::Sync(nonce)] = e.tick(2010 * MS, true)[..] else {
        panic!("no sync after the late answer")
    };
    e.handle(clock_answer(fw(2010 * MS + MS / 2), nonce), 2011 * MS);
    let est = e.clock(2011 * MS).unwrap().estimate.unwrap();
    assert_eq!((est.offset_ns, est.bound_ns), (1000 * MS as i64, MS / 2));
    // The loose relation stated the firmware's 1500.5 ms at 2001 ms: the
    // tight one is stated once that does not take its clock back.
    let injected = |log: &Log| -> Vec<Clocks> {
        take(log)
            .into_iter()
            .filter_map(|c| match c {
                Call::Inject(_, p) => Some(snapshot_clocks(&p)),
                _ => None,
            })
            .collect()
    };
    assert_eq!(
        injected(&log).last().unwrap(),
        &[(65, 1500 * MS + MS / 2), (BOOTTIME, 2001 * MS)]
    );
    e.tick(2500 * MS, false);
    assert_eq!(injected(&log), Vec::<Clocks>::new());
    e.tick(2501 * MS, false);
    assert_eq!(
        injected(&log),
        [vec![(65, fw(2501 * MS)), (BOOTTIME, 2501 * MS)]]
    );
}

/// A board reset while a session records: its writers' open chunks and
/// its undrained ring are gone, and no counter said so (the firmware's
/// counters did not move, no frame was cut). Every sequence of the old
/// boot is marked in every session running; a restart after the last
/// session ended (its stop's flush done) is not. Before: no mark at all.
#[test]
fn a_boot_cut_mid_session_marks_its_sequences() {
    let (mut e, log) = engine();
    e.handle(hello(1, BOOTTIME), 0);
    e.session_started(5);
    e.session_started(6);
    e.handle(chunk(1, 0), 0);
    e.handle(chunk(2, 0), 0);
    e.handle(dropped(0), 0);
    take(&log);
    e.handle(FirmwareEvent::Reset, 0);
    assert_eq!(
        take_sorted(&log),
        [
            Call::Dropped(1),
            Call::Dropped(2),
            Call::Loss(1, Some(5)),
            Call::Loss(1, Some(6)),
            Call::Loss(2, Some(5)),
            Call::Loss(2, Some(6)),
        ]
    );
    assert_eq!(
        (
            e.stats().restarts_mid_session,
            e.stats().trailing_losses_marked
        ),
        (1, 4)
    );
    // A new boot id without a reset before it (its HELLO at seq 0 lost,
    // or a region whose boot id changed): the same.
    e.handle(hello(2, BOOTTIME), 0);
    e.handle(chunk(1, 0), 0);
    e.session_ending(6);
    take(&log);
    e.handle(hello(3, BOOTTIME), 0);
    assert_eq!(take(&log)[..2], [Call::Loss(3, Some(5)), Call::Dropped(3)]);
    // Nothing marked twice: not at the session's end, not at the input's.
    e.handle(chunk(1, 0), 0);
    take(&log);
    e.session_ending(5);
    e.finish(false);
    assert_eq!(take(&log), []);
    // The last session ended: a restart now cut nothing of its.
    e.handle(FirmwareEvent::Reset, 0);
    assert_eq!(take(&log), [Call::Dropped(4)]);
    let s = e.stats();
    assert_eq!((s.restarts_mid_session, s.trailing_losses_marked), (2, 5));
}

/// A two-way link that ends while a session records cut the firmware off:
/// every sequence of the boot is marked in every running session,
/// whatever its counters say, and the user is told. A one-way input's
/// end, or a link lost with no session running, marks nothing.
#[test]
fn a_link_lost_mid_session_marks_every_sequence_of_the_boot() {
    let (mut e, log) = engine();
    e.handle(hello(1, BOOTTIME), 0);
    e.handle(chunk(1, 0), 0);
    e.finish(true);
    assert_eq!(e.stats().links_lost_mid_session, 0, "no session ran");
    e.session_started(3);
    e.session_started(4);
    e.handle(chunk(1, 1), 0);
    e.handle(chunk(2, 0), 0);
    take(&log);
    e.finish(false);
    assert_eq!(
        take(&log),
        [],
        "a recording's end: the counters did not move"
    );
    e.finish(true);
    assert_eq!(
        take_sorted(&log),
        [
            Call::Loss(1, Some(3)),
            Call::Loss(1, Some(4)),
            Call::Loss(2, Some(3)),
            Call::Loss(2, Some(4))
        ]
    );
    let s = e.stats();
    assert_eq!((s.links_lost_mid_session, s.trailing_losses_marked), (1, 4));
    let notes = e.take_notes();
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(
        notes[0].contains("ended while 2 session(s) recorded it"),
        "{notes:?}"
    );
}

/// Chunks still waiting for the boot's first clock sample when the input
/// ends go without a snapshot, counted (before: dropped with no count).
#[test]
fn chunks_held_for_a_clock_go_when_the_input_ends() {
    let (mut e, log) = engine();
    e.handle(hello(1, 70), 0);
    e.session_started(1);
    e.handle(chunk(1, 0), 0);
    e.handle(chunk(1, 1), 0);
    assert_eq!(take(&log), [Call::Register("fw".into())], "held");
    e.finish(false);
    assert_eq!(
        take(&log),
        [
            Call::New(1, "fw".into()),
            Call::Chunk(1, 0),
            Call::Chunk(1, 1)
        ]
    );
    let s = e.stats();
    assert_eq!((s.chunks_forwarded, s.chunks_without_clock), (2, 2));
}

/// The replayed run again: a booting firmware's first second (written
/// before the bridge quieted it, committed by the quieting flush) arrived
/// while no session recorded, and waited for the boot's first clock
/// sample; a session started meanwhile. Before: it went into that
/// session, a second of events before the session began. Now what came
/// while no session recorded goes into none, and what came in the
/// session goes into it.
#[test]
fn chunks_held_for_a_clock_go_only_into_sessions_they_came_in() {
    let (mut e, log) = engine();
    e.handle(hello(1, 65), 1000 * MS);
    e.handle(chunk(1, 0), 1000 * MS);
    e.session_started(7);
    e.handle(chunk(1, 1), 1600 * MS);
    assert_eq!(take(&log), [Call::Register("fw".into())], "held");
    let [Request::Sync(nonce)] = e.tick(1700 * MS, true)[..] else {
        panic!("no sync")
    };
    e.handle(clock_answer(700 * MS, nonce), 1701 * MS);
    let calls = take(&log);
    assert!(!calls.contains(&Call::Chunk(1, 0)), "{calls:?}");
    assert_eq!(calls.last(), Some(&Call::Chunk(1, 1)), "{calls:?}");
    let s = e.stats();
    assert_eq!(
        (s.chunks, s.chunks_no_session, s.chunks_forwarded),
        (2, 1, 1)
    );
}
