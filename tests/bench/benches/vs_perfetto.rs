//! Our producer vs the real Perfetto C SDK, in the same process, against
//! the same tracing service, in the same session.
//!
//! ```text
//! SHMTRACE_BENCH_SERVICE=path/to/real-service cargo bench -p shmtrace-bench --bench vs_perfetto
//! ```
//!
//! The service is started from `$SHMTRACE_BENCH_SERVICE` with
//! `$SHMTRACE_BENCH_SERVICE_ARGS` (default: the harness's `real-service`
//! flags, `--producer-socket {producer} --consumer-socket {consumer}
//! --exit-on-stdin-eof`); without it, a service already listening on
//! `$PERFETTO_PRODUCER_SOCK_NAME` / `$PERFETTO_CONSUMER_SOCK_NAME` is used;
//! with neither, the benchmark says so and exits.
//!
//! Both producers (ours, and the C SDK with the system backend) connect to
//! that service; one session (started through the C SDK's consumer API)
//! enables the "on" categories of both. Rows: a disabled trace point, a
//! scoped slice with a static name (begin + end), the same slice with two
//! debug annotations, an int64 counter. The C SDK is measured twice: through
//! its C API directly (what a C program's `PERFETTO_TE` does: extras on the
//! stack, one call), and through the `perfetto-sdk` crate's macros (what a
//! Rust program gets; they add a mutex and allocations per event). Each cell
//! is the median of several rounds of CPU time; each implementation's loop
//! is monomorphic with the trace point inlined in it (no indirect call per
//! iteration), and the C API's trace point is `PERFETTO_TE`'s: the
//! category is a global holding its enabled flag's address, and the
//! emitting call is marked unlikely. The disabled row
//! runs sixteen distinct trace points per loop iteration, so it measures
//! them rather than the loop. Ratio columns: ours / C API and ours / crate.
//!
//! Both producers ask for a 32 MiB shared memory buffer, so neither drops
//! (the line after the table says whether ours did);
//! `$SHMTRACE_BENCH_SMB_KB` sets another size, e.g. upstream's default
//! 256 to time an overloaded producer.
// `unsafe` here: calls into the real Perfetto's C SDK.
#![allow(unsafe_code)]

#[macro_use]
mod common;

use std::cell::UnsafeCell;
use std::ffi::{c_char, CStr};
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use perfetto_sdk::track_event::{TrackEvent as CTrackEvent, TrackEventDebugArg, TrackEventTrack};
use perfetto_sdk_sys as sys;
use shmtrace_abi::proto::encode_to_slice;
use shmtrace_producer::{trace_counter, trace_event, trace_instant, Category, CounterTrack};

static RS_ON: Category = Category::new("bench.rs");
static RS_OFF: Category = Category::new("bench.rs.off");

perfetto_sdk::track_event_categories! {
    pub mod perfetto_te_ns {
        ("bench.crate", "C SDK via the perfetto-sdk crate", []),
        ("bench.crate.off", "disabled", []),
    }
}

/// Iterations per round of the disabled row; each iteration runs
/// [`DISABLED_PER_ITERATION`] disabled trace points.
const DISABLED_ITERATIONS: u64 = 200_000;
/// Distinct disabled trace points per iteration of the disabled row. A
/// disabled trace point costs less than the loop that would run it alone
/// (a counter, a compare, a branch); sixteen in a row, each its own call
/// site as in a program with trace points all through its code, measure
/// the trace points rather than the loop.
const DISABLED_PER_ITERATION: u64 = 16;
/// Shared memory buffer size both producers ask for, unless
/// `$SHMTRACE_BENCH_SMB_KB` says otherwise.
const SMB_KB: u32 = 32 * 1024;

/// A category registered through the C API directly, kept like the C API's
/// `struct PerfettoTeCategory`: a global holding the addresses of the
/// category's implementation and of its enabled flag, as plain (not
/// atomic) pointers. A trace point reads the flag's address from the
/// global, then the flag (relaxed), as `PERFETTO_TE` does with a category
/// defined at file scope; the compiler may reuse the address between trace
/// points as a C compiler may.
struct CCategory {
    impl_: UnsafeCell<*mut sys::PerfettoTeCategoryImpl>,
    enabled: UnsafeCell<*const AtomicBool>,
}

