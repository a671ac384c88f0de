//! Live sessions: the firmware traced by a host's tools while it runs, as
//! the integration tests (`tests/tests/firmware.rs`) drive it.
//!
//! The `attach` and `stream` binaries set up one region (the same
//! [`LiveStorage`] in `.shmtrace`, PSRAM at `0x2100_0000`) and two writers
//! timed by the FPGA counter ([`CounterClock`], which keeps the host's
//! time under QEMU): the main loop's and the `SysTick` interrupt's (in
//! [`IRQ_WRITER`]). They differ in how the host reaches them, their
//! [`Link`], one of `shmtrace_abi::link`'s services polled from the main
//! loop:
//!
//! * `attach` ([`AttachService`]): the host maps the region (QEMU
//!   `memory-backend-file,share=on`) and consumes its ring
//!   (`shmtrace serve --attach`); the firmware answers the control words:
//!   flush requests (flush the writers, acknowledge) and sync requests
//!   (answer with the clock). `trace_enabled` and `clear_request` reach the
//!   writers through their arbiters.
//! * `stream` ([`UartStream`]): the region is in stream mode; the firmware
//!   drains its own ring into frames on UART0 ([`Uart`], its
//!   [`ByteIo`](shmtrace_abi::link::ByteIo)) for `shmtrace bridge`, and
//!   obeys the host's frames from UART0 (enable, clear, flush, clock sync).
//!
//! # The session
//!
//! The region starts with `trace_enabled` 0: nothing is written until the
//! host enables tracing. From then on the main loop writes a round of
//! events every [`ROUND_NS`] (a slice with a counter sample and an instant
//! in it; every 8th round a floating-point sample and an event with an
//! annotation and a flow on a track of its own) and the interrupt an
//! instant and a counter sample per tick ([`TICK_HZ`]), until the host
//! says finish in the [`Mailbox`]. Then the firmware takes the interrupt's
//! writer out, flushes, and reports exactly what it wrote; it goes on
//! serving its link (flushes, syncs, clears) until the host says exit.
//!
//! While writing, every new `mark` the host stores in the mailbox becomes
//! an instant `host_mark` (annotation `mark`) stamped with the time the
//! firmware read it, acknowledged at once: the host notes its own BOOTTIME
//! around the store and the acknowledgement, and compares it with the
//! instant as the trace places it (the clock alignment error).
//!
//! # Output (semihosting stdout, one JSON object per line)
//!
//! ```text
//! {"event":"ready","mode":M,"region":ADDR,"region_size":N,"mailbox":ADDR}
//! {"event":"enabled","clock_ns":T}        tracing turned on (first time)
//! {"event":"done","emitted":{KEY:N,...},"irq":{"instant":N,"counter_int":M},
//!  "marks":K,"rounds":R,"lost":L,"clock_ns":T}
//! {"event":"exit","lost":L}               then semihosting exit
//! ```
//!
//! `emitted` counts the events the writers wrote (the checker's keys:
//! `slice_begin`, `slice_end`, `instant`, `counter_int`, `counter_double`,
//! `flow_begin`, `arg_uint`), both writers together; `lost` counts
//! everything lost between the writers and the host (dropped events and
//! packets, lost chunks, interrupt borrows that found the writer busy,
//! records a stream's drain could not read). The run exits with
//! failure if `lost` is not 0. Packets the writers lose are added to the
//! region's `packets_dropped` as they happen (a round at a time), so the
//! host's bridge reports them too (a stream sends the counter in STATS).

pub mod mailbox;

use core::sync::atomic::{AtomicU32, Ordering::Relaxed};

use cortex_m::interrupt;
use cortex_m::peripheral::syst::SystClkSource;
use shmtrace_abi::link::{AttachService, StreamService, DEFAULT_CHUNK_BUFFER};
use shmtrace_abi::region::{
    Control, RegionArbiter, RegionConfig, RegionHandles, RegionHeader, RegionStorage, TakeError,
};
use shmtrace_abi::trace::track_event::Type;
use shmtrace_abi::track_event::{Clock, SequenceConfig, TrackEventWriter, WriterCell};
use shmtrace_abi::writer::InPlaceWriter;
use shmtrace_abi::{instant, slice_begin};

