//! Bytes from the `no_std` track event writer (`shmtrace_abi::track_event`)
//! decode with the official schema (PyPI `perfetto`) and mean what was
//! written. Two firmware sequences write into one real SMB; their chunks
//! are read back with abi's reader, each packet gets the trusted fields our
//! service appends (`TrustedFields::encode`: uid, sequence id, pid), and
//! the packets go into a trace file (`Trace { packet }`) that
//! `checker/check_trace.py` judges with exact counts (per event type, per
//! annotation type, per name; flows, slice nesting, interning with
//! resets, timestamps through clock 64), and `shmtrace inspect --check`
//! as well.
//!
//! The writers run with the absolute clock BOOTTIME (6), as on a host: a
//! firmware clock (65) is only convertible once the host relates it to
//! BOOTTIME, which is the bridge's job.

// The collector, clock and sequence replay of abi's own tests.
#[path = "../../abi/tests/support/schema.rs"]
mod schema;
#[path = "../../abi/tests/support/sequence.rs"]
mod sequence;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use sequence::{
    packets_of, replay, smb, storage, take_chunks, writer_with_id, ManualClock, Writer,
};
use shmtrace_abi::trace::builtin_clock::BOOTTIME;
use shmtrace_abi::trace::counter_descriptor::Unit;
use shmtrace_abi::trace::track_event::Type;
use shmtrace_abi::track_event::{ArgValue, CounterTrack, SequenceConfig, Track};
use shmtrace_service::service::trusted::TrustedFields;
use shmtrace_tests::checker::{self, EventCounts, Expectation, Loss, ProducerExpectation};
use shmtrace_tests::scenario;

static MAIN: Track = Track::new("fw main");
static DMA: Track = Track::new("dma").with_parent(&MAIN);
static ISR: Track = Track::new("fw isr");
static LOSSY: Track = Track::new("fw lossy");
static TEMP: CounterTrack = CounterTrack::new("temperature")
    .with_unit(Unit::Count)
    .with_unit_name("mC");
static LOAD: CounterTrack = CounterTrack::new("cpu load");
/// Interned in packets of its own (with its category it overflows one).
static LONG: &str = "a slice name long enough to need a packet of its own for interning .";
static ISR_NAMES: [&str; 6] = ["irq0", "irq1", "irq2", "irq3", "irq4", "irq5"];

/// The producer pid the trusted fields claim.
const PID: i32 = 4242;
/// 20 iterations of the main script.
const ITERATIONS: u64 = 20;

/// What a script asked for, by the checker's keys.
#[derive(Default)]
struct Tally {
    counts: EventCounts,
    names: BTreeMap<String, u64>,
}

impl Tally {
    fn event(&mut self, kind: Type, name: &str) {
        let c = &mut self.counts;
        match kind {
            Type::SliceBegin => c.slice_begin += 1,
            Type::SliceEnd => c.slice_end += 1,
            Type::Instant => c.instant += 1,
            Type::Counter => {}
        }
        if matches!(kind, Type::SliceBegin | Type::Instant) {
            *self.names.entry(name.to_string()).or_default() += 1;
        }
    }
}

/// Packets of writer `id`, each with the trusted fields of sequence
/// `sequence_id`, in `Trace.packet` records.
fn trace_records<const N: usize, const T: usize>(
    w: &mut Writer<'_, N, T>,
    id: u16,
    sequence_id: u32,
    out: &mut Vec<u8>,
) -> Vec<Vec<u8>> {
    let packets = packets_of(&take_chunks(w), id, 0).expect("chunks of whole packets");
    let trusted = TrustedFields {
        uid: 1000,
        sequence_id,
        pid: Some(PID),
        machine_id: 0,
        previous_packet_dropped: 0,
    }
    .encode();
    for p in &packets {
        let len = p.len() + trusted.as_bytes().len();
        out.push(0x0A); // Trace.packet, length-delimited
        let mut v = len as u64;
        while v >= 0x80 {
            out.push(v as u8 | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
        out.extend_from_slice(p);
        out.extend_from_slice(trusted.as_bytes());
    }
    packets
}

fn work_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("firmware-encoding")
        .tempdir()
        .expect("a temporary directory")
}

fn write_trace(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).expect("write the trace");
    path
}

/// `shmtrace inspect --check` passes `trace`.
fn inspect_passes(trace: &Path) {
    let verdict = scenario::inspect(&[trace.to_path_buf()]).expect("shmtrace inspect");
    assert!(
        verdict.ok,
        "shmtrace inspect --check failed: {:#}",
        verdict.analysis
    );
}

