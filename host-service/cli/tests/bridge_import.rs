//! Offline import (`cli::bridge::import`): a recorded firmware source
//! (every event available at once, ending when read) becomes a trace file
//! through the in-process service, with the identity clock relation: the
//! firmware's clock-65 timestamps land on BOOTTIME unchanged.
//!
//! One test per binary: the producer is a process-wide singleton.

mod bridge_common;

use std::collections::VecDeque;
use std::time::Duration;

use bridge_common::{firmware_events, ITERATIONS};
use shmtrace_cli::bridge::import::{import, ImportOptions};
use shmtrace_cli::bridge::{FirmwareEvent, FirmwareSource, Hello, SourceError};
use shmtrace_cli::record::{Progress, ProgressMode};

/// A recording: its events, then the end.
struct Recording(VecDeque<FirmwareEvent>);

impl FirmwareSource for Recording {
    fn poll(&mut self, _: Duration) -> Result<Option<FirmwareEvent>, SourceError> {
        self.0.pop_front().map(Some).ok_or(SourceError::Ended)
    }
    fn transport_loss(&self) -> Vec<(&'static str, u64)> {
        Vec::new()
    }
    fn describe(&self) -> String {
        "a recording".into()
    }
}

#[test]
fn a_recorded_firmware_run_is_imported_into_a_trace() {
    let clock = std::cell::Cell::new(1_000_000_000u64);
    let mut events: VecDeque<FirmwareEvent> = firmware_events(|| {
        clock.set(clock.get() + 10_000);
        clock.get()
    })
    .into();
    let chunks = events
        .iter()
        .filter(|e| matches!(e, FirmwareEvent::Chunk(_)))
        .count() as u64;
    // A chunk before the hello: nothing says where it belongs.
    events.push_front(FirmwareEvent::Hello(Hello {
        boot_id: 1,
        data_source: "recorded.fw".into(),
        producer: "recorder".into(),
        clock_id: 65,
    }));
    events.push_front(events[1].clone());
    let dir = tempfile_dir();
    let out = dir.join("imported.pftrace");
    let (status, summary) = import(
        Box::new(Recording(events)),
        &out,
        &ImportOptions::default(),
        &mut Progress::new(ProgressMode::None),
    )
    .unwrap();
    eprintln!("{summary}");
    assert_eq!(status, 0);
    let e = &summary.engine;
    assert_eq!(e.chunks_before_hello, 1, "{summary}");
    assert_eq!(e.chunks_forwarded, chunks, "{summary}");
    assert_eq!(e.chunks_no_session, 0, "{summary}");
    let analysis = shmtrace_cli::inspect::analyze_files(&[out]).unwrap();
    assert!(analysis.ok(), "{:?}", analysis.problems);
    let te = &analysis.track_events;
    assert_eq!(
        (te.slice_begin, te.slice_end, te.instant),
        (ITERATIONS, ITERATIONS, ITERATIONS)
    );
    // Identity: the first event's firmware time is its trace time.
    let first = analysis.clocks.first_ns.expect("a time span");
    assert_eq!(first, 1_000_010_000);
    std::fs::remove_dir_all(&dir).unwrap();
}

fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("shmtrace-import-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