// SAFETY: the pointers are written once, by `register` on the main thread
// before any trace point, and only read after; the pointees are the C
// SDK's, which it lets any thread use.
unsafe impl Sync for CCategory {}

static C_ON: CCategory = CCategory::unregistered();
static C_OFF: CCategory = CCategory::unregistered();

impl CCategory {
    const fn unregistered() -> Self {
        CCategory {
            impl_: UnsafeCell::new(ptr::null_mut()),
            enabled: UnsafeCell::new(ptr::null()),
        }
    }

    /// Registers the category. `main` registers both C categories before
    /// its first trace point and before any other thread exists.
    fn register(&self, name: &'static CStr) {
        let desc = Box::leak(Box::new(sys::PerfettoTeCategoryDescriptor {
            name: name.as_ptr(),
            desc: c"direct C API".as_ptr(),
            tags: ptr::null_mut(),
            num_tags: 0,
        }));
        // SAFETY: `desc` is a valid descriptor with NUL-terminated strings
        // and no tags, leaked so it outlives the category.
        let impl_ = unsafe { sys::PerfettoTeCategoryImplCreate(desc) };
        // SAFETY: `impl_` was just created; the enabled flag it returns
        // lives as long as the category (forever here) and is a C11
        // atomic_bool, layout-compatible with `AtomicBool`.
        let enabled = unsafe { sys::PerfettoTeCategoryImplGetEnabled(impl_) } as *const AtomicBool;
        assert!(!impl_.is_null() && !enabled.is_null());
        // SAFETY: no other reference to the cells exists: registration
        // runs on the main thread before any trace point reads them (see
        // the `Sync` impl).
        unsafe {
            *self.impl_.get() = impl_;
            *self.enabled.get() = enabled;
        }
    }

    #[inline(always)]
    fn is_enabled(&self) -> bool {
        // SAFETY: written once by `register` before any trace point, so
        // this read races with no write; the flag it points to lives
        // forever (see `register`).
        unsafe { (**self.enabled.get()).load(Ordering::Relaxed) }
    }

    /// `PERFETTO_TE(cat, type, extras...)`: the enabled check inline, the
    /// emitting call out of the way (`PERFETTO_UNLIKELY`).
    #[inline(always)]
    fn emit(
        &self,
        kind: sys::PerfettoTeType,
        name: *const c_char,
        extras: &[*mut sys::PerfettoTeHlExtra],
    ) {
        if self.is_enabled() {
            self.emit_enabled(kind, name, extras);
        }
    }

    /// The emitting call: extras on the stack, one call into the C SDK.
    #[cold]
    #[inline(never)]
    fn emit_enabled(
        &self,
        kind: sys::PerfettoTeType,
        name: *const c_char,
        extras: &[*mut sys::PerfettoTeHlExtra],
    ) {
        let mut list = [ptr::null_mut(); 4];
        list[..extras.len()].copy_from_slice(extras);
        // SAFETY: a registered category, a valid type, a NUL-terminated
        // static name (or null), and a null-terminated extras array
        // whose entries point at live extras on the caller's stack.
        unsafe { sys::PerfettoTeHlEmitImpl(*self.impl_.get(), kind as i32, name, list.as_ptr()) };
    }
}

/// `$e; $e; $e; $e;`
macro_rules! four_times {
    ($e:expr) => {{
        $e;
        $e;
        $e;
        $e;
    }};
}

/// A [`Sampler`] for the disabled row: [`DISABLED_PER_ITERATION`] (16)
/// copies of `$point` per iteration, returning CPU ns per trace point.
/// Each copy is its own trace point (the compiler does not merge atomic
/// loads).
macro_rules! disabled_sampler {
    ($point:expr) => {
        Box::new(|| {
            let start = common::cpu_ns();
            for _ in 0..DISABLED_ITERATIONS {
                four_times!(four_times!($point));
            }
            (common::cpu_ns() - start) as f64
                / (DISABLED_ITERATIONS * DISABLED_PER_ITERATION) as f64
        }) as common::Sampler<'_>
    };
}