pub use crate::fpgaio::CounterClock;
use crate::out::{self, Out};
use crate::shm::{LAYOUT, TARGET_BUFFER};
use crate::tracer::{
    IRQ_TRACK, IRQ_WRITER_ID, LEVEL, MAIN_TRACK, MAIN_WRITER_ID, MOTOR, RELOADS, STEP_FLOW, VOLTAGE,
};
use crate::uart::Uart;
pub use mailbox::Mailbox;

/// The live region: 64 KiB of SMB (64 chunks of 1 KiB) and 64 ring slots:
/// 0.6 s of the session's events, so a host that falls behind for a while
/// (a busy machine) loses nothing.
pub type LiveStorage = RegionStorage<LIVE_SMB, LIVE_SLOTS>;
/// SMB bytes of a live session's region.
const LIVE_SMB: usize = 65536;
/// Ring slots of a live session's region.
const LIVE_SLOTS: usize = 64;
/// A live writer: 16 interned strings, 4 described tracks, 8 cached call
/// sites.
pub type LiveWriter = TrackEventWriter<'static, RegionArbiter<'static>, CounterClock, 16, 4, 8>;

/// The interrupt's writer.
pub static IRQ_WRITER: WriterCell<LiveWriter> = WriterCell::new();
/// Instants the interrupt's writer wrote.
static IRQ_INSTANTS: AtomicU32 = AtomicU32::new(0);
/// Counter samples the interrupt's writer wrote.
static IRQ_COUNTERS: AtomicU32 = AtomicU32::new(0);
/// SysTick interrupts so far.
static TICKS: AtomicU32 = AtomicU32::new(0);

/// Time between two rounds of the main loop's events (2,000 rounds, 8,500
/// events per second).
pub const ROUND_NS: u64 = 500_000;
/// SysTick interrupts per second (each writes 2 events).
pub const TICK_HZ: u32 = 1_000;
/// The SysTick clock (the core clock on the mps2 boards).
const SYSTICK_HZ: u32 = 25_000_000;
/// Category of every event.
pub const CATEGORY: &str = "fw";
/// Data source the region announces: the one a standard track event config
/// enables.
pub const DATA_SOURCE: &str = "track_event";
/// Producer name the region announces.
pub const PRODUCER: &str = "shmtrace-firmware-example";

/// Events written, by the checker's keys.
#[derive(Debug, Clone, Copy, Default)]
pub struct Counts {
    /// Slice begins.
    pub slice_begin: u32,
    /// Slice ends.
    pub slice_end: u32,
    /// Instants (marks included).
    pub instant: u32,
    /// Integer counter samples.
    pub counter_int: u32,
    /// Floating-point counter samples.
    pub counter_double: u32,
    /// Flow ids carried.
    pub flow_begin: u32,
    /// Unsigned debug annotations.
    pub arg_uint: u32,
}

/// How the host reaches the firmware.
pub trait Link {
    /// Serves the host: applies its requests (flushing `writers` when
    /// asked) and moves what the writers committed towards it.
    fn serve(&mut self, writers: &mut Writers);
    /// What the link lost between the region and the host.
    fn lost(&self) -> u64;
    /// Name printed in the `ready` line.
    fn mode(&self) -> &'static str;
}

impl Link for AttachService<'static> {
    fn serve(&mut self, writers: &mut Writers) {
        self.poll(|| writers.flush(), CounterClock);
    }

    /// Nothing: the host consumes the ring and counts what it loses.
    fn lost(&self) -> u64 {
        0
    }

    fn mode(&self) -> &'static str {
        "attach"
    }
}

/// The rate UART0 is set to (QEMU does not keep to it).
pub const BAUD: u32 = 115_200;
/// The stream link: the region's records as frames on UART0.
pub type UartStream = StreamService<'static, Uart, [u8; DEFAULT_CHUNK_BUFFER]>;

