//! A simulated firmware for the bridge's end-to-end tests and its bench:
//! what a microcontroller running shmtrace-abi does, on the host.
//!
//! * **region** mode: the firmware's `RegionStorage` lies in a file at an
//!   offset (as QEMU's guest RAM lies in its `memory-backend-file`), mapped
//!   shared; a host attaches to it (`shmtrace serve --attach FILE@OFFSET`,
//!   `shmtrace bridge --input region:FILE@OFFSET`). The firmware answers
//!   the host's control words: flush requests (flush, then `flush_ack`),
//!   sync requests (its clock), `trace_enabled`, `clear_request` (its
//!   writers restart their sequences).
//! * **stream** mode: the region lives in this process in stream mode; a
//!   drain thread takes its ring records and sends them as frames (abi's
//!   `FrameEncoder`) to a file or FIFO (`--out`), or to the one TCP client
//!   of `--listen PORT`, whose frames back (ENABLE, DISABLE, CLEAR, FLUSH,
//!   SYNC) it obeys, answering a SYNC after sending everything committed
//!   before it. `--baud` paces the bytes as a UART of that speed would.
//!
//! Events: writer 1 is abi's `TrackEventWriter` (interned names, clock 64
//! deltas against the firmware clock 65): per iteration a slice `work` with
//! an instant `tick` inside; writer 2 is a plain `TraceWriter` that writes
//! every `--large-every` iterations an instant `large` (absolute time on
//! clock 65) with a `--large-bytes` string annotation `blob`: a packet
//! spanning chunks, with patches. The firmware clock is the process's
//! monotonic time plus 1 s.
//!
//! Stream faults (exact counts for the tests): `--garbage-every K` text
//! before every K-th frame, `--duplicate-every K` every K-th CHUNK/PATCH
//! frame sent twice, `--corrupt-stats-every K` every K-th STATS frame with
//! a flipped byte, `--oversized-every K` a bogus header announcing 1 MiB
//! before every K-th frame, `--drop-chunk-every K` every K-th CHUNK frame
//! not sent (data lost), `--truncate-tail` the last frame cut short.
//!
//! `--reset-after N` restarts the firmware every N iterations (a new
//! region initialization: tracing on again only if it starts on, a new
//! boot id, and in stream mode frames from seq 0 with a HELLO);
//! `--repeat-boot-id` keeps the first boot id on every restart, as
//! firmware whose RAM a reset zeroes does.
//! `--close-when-done` ends a TCP stream after the run's last frame (the
//! host sees the end of its input once it took everything).
//! `--go-file PATH` waits for PATH to exist before the first event (a
//! one-way stream has no ENABLE to wait for); `--leave-open` does not flush
//! the writers at the end (their last chunks stay `BeingWritten`, as in a
//! RAM dump taken while the firmware runs).
//!
//! Reports JSON lines on stdout: `ready`, `enabled`, `reset`, `done` (what
//! was emitted in the checker's vocabulary, what was dropped, the time from
//! the first event until everything was handed over (`run_us`), the faults,
//! the ring latency in region mode with `--flush-each`, the clock's offset
//! to BOOTTIME); it exits when stdin closes (or right after `done` with
//! `--exit-when-done`).
// `unsafe` here: the region in a shared file mapping, as a firmware's RAM.
#![allow(unsafe_code)]

use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::ExitCode;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;
use shmtrace_abi::frame::{Frame, FrameDecoder, FrameEncoder, FrameStats, Hello};
use shmtrace_abi::layout::PageLayout;
use shmtrace_abi::proto::{Message, Sink};
use shmtrace_abi::region::{
    Control, Record, RegionArbiter, RegionConfig, RegionHandles, RegionReader, RegionStorage,
};
use shmtrace_abi::track_event::{SequenceConfig, Track, TrackEventWriter};
use shmtrace_abi::writer::{InPlaceWriter, TraceWriter};

