//! # shmtrace-abi
//!
//! A `#![no_std]`, allocation-free implementation of Perfetto's shared-memory
//! buffer (SMB) ABI, version 1: the bytes a producer and the tracing service
//! exchange through shared memory.
//!
//! Module plan (each module states its own invariants):
//!
//! * [`layout`]: constants, page sizes, page layouts and the checked byte
//!   views of the page header and chunk header (smoltcp `wire/` style).
//! * [`state`]: the 2-bit chunk state machine as pure `const fn`s over the
//!   page header bitmap.
//! * [`sync`]: the atomic-word shim (`core` atomics normally, loom under
//!   `--cfg loom`) and the small traits the state-machine operations are
//!   generic over.
//! * [`smb`]: the view over shared memory the crate does not own. All
//!   pointer work lives in its private `raw` submodule; `smb` itself has a
//!   handful of `unsafe` calls into it, each carrying the state-machine
//!   ownership argument. The rest of the crate is `unsafe`-free
//!   (`#![deny(unsafe_code)]`, allowed item by item).
//! * [`proto`]: the zero-alloc protobuf encoder and the small-message
//!   [`Cursor`](proto::Cursor).
//! * [`trace`]: the trace vocabulary (field numbers and enums of
//!   TracePacket, TrackEvent and friends).
//! * [`writer`]: the producer-side `TraceWriter` (fragmentation, patches,
//!   drop mode) and the lean `InPlaceWriter` (small whole packets).
//! * [`track_event`]: track events for `no_std` programs (firmware):
//!   typed writers, per-sequence interning, the clock hook, writer cells.
//! * [`reader`]: the service-side parser of a copied (untrusted) chunk and
//!   patch application.
//! * [`region`]: region ABI v1, a firmware's SMB and commit ring in shared
//!   RAM (layout, lock-free commit ring, firmware storage and arbiter,
//!   hostile-input reader).
//! * [`frame`]: frame format v1, the byte-stream transport of firmware
//!   chunks and patches (encoder, hostile incremental decoder).
//! * [`link`]: the firmware's side of both transports, polled from its
//!   main loop: the shared-RAM control words, and the stream-mode drain
//!   into frames with the host's commands read back.
//!
//! ## Features
//!
//! * `portable-atomic`: single-core targets without compare-and-swap (see
//!   the shared memory rules and the Cortex-M0 section below).
//! * `crc-bitwise`: the frame CRC ([`frame`], [`link::StreamService`])
//!   computed bit by bit, without a table. By default a target without an
//!   OS (a firmware) looks it up in a 1 KiB table in flash: 7 instructions
//!   per byte sent on a Cortex-M4, 10 on a Cortex-M0; bit by bit takes 64
//!   and 81, and the example firmwares' flash shrinks by 876 to 1056 bytes.
//!   A slice begin is about 14 bytes in its chunk: its CRC costs about 100
//!   instructions with the table, 900 without, and writing it 135
//!   (Cortex-M4; `abi/firmware/report.py` measures all of these). Hosts
//!   use a 16 KiB table unless the feature is on. The frames are the same
//!   either way.
//!
//! ## Shared memory rules
//!
//! * Words shared with the peer (page header bitmap, chunk header fields) are
//!   native lock-free atomics overlaid on the memory
//!   ([`sync::AtomicLeU32`]), stored little-endian on every target, so a
//!   big-endian core (a Cortex-R in BE-8 mode, a PowerPC) writes the bytes
//!   a little-endian host reads; on little-endian targets that costs
//!   nothing. By
//!   default the crate refuses to build on targets without native 16- and
//!   32-bit compare-and-swap, because emulated atomics (critical sections)
//!   are not atomic with respect to another process, core or debug probe.
//! * The `portable-atomic` feature is for single-core targets without those
//!   instructions (Cortex-M0/M0+, RV32 without the A extension) where every
//!   party touching the SMB runs on that core, such as firmware that writes
//!   chunks and drains them itself through a [`region::RegionReader`]. The
//!   shared words then come from `portable-atomic` (and `heapless`'s queues
//!   use it too); the firmware build picks its fallback, see below. On
//!   targets with native atomics the feature changes nothing:
//!   `portable-atomic` runs the same instructions.
//!
//! ## Cortex-M0/M0+ (`thumbv6m-none-eabi`) and other chips without CAS
//!
//! * Enable the `portable-atomic` feature and pick one fallback for
//!   `portable-atomic`'s read-modify-writes (without one the build fails in
//!   `heapless` with "`compare_exchange_weak` requires atomic CAS but not
//!   available on this target by default"):
//!   * the cfg `portable_atomic_unsafe_assume_single_core` (interrupts
//!     masked around each one). Put it in `.cargo/config.toml` next to the
//!     linker script flag, `rustflags = ["-C", "link-arg=-Tlink.x", "--cfg",
//!     "portable_atomic_unsafe_assume_single_core"]`: a `RUSTFLAGS`
//!     variable replaces the config's `rustflags` instead of adding to them,
//!     and cortex-m-rt's `-Tlink.x` is lost with them;
//!   * or a dependency `portable-atomic = { version = "1", features =
//!     ["critical-section"] }` and a `critical-section` implementation
//!     (cortex-m's `critical-section-single-core` feature): about 1.4 KiB
//!     more `.text` on a Cortex-M0.
//! * Every party touching the SMB runs on that core: take the region in
//!   stream mode and send it over a byte stream ([`link::StreamService`]:
//!   `shmtrace bridge`, or a capture `shmtrace import --frames` reads),
//!   or leave it to a RAM dump taken while the core is halted
//!   (`shmtrace import --region-dump`). A host reading the RAM while the
//!   firmware runs (`shmtrace serve --attach`, `bridge --input region:`)
//!   takes chunks with a compare-and-swap that the firmware's masked
//!   read-modify-writes are not atomic with.
//! * RAM: a region with one 4 KiB page and 16 ring slots is 4864 bytes, a
//!   [`link::StreamService`]'s chunk buffer a page less 8 bytes (keep it
//!   in a `static`, e.g. `cortex_m::singleton!`, and hand the service a
//!   `&mut [u8]`: an array passed by value is copied on the way, and
//!   `main`'s frame then holds several copies), a track event writer with
//!   its chunk writer and arbiter about 370 bytes with the default tables.
//!   A 16 KiB part fits all of it with room for the stack.
//!   `abi/firmware/m0` is a whole Cortex-M0 firmware (QEMU `microbit`).
//! * Payload bytes are copied in and out with `ptr::copy_nonoverlapping`;
//!   no Rust reference ever covers memory the peer can change, and anything
//!   read from it is validated from a private copy.
//! * Nothing a peer writes can make this crate panic.
//!
//! ## Cortex-M23 (`thumbv8m.base-none-eabi`)
//!
//! ARMv8-M Baseline has compare-and-swap, so no feature is needed, but
//! like ARMv6-M it has no 32x32->64-bit multiply: the build script sees
//! the target's name and the tick clock multiplies in 16-bit halves there
//! rather than calling the compiler's 64-bit routine. (A custom target
//! file for such a core keeps the library routine: correct, slower.)
//!
//! ## Testing
//!
//! `cargo test -p shmtrace-abi` (unit, property and real-thread stress tests);
//! `RUSTFLAGS="--cfg loom" cargo test -p shmtrace-abi --release --test 'loom_*'`
//! (loom models of the chunk protocol and the commit ring); `cargo +nightly miri test -p
//! shmtrace-abi` (undefined-behaviour and data-race checks of the pointer
//! code).
#![no_std]
#![deny(missing_docs)]
#![deny(unsafe_code)]
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

#[cfg(any(test, loom))]
extern crate std;

#[cfg(not(any(
    feature = "portable-atomic",
    all(target_has_atomic = "32", target_has_atomic = "16")
)))]
compile_error!(
    "shmtrace-abi needs native lock-free 16- and 32-bit atomics with compare-and-swap: \
     SMB words are shared with another process, core or probe, for which emulated \
     atomics are not atomic (on a single-core target where every party touching the \
     SMB runs on that core, enable the `portable-atomic` feature)"
);

pub mod frame;
pub mod layout;
pub mod link;
pub mod proto;
pub mod reader;
pub mod region;
pub mod smb;
pub mod state;
pub mod sync;
pub mod trace;
pub mod track_event;
pub mod writer;