/// The stream link of the stream-mode region behind `handles`; takes
/// UART0 and sends the HELLO frame.
pub fn uart_stream(handles: &RegionHandles<'static>) -> UartStream {
    let Some(uart) = Uart::uart0(BAUD) else {
        out::fail("UART0 taken")
    };
    match StreamService::new(handles, uart, [0; DEFAULT_CHUNK_BUFFER]) {
        Ok(link) => link,
        Err(_) => out::fail("stream link refused"),
    }
}

impl Link for UartStream {
    fn serve(&mut self, writers: &mut Writers) {
        self.poll(|| writers.flush(), CounterClock);
    }

    fn lost(&self) -> u64 {
        StreamService::lost(self)
    }

    fn mode(&self) -> &'static str {
        "stream"
    }
}

/// The main loop's writer and access to the interrupt's.
pub struct Writers {
    main: LiveWriter,
    /// Losses of the interrupt's writer, once taken out: events, packets.
    irq_lost: (u64, u64),
    /// Busy misses published in the region's `packets_dropped` so far.
    published: u64,
}

impl Writers {
    /// Commits the chunks both writers hold.
    pub fn flush(&mut self) {
        self.main.flush();
        // Masked, so the interrupt never finds its writer busy (and loses
        // an event) while this borrows it.
        interrupt::free(|_| IRQ_WRITER.try_with(|w| w.flush()));
    }

    /// The firmware's clock now.
    pub fn now_ns(&self) -> u64 {
        CounterClock.now_ns()
    }

    /// Events and packets both writers lost so far (interrupts that found
    /// their writer busy count as packets).
    fn losses(&self) -> (u64, u64) {
        let irq = interrupt::free(|_| IRQ_WRITER.try_with(|w| writer_lost(w)));
        let (irq_events, irq_packets) = irq.unwrap_or(self.irq_lost);
        let (events, packets) = writer_lost(&self.main);
        (
            events + irq_events,
            packets + irq_packets + u64::from(IRQ_WRITER.busy_misses()),
        )
    }

    /// Everything the writers lost so far (0 if nothing).
    pub fn lost(&self) -> u64 {
        let (events, packets) = self.losses();
        events + packets
    }

    /// Adds the interrupt events lost to a busy writer since the last call
    /// to the region's `packets_dropped`, so the host counts them too (the
    /// packets the writers drop, their region arbiters count themselves).
    fn publish_losses(&mut self, control: &Control<'_>) {
        let misses = u64::from(IRQ_WRITER.busy_misses());
        if misses > self.published {
            control.count_packets_dropped((misses - self.published) as u32);
            self.published = misses;
        }
    }
}

/// Losses one writer counted: events it dropped, packets its chunk writer
/// dropped or could not complete.
fn writer_lost(w: &LiveWriter) -> (u64, u64) {
    let packets = w.writer_stats();
    (
        u64::from(w.stats().events_dropped),
        packets.packets_dropped() + packets.packets_incomplete,
    )
}

/// The region configuration of a live session.
pub const fn region_config(stream_mode: bool) -> RegionConfig<'static> {
    RegionConfig {
        producer: PRODUCER,
        stream_mode,
        trace_enabled: false,
        ..RegionConfig::new(DATA_SOURCE)
    }
}

/// The region header of a live session, checked and laid out at compile
/// time (the firmware stores its words).
type LiveHeader = Result<RegionHeader<LIVE_SMB, LIVE_SLOTS>, TakeError>;
/// [`LiveHeader`] of a session through shared RAM.
const ATTACH_HEADER: LiveHeader = RegionHeader::new(&region_config(false));
/// [`LiveHeader`] of a session in stream mode.
const STREAM_HEADER: LiveHeader = RegionHeader::new(&region_config(true));
// A config that does not fit the storage fails the build.
const _: () = assert!(ATTACH_HEADER.is_ok() && STREAM_HEADER.is_ok());