const SMB: usize = 256 * 1024;
const SLOTS: usize = 256;
type Storage = RegionStorage<SMB, SLOTS>;
/// Chunks of 1020 bytes (four per 4 KiB page).
const LAYOUT: PageLayout = PageLayout::Div4;
const FW_CLOCK: u32 = 65;
static MAIN: Track = Track::new("sim firmware");

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            println!("{}", json!({"event": "error", "message": e}));
            eprintln!("sim-firmware: {e}");
            ExitCode::from(2)
        }
    }
}

#[derive(Debug, Clone, Default)]
struct Args {
    mode: String,
    file: Option<PathBuf>,
    offset: u64,
    out: Option<PathBuf>,
    listen: Option<u16>,
    baud: u64,
    iterations: u64,
    rate: f64,
    large_every: u64,
    large_bytes: usize,
    boot_id: u32,
    data_source: String,
    reset_after: u64,
    repeat_boot_id: bool,
    flush_each: bool,
    wait_enabled: bool,
    exit_when_done: bool,
    garbage_every: u64,
    duplicate_every: u64,
    corrupt_stats_every: u64,
    oversized_every: u64,
    drop_chunk_every: u64,
    truncate_tail: bool,
    stats_every_ms: u64,
    go_file: Option<PathBuf>,
    leave_open: bool,
    close_when_done: bool,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        iterations: 100,
        large_bytes: 3000,
        boot_id: 1,
        data_source: "sim.firmware".into(),
        stats_every_ms: 100,
        ..Args::default()
    };
    let mut it = std::env::args().skip(1);
    a.mode = it
        .next()
        .ok_or("usage: sim-firmware region|stream [flags]")?;
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        let num = |v: String| v.parse::<u64>().map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "--file" => a.file = Some(value()?.into()),
            "--offset" => a.offset = num(value()?)?,
            "--out" => a.out = Some(value()?.into()),
            "--listen" => a.listen = Some(num(value()?)? as u16),
            "--baud" => a.baud = num(value()?)?,
            "--iterations" => a.iterations = num(value()?)?,
            "--rate" => a.rate = value()?.parse().map_err(|e| format!("--rate: {e}"))?,
            "--large-every" => a.large_every = num(value()?)?,
            "--large-bytes" => a.large_bytes = num(value()?)? as usize,
            "--boot-id" => a.boot_id = num(value()?)? as u32,
            "--data-source" => a.data_source = value()?,
            "--reset-after" => a.reset_after = num(value()?)?,
            "--repeat-boot-id" => a.repeat_boot_id = true,
            "--flush-each" => a.flush_each = true,
            "--wait-enabled" => a.wait_enabled = true,
            "--exit-when-done" => a.exit_when_done = true,
            "--garbage-every" => a.garbage_every = num(value()?)?,
            "--duplicate-every" => a.duplicate_every = num(value()?)?,
            "--corrupt-stats-every" => a.corrupt_stats_every = num(value()?)?,
            "--oversized-every" => a.oversized_every = num(value()?)?,
            "--drop-chunk-every" => a.drop_chunk_every = num(value()?)?,
            "--truncate-tail" => a.truncate_tail = true,
            "--stats-every-ms" => a.stats_every_ms = num(value()?)?,
            "--go-file" => a.go_file = Some(value()?.into()),
            "--leave-open" => a.leave_open = true,
            "--close-when-done" => a.close_when_done = true,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(a)
}

/// The firmware clock: monotonic time plus 1 s, in ns.
fn fw_now() -> u64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64 + 1_000_000_000
}

fn boottime_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// Firmware clock minus BOOTTIME, from the closest of a few back-to-back
/// readings (the firmware clock is monotonic time, which BOOTTIME runs
/// with while the machine does not suspend).
fn fw_minus_boottime() -> i64 {
    (0..16)
        .map(|_| {
            let a = fw_now();
            let b = boottime_ns();
            let c = fw_now();
            (c - a, (a / 2 + c / 2) as i64 - b as i64)
        })
        .min_by_key(|(spread, _)| *spread)
        .map_or(0, |(_, d)| d)
}

fn emit(value: serde_json::Value) {
    println!("{value}");
    let _ = std::io::stdout().flush();
}

