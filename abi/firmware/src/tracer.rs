//! The tracing calls: with [`crate::shm`], the only module of the firmware
//! that uses shmtrace-abi.
//!
//! Two contexts write, each through its own [`TrackEventWriter`] (its own
//! sequence, writer id and arbiter), so neither ever waits for the other:
//!
//! * the main loop, through the writer a [`ShmTracer`] owns: slices,
//!   instants, integer and floating-point counters, an event built with a
//!   debug annotation and a flow on a track of its own, clock snapshots;
//! * the `SysTick` interrupt, through the writer in [`IRQ_WRITER`], a
//!   [`WriterCell`] static it borrows with one compare-and-swap
//!   ([`on_systick`]): an instant and a counter per interrupt.
//!
//! Both are timed by [`SysTickClock`]. Event names are `&'static str`s the
//! writers intern per sequence; slice begins and instants name theirs at
//! call sites (`slice_begin!`, `instant!`), whose interned ids each writer
//! caches. No field number appears here.

use core::mem::size_of;
use core::sync::atomic::{AtomicU32, Ordering::Relaxed};

use shmtrace_abi::region::RegionStorage;
use shmtrace_abi::trace::counter_descriptor::Unit;
use shmtrace_abi::trace::track_event::Type;
use shmtrace_abi::track_event::{
    Clock, ClockValue, CounterTrack, SequenceConfig, Track, TrackEventWriter, WriterCell,
};
use shmtrace_abi::writer::InPlaceWriter;
use shmtrace_abi::{instant, slice_begin};

use crate::clocks::{self, SysTickClock};
use crate::events::{Moved, Tracer, CATEGORY, TICK, WORK};
use crate::out::{self, Out};
use crate::shm::{self, Arbiter, Transport};

/// The main loop's writer id (its packet sequence).
pub const MAIN_WRITER_ID: u16 = 1;
/// The interrupt's writer id.
pub const IRQ_WRITER_ID: u16 = 2;
/// The sequence-scoped clock id of the RTOS-style tick clock the main
/// sequence's clock snapshots relate the event clock to.
pub const TICK_CLOCK_ID: u32 = 66;
/// The flow every [`Tracer::step`] event belongs to.
pub const STEP_FLOW: u64 = 0x5354_4550;

/// The main loop's track (its sequence's default track).
pub static MAIN_TRACK: Track = Track::new("firmware");
/// An integer counter.
pub static LEVEL: CounterTrack = CounterTrack::new("level")
    .with_parent(&MAIN_TRACK)
    .with_unit_name("mC");
/// A floating-point counter.
pub static VOLTAGE: CounterTrack = CounterTrack::new("supply")
    .with_parent(&MAIN_TRACK)
    .with_unit_name("V");
/// The track of the [`Tracer::step`] events.
pub static MOTOR: Track = Track::new("motor").with_parent(&MAIN_TRACK);
/// The interrupt's track.
pub static IRQ_TRACK: Track = Track::new("SysTick");
/// The interrupt's counter: SysTick reloads.
pub static RELOADS: CounterTrack = CounterTrack::new("reloads")
    .with_parent(&IRQ_TRACK)
    .with_unit(Unit::Count);

/// The main loop's writer: `N` interned strings, `T` described tracks,
/// `S` call sites cached.
pub type MainWriter<const N: usize, const T: usize, const S: usize> =
    TrackEventWriter<'static, Arbiter, SysTickClock, N, T, S>;
/// The interrupt's writer: the demo's main writer type (writers of one type
/// share their code; smaller tables would save RAM and cost a second copy
/// of the writer's code).
pub type IrqWriter = MainWriter<16, 4, 8>;

/// The interrupt's writer, set up by [`ShmTracer::new`].
pub static IRQ_WRITER: WriterCell<IrqWriter> = WriterCell::new();
/// Instants the interrupt's writer wrote.
static IRQ_INSTANTS: AtomicU32 = AtomicU32::new(0);
/// Counter samples the interrupt's writer wrote.
static IRQ_COUNTERS: AtomicU32 = AtomicU32::new(0);
/// Events the interrupt's writer did not write.
static IRQ_LOST: AtomicU32 = AtomicU32::new(0);

/// The `SysTick` handler's tracing, after [`clocks::count_reload`]
/// returned `reloads`: an instant and a sample of the reload count, through
/// the interrupt's own writer. Nothing happens before the writer is set up
/// or after [`Tracer::stop`] took it out.
pub fn on_systick(reloads: u32) {
    IRQ_WRITER.try_with(|w| {
        let count = |ok: bool, n: &AtomicU32| {
            let counter = if ok { n } else { &IRQ_LOST };
            counter.store(counter.load(Relaxed) + 1, Relaxed);
        };
        count(instant!(w, "irq", "systick"), &IRQ_INSTANTS);
        count(w.counter(&RELOADS, i64::from(reloads)), &IRQ_COUNTERS);
    });
}

/// A [`Tracer`] writing track events into the region of [`crate::shm`].
/// Unless `FULL`, it writes only slices, instants and integer counters (the
/// other calls do nothing), from the main loop only, and leaves its chunks
/// in the region for a host, so that nothing else is linked.
// `repr(C)`, the writer first: the tracer's address is the writer's (the
// event calls pass it as it is), and its hot fields stay within reach of
// the short loads and stores; the compiler put the drain's reader first.
#[repr(C)]
pub struct ShmTracer<const N: usize, const T: usize, const S: usize, const FULL: bool> {
    writer: MainWriter<N, T, S>,
    snapshots: u32,
    transport: Option<Transport>,
}