/// Sets up the writers over `handles`: the main one returned, the
/// interrupt's in [`IRQ_WRITER`].
fn writers(handles: &RegionHandles<'static>) -> Writers {
    let make = |id: u16, track| {
        let Ok(arbiter) = RegionArbiter::new(handles, LAYOUT) else {
            out::fail("arbiter refused")
        };
        let Ok(out) = InPlaceWriter::new(arbiter, id, TARGET_BUFFER) else {
            out::fail("writer refused")
        };
        LiveWriter::new(out, CounterClock, SequenceConfig::new(track))
    };
    let main = make(MAIN_WRITER_ID, &MAIN_TRACK);
    if IRQ_WRITER.set(make(IRQ_WRITER_ID, &IRQ_TRACK)).is_err() {
        out::fail("interrupt writer set twice")
    }
    Writers {
        main,
        irq_lost: (0, 0),
        published: 0,
    }
}

/// The `SysTick` handler: an instant and a sample of the tick count
/// through the interrupt's writer (which skips them while the host does
/// not record, and is gone once the session finished).
pub fn on_systick() {
    let n = TICKS.load(Relaxed).wrapping_add(1);
    TICKS.store(n, Relaxed);
    IRQ_WRITER.try_with(|w| {
        if instant!(w, "irq", "systick") {
            IRQ_INSTANTS.store(IRQ_INSTANTS.load(Relaxed) + 1, Relaxed);
        }
        if w.counter(&RELOADS, i64::from(n)) {
            IRQ_COUNTERS.store(IRQ_COUNTERS.load(Relaxed) + 1, Relaxed);
        }
    });
}

fn start_systick() {
    let Some(mut p) = cortex_m::Peripherals::take() else {
        out::fail("cortex-m peripherals already taken")
    };
    p.SYST.set_clock_source(SystClkSource::Core);
    p.SYST.set_reload(SYSTICK_HZ / TICK_HZ - 1);
    p.SYST.clear_current();
    p.SYST.enable_interrupt();
    p.SYST.enable_counter();
}

/// Where the session is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting for the host to enable tracing.
    Waiting,
    /// Writing rounds of events.
    Writing,
    /// Finished: serving the link only.
    Done,
}