/// What the firmware wrote, in the checker's vocabulary.
#[derive(Debug, Default, Clone, Copy)]
struct Emitted {
    slice_begin: u64,
    slice_end: u64,
    instant: u64,
    large: u64,
    large_bytes: u64,
    arg_string: u64,
    dropped: u64,
    /// When the first iteration began.
    started: Option<Instant>,
}

/// A large instant on clock 65 (TracePacket 8, 58, 11; TrackEvent 9, 23,
/// 22, 4; DebugAnnotation 10, 6).
fn large_event<S: Sink>(p: &mut Message<'_, S>, ts: u64, blob: &str) {
    p.uint64(8, ts);
    p.uint32(58, FW_CLOCK);
    p.nested(11, |e| {
        e.enumeration(9, 3);
        e.string(23, "large");
        e.string(22, "fw");
        e.nested(4, |a| {
            a.string(10, "blob");
            a.string(6, blob);
        });
    });
}

/// Serves the host's flush and sync words; `true` if it flushed.
fn serve_control(control: &Control<'_>, te: &mut dyn FnMut()) -> bool {
    control.answer_sync(fw_now);
    let asked = control.flush_request();
    if asked != control.flush_ack() {
        te();
        control.ack_flush(asked);
        return true;
    }
    false
}

/// Runs one boot: iterations from `first` until done or a reset is due.
/// Returns the next iteration (== iterations when done).
fn run_boot(
    a: &Args,
    handles: &RegionHandles<'_>,
    first: u64,
    emitted: &mut Emitted,
    latencies: &mut Vec<u64>,
    stop: &AtomicBool,
    after_done: &mut dyn FnMut(&Emitted, &[u64]),
) -> Result<u64, String> {
    let arbiter = || RegionArbiter::new(handles, LAYOUT).map_err(|e| e.to_string());
    let clock: fn() -> u64 = fw_now;
    let mut te: TrackEventWriter<_, _> = TrackEventWriter::new(
        InPlaceWriter::new(arbiter()?, 1, 0).map_err(|e| format!("{e:?}"))?,
        clock,
        SequenceConfig::new(&MAIN),
    );
    let mut big: TraceWriter<_> =
        TraceWriter::new(arbiter()?, 2, 0).map_err(|e| format!("{e:?}"))?;
    let blob = "x".repeat(a.large_bytes);
    let control = handles.control;
    if a.wait_enabled {
        while !control.trace_enabled() {
            if stop.load(Ordering::Relaxed) {
                return Ok(a.iterations);
            }
            serve_control(&control, &mut || {});
            std::thread::sleep(Duration::from_micros(200));
        }
        emit(json!({"event": "enabled"}));
    }
    if let Some(go) = &a.go_file {
        while !go.exists() {
            if stop.load(Ordering::Relaxed) {
                return Ok(a.iterations);
            }
            serve_control(&control, &mut || {});
            std::thread::sleep(Duration::from_millis(1));
        }
        emit(json!({"event": "go"}));
    }
    let start = Instant::now();
    emitted.started.get_or_insert(start);
    let mut i = first;
    while i < a.iterations {
        if a.reset_after > 0 && i > first && i % a.reset_after == 0 {
            break;
        }
        if a.rate > 0.0 {
            let due = start + Duration::from_secs_f64((i - first) as f64 / a.rate);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
        }
        let ok = te.slice_begin("fw", "work");
        emitted.slice_begin += u64::from(ok);
        emitted.dropped += u64::from(!ok);
        let ok = te.instant("fw", "tick");
        emitted.instant += u64::from(ok);
        emitted.dropped += u64::from(!ok);
        if a.large_every > 0 && i % a.large_every == a.large_every / 2 {
            let ts = fw_now();
            let ok = matches!(
                big.write_packet(|p| large_event(p, ts, &blob)),
                shmtrace_abi::writer::PacketOutcome::Written
            );
            if ok {
                emitted.instant += 1;
                emitted.large += 1;
                emitted.large_bytes += a.large_bytes as u64;
                emitted.arg_string += 1;
            } else {
                emitted.dropped += 1;
            }
        }
        let ok = te.slice_end();
        emitted.slice_end += u64::from(ok);
        emitted.dropped += u64::from(!ok);
        if a.flush_each {
            // Commit, and time until the host took everything published.
            te.flush();
            let published = control.counters().ring_head;
            let t0 = Instant::now();
            while (control.counters().ring_tail.wrapping_sub(published) as i32) < 0
                && t0.elapsed() < Duration::from_secs(1)
            {
                serve_control(&control, &mut || {});
                // Let the host run (on a machine with few cores, a spin
                // would be the latency measured).
                std::thread::yield_now();
            }
            latencies.push(t0.elapsed().as_nanos() as u64);
        }
        serve_control(&control, &mut || {
            te.flush();
            big.flush();
        });
        i += 1;
    }
    let leave_open = a.leave_open && i >= a.iterations;
    if !leave_open {
        te.flush();
        big.flush();
    }
    if i >= a.iterations {
        after_done(emitted, latencies);
        // Serve the host until told to stop (it flushes and syncs on).
        while !stop.load(Ordering::Relaxed) && !a.exit_when_done {
            serve_control(&control, &mut || {
                te.flush();
                big.flush();
            });
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    if leave_open {
        // A dropped writer hands its chunk over; a RAM dump of a running
        // firmware finds it still being written.
        std::mem::forget(te);
        std::mem::forget(big);
    }
    Ok(i)
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn done_report(
    a: &Args,
    e: &Emitted,
    latencies: &[u64],
    started: Instant,
    faults: serde_json::Value,
) {
    let mut l = latencies.to_vec();
    l.sort_unstable();
    emit(json!({
        "event": "done",
        "emitted": {
            "slice_begin": e.slice_begin,
            "slice_end": e.slice_end,
            "instant": e.instant,
            "large": e.large,
            "large_bytes": e.large_bytes,
            "arg_string": e.arg_string,
        },
        "dropped": e.dropped,
        "iterations": a.iterations,
        "run_us": e.started.map_or(0, |s| s.elapsed().as_micros() as u64),
        "elapsed_us": started.elapsed().as_micros() as u64,
        "faults": faults,
        "latency_ns": {
            "samples": l.len(),
            "p50": percentile(&l, 0.5),
            "p90": percentile(&l, 0.9),
            "p99": percentile(&l, 0.99),
            "max": l.last().copied().unwrap_or(0),
        },
        "fw_minus_boottime_ns": fw_minus_boottime(),
    }));
}

/// Stops on stdin's end of file.
fn watch_stdin(stop: &'static AtomicBool) {
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
        stop.store(true, Ordering::Relaxed);
    });
}

fn config(a: &Args, stream: bool) -> RegionConfig<'_> {
    let mut c = RegionConfig::new(&a.data_source);
    c.producer = "sim-mcu";
    c.boot_id = a.boot_id;
    c.stream_mode = stream;
    // A host enables tracing when a session starts.
    c.trace_enabled = !a.wait_enabled;
    c
}