fn main() {
    if common::test_mode() {
        return;
    }
    let Some(_service) = common::start_service("vs_perfetto") else {
        return;
    };

    let smb_kb = std::env::var("SHMTRACE_BENCH_SMB_KB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(SMB_KB);
    // The C SDK, system backend.
    common::init_c_sdk(smb_kb);
    CTrackEvent::init();
    perfetto_te_ns::register().expect("categories register");
    C_ON.register(c"bench.c");
    C_OFF.register(c"bench.c.off");
    CTrackEvent::publish_categories();

    // Ours.
    common::start_producer(
        "vs_perfetto",
        smb_kb,
        &[&RS_ON, &RS_OFF],
        Duration::from_secs(10),
    );

    let session = common::start_session(&["bench.rs", "bench.crate", "bench.c"]);
    common::wait_until("the session did not enable every producer", || {
        RS_ON.is_enabled()
            && C_ON.is_enabled()
            && perfetto_sdk::track_event_category_enabled!("bench.crate")
    });
    assert!(!RS_OFF.is_enabled() && !C_OFF.is_enabled());

    let counter = CounterTrack::new("bench.counter");
    let crate_counter = TrackEventTrack::register_counter_track(
        "bench.counter.crate",
        TrackEventTrack::process_track_uuid(),
    )
    .expect("counter track");
    // A registered counter track for the C API (its cheapest form: the
    // descriptor is serialized once).
    // SAFETY: set by `PerfettoTeInit`, read-only after.
    let process_uuid = unsafe { sys::perfetto_te_process_track_uuid };
    let c_counter_uuid = process_uuid ^ 0x5EED_C0DE;
    let mut c_counter_desc = vec![0u8; 64];
    let n = encode_to_slice(&mut c_counter_desc, |d| {
        d.uint64(1, c_counter_uuid);
        d.uint64(5, process_uuid);
        d.string(2, "bench.counter.c");
        d.nested(8, |_| {});
    })
    .expect("descriptor encodes");
    c_counter_desc.truncate(n);
    let c_counter = sys::PerfettoTeRegisteredTrackImpl {
        descriptor: c_counter_desc.as_mut_ptr().cast(),
        descriptor_size: c_counter_desc.len(),
        uuid: c_counter_uuid,
    };

    let slice_begin = sys::PerfettoTeType_PERFETTO_TE_TYPE_SLICE_BEGIN;
    let slice_end = sys::PerfettoTeType_PERFETTO_TE_TYPE_SLICE_END;
    let instant = sys::PerfettoTeType_PERFETTO_TE_TYPE_INSTANT;
    let counter_type = sys::PerfettoTeType_PERFETTO_TE_TYPE_COUNTER;
    let name = c"slice".as_ptr();
    let sink = AtomicBool::new(false);

    let rows: [(&str, [f64; 3]); 4] = [
        (
            "disabled trace point",
            common::measure([
                disabled_sampler!(trace_instant!(RS_OFF, "slice")),
                disabled_sampler!(C_OFF.emit(instant, name, &[])),
                disabled_sampler!(perfetto_sdk::track_event_instant!(
                    "bench.crate.off",
                    "slice"
                )),
            ]),
        ),
        (
            "scoped slice, static name",
            common::measure([
                sampler!(|_i| {
                    let _g = trace_event!(RS_ON, "slice");
                    sink.store(true, Ordering::Relaxed);
                }),
                sampler!(|_i| {
                    C_ON.emit(slice_begin, name, &[]);
                    sink.store(true, Ordering::Relaxed);
                    C_ON.emit(slice_end, ptr::null(), &[]);
                }),
                sampler!(|_i| {
                    perfetto_sdk::scoped_track_event!("bench.crate", "slice");
                    sink.store(true, Ordering::Relaxed);
                }),
            ]),
        ),
        (
            "slice with 2 debug annotations",
            common::measure([
                sampler!(|i| {
                    let _g = trace_event!(RS_ON, "slice", "count" => i, "label" => "value");
                    sink.store(true, Ordering::Relaxed);
                }),
                sampler!(|i| {
                    let mut a = sys::PerfettoTeHlExtraDebugArgUint64 {
                        header: sys::PerfettoTeHlExtra {
                            type_: sys::PerfettoTeHlExtraType_PERFETTO_TE_HL_EXTRA_TYPE_DEBUG_ARG_UINT64,
                        },
                        name: c"count".as_ptr(),
                        value: i,
                    };
                    let mut b = sys::PerfettoTeHlExtraDebugArgString {
                        header: sys::PerfettoTeHlExtra {
                            type_: sys::PerfettoTeHlExtraType_PERFETTO_TE_HL_EXTRA_TYPE_DEBUG_ARG_STRING,
                        },
                        name: c"label".as_ptr(),
                        value: c"value".as_ptr(),
                    };
                    C_ON.emit(slice_begin, name, &[&mut a.header, &mut b.header]);
                    sink.store(true, Ordering::Relaxed);
                    C_ON.emit(slice_end, ptr::null(), &[]);
                }),
                sampler!(|i| {
                    perfetto_sdk::scoped_track_event!(
                        "bench.crate",
                        "slice",
                        |ctx: &mut perfetto_sdk::track_event::EventContext| {
                            ctx.add_debug_arg("count", TrackEventDebugArg::Uint64(i))
                                .add_debug_arg("label", TrackEventDebugArg::String("value"));
                        }
                    );
                    sink.store(true, Ordering::Relaxed);
                }),
            ]),
        ),
        (
            "int64 counter",
            common::measure([
                sampler!(|i| trace_counter!(RS_ON, &counter, i as i64)),
                sampler!(|i| {
                    let mut track = sys::PerfettoTeHlExtraRegisteredTrack {
                        header: sys::PerfettoTeHlExtra {
                            type_: sys::PerfettoTeHlExtraType_PERFETTO_TE_HL_EXTRA_TYPE_REGISTERED_TRACK,
                        },
                        track: &c_counter,
                    };
                    let mut value = sys::PerfettoTeHlExtraCounterInt64 {
                        header: sys::PerfettoTeHlExtra {
                            type_:
                                sys::PerfettoTeHlExtraType_PERFETTO_TE_HL_EXTRA_TYPE_COUNTER_INT64,
                        },
                        value: i as i64,
                    };
                    C_ON.emit(
                        counter_type,
                        ptr::null(),
                        &[&mut track.header, &mut value.header],
                    );
                }),
                sampler!(|i| {
                    perfetto_sdk::track_event_counter!(
                        "bench.crate",
                        |ctx: &mut perfetto_sdk::track_event::EventContext| {
                            ctx.set_track(&crate_counter).set_counter(
                                perfetto_sdk::track_event::TrackEventCounter::Int64(i as i64),
                            );
                        }
                    );
                }),
            ]),
        ),
    ];
    common::stop_session(session);
    let stats = shmtrace_producer::stats();

    println!();
    println!(
        "{:<32} {:>10} {:>16} {:>18} {:>11} {:>13}",
        "ns per operation (median)",
        "shmtrace",
        "Perfetto C API",
        "perfetto-sdk crate",
        "ours/C API",
        "ours/crate"
    );
    for (label, [ours, c_api, krate]) in rows {
        println!(
            "{label:<32} {ours:>10.2} {c_api:>16.2} {krate:>18.2} {:>11.3} {:>13.3}",
            ours / c_api,
            ours / krate
        );
    }
    println!(
        "\nA disabled trace point: ours is one relaxed load of the category's enabled flag and a \
         not-taken branch; the C API's PERFETTO_TE also reads the flag's address from the \
         category (reused across a row of trace points, as a C compiler may), so that row's \
         ratio is near 1 by construction; the crate's macros index a category table first. The \
         enabled rows are where the implementations differ."
    );
    println!(
        "\n{} iterations x {} rounds per cell ({DISABLED_ITERATIONS} x \
         {DISABLED_PER_ITERATION} trace points for the disabled row), shared memory buffer \
         {smb_kb} KiB",
        common::ITERATIONS,
        common::ROUNDS
    );
    println!(
        "our producer: {} packets dropped (SMB full), {} chunks committed, {} failed chunk acquisitions, \
         {} chunks reclaimed from idle writers",
        stats.packets_dropped, stats.chunks_committed, stats.acquire_failures, stats.chunks_reclaimed
    );
}