/// Takes `storage` for a session over `link` (made from the region's
/// handles) and runs it (see the module docs); never returns.
pub fn run<L: Link>(
    storage: &'static LiveStorage,
    mailbox: &'static Mailbox,
    stream_mode: bool,
    link: impl FnOnce(&RegionHandles<'static>) -> L,
) -> ! {
    let mut out = Out::open();
    mailbox.reset();
    let header = if stream_mode {
        &STREAM_HEADER
    } else {
        &ATTACH_HEADER
    };
    let handles = match header {
        Ok(header) => storage.take_header(header),
        Err(e) => Err(*e),
    };
    let Ok(handles) = handles else {
        out::fail("region refused")
    };
    let control = handles.control;
    let mut writers = writers(&handles);
    let mut link = link(&handles);
    start_systick();
    out.line(format_args!(
        "{{\"event\":\"ready\",\"mode\":\"{}\",\"region\":{},\"region_size\":{},\"mailbox\":{}}}",
        link.mode(),
        core::ptr::from_ref(storage) as usize,
        LiveStorage::REGION_SIZE,
        core::ptr::from_ref(mailbox) as usize,
    ));

    let mut phase = Phase::Waiting;
    let mut counts = Counts::default();
    let mut rounds: u32 = 0;
    let mut marks: u32 = 0;
    let mut seen_mark = mailbox.mark();
    let mut next_round = 0u64;
    loop {
        link.serve(&mut writers);
        let now = writers.now_ns();
        match phase {
            Phase::Waiting if control.trace_enabled() => {
                phase = Phase::Writing;
                mailbox.set_state(mailbox::STATE_WRITING);
                out.line(format_args!("{{\"event\":\"enabled\",\"clock_ns\":{now}}}"));
            }
            Phase::Writing => {
                let mark = mailbox.mark();
                if mark != seen_mark {
                    let at = writers.now_ns();
                    mailbox.acknowledge(mark);
                    seen_mark = mark;
                    marks += 1;
                    if writers
                        .main
                        .event(Type::Instant, CATEGORY, "host_mark")
                        .arg("mark", mark)
                        .at(at)
                        .emit()
                    {
                        counts.instant += 1;
                        counts.arg_uint += 1;
                    }
                }
                if now >= next_round {
                    round(&mut writers.main, rounds, &mut counts);
                    writers.publish_losses(&control);
                    rounds += 1;
                    next_round = now + ROUND_NS;
                }
                if mailbox.command() >= mailbox::COMMAND_FINISH {
                    phase = Phase::Done;
                    finish(&mut writers, &mut counts);
                    link.serve(&mut writers);
                    writers.publish_losses(&control);
                    let lost = session_lost(&writers, &link, &control);
                    report_done(&mut out, &counts, marks, rounds, lost, writers.now_ns());
                    mailbox.set_state(mailbox::STATE_DONE);
                }
            }
            Phase::Waiting | Phase::Done => {}
        }
        if mailbox.command() == mailbox::COMMAND_EXIT && phase != Phase::Writing {
            let lost = session_lost(&writers, &link, &control);
            out.line(format_args!("{{\"event\":\"exit\",\"lost\":{lost}}}"));
            out::exit(lost == 0);
        }
    }
}

/// Everything lost between the writers and the host: what the writers
/// lost, chunks the region lost, what the link lost.
fn session_lost(writers: &Writers, link: &impl Link, control: &Control<'_>) -> u64 {
    writers.lost() + u64::from(control.counters().chunks_lost) + link.lost()
}

/// One round of the main loop's events, counted in `counts` as written.
fn round(w: &mut LiveWriter, n: u32, counts: &mut Counts) {
    let count = |ok: bool, c: &mut u32| *c += u32::from(ok);
    count(slice_begin!(w, CATEGORY, "work"), &mut counts.slice_begin);
    count(
        w.counter(&LEVEL, i64::from(n % 100) - 50),
        &mut counts.counter_int,
    );
    count(instant!(w, CATEGORY, "tick"), &mut counts.instant);
    if n % 8 == 0 {
        count(
            w.counter_f64(&VOLTAGE, 3.3 + f64::from(n % 16) * 0.01),
            &mut counts.counter_double,
        );
        let step = w
            .event(Type::Instant, CATEGORY, "step")
            .on(&MOTOR)
            .arg("rep", n)
            .flow(STEP_FLOW)
            .emit();
        if step {
            counts.instant += 1;
            counts.arg_uint += 1;
            counts.flow_begin += 1;
        }
    }
    count(w.slice_end(), &mut counts.slice_end);
}

/// Ends the session's writing: the interrupt's writer taken out (its
/// chunk committed), the main writer flushed, the interrupt's events added
/// to `counts`.
fn finish(writers: &mut Writers, counts: &mut Counts) {
    if let Some(mut irq) = interrupt::free(|_| IRQ_WRITER.take()) {
        irq.flush();
        writers.irq_lost = writer_lost(&irq);
    }
    writers.main.flush();
    counts.instant += IRQ_INSTANTS.load(Relaxed);
    counts.counter_int += IRQ_COUNTERS.load(Relaxed);
}

fn report_done(out: &mut Out, c: &Counts, marks: u32, rounds: u32, lost: u64, now: u64) {
    out.line(format_args!(
        "{{\"event\":\"done\",\"emitted\":{{\"slice_begin\":{},\"slice_end\":{},\
         \"instant\":{},\"counter_int\":{},\"counter_double\":{},\"flow_begin\":{},\
         \"arg_uint\":{}}},\"irq\":{{\"instant\":{},\"counter_int\":{}}},\
         \"marks\":{marks},\"rounds\":{rounds},\"lost\":{lost},\"clock_ns\":{now}}}",
        c.slice_begin,
        c.slice_end,
        c.instant,
        c.counter_int,
        c.counter_double,
        c.flow_begin,
        c.arg_uint,
        IRQ_INSTANTS.load(Relaxed),
        IRQ_COUNTERS.load(Relaxed),
    ));
}