impl<const N: usize, const T: usize, const S: usize, const FULL: bool> ShmTracer<N, T, S, FULL> {
    /// Takes the region in `storage` and sets up the main loop's writer;
    /// if `FULL`, the interrupt's writer too (in [`IRQ_WRITER`]) and the
    /// drain.
    pub fn new<const SMB: usize, const SLOTS: usize>(
        storage: &'static RegionStorage<SMB, SLOTS>,
    ) -> Self {
        let (handles, transport) = shm::init(storage, FULL);
        let Ok(out) =
            InPlaceWriter::new(shm::arbiter(&handles), MAIN_WRITER_ID, shm::TARGET_BUFFER)
        else {
            out::fail("writer refused")
        };
        let writer = TrackEventWriter::new(out, SysTickClock, SequenceConfig::new(&MAIN_TRACK));
        if FULL {
            let irq = shm::arbiter(&handles);
            let Ok(out) = InPlaceWriter::new(irq, IRQ_WRITER_ID, shm::TARGET_BUFFER) else {
                out::fail("writer refused")
            };
            let w = TrackEventWriter::new(out, SysTickClock, SequenceConfig::new(&IRQ_TRACK));
            if IRQ_WRITER.set(w).is_err() {
                out::fail("interrupt writer set twice")
            }
        }
        Self {
            writer,
            transport,
            snapshots: 0,
        }
    }
}

// Event outcomes are ignored: the writer counts every loss in its stats,
// which `dropped` reports.
impl<const N: usize, const T: usize, const S: usize, const FULL: bool> Tracer
    for ShmTracer<N, T, S, FULL>
{
    #[inline(always)]
    fn now(&mut self) -> u64 {
        SysTickClock.now_ns()
    }

    #[inline(always)]
    fn slice_begin(&mut self) {
        let _ = slice_begin!(self.writer, CATEGORY, WORK);
    }

    #[inline(always)]
    fn slice_end(&mut self) {
        let _ = self.writer.slice_end();
    }

    #[inline(always)]
    fn instant(&mut self) {
        let _ = instant!(self.writer, CATEGORY, TICK);
    }

    #[inline(always)]
    fn counter(&mut self, value: i64) {
        let _ = self.writer.counter(&LEVEL, value);
    }

    #[inline(always)]
    fn counter_f64(&mut self, value: f64) {
        if !FULL {
            return;
        }
        let _ = self.writer.counter_f64(&VOLTAGE, value);
    }

    #[inline(always)]
    fn step(&mut self, value: u32) {
        if !FULL {
            return;
        }
        let _ = self
            .writer
            .event(Type::Instant, CATEGORY, "step")
            .on(&MOTOR)
            .arg("rep", value)
            .flow(STEP_FLOW)
            .emit();
    }

    #[inline(always)]
    fn clock_snapshot(&mut self) {
        if !FULL {
            return;
        }
        let tick_clock = ClockValue::absolute(TICK_CLOCK_ID, clocks::tick_clock_ns());
        if self.writer.clock_snapshot(tick_clock) {
            self.snapshots += 1;
        }
    }

    fn clear(&mut self) {
        self.writer.clear_incremental_state();
    }

    fn flush(&mut self) {
        self.writer.flush();
    }

    fn drain(&mut self, f: &mut dyn FnMut(Moved<'_>)) {
        if let (true, Some(transport)) = (FULL, &mut self.transport) {
            transport.drain(f);
        }
    }

    fn stop(&mut self) {
        if !FULL {
            return;
        }
        // Taken with interrupts masked: the interrupt never finds the cell
        // busy (a miss it would count as a loss) while the writer is moved
        // out; after it, the interrupt finds the cell empty and writes
        // nothing. The writer commits its chunk when it is dropped.
        let irq = cortex_m::interrupt::free(|_| IRQ_WRITER.take());
        drop(irq);
    }

    fn dropped(&self) -> u64 {
        let events = self.writer.stats();
        let packets = self.writer.writer_stats();
        u64::from(events.events_dropped)
            + packets.packets_dropped()
            + packets.packets_incomplete
            + self.transport.as_ref().map_or(0, Transport::lost)
            + u64::from(IRQ_LOST.load(Relaxed))
            + u64::from(IRQ_WRITER.busy_misses())
    }

    fn report(&mut self, out: &mut Out) {
        let now = SysTickClock.now_ns();
        out.line(format_args!("clock_end {now}"));
        out.line(format_args!("snapshots {}", self.snapshots));
        out.line(format_args!(
            "irq instant={} counter={}",
            IRQ_INSTANTS.load(Relaxed),
            IRQ_COUNTERS.load(Relaxed)
        ));
        out.line(format_args!(
            "state writer={} in_place={} arbiter={} interning={N} tracks={T} sites={S}",
            size_of::<MainWriter<N, T, S>>(),
            size_of::<InPlaceWriter<'static, Arbiter>>(),
            size_of::<Arbiter>(),
        ));
    }
}