#[test]
fn firmware_sequences_decode_with_the_official_schema() {
    let mut storage = storage();
    let smb = smb(&mut storage);
    let clock = ManualClock::at(1_000_000_000);
    let config = |track| SequenceConfig::new(track).with_clock_id(BOOTTIME);
    let mut main: Writer = writer_with_id(&smb, &clock, config(&MAIN), 1);
    // Room for four interned strings: the ISR's names go inline after that.
    let mut isr: Writer<4> = writer_with_id(&smb, &clock, config(&ISR), 2);
    let mut t = Tally::default();

    for i in 0..ITERATIONS {
        clock.advance(1_000);
        assert!(main.slice_begin("fw", "loop"));
        t.event(Type::SliceBegin, "loop");
        clock.advance(10);
        let b = main.event(Type::Instant, "fw", "sample");
        let c = &mut t.counts;
        let b = match i % 6 {
            0 => {
                c.arg_int += 1;
                b.arg("delta", -(i as i64))
            }
            1 => {
                c.arg_uint += 1;
                b.arg("raw", i)
            }
            2 => {
                c.arg_double += 1;
                b.arg("volts", 3.3)
            }
            3 => {
                c.arg_bool += 1;
                b.arg("ok", true)
            }
            4 => {
                c.arg_string += 1;
                b.arg("state", "idle")
            }
            _ => {
                c.arg_pointer += 1;
                b.arg("buf", ArgValue::Pointer(0x2000_0000 + i))
            }
        };
        assert!(b.emit());
        t.event(Type::Instant, "sample");
        assert!(main.counter(&TEMP, 20_000 + i as i64));
        t.counts.counter_int += 1;
        assert!(main.counter_f64(&LOAD, i as f64 / 20.0));
        t.counts.counter_double += 1;
        assert!(main
            .event(Type::SliceBegin, "io", "transfer")
            .on(&DMA)
            .flow(100 + i)
            .emit());
        t.event(Type::SliceBegin, "transfer");
        t.counts.flow_begin += 1;
        clock.advance(50);
        assert!(main.event(Type::SliceEnd, "", "").on(&DMA).emit());
        t.event(Type::SliceEnd, "");
        assert!(main
            .event(Type::Instant, "io", "done")
            .terminating_flow(100 + i)
            .emit());
        t.event(Type::Instant, "done");
        t.counts.flow_end += 1;
        if i % 5 == 0 {
            assert!(main.slice_begin("fw", LONG));
            t.event(Type::SliceBegin, LONG);
            clock.advance(5);
            assert!(main.slice_end());
            t.event(Type::SliceEnd, "");
        }
        if i == 10 {
            main.clear_incremental_state();
        }
        clock.advance(100);
        assert!(main.slice_end());
        t.event(Type::SliceEnd, "");
    }
    // One event earlier than the previous one: written with its absolute
    // time (the checker counts it as out of order, as Perfetto sorts it).
    clock.set(clock.get() - 500);
    assert!(main.instant("fw", "late"));
    t.event(Type::Instant, "late");
    for i in 0..30 {
        clock.advance(7);
        let name = ISR_NAMES[i % ISR_NAMES.len()];
        assert!(isr.instant("isr", name));
        t.event(Type::Instant, name);
        if i % 3 == 0 {
            assert!(isr.counter(&TEMP, i as i64));
            t.counts.counter_int += 1;
        }
    }
    assert_eq!(t.counts.track_events(), 169 + 40);
    let (main_stats, isr_stats) = (main.stats(), isr.stats());
    assert_eq!((main_stats.resets, isr_stats.resets), (2, 1));
    // "isr" and three names interned; the other three names (5 uses each)
    // inline.
    assert_eq!(isr_stats.strings_inline, 15);

    let mut trace = Vec::new();
    let main_packets = trace_records(&mut main, 1, 2, &mut trace);
    let isr_packets = trace_records(&mut isr, 2, 3, &mut trace);
    // Our own replay agrees (ids, resets, deltas) before Python's does.
    let main_seq = replay(main_packets, BOOTTIME, MAIN.uuid()).expect("main replays");
    let isr_seq = replay(isr_packets, BOOTTIME, ISR.uuid()).expect("isr replays");
    assert_eq!(main_seq.events.len() + isr_seq.events.len(), 209);
    assert!(main_seq.interned.iter().any(|i| i.name == LONG));

    let dir = work_dir();
    let path = write_trace(dir.path(), "firmware.pftrace", &trace);
    let expect = Expectation {
        producers: vec![ProducerExpectation {
            pid: Some(PID as u32),
            emitted: t.counts,
        }],
        loss: Loss::None,
        require_trace_stats: false,
        require_service_packets: false,
        remote_producers: false,
    };
    let report = checker::check(std::slice::from_ref(&path), &expect, dir.path(), "firmware")
        .expect("checker");
    report.assert_ok("firmware sequences");
    assert_eq!(report.totals, t.counts);
    assert_eq!(report.events_by_name, t.names);
    assert_eq!(report.out_of_order, 1);
    assert_eq!(
        report.events_by_category.get("fw"),
        Some(&(20 + 20 + 4 + 1))
    );
    assert_eq!(report.events_by_category.get("io"), Some(&40));
    assert_eq!(report.events_by_category.get("isr"), Some(&30));
    let sequences: Vec<_> = report
        .sequences
        .iter()
        .map(|s| {
            (
                s.id,
                s.pids.clone(),
                s.track_events,
                s.cleared,
                s.loss_marks,
            )
        })
        .collect();
    assert_eq!(
        sequences,
        [
            (2, vec![PID as u32], 169, 2, 0),
            (3, vec![PID as u32], 40, 1, 0)
        ]
    );
    assert!(report
        .sequences
        .iter()
        .all(|s| s.skipped_incremental == 0 && !s.start_lost));
    inspect_passes(&path);
}