fn run() -> Result<(), String> {
    let a = parse()?;
    static STOP: AtomicBool = AtomicBool::new(false);
    watch_stdin(&STOP);
    let _ = fw_now();
    match a.mode.as_str() {
        "region" => region_mode(&a, &STOP),
        "stream" => stream_mode(&a, &STOP),
        other => Err(format!("unknown mode {other} (region, stream)")),
    }
}

// ----------------------------------------------------------------- region

/// The firmware's RAM: the file mapped shared, the storage at the offset.
struct Ram {
    base: NonNull<u8>,
    len: usize,
    offset: usize,
}

impl Ram {
    fn map(path: &PathBuf, offset: u64) -> Result<Self, String> {
        let offset = offset as usize;
        if offset % 4096 != 0 {
            return Err("the region offset must be page aligned here".into());
        }
        let len = offset + std::mem::size_of::<Storage>();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        if file.metadata().map_err(|e| e.to_string())?.len() < len as u64 {
            file.set_len(len as u64).map_err(|e| e.to_string())?;
        }
        // SAFETY: a fresh shared mapping chosen by the kernel.
        let ptr = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::SHARED,
                &file,
                0,
            )
        }
        .map_err(|e| format!("mmap: {e}"))?;
        Ok(Ram {
            base: NonNull::new(ptr.cast()).ok_or("mmap returned null")?,
            len,
            offset,
        })
    }

    /// The storage, as the firmware's RAM holds it.
    fn storage(&mut self) -> &mut Storage {
        // SAFETY: the mapping holds a `Storage` at `offset` (page aligned),
        // every byte pattern is valid for it (byte arrays and a
        // `MaybeUninit`), and `&mut self` makes this the only reference
        // this process makes into the mapping. The host process is the
        // peer the region's protocol is written for.
        unsafe { &mut *self.base.as_ptr().add(self.offset).cast::<Storage>() }
    }
}

