//! The region source against a firmware region in a file: abi's
//! `RegionStorage` over a shared mapping of the same file (as a QEMU guest's
//! RAM is), written with abi's `TraceWriter` through a `RegionArbiter`.

use shmtrace_abi::layout::PageLayout;
use shmtrace_abi::region::{RegionArbiter, RegionConfig, HEADER_SIZE};
use shmtrace_abi::writer::TraceWriter;

use super::*;
use crate::bridge::testing::{create, file, Firmware, Storage, OFFSET};

fn config() -> RegionConfig<'static> {
    let mut c = RegionConfig::new("fw.region");
    c.producer = "mcu";
    c.boot_id = 40;
    c
}

/// Polls until `n` events came (or 5 s passed).
fn take(source: &mut RegionSource, n: usize) -> Vec<FirmwareEvent> {
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while out.len() < n && Instant::now() < deadline {
        if let Some(e) = source.poll(Duration::from_millis(10)).unwrap() {
            out.push(e);
        }
    }
    out
}

fn count(pairs: &[(&'static str, u64)], name: &str) -> u64 {
    pairs
        .iter()
        .find(|(n, _)| *n == name)
        .map_or_else(|| panic!("no counter {name}"), |(_, v)| *v)
}

#[test]
fn waits_for_the_file_and_the_firmware_then_forwards_and_controls_it() {
    let path = file("live");
    let _ = std::fs::remove_file(&path);
    let mut source = RegionSource::new(&path, OFFSET, Duration::from_millis(1)).unwrap();
    assert_eq!(
        source.describe(),
        format!("region:{}@0x2000", path.display())
    );
    // No file, then a file of zeros: nothing, no error.
    assert_eq!(source.poll(Duration::from_millis(30)).unwrap(), None);
    create(&path);
    assert_eq!(source.poll(Duration::from_millis(150)).unwrap(), None);
    assert!(!source.is_attached());
    // A request before attaching is kept (enable) or moot (flush).
    assert!(source.request(Request::Enable(false)));
    assert!(source.request(Request::Flush));
    assert!(!source.flush_pending());

    let mut fw = Firmware::map(&path);
    let handles = fw.boot(&config());
    assert!(handles.control.trace_enabled());
    let events = take(&mut source, 1);
    assert_eq!(
        events,
        [FirmwareEvent::Hello(Hello {
            boot_id: 40,
            data_source: "fw.region".into(),
            producer: "mcu".into(),
            clock_id: 65,
        })]
    );
    assert!(
        !handles.control.trace_enabled(),
        "the wanted state is written on attach"
    );
    assert!(source.request(Request::Enable(true)));
    assert!(handles.control.trace_enabled());
    assert!(source.request(Request::Clear));
    assert_eq!(handles.control.clear_request(), 1);

    // A packet spanning three chunks: chunks, and its patches as a group.
    let mut writer: TraceWriter<_> = TraceWriter::new(
        RegionArbiter::new(&handles, PageLayout::Div4).unwrap(),
        1,
        0,
    )
    .unwrap();
    let _ = writer.write_packet(|p| p.nested(11, |e| e.bytes(4, &[7u8; 2500])));
    writer.flush();
    let events = take(&mut source, 4);
    let kinds: Vec<_> = events
        .iter()
        .map(|e| match e {
            FirmwareEvent::Chunk(c) => format!("chunk {}", c[0]),
            FirmwareEvent::Patches(g) => {
                format!("patches {} {} {}", g.chunk_id, g.patches.len(), g.has_more)
            }
            FirmwareEvent::Stats(_) => "stats".into(),
            other => format!("{other:?}"),
        })
        .collect();
    // Chunk 0's patches come once the packet moved on past it.
    assert_eq!(
        kinds[..],
        ["chunk 0", "chunk 1", "patches 0 1 false", "chunk 2"],
        "{kinds:?}"
    );

    // Sync: the firmware answers, the source reads it back two-way.
    assert!(source.can_sync());
    assert!(source.request(Request::Sync(77)));
    assert!(handles.control.answer_sync(|| 123_456));
    let events = take(&mut source, 1);
    let clock = events.iter().find_map(|e| match e {
        FirmwareEvent::Clock(c) => Some(*c),
        _ => None,
    });
    assert_eq!(
        clock,
        Some(ClockSample {
            firmware_ns: 123_456,
            nonce: Some(77),
            transfer_ns: 0
        }),
        "{events:?}"
    );

    // Flush: pending until the firmware acknowledges and the ring drained.
    assert!(source.request(Request::Flush));
    assert!(source.flush_pending());
    assert_eq!(source.poll(Duration::from_millis(5)).unwrap(), None);
    assert!(source.flush_pending(), "not acknowledged yet");
    let _ = writer.write_packet(|p| p.uint64(8, 1));
    writer.flush();
    handles.control.ack_flush(handles.control.flush_request());
    let events = take(&mut source, 1);
    assert!(matches!(events[0], FirmwareEvent::Chunk(_)), "{events:?}");
    let _ = source.poll(Duration::ZERO).unwrap();
    assert!(!source.flush_pending());

    // Firmware counters are reported when they change.
    handles.control.count_packets_dropped(3);
    let events = take(&mut source, 1);
    assert_eq!(
        events,
        [FirmwareEvent::Stats(vec![
            ("packets_dropped".into(), 3),
            ("ring_overflows".into(), 0),
            ("chunks_lost".into(), 0),
        ])]
    );
    assert_eq!(count(&source.counters(), "chunks"), 4);
    assert!(source.transport_loss().iter().all(|(_, v)| *v == 0));
    drop(writer);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn a_reset_a_bad_header_and_a_replaced_file_are_survived() {
    let path = file("hostile");
    create(&path);
    let mut fw = Firmware::map(&path);
    let _ = fw.boot(&config());
    let mut source = RegionSource::new(&path, OFFSET, Duration::from_millis(1)).unwrap();
    assert!(matches!(
        take(&mut source, 1)[..],
        [FirmwareEvent::Hello(_)]
    ));
    assert!(source.request(Request::Enable(true)));

    // The firmware restarts: a reset, then the new boot's hello; the
    // wanted state is written again.
    let mut c = config();
    c.trace_enabled = false;
    let handles = fw.boot(&c);
    let events = take(&mut source, 2);
    assert_eq!(events[0], FirmwareEvent::Reset);
    assert!(
        matches!(&events[1], FirmwareEvent::Hello(h) if h.boot_id == 41),
        "{events:?}"
    );
    assert!(handles.control.trace_enabled());

    // Slots no firmware writes: counted, skipped.
    let ring = handles.header.ring.offset as usize;
    for k in 0..4 {
        fw.poke(ring + k, 0xEE);
    }
    assert_eq!(source.poll(Duration::from_millis(20)).unwrap(), None);
    assert_eq!(count(&source.transport_loss(), "bad_slots"), 1);

    // A header of an unknown version (magic intact): refused, counted,
    // the boot ended; nothing panics; retried after the backoff.
    fw.poke(8, 2);
    fw.poke(0x10, 0x99); // a new boot id makes the reader look again
    let events = take(&mut source, 1);
    assert_eq!(events, [FirmwareEvent::Reset]);
    assert!(!source.is_attached());
    assert_eq!(count(&source.transport_loss(), "regions_refused"), 1);
    fw.poke(8, 1);
    let events = take(&mut source, 1);
    assert!(
        matches!(&events[..], [FirmwareEvent::Hello(h)] if h.boot_id & 0xFF == 0x99),
        "{events:?}"
    );

    // A ring that would lie past the region's end (ring indices out of
    // range): refused, counted.
    let ring_offset = 0x18;
    let saved: Vec<u8> = (0..4).map(|k| fw.peek(ring_offset + k)).collect();
    fw.poke(ring_offset + 3, 0x7F);
    fw.poke(0x10, 0x98); // a new boot id makes the reader look again
    assert_eq!(take(&mut source, 1), [FirmwareEvent::Reset]);
    assert_eq!(count(&source.transport_loss(), "regions_refused"), 2);
    for (k, b) in saved.into_iter().enumerate() {
        fw.poke(ring_offset + k, b);
    }
    let events = take(&mut source, 1);
    assert!(
        matches!(&events[..], [FirmwareEvent::Hello(_)]),
        "{events:?}"
    );

    // QEMU restarted with a new file: let go, attached again.
    drop(fw);
    std::fs::remove_file(&path).unwrap();
    create(&path);
    let mut fw = Firmware::map(&path);
    let _handles = fw.boot(&config());
    let events = take(&mut source, 2);
    assert_eq!(events[0], FirmwareEvent::Reset);
    assert!(
        matches!(&events[1], FirmwareEvent::Hello(h) if h.boot_id == 40),
        "{events:?}"
    );
    assert_eq!(count(&source.counters(), "detaches"), 3);
    assert_eq!(count(&source.counters(), "attaches"), 4);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn a_stream_mode_region_is_refused_and_a_misaligned_offset_at_once() {
    assert!(RegionSource::new(Path::new("x"), 4, DEFAULT_POLL_INTERVAL).is_err());
    let path = file("stream");
    create(&path);
    let mut fw = Firmware::map(&path);
    let mut c = config();
    c.stream_mode = true;
    let _handles = fw.boot(&c);
    let mut source = RegionSource::new(&path, OFFSET, DEFAULT_POLL_INTERVAL).unwrap();
    assert_eq!(source.poll(Duration::from_millis(50)).unwrap(), None);
    assert_eq!(count(&source.transport_loss(), "regions_refused"), 1);
    // A header past the end of a short file is waited for.
    let short = file("short");
    std::fs::write(&short, vec![0u8; HEADER_SIZE]).unwrap();
    let mut source = RegionSource::new(&short, 8, DEFAULT_POLL_INTERVAL).unwrap();
    assert_eq!(source.poll(Duration::from_millis(20)).unwrap(), None);
    assert_eq!(count(&source.transport_loss(), "regions_refused"), 0);
    std::fs::remove_file(&path).unwrap();
    std::fs::remove_file(&short).unwrap();
}

/// Two readers of one region would take each other's records and control
/// words: the second is refused before it touches the region (in this
/// process as in another: the claim is per open file, not per process),
/// naming the holder, as an input that cannot be opened; the first reads
/// on untouched. Another region of the same file (a second core's) is
/// read beside it. A claim taken while the file has no region yet holds;
/// one let go (the reader dropped) can be taken.
#[test]
fn a_region_has_one_reader_and_other_regions_of_the_file_are_read_beside_it() {
    let path = file("claimed");
    create(&path);
    let size = std::mem::size_of::<Storage>() as u64;
    let second = (OFFSET + size).next_multiple_of(4096);
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(second + size).unwrap();
    let mut fw = Firmware::map(&path);
    let handles = fw.boot(&config());
    let mut core1 = Firmware::map_at(&path, second);
    let mut c = config();
    c.data_source = "fw.core1";
    c.boot_id = 7;
    let _core1_handles = core1.boot(&c);

    let mut first = RegionSource::new(&path, OFFSET, Duration::from_millis(1)).unwrap();
    assert!(matches!(&take(&mut first, 1)[..], [FirmwareEvent::Hello(h)] if h.boot_id == 40));
    assert!(first.request(Request::Enable(true)));
    let header = || {
        let at = OFFSET as usize;
        std::fs::read(&path).unwrap()[at..at + HEADER_SIZE].to_vec()
    };
    let before = header();

    let refused = RegionSource::new(&path, OFFSET, Duration::from_millis(1)).unwrap_err();
    let why = format!(
        "the region is already being read by another reader (pid {}: this process); \
         a region has one reader",
        std::process::id()
    );
    assert!(
        matches!(&refused, SourceError::Busy(w) if *w == why),
        "{refused:?}"
    );
    let name = region_name(&path, OFFSET);
    let error = refused.into_cli(name.clone());
    assert_eq!(error.exit_code(), crate::exit::IO);
    assert_eq!(error.to_string(), format!("cannot attach {name}: {why}"));

    // The other core's region: claimed and read beside the first.
    let mut other = RegionSource::new(&path, second, Duration::from_millis(1)).unwrap();
    assert_eq!(
        take(&mut other, 1),
        [FirmwareEvent::Hello(Hello {
            boot_id: 7,
            data_source: "fw.core1".into(),
            producer: "mcu".into(),
            clock_id: 65,
        })]
    );

    // The first reader's region was not touched, and it reads on.
    assert_eq!(header(), before);
    assert!(handles.control.trace_enabled());
    let mut writer: TraceWriter<_> = TraceWriter::new(
        RegionArbiter::new(&handles, PageLayout::Div4).unwrap(),
        1,
        0,
    )
    .unwrap();
    let _ = writer.write_packet(|p| p.bytes(4, b"still mine"));
    writer.flush();
    let events = take(&mut first, 1);
    assert!(
        matches!(&events[..], [FirmwareEvent::Chunk(c)] if c.windows(10).any(|w| w == b"still mine")),
        "{events:?}"
    );
    assert_eq!(count(&first.counters(), "resets"), 0);
    assert_eq!(count(&first.counters(), "attaches"), 1);
    assert_eq!(count(&first.counters(), "detaches"), 0);

    // Let go, the region can be taken.
    drop(first);
    let mut next = RegionSource::new(&path, OFFSET, Duration::from_millis(1)).unwrap();
    assert!(matches!(&take(&mut next, 1)[..], [FirmwareEvent::Hello(h)] if h.boot_id == 40));
    drop(writer);
    std::fs::remove_file(&path).unwrap();

    // Two readers waiting for a file: the first to see it claims it and
    // holds it while the firmware is not there yet; the other is refused
    // once it sees the file.
    let late = file("late");
    let _ = std::fs::remove_file(&late);
    let mut a = RegionSource::new(&late, OFFSET, Duration::from_millis(1)).unwrap();
    let mut b = RegionSource::new(&late, OFFSET, Duration::from_millis(1)).unwrap();
    create(&late);
    assert_eq!(a.poll(Duration::from_millis(150)).unwrap(), None);
    let refused = b.poll(Duration::from_millis(150)).unwrap_err();
    assert!(
        matches!(&refused, SourceError::Busy(w) if *w == why),
        "{refused:?}"
    );
    std::fs::remove_file(&late).unwrap();
}

/// A stream-mode region is refused with a word on where its data goes (a
/// firmware built for the UART run under `serve --attach`).
#[test]
fn a_stream_mode_region_is_refused_with_where_its_data_goes() {
    assert_eq!(
        super::refusal(&ReaderError::StreamMode),
        "the firmware consumes this region's ring itself (its region was taken in stream \
         mode: it sends its chunks as frames over its byte stream, a UART say, for `shmtrace \
         bridge --input` to read)"
    );
    let small = ReaderError::BufferTooSmall {
        needed: 4088,
        got: 8,
    };
    assert_eq!(super::refusal(&small), small.to_string());
}