#[test]
fn firmware_losses_are_marked_and_counted() {
    let mut storage = storage();
    let smb = smb(&mut storage);
    let clock = ManualClock::at(5_000_000);
    let config = SequenceConfig::new(&LOSSY).with_clock_id(BOOTTIME);
    let mut w: Writer = writer_with_id(&smb, &clock, config, 9);
    let mut emitted = Tally::default();
    let mut written = Tally::default();
    let mut record = |kind: Type, name: &str, ok: bool| {
        emitted.event(kind, name);
        if ok {
            written.event(kind, name);
        }
        if kind == Type::Counter {
            emitted.counts.counter_int += 1;
            written.counts.counter_int += u64::from(ok);
        }
    };
    let long_value = "x".repeat(200);
    for i in 0..10 {
        clock.advance(1_000);
        if i == 3 {
            // No chunk: the SMB is full.
            w.arbiter_mut().full = true;
            w.flush();
        }
        let ok = w.slice_begin("c", "work");
        record(Type::SliceBegin, "work", ok);
        clock.advance(10);
        let ok = if i == 6 {
            // Too long for any packet.
            w.event(Type::Instant, "c", "tick")
                .arg("dump", long_value.as_str())
                .emit()
        } else {
            w.instant("c", "tick")
        };
        assert!(!(ok && i == 6), "a 200-byte annotation was written");
        record(Type::Instant, "tick", ok);
        let ok = w.counter(&TEMP, i);
        record(Type::Counter, "", ok);
        if i == 3 {
            w.arbiter_mut().full = false;
        }
        clock.advance(10);
        let ok = w.slice_end();
        record(Type::SliceEnd, "", ok);
    }
    // The too-long instant's annotation was asked for, never written.
    emitted.counts.arg_string += 1;
    let stats = w.stats();
    // Iteration 3 lost its begin, instant and counter (its end was left
    // out for the begin's sake); iteration 6 its instant.
    assert_eq!((stats.events_dropped, stats.ends_suppressed), (4, 1));
    let lost = u64::from(stats.events_dropped + stats.ends_suppressed);
    assert_eq!(
        emitted.counts.track_events() - written.counts.track_events(),
        lost
    );

    let mut trace = Vec::new();
    let packets = trace_records(&mut w, 9, 2, &mut trace);
    let seq = replay(packets, BOOTTIME, LOSSY.uuid()).expect("replays");
    assert_eq!(seq.loss_marks.len(), 2);
    let dir = work_dir();
    let path = write_trace(dir.path(), "lossy.pftrace", &trace);
    let expect = Expectation {
        producers: vec![ProducerExpectation {
            pid: Some(PID as u32),
            emitted: emitted.counts,
        }],
        loss: Loss::Allowed,
        require_trace_stats: false,
        require_service_packets: false,
        remote_producers: false,
    };
    let report = checker::check_with_counted_loss(
        std::slice::from_ref(&path),
        &expect,
        &[lost],
        dir.path(),
        "lossy",
    )
    .expect("checker");
    report.assert_ok("a lossy firmware sequence");
    let mut want = written.counts;
    want.arg_string = 0;
    assert_eq!(report.totals, want);
    assert_eq!(
        report.loss_indicators.get("mid_sequence_loss_marks"),
        Some(&2)
    );
    let s = &report.sequences[0];
    assert_eq!((s.cleared, s.loss_marks, s.skipped_incremental), (3, 2, 0));
    inspect_passes(&path);
}
