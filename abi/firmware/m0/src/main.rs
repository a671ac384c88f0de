//! # shmtrace-firmware-m0
//!
//! A Cortex-M0 firmware (`thumbv6m-none-eabi`: no compare-and-swap) for
//! QEMU's `microbit` board (nRF51822: 16 KiB of RAM) built with
//! `shmtrace-abi`'s `portable-atomic` feature, as the crate docs tell a
//! firmware author to. It writes slices, instants, integer and
//! floating-point counters and an event with debug annotations from its
//! main loop, and instants from the `SysTick` interrupt through a
//! [`WriterCell`] (its compare-and-swap is portable-atomic's), into a
//! stream-mode region that it drains itself into frames on UART0
//! (`shmtrace_abi::link::StreamService`).
//!
//! Nobody has to answer it: tracing is on from the start, so QEMU's
//! `-serial file:FRAMES` captures the stream for `shmtrace import --frames
//! FRAMES`; a `shmtrace bridge` on `-serial tcp:...` records it live as
//! well. After [`ITERATIONS`] turns of the loop (and at least
//! [`IRQ_EVENTS`] interrupt events) it flushes both writers, sends what
//! they held, prints what it wrote as one JSON line over semihosting and
//! exits (`tests/tests/firmware_m0.rs` checks the trace against that line):
//!
//! ```text
//! {"event":"done","emitted":{"slice_begin":N,...},"lost":N}
//! ```
//!
//! `emitted` uses the trace checker's keys; `lost` counts events dropped
//! or missed by both writers and records the link lost, and must be 0.
//! The exit status is failure after a panic or a hard fault (an unaligned
//! access, say) and when something was lost.
//!
//! RAM (16 KiB): the region (256-byte header, 16 ring slots, one 4 KiB SMB
//! page: 4864 bytes), the stream's chunk buffer (a page less 8 bytes) in a
//! static, not on the stack, and the two writers; the stack takes the rest.
#![no_std]
#![no_main]

mod exit;
mod nrf51;

use core::sync::atomic::{AtomicBool, AtomicU32, Ordering::Relaxed};

use cortex_m::peripheral::syst::SystClkSource;
use cortex_m_rt::{entry, exception, ExceptionFrame};
use cortex_m_semihosting::hprintln;
use shmtrace_abi::layout::PageLayout;
use shmtrace_abi::link::{StreamService, DEFAULT_CHUNK_BUFFER};
use shmtrace_abi::region::{RegionArbiter, RegionConfig, RegionHeader, RegionStorage, TakeError};
use shmtrace_abi::trace::track_event::Type;
use shmtrace_abi::track_event::{
    CounterTrack, SequenceConfig, Track, TrackEventWriter, WriterCell,
};
use shmtrace_abi::writer::InPlaceWriter;
use shmtrace_abi::{instant, slice_begin};

use exit::exit;

/// Turns of the main loop, six events each.
pub const ITERATIONS: u32 = 300;
/// Interrupt events the run waits for at least.
pub const IRQ_EVENTS: u32 = 10;
/// SysTick's period in core clock ticks.
const SYSTICK_RELOAD: u32 = 20_000;

const SMB_BYTES: usize = 4096;
const SLOTS: usize = 16;

/// Stream mode (the firmware drains its ring), tracing on from the start.
const CONFIG: RegionConfig<'static> = RegionConfig {
    producer: "shmtrace-firmware-m0",
    stream_mode: true,
    ..RegionConfig::new("track_event")
};
/// The header laid out at compile time; a bad config fails the build.
const HEADER: Result<RegionHeader<SMB_BYTES, SLOTS>, TakeError> = RegionHeader::new(&CONFIG);
const _: () = assert!(
    HEADER.is_ok(),
    "the region's config does not fit its storage"
);

static REGION: RegionStorage<SMB_BYTES, SLOTS> = RegionStorage::new();

static MAIN: Track = Track::new("m0 main");
static TIMER: Track = Track::new("m0 systick");
static LEVEL: CounterTrack = CounterTrack::new("level").with_parent(&MAIN);
static VOLTS: CounterTrack = CounterTrack::new("volts").with_parent(&MAIN);

type Writer = TrackEventWriter<'static, RegionArbiter<'static>, fn() -> u64>;

/// The interrupt's writer (writer id 2).
static IRQ: WriterCell<Writer> = WriterCell::new();
/// Whether the interrupt writes (until the run is over).
static IRQ_ON: AtomicBool = AtomicBool::new(false);
/// Instants the interrupt wrote. Only the handler increments it (a load
/// and a store: ARMv6-M has no atomic add).
static IRQ_WRITTEN: AtomicU32 = AtomicU32::new(0);

#[exception]
fn SysTick() {
    if IRQ_ON.load(Relaxed) && IRQ.try_with(|w| instant!(w, "irq", "tick")) == Some(true) {
        IRQ_WRITTEN.store(IRQ_WRITTEN.load(Relaxed) + 1, Relaxed);
    }
}

/// What the main loop wrote, by the checker's keys.
#[derive(Default)]
struct Emitted {
    slice_begin: u32,
    slice_end: u32,
    instant: u32,
    counter_int: u32,
    counter_double: u32,
    arg_uint: u32,
    arg_string: u32,
}