impl Drop for Ram {
    fn drop(&mut self) {
        // SAFETY: the mapping of `map`; the storage borrows `self`.
        let _ = unsafe { rustix::mm::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

fn region_mode(a: &Args, stop: &AtomicBool) -> Result<(), String> {
    let path = a.file.clone().ok_or("region mode needs --file")?;
    let mut ram = Ram::map(&path, a.offset)?;
    let started = Instant::now();
    let mut emitted = Emitted::default();
    let mut latencies = Vec::new();
    let mut next = 0;
    let mut boots = 0;
    loop {
        let handles = ram
            .storage()
            .init(&config(a, false))
            .map_err(|e| e.to_string())?;
        boots += 1;
        emit(
            json!({"event": if boots == 1 { "ready" } else { "reset" }, "boot_id": handles.header.boot_id}),
        );
        next = run_boot(
            a,
            &handles,
            next,
            &mut emitted,
            &mut latencies,
            stop,
            &mut |e, l| done_report(a, e, l, started, json!({})),
        )?;
        if next >= a.iterations || stop.load(Ordering::Relaxed) {
            break;
        }
        // Before the reset, the host takes what the boot committed.
        let deadline = Instant::now() + Duration::from_secs(2);
        while handles.control.counters().ring_tail != handles.control.counters().ring_head
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    if !a.exit_when_done {
        while !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    Ok(())
}

// ----------------------------------------------------------------- stream

/// Where frames go, paced like a UART of `baud` if given, with faults.
struct Link {
    out: Box<dyn Write + Send>,
    /// Bytes per second (0: unpaced).
    rate: u64,
    start: Instant,
    sent: u64,
    frames: u64,
    chunk_frames: u64,
    data_frames: u64,
    stats_frames: u64,
    faults: Faults,
    /// Faults are made while the firmware runs, not in the answers after.
    faulty: bool,
}

#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
struct Faults {
    garbage: u64,
    garbage_bytes: u64,
    duplicated: u64,
    corrupted: u64,
    oversized: u64,
    dropped_chunks: u64,
    truncated: u64,
}

const GARBAGE: &[u8] = b"boot: hello from the sim firmware\r\n";

impl Link {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        if self.rate > 0 {
            self.sent += bytes.len() as u64;
            let due = self.start + Duration::from_secs_f64(self.sent as f64 / self.rate as f64);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
        }
        self.out.write_all(bytes)
    }

    /// Sends one encoded frame, with the faults asked for.
    fn frame(&mut self, a: &Args, frame: &[u8]) -> std::io::Result<()> {
        self.frames += 1;
        let kind = frame[2];
        let faulty = self.faulty;
        let every = |k: u64, n: u64| faulty && k > 0 && n % k == 0;
        if every(a.garbage_every, self.frames) {
            self.faults.garbage += 1;
            self.faults.garbage_bytes += GARBAGE.len() as u64;
            self.write(GARBAGE)?;
        }
        if every(a.oversized_every, self.frames) {
            self.faults.oversized += 1;
            let mut bogus = shmtrace_abi::frame::MAGIC.to_vec();
            bogus.extend_from_slice(&[0x02, 0, 0x11, 0x11, 0x11, 0x11, 0, 0, 0x10, 0]);
            self.write(&bogus)?;
        }
        match kind {
            shmtrace_abi::frame::kind::CHUNK => {
                self.chunk_frames += 1;
                if every(a.drop_chunk_every, self.chunk_frames) {
                    self.faults.dropped_chunks += 1;
                    return Ok(());
                }
            }
            shmtrace_abi::frame::kind::STATS => {
                self.stats_frames += 1;
                if every(a.corrupt_stats_every, self.stats_frames) {
                    self.faults.corrupted += 1;
                    let mut bad = frame.to_vec();
                    bad[12] ^= 0x5A;
                    return self.write(&bad);
                }
            }
            _ => {}
        }
        self.write(frame)?;
        let data = matches!(
            kind,
            shmtrace_abi::frame::kind::CHUNK | shmtrace_abi::frame::kind::PATCH
        );
        if data {
            self.data_frames += 1;
            if every(a.duplicate_every, self.data_frames) {
                self.faults.duplicated += 1;
                self.write(frame)?;
            }
        }
        Ok(())
    }
}

/// The drain side of a stream-mode firmware: ring records to frames,
/// commands from the host to control words.
struct Drain<'h> {
    handles: RegionHandles<'h>,
    reader: RegionReader<'h>,
    encoder: FrameEncoder,
    link: Link,
    buf: Vec<u8>,
    frame: Vec<u8>,
    commands: Option<(TcpStream, FrameDecoder<Vec<u8>>)>,
}

impl Drain<'_> {
    fn send(
        &mut self,
        a: &Args,
        encode: impl FnOnce(&mut FrameEncoder, &mut Vec<u8>),
    ) -> Result<(), String> {
        self.frame.clear();
        encode(&mut self.encoder, &mut self.frame);
        let frame = std::mem::take(&mut self.frame);
        let r = self.link.frame(a, &frame).map_err(|e| format!("send: {e}"));
        self.frame = frame;
        r
    }

    /// Sends every record the ring has.
    fn drain(&mut self, a: &Args) -> Result<usize, String> {
        let mut n = 0;
        loop {
            let mut frame = std::mem::take(&mut self.frame);
            frame.clear();
            match self.reader.poll(&mut self.buf) {
                Ok(Some(Record::Reset(_))) | Ok(None) => {
                    self.frame = frame;
                    return Ok(n);
                }
                Ok(Some(record)) => {
                    self.encoder
                        .record(&record, &mut |b: &[u8]| frame.extend_from_slice(b));
                }
                Err(e) => return Err(format!("own ring: {e}")),
            }
            let r = self.link.frame(a, &frame).map_err(|e| format!("send: {e}"));
            self.frame = frame;
            r?;
            n += 1;
        }
    }

    fn hello(&mut self, a: &Args, boot_id: u32) -> Result<(), String> {
        let mut header = self.handles.header;
        header.boot_id = boot_id;
        self.send(a, |enc, out| {
            enc.hello(&Hello::from_header(&header), &mut |b: &[u8]| {
                out.extend_from_slice(b)
            })
        })
    }

    fn stats(&mut self, a: &Args) -> Result<(), String> {
        let c = self.handles.control.counters();
        let s = FrameStats {
            packets_dropped: c.packets_dropped,
            ring_overflows: c.ring_overflows,
            chunks_lost: c.chunks_lost,
            frames_dropped: 0,
        };
        self.send(a, |enc, out| {
            enc.stats(&s, &mut |b: &[u8]| out.extend_from_slice(b))
        })
    }

    /// Obeys the host's frames; `false` once the host has gone.
    fn commands(&mut self, a: &Args) -> Result<bool, String> {
        let Some((stream, _)) = &mut self.commands else {
            return Ok(true);
        };
        let mut bytes = [0u8; 256];
        let n = match stream.read(&mut bytes) {
            Ok(0) => return Ok(false),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(true),
            Err(e) => return Err(format!("read: {e}")),
        };
        let mut input = &bytes[..n];
        let mut frames = Vec::new();
        if let Some((_, decoder)) = &mut self.commands {
            while !input.is_empty() {
                let (used, f) = decoder.push(input);
                input = &input[used..];
                if let Some(f) = f {
                    match f.parse() {
                        Ok(Frame::Enable) => frames.push((1, 0)),
                        Ok(Frame::Disable) => frames.push((2, 0)),
                        Ok(Frame::Clear) => frames.push((3, 0)),
                        Ok(Frame::Flush(id)) => frames.push((4, id)),
                        Ok(Frame::Sync(n)) => frames.push((5, n)),
                        _ => {}
                    }
                }
            }
        }
        let control = self.handles.control;
        for (what, value) in frames {
            match what {
                1 => control.set_trace_enabled(true),
                2 => control.set_trace_enabled(false),
                3 => {
                    control.request_clear();
                }
                4 => {
                    // The writers flush on the firmware's thread.
                    let id = control.request_flush();
                    let deadline = Instant::now() + Duration::from_millis(200);
                    while control.flush_ack() != id && Instant::now() < deadline {
                        std::thread::sleep(Duration::from_micros(100));
                    }
                    self.drain(a)?;
                }
                _ => {
                    // Everything committed before the sync goes first.
                    self.drain(a)?;
                    let now = fw_now();
                    self.send(a, |enc, out| {
                        enc.clock(now, value, &mut |b: &[u8]| out.extend_from_slice(b))
                    })?;
                }
            }
        }
        Ok(true)
    }
}

fn stream_mode(a: &Args, stop: &AtomicBool) -> Result<(), String> {
    let (out, commands): (Box<dyn Write + Send>, _) = match (&a.out, a.listen) {
        (Some(path), _) => (
            Box::new(
                OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .open(path)
                    .map_err(|e| format!("{}: {e}", path.display()))?,
            ),
            None,
        ),
        (None, Some(port)) => {
            let listener =
                TcpListener::bind(("127.0.0.1", port)).map_err(|e| format!("listen: {e}"))?;
            emit(
                json!({"event": "listening", "port": listener.local_addr().map_err(|e| e.to_string())?.port()}),
            );
            let (stream, _) = listener.accept().map_err(|e| format!("accept: {e}"))?;
            stream.set_nodelay(true).map_err(|e| e.to_string())?;
            let reader = stream.try_clone().map_err(|e| e.to_string())?;
            reader.set_nonblocking(true).map_err(|e| e.to_string())?;
            (
                Box::new(stream) as Box<dyn Write + Send>,
                Some((reader, FrameDecoder::new(vec![0u8; 256]))),
            )
        }
        _ => return Err("stream mode needs --out PATH or --listen PORT".into()),
    };
    let mut storage = Box::new(Storage::new());
    let handles = storage.init(&config(a, true)).map_err(|e| e.to_string())?;
    let reader = RegionReader::attach(&handles).map_err(|e| e.to_string())?;
    let buf = vec![0u8; reader.chunk_buffer_len()];
    let mut drain = Drain {
        handles,
        reader,
        encoder: FrameEncoder::new(),
        link: Link {
            out,
            rate: a.baud / 10,
            start: Instant::now(),
            sent: 0,
            frames: 0,
            chunk_frames: 0,
            data_frames: 0,
            stats_frames: 0,
            faults: Faults::default(),
            faulty: true,
        },
        buf,
        frame: Vec::new(),
        commands,
    };
    let started = Instant::now();
    // A reset: the firmware asks for a new boot id; the drain answers once
    // it sent everything of the old boot and the new HELLO.
    let pending_boot = AtomicU32::new(a.boot_id);
    let drained_boot = AtomicU32::new(a.boot_id);
    let producer_done = AtomicBool::new(false);
    // The faults made, once the drain sent everything the run committed.
    let final_faults = std::sync::Mutex::new(None::<serde_json::Value>);
    let result = std::thread::scope(|scope| -> Result<(), String> {
        let drain_thread = scope.spawn(|| -> Result<(), String> {
            drain.hello(a, a.boot_id)?;
            emit(json!({"event": "ready"}));
            let mut last_stats = Instant::now();
            let mut boot = a.boot_id;
            loop {
                let want = pending_boot.load(Ordering::Acquire);
                if want != boot {
                    drain.drain(a)?;
                    drain.encoder = FrameEncoder::new();
                    // RAM a reset zeroes has no boot id to count from.
                    let announced = if a.repeat_boot_id { a.boot_id } else { want };
                    drain.hello(a, announced)?;
                    boot = want;
                    drained_boot.store(want, Ordering::Release);
                }
                let alive = drain.commands(a)?;
                let n = drain.drain(a)?;
                if drain.link.faulty && producer_done.load(Ordering::Acquire) {
                    // The run is over: everything it committed goes, then
                    // the counters; the faults are final.
                    drain.drain(a)?;
                    drain.stats(a)?;
                    // One more good frame, so a receiver sees the gap of a
                    // corrupted last STATS frame.
                    let now = fw_now();
                    drain.send(a, |enc, out| {
                        enc.clock(now, 0, &mut |b: &[u8]| out.extend_from_slice(b))
                    })?;
                    if a.truncate_tail {
                        drain.link.faults.truncated += 1;
                        let now = fw_now();
                        let mut frame = Vec::new();
                        drain
                            .encoder
                            .clock(now, 0, &mut |b: &[u8]| frame.extend_from_slice(b));
                        drain
                            .link
                            .write(&frame[..frame.len() - 5])
                            .map_err(|e| e.to_string())?;
                    }
                    let _ = drain.link.out.flush();
                    if a.truncate_tail || a.close_when_done {
                        // The stream ends here (after the cut frame): the
                        // link closes (both ends of a TCP connection).
                        drain.link.out = Box::new(std::io::sink());
                        drain.commands = None;
                    }
                    drain.link.faulty = false;
                    let mut faults =
                        serde_json::to_value(drain.link.faults).map_err(|e| e.to_string())?;
                    faults["frames"] = drain.link.frames.into();
                    *final_faults.lock().unwrap_or_else(|e| e.into_inner()) = Some(faults);
                    if a.out.is_some() || a.truncate_tail || a.close_when_done {
                        // A file or FIFO, or a cut stream: nothing more to
                        // say.
                        break;
                    }
                } else if drain.link.faulty
                    && last_stats.elapsed() >= Duration::from_millis(a.stats_every_ms)
                {
                    last_stats = Instant::now();
                    drain.stats(a)?;
                    let now = fw_now();
                    drain.send(a, |enc, out| {
                        enc.clock(now, 0, &mut |b: &[u8]| out.extend_from_slice(b))
                    })?;
                }
                // The host closed the connection; or this process is asked to
                // stop once the run's frames went out.
                if !alive || (stop.load(Ordering::Relaxed) && !drain.link.faulty) {
                    break;
                }
                if n == 0 {
                    std::thread::sleep(Duration::from_micros(200));
                }
            }
            let _ = drain.link.out.flush();
            Ok(())
        });
        let mut emitted = Emitted::default();
        let mut latencies = Vec::new();
        let mut next = 0;
        let mut boot = a.boot_id;
        let mut after_done = |e: &Emitted, l: &[u64]| {
            producer_done.store(true, Ordering::Release);
            let deadline = Instant::now() + Duration::from_secs(30);
            let faults = loop {
                if let Some(f) = final_faults
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .take()
                {
                    break f;
                }
                if Instant::now() >= deadline {
                    break json!({"error": "the drain did not finish"});
                }
                std::thread::sleep(Duration::from_millis(1));
            };
            done_report(a, e, l, started, faults);
        };
        loop {
            next = run_boot(
                a,
                &handles,
                next,
                &mut emitted,
                &mut latencies,
                stop,
                &mut after_done,
            )?;
            if next >= a.iterations || stop.load(Ordering::Relaxed) {
                break;
            }
            boot += 1;
            // A restart initializes the region: tracing as configured.
            handles.control.set_trace_enabled(!a.wait_enabled);
            pending_boot.store(boot, Ordering::Release);
            while drained_boot.load(Ordering::Acquire) != boot && !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_micros(200));
            }
            emit(json!({"event": "reset", "boot_id": boot}));
        }
        producer_done.store(true, Ordering::Release);
        drain_thread
            .join()
            .map_err(|_| "the drain thread panicked".to_string())?
    });
    result?;
    if !a.exit_when_done {
        while !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    drop(storage);
    Ok(())
}