fn count(written: bool, n: &mut u32) {
    *n += u32::from(written);
}

/// One turn of the loop: a slice around two counter samples, an instant
/// and an instant with two annotations.
fn iteration(w: &mut Writer, n: u32, c: &mut Emitted) {
    count(slice_begin!(w, "app", "work"), &mut c.slice_begin);
    count(w.counter(&LEVEL, i64::from(n % 100)), &mut c.counter_int);
    let volts = 3.0 + f64::from(n % 10) / 10.0;
    count(w.counter_f64(&VOLTS, volts), &mut c.counter_double);
    count(instant!(w, "app", "tick"), &mut c.instant);
    let annotated = w
        .event(Type::Instant, "app", "sample")
        .arg("n", n)
        .arg("state", "ok")
        .emit();
    count(annotated, &mut c.instant);
    count(annotated, &mut c.arg_uint);
    count(annotated, &mut c.arg_string);
    count(w.slice_end(), &mut c.slice_end);
}

#[entry]
fn main() -> ! {
    nrf51::start_timer();
    let region = match &HEADER {
        Ok(header) => REGION.take_header(header),
        Err(e) => Err(*e),
    };
    let Ok(region) = region else { fail("region") };
    let writer = |id, track| -> Option<Writer> {
        let arbiter = RegionArbiter::new(&region, PageLayout::Div4).ok()?;
        let out = InPlaceWriter::new(arbiter, id, 0).ok()?;
        Some(TrackEventWriter::new(
            out,
            nrf51::now_ns as fn() -> u64,
            SequenceConfig::new(track),
        ))
    };
    let (Some(mut main), Some(irq)) = (writer(1, &MAIN), writer(2, &TIMER)) else {
        fail("writers")
    };
    if IRQ.set(irq).is_err() {
        fail("irq writer");
    }
    // The chunk buffer in a static: a `[u8; DEFAULT_CHUNK_BUFFER]` passed
    // by value is copied on its way into the service, and main's frame
    // holds the copies (5.6 KiB instead of 1.6 here; 10 KiB in a variant
    // that unwrapped the result, which ran the stack over `.bss`).
    let Some(buffer) =
        cortex_m::singleton!(: [u8; DEFAULT_CHUNK_BUFFER] = [0; DEFAULT_CHUNK_BUFFER])
    else {
        fail("chunk buffer")
    };
    let Ok(mut link) = StreamService::new(&region, nrf51::Uart0::start(), &mut buffer[..]) else {
        fail("stream")
    };

    let Some(mut core) = cortex_m::Peripherals::take() else {
        fail("core peripherals")
    };
    core.SYST.set_clock_source(SystClkSource::Core);
    core.SYST.set_reload(SYSTICK_RELOAD - 1);
    core.SYST.clear_current();
    core.SYST.enable_counter();
    IRQ_ON.store(true, Relaxed);
    core.SYST.enable_interrupt();

    let mut emitted = Emitted::default();
    let mut n = 0;
    while n < ITERATIONS || IRQ_WRITTEN.load(Relaxed) < IRQ_EVENTS {
        link.poll(
            || {
                main.flush();
                IRQ.try_with(|w| w.flush());
            },
            nrf51::now_ns,
        );
        if n < ITERATIONS {
            iteration(&mut main, n, &mut emitted);
            n += 1;
        }
    }
    IRQ_ON.store(false, Relaxed);
    core.SYST.disable_interrupt();
    main.flush();
    IRQ.try_with(|w| w.flush());
    // Sends the chunks the flushes committed.
    link.poll(|| {}, nrf51::now_ns);

    let irq = IRQ_WRITTEN.load(Relaxed);
    let (main_stats, irq_stats) = (
        main.stats(),
        IRQ.try_with(|w| w.stats()).unwrap_or_default(),
    );
    let lost = u64::from(main_stats.events_dropped)
        + u64::from(irq_stats.events_dropped)
        + u64::from(IRQ.busy_misses())
        + link.lost();
    let e = &emitted;
    hprintln!(
        "{{\"event\":\"done\",\"emitted\":{{\"slice_begin\":{},\"slice_end\":{},\"instant\":{},\
         \"counter_int\":{},\"counter_double\":{},\"arg_uint\":{},\"arg_string\":{}}},\
         \"irq_instants\":{},\"lost\":{}}}",
        e.slice_begin,
        e.slice_end,
        e.instant + irq,
        e.counter_int,
        e.counter_double,
        e.arg_uint,
        e.arg_string,
        irq,
        lost
    );
    exit(lost == 0)
}

/// Reports a failed setup step and ends the run.
fn fail(what: &str) -> ! {
    hprintln!("{{\"event\":\"failed\",\"what\":\"{}\"}}", what);
    exit(false)
}

#[exception]
unsafe fn HardFault(frame: &ExceptionFrame) -> ! {
    hprintln!("{{\"event\":\"hard_fault\",\"pc\":{}}}", frame.pc());
    exit(false)
}

#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    fail("panic")
}
