#!/usr/bin/env python3
"""Size and instructions-per-event report of the firmware example.

Builds the five binaries of this package (release profile: opt-level "s",
fat LTO, panic=abort), runs them under QEMU (mps2-an386, Cortex-M4) and
prints a benchmark table:

* the issue's goals as measured: the .text a producer adds over the
  skeleton, the smallest (`instants`: one writer, instants only) and
  `minimal` (one writer, slices, instants, a counter, smallest tables), the
  harness's own reporting left out and shown; the .text of the shmtrace
  writer, arbiter and slice/instant/counter path in `minimal`,
  instructions per event, instructions in mem* functions, the RAM a writer
  keeps;
* .text / .rodata / .bss of the skeleton (same runtime, clock, loop and
  output, no shmtrace), `minimal` and `demo`, what each adds, by crate, with
  the share of shmtrace_abi and of compiler_builtins' mem* functions;
* where the SMB lies and the alignment gap before it;
* the exact number of instructions each event kind costs: QEMU runs
  `minimal` and `demo` with `-icount shift=0 -singlestep -d exec,nochain,int`,
  which logs one `Trace` line per executed instruction and every exception
  entry and return; the report counts the instructions from the entry of
  `markers::begin` to the entry of `markers::end` around every call, leaving
  out those of the SysTick interrupt (counted separately) and the second
  line QEMU logs for an I/O instruction it re-executes. "first" is the
  sequence's first call of a kind (it writes the reset packet, the track
  descriptor, the interned strings), "after clear" the first after the
  sequence restarted; min/median/max are over the other calls. The counts
  are cross-checked with the SysTick ticks (40 instructions each) the
  firmware summed around the same calls in a normal run.

* the stream link's cost: the `frames` binary (src/frames.rs) encodes
  CHUNK frames (12-byte header, chunk, CRC-32 of both) of three chunk
  lengths between the markers, on the Cortex-M4 and, built from m0/ as
  `m0-frames` (thumbv6m-none-eabi), on QEMU's `microbit` (Cortex-M0), each
  with shmtrace-abi's CRC as it ships (a 1 KiB table) and with its
  `crc-bitwise` feature (no table): exact instructions per frame, per frame
  byte, per slice begin streamed, against writing one, and the flash the
  table takes. Every frame's CRC is recomputed here.

It also checks every run: each binary exits with status 0, and the chunks
`instants`, `minimal`, `demo` and `demo-bss` drained from their SMB decode (chunk
headers, fragments, patches, then the TracePackets of each writer's
sequence: reset packets, interned strings, track descriptors, delta
timestamps on clock 64) to exactly the events the firmware says it wrote;
the demo's SMB lies in PSRAM backed by a host file, where its last chunk's
payload must be visible.

This is a benchmark printout, not a test: it fails (exit status 1) only if
the firmware does not build or run, or the counts do not match.

Needs: cargo with the thumbv7em-none-eabihf and thumbv6m-none-eabi targets, qemu-system-arm (7.2)
and binutils-arm-none-eabi (Debian package names). Python 3 stdlib only.
"""

import argparse
import bisect
import os
import re
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

HERE = Path(__file__).resolve().parent
TARGET = "thumbv7em-none-eabihf"
# cargo runs in HERE, so a relative CARGO_TARGET_DIR is relative to it.
ELF_DIR = HERE / os.environ.get("CARGO_TARGET_DIR", "target") / TARGET / "release"
TOOLS = ("cargo", "qemu-system-arm", "arm-none-eabi-nm", "arm-none-eabi-size", "arm-none-eabi-objdump")
BINARIES = ("skeleton", "instants", "minimal", "demo", "demo-bss")
# The binaries leaving their region to a host, which reads it from the PSRAM file.
HOST_READ = ("instants", "minimal")

QEMU = [
    "qemu-system-arm", "-M", "mps2-an386", "-cpu", "cortex-m4",
    "-display", "none", "-monitor", "none", "-serial", "none",
    "-semihosting-config", "enable=on,target=native",
    # One instruction per virtual nanosecond: SysTick (and so the firmware's
    # clock and interrupts) advance with the instructions, not the host.
    "-icount", "shift=0",
]
QEMU_TIMEOUT = 120
# The stream link's cost (src/frames.rs): `frames` on the Cortex-M4 above,
# m0/'s `m0-frames` (thumbv6m, its own workspace and target dir) on QEMU's
# nRF51 `microbit` (Cortex-M0), built as shmtrace-abi ships and with each
# feature in CRC_VARIANTS (a copy named `NAME-FEATURE` beside the ELF: the
# plain build overwrites the ELF).
M0_DIR = HERE / "m0"
M0_TARGET = "thumbv6m-none-eabi"
M0_ELF_DIR = M0_DIR / os.environ.get("CARGO_TARGET_DIR", "target") / M0_TARGET / "release"
QEMU_M0 = [
    "qemu-system-arm", "-M", "microbit", "-display", "none", "-monitor", "none", "-serial", "none",
    "-semihosting-config", "enable=on,target=native", "-icount", "shift=0",
]
BITWISE = "crc-bitwise"
# The CRC variants measured: as shmtrace-abi ships, and with the feature.
CRC_VARIANTS = (("1 KiB table (default)", None), (f"bitwise ({BITWISE})", BITWISE))
# (core, machine, package, ELF directory, binary).
FRAME_BENCHES = (("Cortex-M4", QEMU, HERE, ELF_DIR, "frames"), ("Cortex-M0", QEMU_M0, M0_DIR, M0_ELF_DIR, "m0-frames"))
# src/frames.rs: the chunk bytes' seed; the frame header (shmtrace_abi::frame).
FRAME_SEED = 0x5EED_F00D
FRAME_MAGIC, FRAME_CHUNK, FRAME_CRC = b"\xd5\x7a", 2, 4
# mps2-an386's PSRAM (the machine's main RAM, memory.x region PSRAM).
PSRAM_BASE = 0x2100_0000
PSRAM_SIZE = 16 << 20
# QEMU's mps2 boards clock SysTick's "core" source at SYSCLK = 25 MHz
# (hw/arm/mps2.c); -icount shift=0 executes one instruction per virtual
# nanosecond, so one tick is 40 instructions.
INSNS_PER_TICK = 1_000_000_000 // 25_000_000

# The goals.
GOAL_TEXT = 4096
GOAL_SLICE_BEGIN = 150
GOAL_RAM = 256

SECTIONS = (".text", ".rodata", ".data", ".bss", ".shmtrace")
# What the firmware writes (src/tracer.rs, src/events.rs).
MAIN_WRITER, IRQ_WRITER = 1, 2
FIRMWARE_CLOCK = 65
TICK_CLOCK = 66
PERIOD_NS = 20_000
STEP_FLOW = 0x5354_4550
# Chunk header `packets` flags (Perfetto SMB ABI v1).
FIRST_CONTINUES = 0x1
LAST_CONTINUES = 0x2
DROPPED_FRAGMENT = 0x0FFF_FFFF
# TracePacket fields.
P_CLOCK_SNAPSHOT, P_TIMESTAMP, P_TRACK_EVENT, P_INTERNED_DATA, P_SEQUENCE_FLAGS = 6, 8, 11, 12, 13
P_PREVIOUS_PACKET_DROPPED, P_TIMESTAMP_CLOCK_ID, P_DEFAULTS, P_TRACK_DESCRIPTOR = 42, 58, 59, 60
P_FIRST_PACKET_ON_SEQUENCE = 87
SEQ_CLEARED, SEQ_NEEDS_STATE = 1, 2
# TrackEvent fields.
E_CATEGORY_IIDS, E_DEBUG_ANNOTATIONS, E_TYPE, E_NAME_IID, E_TRACK_UUID = 3, 4, 9, 10, 11
E_COUNTER_VALUE, E_DOUBLE_COUNTER_VALUE, E_FLOW_IDS = 30, 44, 47
EVENT_TYPES = {1: "slice_begin", 2: "slice_end", 3: "instant", 4: "counter"}
# InternedData fields, by the TrackEvent field that refers to them.
INTERNED_KINDS = {1: "category", 2: "event name", 3: "annotation name"}

MEM_FN = re.compile(r"^(compiler_builtins::mem::.*|__aeabi_mem\w*|mem(cpy|move|set|cmp))$")


class ReportError(Exception):
    """The firmware did not build or run, or its counts do not match."""


def run(cmd, **kw):
    try:
        return subprocess.run(cmd, check=True, text=True, capture_output=True, **kw).stdout
    except subprocess.CalledProcessError as e:
        raise ReportError(f"{' '.join(map(str, cmd))} failed ({e.returncode}):\n{e.stdout}{e.stderr}") from None


# ------------------------------------------------------------------ ELF facts


def section_table(elf):
    """name -> (address, size) of the allocated sections."""
    out = {}
    for line in run(["arm-none-eabi-size", "-A", "-d", elf]).splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0].startswith(".") and parts[1].isdigit():
            out[parts[0]] = (int(parts[2]), int(parts[1]))
    return out


def section_alignment(elf, name):
    for line in run(["arm-none-eabi-objdump", "-h", elf]).splitlines():
        parts = line.split()
        if len(parts) == 7 and parts[1] == name and parts[6].startswith("2**"):
            return 1 << int(parts[6][3:])
    raise ReportError(f"{elf}: no section {name}")


def symbols(elf):
    """(address, size, type, demangled name) of every sized symbol."""
    out = []
    for line in run(["arm-none-eabi-nm", "--size-sort", "-S", "-C", elf]).splitlines():
        parts = line.split(None, 3)
        if len(parts) == 4:
            out.append((int(parts[0], 16), int(parts[1], 16), parts[2], parts[3]))
    return out


def crate_of(name):
    """The crate a (demangled) symbol belongs to, for the size breakdown."""
    if MEM_FN.match(name):
        return "compiler_builtins mem*"
    if name.startswith("<"):
        # `<Type as Trait>::f`: the type's crate, or the trait's for
        # primitive and reference types.
        inner = name[1:]
        ty, _, rest = inner.partition(" as ")
        path = ty.lstrip("&*").replace("mut ", "").replace("const ", "")
        name = path if "::" in path else rest
    if "::" in name:
        crate = name.split("::", 1)[0].lstrip("<&*")
        if crate == "__rustc":
            return "panic handler"
        return crate if crate not in ("skeleton", "instants", "minimal", "demo", "demo_bss") else "the binary"
    if name.startswith("__") and ("div" in name or "mod" in name or "aeabi" in name):
        return "compiler_builtins"
    if name in ("Reset", "DefaultHandler_", "DefaultPreInit", "HardFault_", "main", "SysTick"):
        return "cortex_m_rt"
    return "(other)"


def text_by_crate(syms):
    groups = {}
    for _addr, size, kind, name in syms:
        if kind in "tTwW":
            groups[crate_of(name)] = groups.get(crate_of(name), 0) + size
    return groups


def find_symbol(syms, suffix):
    found = [s for s in syms if s[3] == suffix or s[3].endswith("::" + suffix)]
    if len(found) != 1:
        raise ReportError(f"expected one symbol named {suffix}, found {len(found)}")
    return found[0]


def smb_placement(elf):
    """(section, address, size, gap before it, section alignment) of `REGION`."""
    syms = symbols(elf)
    addr, size, _, _ = find_symbol(syms, "REGION")
    for name, (start, length) in section_table(elf).items():
        if start <= addr < start + length:
            break
    else:
        raise ReportError(f"{elf}: SMB at {addr:#x} is in no section")
    ends = [a + s for a, s, _, _ in syms if start <= a < addr and s > 0]
    gap = addr - max(ends, default=start)
    return name, addr, size, gap, section_alignment(elf, name)


# ------------------------------------------------------------------ running


def qemu(elf, *extra, machine=QEMU):
    cmd = machine + list(extra) + ["-kernel", str(elf)]
    try:
        proc = subprocess.run(cmd, text=True, capture_output=True, timeout=QEMU_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise ReportError(f"{elf.name}: QEMU did not exit within {QEMU_TIMEOUT} s") from None
    if proc.returncode != 0:
        raise ReportError(
            f"{elf.name}: QEMU exited with {proc.returncode} (semihosting exit status)\n"
            f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
        )
    return proc.stdout


def key_values(args):
    return {k: int(v) for k, v in (a.split("=") for a in args)}


class Output:
    """The firmware's semihosting lines (see src/lib.rs)."""

    def __init__(self, name, text):
        self.name = name
        self.kinds = None
        self.reps = self.clear_at = None
        self.chunks = []  # bytes of each drained chunk, in drain order
        self.patches = []  # (writer, chunk_id, offset, data, has_more)
        self.calls, self.clean, self.ticks, self.irq, self.state = {}, {}, {}, {}, {}
        self.clock_end = self.snapshots = self.dropped = None
        done = False
        for line in text.splitlines():
            word, _, rest = line.partition(" ")
            args = rest.split()
            if word == "kinds":
                self.kinds = args
            elif word in ("reps", "clear_at", "clock_end", "snapshots", "dropped"):
                setattr(self, word, int(args[0]))
            elif word == "chunk":
                length, hexed = int(args[0]), args[1] if len(args) > 1 else ""
                data = bytes.fromhex(hexed)
                if len(data) > length:
                    raise ReportError(f"{name}: chunk line longer than its length")
                self.chunks.append(data + bytes(length - len(data)))
            elif word == "patch":
                writer, chunk_id, offset = int(args[0]), int(args[1]), int(args[2])
                self.patches.append((writer, chunk_id, offset, bytes.fromhex(args[3]), args[4] == "1"))
            elif word in ("calls", "clean", "systick", "irq", "state"):
                target = {"calls": self.calls, "clean": self.clean, "systick": self.ticks,
                          "irq": self.irq, "state": self.state}[word]
                target.update(key_values(args))
            elif word == "done":
                done = True
            elif word == "error":
                raise ReportError(f"{name}: firmware error: {rest}")
        if not done or self.kinds is None or self.reps is None or self.dropped is None:
            raise ReportError(f"{name}: incomplete output:\n{text[-2000:]}")
        for kind in self.kinds:
            if self.calls.get(kind) != self.reps:
                raise ReportError(f"{name}: {self.calls.get(kind)} calls of {kind}, expected {self.reps}")


# ------------------------------------------------------------------ a host's view of a region

REGION_MAGIC = b"shmtrace"
LAYOUT_CHUNKS = {1: 1, 2: 2, 3: 4, 4: 7, 5: 14}
COMPLETE, BEING_WRITTEN = 3, 1


def region_chunks(image, where):
    """The Complete chunks of the region at the start of `image` (bytes), as
    a host reads them after the firmware stopped: header fields, then every
    page of the SMB (`shmtrace_abi::region` docs, Perfetto SMB ABI v1)."""
    if image[:8] != REGION_MAGIC:
        raise ReportError(f"{where}: no region magic")
    version, header_size, region_size = struct.unpack_from("<HHI", image, 8)
    smb_offset, smb_size, page_size = struct.unpack_from("<III", image, 0x24)
    if version != 1 or region_size > len(image) or smb_offset + smb_size > region_size or page_size % 4096:
        raise ReportError(f"{where}: bad region header (version {version}, size {region_size})")
    chunks = []
    for page in range(smb_size // page_size):
        base = smb_offset + page * page_size
        (bitmap,) = struct.unpack_from("<I", image, base)
        n = LAYOUT_CHUNKS.get((bitmap >> 28) & 7, 0)
        if not n:
            continue
        size = ((page_size - 8) // n) & ~3
        for j in range(n):
            state = (bitmap >> (2 * j)) & 3
            if state == BEING_WRITTEN:
                raise ReportError(f"{where}: page {page} chunk {j} still being written after the final flush")
            if state == COMPLETE:
                at = base + 8 + j * size
                chunks.append(image[at:at + size])
    return chunks


# ------------------------------------------------------------------ decoding


def varint(buf, i):
    value = shift = 0
    while True:
        if i >= len(buf) or shift > 63:
            raise ReportError("truncated or overlong varint")
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return value, i


def fields(msg):
    """(field, value) pairs of a protobuf message (bytes for length-delimited
    and fixed-size fields)."""
    i = 0
    while i < len(msg):
        key, i = varint(msg, i)
        wire = key & 7
        if wire == 0:
            value, i = varint(msg, i)
        elif wire in (1, 5):
            n = 8 if wire == 1 else 4
            value, i = msg[i:i + n], i + n
        elif wire == 2:
            n, i = varint(msg, i)
            value, i = msg[i:i + n], i + n
        else:
            raise ReportError(f"wire type {wire} in a packet")
        if i > len(msg):
            raise ReportError("field runs past its message")
        yield key >> 3, value


def by_field(msg):
    out = {}
    for k, v in fields(msg):
        out.setdefault(k, []).append(v)
    return out


def one(f, field, default=None):
    values = f.get(field)
    if not values:
        return default
    if len(values) != 1:
        raise ReportError(f"field {field} repeated")
    return values[0]


def signed(v):
    return v - (1 << 64) if v >= 1 << 63 else v


def packets(out):
    """{writer: [TracePacket bytes, ...]} from the drained chunks (in chunk
    id order, patches applied)."""
    chunks = {}
    for data in out.chunks:
        chunk_id, writer = struct.unpack_from("<IH", data)
        if (writer, chunk_id) in chunks:
            raise ReportError(f"{out.name}: chunk {chunk_id} of writer {writer} drained twice")
        chunks[(writer, chunk_id)] = bytearray(data)
    for writer, chunk_id, offset, data, _more in out.patches:
        chunk = chunks.get((writer, chunk_id))
        if chunk is None or 8 + offset + 4 > len(chunk):
            raise ReportError(f"{out.name}: patch for unknown chunk {chunk_id} or out of range")
        chunk[8 + offset:8 + offset + 4] = data
    result = {}
    for writer in sorted({w for w, _ in chunks}):
        ids = sorted(c for w, c in chunks if w == writer)
        if ids != list(range(len(ids))):
            raise ReportError(f"{out.name}: writer {writer}'s chunk ids {ids} have gaps (a chunk was lost)")
        pkts, partial = [], None
        for chunk_id in ids:
            data = chunks[(writer, chunk_id)]
            (bits,) = struct.unpack_from("<H", data, 6)
            count, flags = bits & 0x3FF, bits >> 10
            i = 8
            for n in range(count):
                size, i = varint(data, i)
                if size == DROPPED_FRAGMENT:
                    raise ReportError(f"{out.name}: a packet of writer {writer} was dropped (sentinel)")
                frag, i = bytes(data[i:i + size]), i + size
                if i > len(data):
                    raise ReportError(f"{out.name}: chunk {chunk_id}: fragment runs past the chunk")
                if n == 0 and flags & FIRST_CONTINUES:
                    if partial is None:
                        raise ReportError(f"{out.name}: chunk {chunk_id} continues a packet that did not begin")
                    partial += frag
                else:
                    if partial is not None:
                        raise ReportError(f"{out.name}: chunk {chunk_id}: a packet did not continue")
                    partial = frag
                if n == count - 1 and flags & LAST_CONTINUES:
                    continue
                if partial:  # an empty fragment pads a chunk
                    pkts.append(partial)
                partial = None
        if partial is not None:
            raise ReportError(f"{out.name}: writer {writer}'s last packet never ended")
        result[writer] = pkts
    return result


class Sequence:
    """One writer's packet sequence, decoded as the trace processor would:
    every rule a reader relies on is checked."""

    def __init__(self, name, writer):
        self.where = f"{name}, writer {writer}"
        self.valid = False
        self.t = None  # clock 64, ns
        self.last_abs = 0  # latest absolute time seen
        self.interned = {}
        self.tracks = {}
        self.default_track = None
        self.resets = 0
        self.snapshots = []  # {clock id: ns}
        self.events = []  # dicts

    def fail(self, what):
        raise ReportError(f"{self.where}: {what}")

    def absolute(self, f):
        ts, clock = one(f, P_TIMESTAMP), one(f, P_TIMESTAMP_CLOCK_ID)
        if ts is None or clock != FIRMWARE_CLOCK:
            self.fail(f"packet stamped {ts} on clock {clock}, not on the firmware clock {FIRMWARE_CLOCK}")
        if ts < self.last_abs:
            self.fail(f"absolute time went back from {self.last_abs} to {ts}")
        self.last_abs = ts
        return ts

    def packet(self, pkt):
        f = by_field(pkt)
        if one(f, P_PREVIOUS_PACKET_DROPPED):
            self.fail("a packet was lost (previous_packet_dropped)")
        flags = one(f, P_SEQUENCE_FLAGS, 0)
        if flags & SEQ_CLEARED:
            self.reset(f)
        elif P_TRACK_DESCRIPTOR in f:
            ts = self.absolute(f)
            d = by_field(one(f, P_TRACK_DESCRIPTOR))
            self.tracks[one(d, 1)] = {"name": one(d, 2, b"").decode(), "counter": 8 in d, "at": ts}
        elif P_CLOCK_SNAPSHOT in f:
            ts = self.absolute(f)
            clocks, _ = self.clocks(one(f, P_CLOCK_SNAPSHOT))
            if clocks.get(FIRMWARE_CLOCK) != ts:
                self.fail("a clock snapshot without the firmware clock at its own time")
            self.snapshots.append(clocks)
        if P_INTERNED_DATA in f:
            if not (flags & SEQ_NEEDS_STATE and self.valid):
                self.fail("interned data outside valid incremental state")
            for kind, entry in fields(one(f, P_INTERNED_DATA)):
                e = by_field(entry)
                table = self.interned.setdefault(kind, {})
                iid = one(e, 1)
                if iid in table:
                    self.fail(f"{INTERNED_KINDS.get(kind)} id {iid} interned twice")
                table[iid] = one(e, 2, b"").decode()
        if P_TRACK_EVENT in f:
            self.event(f, flags)

    def clocks(self, snapshot):
        """{clock id: ns} of a ClockSnapshot, and the ids marked incremental."""
        values, incremental = {}, set()
        for _, c in fields(snapshot):
            c = by_field(c)
            values[one(c, 1)] = one(c, 2)
            if one(c, 3, 0):
                incremental.add(one(c, 1))
        return values, incremental

    def reset(self, f):
        ts = self.absolute(f)
        d = by_field(one(f, P_DEFAULTS, b""))
        if one(d, 58) != 64:
            self.fail("the reset packet does not put events on clock 64")
        te = by_field(one(d, 11, b""))
        clocks, incremental = self.clocks(one(f, P_CLOCK_SNAPSHOT, b""))
        if clocks.get(64) != ts or incremental != {64} or clocks.get(FIRMWARE_CLOCK) != ts:
            self.fail(f"the reset packet does not define clock 64 as the firmware clock now: {clocks}")
        if self.t is not None and ts < self.t:
            self.fail(f"a reset at {ts} before the previous event at {self.t}")
        self.valid, self.t, self.resets = True, ts, self.resets + 1
        self.default_track = one(te, 11)
        self.interned, self.tracks = {}, {}

    def name(self, kind, iid):
        if iid is None:
            return None
        s = self.interned.get(kind, {}).get(iid)
        if s is None:
            self.fail(f"{INTERNED_KINDS[kind]} id {iid} not interned on the sequence")
        return s

    def event(self, f, flags):
        if not (flags & SEQ_NEEDS_STATE and self.valid):
            self.fail("a track event outside valid incremental state")
        if P_TIMESTAMP_CLOCK_ID in f:
            self.fail("an event with an absolute time (time went backwards)")
        delta = one(f, P_TIMESTAMP)
        if delta is None:
            self.fail("an event without a time")
        self.t += delta
        e = by_field(one(f, P_TRACK_EVENT))
        kind = EVENT_TYPES.get(one(e, E_TYPE))
        if kind is None:
            self.fail(f"track event of type {one(e, E_TYPE)}")
        uuid = one(e, E_TRACK_UUID, self.default_track)
        track = self.tracks.get(uuid)
        if track is None:
            self.fail(f"an event on track {uuid:#x}, not described since the reset")
        cats = [self.name(1, c) for c in e.get(E_CATEGORY_IIDS, [])]
        args = {}
        for a in e.get(E_DEBUG_ANNOTATIONS, []):
            a = by_field(a)
            value = next((signed(one(a, k)) if k == 4 else one(a, k) for k in (3, 4) if k in a), None)
            args[self.name(3, one(a, 1))] = value
        value = one(e, E_COUNTER_VALUE)
        if value is not None:
            value = signed(value)
        double = one(e, E_DOUBLE_COUNTER_VALUE)
        if double is not None:
            value = struct.unpack("<d", double)[0]
        if (kind == "counter") != (value is not None) or (kind == "counter") != track["counter"]:
            self.fail(f"a {kind} with value {value} on track {track['name']}")
        self.events.append({
            "kind": kind, "t": self.t, "track": track["name"], "categories": cats,
            "name": self.name(2, one(e, E_NAME_IID)), "args": args, "value": value,
            "flows": [struct.unpack("<Q", x)[0] for x in e.get(E_FLOW_IDS, [])],
        })


def decode(out):
    """{writer: Sequence} of everything `out` drained."""
    seqs = {}
    for writer, pkts in packets(out).items():
        s = seqs[writer] = Sequence(out.name, writer)
        # The first packet is marked as such: the reset packet, or a plain
        # packet before it when packets were lost before the first one (the
        # reset then carries the loss mark).
        if not pkts or not one(by_field(pkts[0]), P_FIRST_PACKET_ON_SEQUENCE):
            s.fail("the first packet is not marked first_packet_on_sequence")
        for p in pkts:
            s.packet(p)
    return seqs


def expect(where, what, got, want):
    if got != want:
        raise ReportError(f"{where}: {what}: {got!r}, expected {want!r}")


def check_events(out):
    """Checks what `out` drained against what its firmware wrote; returns a
    summary line."""
    if out.dropped:
        raise ReportError(f"{out.name}: the firmware lost {out.dropped} events, packets or chunks")
    seqs = decode(out)
    full = "step" in out.kinds
    expect(out.name, "sequences (writer ids)", sorted(seqs), [MAIN_WRITER, IRQ_WRITER] if full else [MAIN_WRITER])
    main = seqs[MAIN_WRITER]
    expect(main.where, "resets (first packet, and the clear)", main.resets, 2)
    ev = main.events

    def of(kind, track="firmware", name=None):
        return [e for e in ev if e["kind"] == kind and e["track"] == track and (name is None or e["name"] == name)]

    reps = list(range(out.reps))
    expect(main.where, "events", len(ev), sum(out.calls.get(k, 0) for k in out.kinds if k not in ("markers_only", "clock", "clock_snapshot")))
    for kind, name in (("slice_begin", "work"), ("instant", "tick")):
        got = of(kind, name=name)
        expect(main.where, f"{kind} events named {name} in category fw", len([e for e in got if e["categories"] == ["fw"]]), out.calls.get(kind, 0))
    expect(main.where, "slice ends", len(of("slice_end")), out.calls.get("slice_end", 0))
    expect(main.where, "integer counter values", [e["value"] for e in of("counter", "level")],
           [r - 32 for r in reps] if "counter" in out.kinds else [])
    if full:
        expect(main.where, "floating-point counter values", [e["value"] for e in of("counter", "supply")], [r * 0.25 for r in reps])
        steps = of("instant", "motor", "step")
        expect(main.where, "step annotations", [e["args"] for e in steps], [{"rep": r} for r in reps])
        expect(main.where, "step flows", {tuple(e["flows"]) for e in steps}, {(STEP_FLOW,)})
        expect(main.where, "clock snapshots", len(main.snapshots), out.snapshots)
        # The tick clock (whole SysTick periods) is read just before the
        # event clock; the interrupt may run in between.
        for s in main.snapshots:
            if not 0 <= s[FIRMWARE_CLOCK] - s[TICK_CLOCK] < 2 * PERIOD_NS:
                raise ReportError(f"{main.where}: snapshot {s}: the tick clock is not within a period of the event clock")
        irq = seqs[IRQ_WRITER]
        expect(irq.where, "instants", len([e for e in irq.events if e["kind"] == "instant" and e["name"] == "systick"]), out.irq["instant"])
        samples = [e["value"] for e in irq.events if e["kind"] == "counter" and e["track"] == "reloads"]
        expect(irq.where, "reload samples", len(samples), out.irq["counter"])
        if samples != sorted(set(samples)):
            raise ReportError(f"{irq.where}: reload samples {samples} do not increase")
    for s in seqs.values():
        if s.events and s.events[-1]["t"] > out.clock_end:
            raise ReportError(f"{s.where}: an event at {s.events[-1]['t']} ns, after the clock's end {out.clock_end}")
    return (f"{out.name}: {len(out.chunks)} chunks, " + ", ".join(
        f"writer {w}: {len(s.events)} events in {s.resets} sequence start(s), t = {s.events[0]['t'] if s.events else 0}"
        f"..{s.events[-1]['t'] if s.events else 0} ns" for w, s in sorted(seqs.items())) + "; as written, 0 lost")


# ------------------------------------------------------------------ counting


TRACE_PC = re.compile(r"\[[0-9a-f]+/([0-9a-f]+)/")
STOPPED_PC = re.compile(r"\[([0-9a-f]+)\]")


def count_windows(log, syms):
    """Per marker window (in order): (instructions, of them in mem*), and the
    instruction counts of the SysTick handler runs."""
    funcs = sorted((a & ~1, s, n) for a, s, t, n in syms if t in "tTwW" and s > 0)
    starts = [f[0] for f in funcs]
    begin = find_symbol(syms, "markers::begin")[0] & ~1
    end = find_symbol(syms, "markers::end")[0] & ~1

    mem_cache = {}

    def in_mem(pc):
        hit = mem_cache.get(pc)
        if hit is None:
            i = bisect.bisect_right(starts, pc) - 1
            hit = i >= 0 and pc < funcs[i][0] + funcs[i][1] and bool(MEM_FN.match(funcs[i][2]))
            mem_cache[pc] = hit
        return hit

    windows, irqs = [], []
    inside, n, mem, depth, irq_n, last_pc, last_in_irq = False, 0, 0, 0, 0, None, False

    def executed(pc):
        nonlocal inside, n, mem, irq_n, last_pc, last_in_irq
        last_pc, last_in_irq = pc, depth > 0
        if depth:
            irq_n += 1
            return
        if pc == begin:
            if inside:
                raise ReportError("markers::begin entered twice without markers::end")
            inside, n, mem = True, 0, 0
        elif pc == end and inside:
            windows.append((n, mem))
            inside = False
        if inside:
            n += 1
            mem += in_mem(pc)

    # A `Trace` line is printed as QEMU starts the instruction; it counts
    # once the next line does not say QEMU stopped before it (to take an
    # interrupt when the instruction budget ran out).
    pending = None
    with open(log, errors="replace") as f:
        for line in f:
            if line.startswith("Stopped execution of TB chain before"):
                stopped = STOPPED_PC.search(line)
                if pending is not None and stopped and int(stopped.group(1), 16) == pending:
                    pending = None
                    continue
            if pending is not None:
                executed(pending)
                pending = None
            if line.startswith("Trace"):
                pending = int(TRACE_PC.search(line).group(1), 16)
            elif line.startswith("cpu_io_recompile: rewound execution of TB to "):
                # The I/O instruction logged last runs again (and is logged
                # again): count it once.
                pc = int(line.rsplit(" ", 1)[1], 16)
                if pc == last_pc:
                    if last_in_irq:
                        irq_n -= 1
                    elif inside:
                        n -= 1
                        mem -= in_mem(pc)
            elif line.startswith("...taking pending") and "exception" in line:
                if depth == 0:
                    irq_n = 0
                depth += 1
            elif line.startswith("...successful exception return"):
                depth -= 1
                if depth == 0:
                    irqs.append(irq_n)
        if pending is not None:
            executed(pending)
    return windows, irqs


def frame_counts(name, text, log, syms):
    """Checks the frames a `frames` run printed (src/frames.rs), each CRC
    recomputed, and returns {chunk length: [instructions net of the
    markers, per round]}."""
    lines = text.splitlines()
    head = [line.split() for line in lines if line.startswith("frames ")]
    if "done" not in lines or len(head) != 1 or int(head[0][2]) != FRAME_SEED:
        raise ReportError(f"{name}: incomplete output:\n{text[-2000:]}")
    rounds = int(head[0][4])
    frames = [tuple(int(v, 16 if i == 3 else 10) for i, v in enumerate(line.split()[1:]))
              for line in lines if line.startswith("frame ")]
    if not frames or len(frames) % rounds:
        raise ReportError(f"{name}: {len(frames)} frames in {rounds} rounds")
    chunk, x = bytearray(), FRAME_SEED
    for _ in range(max(length for _, length, _, _ in frames)):
        x ^= (x << 13) & 0xFFFF_FFFF
        x ^= x >> 17
        x ^= (x << 5) & 0xFFFF_FFFF
        chunk.append(x & 0xFF)
    for n, (seq, length, sent, crc) in enumerate(frames):
        body = FRAME_MAGIC + bytes([FRAME_CHUNK, 0]) + struct.pack("<II", seq, length) + chunk[:length]
        if seq != n or sent != len(body) + FRAME_CRC or crc != zlib.crc32(body):
            raise ReportError(f"{name}: frame {n} (seq {seq}, {length} bytes): sent {sent} bytes, CRC {crc:08x}; "
                              f"expected {len(body) + FRAME_CRC} bytes, CRC {zlib.crc32(body):08x}")
    windows, _ = count_windows(log, syms)
    per_round = len(frames) // rounds
    if len(windows) != rounds * (1 + per_round):
        raise ReportError(f"{name}: {len(windows)} marker windows in the log, expected {rounds * (1 + per_round)}")
    counts = {}
    for r in range(rounds):
        at = r * (1 + per_round)
        base = windows[at][0]
        for (_, length, _, _), (n, _) in zip(frames[r * per_round:], windows[at + 1:at + 1 + per_round]):
            counts.setdefault(length, []).append(n - base)
    return counts


def slice_begin_bytes(out):
    """The median size a slice begin takes in its chunk (its packet and the
    fragment's size varint), interned names already defined."""
    sizes = []
    for pkts in packets(out).values():
        for p in pkts:
            f = by_field(p)
            if P_TRACK_EVENT in f and P_INTERNED_DATA not in f and one(by_field(one(f, P_TRACK_EVENT)), E_TYPE) == 1:
                sizes.append(len(p) + (1 if len(p) < 0x80 else 2))
    if not sizes:
        raise ReportError(f"{out.name}: no slice begin without interned data")
    return statistics.median(sizes)


def print_frames(frames, slice_bytes, slice_insns):
    """The stream link's section: {(core, crc): (counts, flash, table)}."""
    first = next(iter(frames.values()))[0]
    lengths = sorted(first)
    short, long = lengths[-2], lengths[-1]
    print(f"\n== the stream link: CHUNK frames (src/frames.rs: FrameEncoder::chunk, 12-byte header + chunk + CRC-32 of "
          f"both, into a sink that counts; exact: single-step log, net of the markers, the median of "
          f"{len(first[long])} rounds)")
    rows, per_byte = [], {}
    for (core, crc), (counts, flash, tab) in frames.items():
        med = {n: statistics.median(counts[n]) for n in lengths}
        per_byte[core, crc] = (med[long] - med[short]) / (long - short)
        rows.append((core, crc, flash, tab) + tuple(f"{med[n]:g}" for n in lengths) + (f"{per_byte[core, crc]:.2f}",))
    table(rows, ("core", "CRC", "flash (.text + .rodata)", "CRC static") + tuple(f"{n} B chunk" for n in lengths)
          + ("per frame byte",))
    base = CRC_VARIANTS[0][0]
    against = "".join(f", {core} {crc} {flash - frames[core, base][1]:+d} B" for (core, crc), (_, flash, _) in frames.items()
                      if crc != base)
    print(f"per frame byte: ({long} B - {short} B) / {long - short}; flash: the `frames` binary's (M4) and "
          f"`m0-frames`' (M0) .text + .rodata{f' (against the {base}{against})' if against else ''}; CRC static: "
          f"their shmtrace_abi::frame::CRC (a table, if any, and the algorithm's address)")
    print(f"a slice begin is {slice_bytes:g} bytes in its chunk (`minimal`'s median: packet + size varint) and costs "
          f"{slice_insns:g} instructions to write (Cortex-M4, above); streaming it adds the CRC of its bytes:")
    table([(core, crc, f"{slice_bytes * pb:.0f}", f"{slice_bytes * pb / slice_insns:.2f}")
           for (core, crc), pb in per_byte.items()],
          ("core", "CRC", "CRC instructions per slice begin", f"of the {slice_insns:g} to write it (M4)"))


# ------------------------------------------------------------------ report


def table(rows, header):
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    fmt = "  ".join(("{:<%d}" if i == 0 else "{:>%d}") % w for i, w in enumerate(widths))
    print(fmt.format(*header))
    for r in rows:
        print(fmt.format(*r))


def per_kind_counts(out, windows):
    """Per kind: the net instruction counts of its calls (minus the markers'
    own), the first call and the first after the clear, min/median/max of
    the others, instructions in mem*, and the mean the SysTick sums give."""
    kinds, reps = out.kinds, out.reps
    if len(windows) != len(kinds) * reps:
        raise ReportError(f"{out.name}: {len(windows)} marker windows in the log, expected {len(kinds) * reps}")
    per = {k: windows[i::len(kinds)] for i, k in enumerate(kinds)}
    base = statistics.median(n for n, _ in per[kinds[0]])
    base_mean = statistics.mean(n for n, _ in per[kinds[0]])
    base_ticks = out.ticks[kinds[0]] / out.clean[kinds[0]]
    result = {}
    for k in kinds[1:]:
        w = per[k]
        steady = [n - base for r, (n, _) in enumerate(w) if r not in (0, out.clear_at)]
        net_mean = statistics.mean(n for n, _ in w) - base_mean
        # SysTick: mean over the calls no interrupt ran in (the firmware's
        # `clean` calls; the log leaves interrupts out of every call).
        tick_mean = (out.ticks[k] / out.clean[k] - base_ticks) * INSNS_PER_TICK
        # Each clean call's tick count is off by less than one tick; the
        # calls an interrupt ran in are left out of the SysTick sums only, so
        # allow for a first call among them.
        if abs(tick_mean - net_mean) > 2 * INSNS_PER_TICK + 2500 / reps:
            raise ReportError(f"{out.name} {k}: SysTick gives {tick_mean:.0f} instructions per call, "
                              f"single-step {net_mean:.0f}")
        result[k] = {
            "first": w[0][0] - base, "after_clear": w[out.clear_at][0] - base,
            "min": min(steady), "median": statistics.median(steady), "max": max(steady),
            "mem": sum(m for _, m in w), "share": sum(m for _, m in w) / sum(n for n, _ in w),
            "mean": net_mean, "tick_mean": tick_mean, "base": base,
        }
    return result


def print_instructions(out, per_kind):
    rows = [(k, f"{v['first']:g}", f"{v['after_clear']:g}", f"{v['min']:g}", f"{v['median']:g}", f"{v['max']:g}",
             f"{100 * v['share']:.1f} %", f"{v['mean']:.0f}", f"{v['tick_mean']:.0f}") for k, v in per_kind.items()]
    table(rows, ("kind", "first", "after clear", "min", "median", "max", "in mem*", "mean", "SysTick mean"))
    base = next(iter(per_kind.values()))["base"]
    print(f"net of the markers' own {base:g} instructions. first: the sequence's first call of the kind (it "
          f"writes the reset packet, descriptors, interned strings); after clear: the first after the sequence "
          f"restarted; min/median/max: the other {out.reps - 2} calls; mean: all calls, cross-checked with "
          f"SysTick (-icount shift=0, {INSNS_PER_TICK} instructions per tick, the calls no interrupt ran in)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--no-build", action="store_true", help="use the ELF files already built")
    ap.add_argument("--keep-log", metavar="DIR", help="keep the single-step logs in DIR")
    args = ap.parse_args()

    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        raise ReportError(f"missing tools: {', '.join(missing)} (apt-get install qemu-system-arm binutils-arm-none-eabi)")
    if not args.no_build:
        print("building (release: opt-level s, fat LTO, codegen-units 1, panic=abort) ...", flush=True)
        # The frame benchmarks with a bitwise CRC first, kept as copies: the
        # plain builds after them overwrite the ELFs.
        for _core, _machine, package, elf_dir, b in FRAME_BENCHES:
            for _crc, feature in CRC_VARIANTS:
                if feature:
                    run(["cargo", "build", "--release", "--bin", b, "--features", f"shmtrace-abi/{feature}"], cwd=package)
                    shutil.copyfile(elf_dir / b, elf_dir / f"{b}-{feature}")
        run(["cargo", "build", "--release", "--bins"], cwd=M0_DIR)
        run(["cargo", "build", "--release", "--bins"], cwd=HERE)
    elf = {b: ELF_DIR / b for b in BINARIES}
    frame_elf = {(core, crc): (machine, elf_dir / (f"{b}-{feature}" if feature else b))
                 for core, machine, _package, elf_dir, b in FRAME_BENCHES for crc, feature in CRC_VARIANTS}
    for path in list(elf.values()) + [p for _, p in frame_elf.values()]:
        if not path.exists():
            raise ReportError(f"{path} missing")

    sec = {b: section_table(p) for b, p in elf.items()}
    syms = {b: symbols(p) for b, p in elf.items()}
    by = {b: text_by_crate(syms[b]) for b in BINARIES}

    with tempfile.TemporaryDirectory(prefix="shmtrace-fw-") as tmp:
        tmp = Path(args.keep_log) if args.keep_log else Path(tmp)
        tmp.mkdir(parents=True, exist_ok=True)
        # ---- normal runs; `instants`, `minimal` and `demo` with PSRAM in a
        # host file
        outs, psram = {}, {}
        for b in BINARIES:
            extra = []
            if b in HOST_READ + ("demo",):
                psram[b] = tmp / f"{b}.psram"
                psram[b].unlink(missing_ok=True)
                extra = ["-object", f"memory-backend-file,id=m,size=16M,mem-path={psram[b]},share=on",
                         "-machine", "memory-backend=m"]
            outs[b] = Output(b, qemu(elf[b], *extra))
        if outs["skeleton"].chunks or outs["skeleton"].patches:
            raise ReportError("the skeleton drained data")
        regions = {b: smb_placement(elf[b]) for b in HOST_READ + ("demo", "demo-bss")}
        images = {}
        for b in HOST_READ + ("demo",):
            name, addr, size, _, _ = regions[b]
            if not PSRAM_BASE <= addr < PSRAM_BASE + PSRAM_SIZE:
                raise ReportError(f"{b}'s region at {addr:#x} is not in PSRAM")
            with open(psram[b], "rb") as f:
                f.seek(addr - PSRAM_BASE)
                images[b] = f.read(size)
        # `instants` and `minimal` leave their chunks to a host: read them as
        # one would.
        for b in HOST_READ:
            if outs[b].chunks:
                raise ReportError(f"{b} drained chunks itself")
            outs[b].chunks = region_chunks(images[b], f"{b}'s region")
        summaries = [check_events(outs[b]) for b in HOST_READ + ("demo", "demo-bss")]
        # The demo drains its own region; a host sees it too: the last chunk
        # it drained is in the file.
        last = outs["demo"].chunks[-1] if outs["demo"].chunks else b""
        payload = last[8:].rstrip(b"\0")
        if len(payload) < 4 or payload not in images["demo"]:
            raise ReportError("the demo's last drained chunk is not visible in the PSRAM backing file")

        # ---- single-step runs
        counted = {}
        for b in ("minimal", "demo"):
            log = tmp / f"{b}.exec.log"
            ss = Output(f"{b} (single-step)", qemu(elf[b], "-singlestep", "-d", "exec,nochain,int", "-D", str(log)))
            counted[b] = count_windows(log, syms[b])
            if ss.calls != outs[b].calls or ss.irq != outs[b].irq:
                raise ReportError(f"{b}: the single-step run wrote other events than the normal run")
        frames = {}
        for (core, crc), (machine, path) in frame_elf.items():
            log = tmp / f"{path.name}.exec.log"
            text = qemu(path, "-singlestep", "-d", "exec,nochain,int", "-D", str(log), machine=machine)
            fsyms = symbols(path)
            flash = sum(size for name, (_, size) in section_table(path).items() if name in (".text", ".rodata"))
            table_size = sum(size for _a, size, _t, name in fsyms if name == "shmtrace_abi::frame::CRC")
            frames[core, crc] = (frame_counts(f"{path.name} ({core})", text, log, fsyms), flash, table_size)
            if not args.keep_log:
                log.unlink()

    # ---- the goals
    m = outs["minimal"]
    text_abi = by["minimal"].get("shmtrace_abi", 0)
    per_kind = {b: per_kind_counts(outs[b], counted[b][0]) for b in ("minimal", "demo")}
    slice_begin = per_kind["minimal"]["slice_begin"]["median"]
    common = ("slice_begin", "slice_end", "instant", "counter")
    # Every kind of event the writer's fast paths write (not the demo's
    # `step`, a general event with annotations, nor its clock snapshots).
    events = common + ("counter_f64",)
    worst = max(((b, k, per_kind[b][k]["median"]) for b in per_kind for k in events if k in per_kind[b]),
                key=lambda t: t[2])
    mem_common = sum(per_kind[b][k]["mem"] for b in per_kind for k in common)
    print(f"\n== goals (issue 16), measured on `instants` (one writer, instants only) and `minimal` ({TARGET}, "
          f"opt-level s, fat LTO, QEMU mps2-an386); `minimal`: one writer, {m.state['interning']} interned strings, {m.state['tracks']} tracks, {m.state['sites']} cached call sites, its region left to a host "
          f"(the demos drain a 4 KiB SMB, one page, themselves)")
    rows = [
        (".text: writer + arbiter + slice/instant/counter path (shmtrace_abi symbols)", text_abi,
         f"<= {GOAL_TEXT}", "yes" if text_abi <= GOAL_TEXT else "NO"),
        ("instructions: slice begin with interned names (median, clock read included)", f"{slice_begin:g}",
         f"<= {GOAL_SLICE_BEGIN}", "yes" if slice_begin <= GOAL_SLICE_BEGIN else "NO"),
        ("instructions per event: the worst kind's median, `minimal` and `demo` "
         f"({worst[1]} in `{worst[0]}`)", f"{worst[2]:g}",
         f"<= {GOAL_SLICE_BEGIN}", "yes" if worst[2] <= GOAL_SLICE_BEGIN else "NO"),
        ("instructions in mem* functions: slice begin/end, instant, counter", mem_common, "0",
         "yes" if mem_common == 0 else "NO"),
        ("RAM: writer state (TrackEventWriter + InPlaceWriter + arbiter)", m.state["writer"], f"<= {GOAL_RAM}",
         "yes" if m.state["writer"] <= GOAL_RAM else "NO"),
    ]
    # The table: the .text a producer adds over the skeleton, for the
    # smallest (`instants`) and for slices, instants and a counter with its
    # descriptor (`minimal`). The harness's own reporting (printing the
    # writer's stats and state, summing its losses: the tracer's `report`
    # and `dropped`) is in each binary but no part of a producer: it is left
    # out, and shown.
    added = {}
    for b in HOST_READ:
        # By method: a wrapper's and its inner tracer's copies both count.
        harness = {}
        for _a, size, kind, name in syms[b]:
            method = name.rsplit("::", 1)[-1]
            if (kind in "tT" and " as shmtrace_firmware_example::events::Tracer>::" in name
                    and method in ("report", "dropped")):
                harness[method] = harness.get(method, 0) + size
        in_all = sec[b][".text"][1] - sec["skeleton"][".text"][1]
        added[b] = (in_all - sum(harness.values()), in_all, harness)
    rows[0:0] = [
        (".text added over the skeleton: the smallest producer (`instants`: writer + arbiter + instants)",
         added["instants"][0], f"<= {GOAL_TEXT}", "yes" if added["instants"][0] <= GOAL_TEXT else "NO"),
        (".text added over the skeleton: `minimal` (+ slice begin/end, a counter and its descriptor)",
         added["minimal"][0], f"<= {GOAL_TEXT}", "yes" if added["minimal"][0] <= GOAL_TEXT else "NO"),
    ]
    table(rows, ("goal", "measured", "target", "met"))
    for b in HOST_READ:
        net, in_all, harness = added[b]
        print(f"`{b}` adds .text {in_all:+d} B over the skeleton in all, of which the harness's reporting is "
              + ", ".join(f"{name} {size} B" for name, size in sorted(harness.items()))
              + f"; shmtrace_abi's symbols are {by[b].get('shmtrace_abi', 0)} B, the rest the firmware's setup and "
              f"calls (LTO inlines the region's setup and the writer's construction into them); mem* "
              f"{by[b].get('compiler_builtins mem*', 0) - by['skeleton'].get('compiler_builtins mem*', 0):+d} B")
    clock = per_kind["minimal"]["clock"]["median"]
    print(f"slice begin: {clock:g} of the instructions read the clock hook (SysTick + TickRate), "
          f"{slice_begin - clock:g} are shmtrace's (writer, the call site's cached ids, the region arbiter's trace_enabled and "
          f"clear_request checks)")
    # The one-time setup: LTO inlines the region's initialization (header,
    # ring, page headers), the arbiter's and the writer's construction into
    # the firmware's `ShmTracer::new`, which holds little else.
    setup = sum(size for _a, size, kind, name in syms["minimal"]
                if kind in "tT" and name.startswith("shmtrace_firmware_example::tracer::ShmTracer") and name.endswith("::new"))
    print(f"one-time setup: the firmware's ShmTracer::new is {setup} B (the region's header, ring and page headers, the "
          f"arbiter and the writer, inlined into it); shmtrace_abi's symbols and it together: {text_abi + setup} B")
    print("\nshmtrace_abi .text in `minimal`, by module (symbol sizes; LTO inlines the SMB and arbiter calls of the "
          "chunk switch into writer::in_place)")
    groups = {}
    for _addr, size, kind, name in syms["minimal"]:
        if kind in "tTwW" and crate_of(name) == "shmtrace_abi":
            inner = name
            if name.startswith("<"):
                ty, _, trait = name[1:].partition(" as ")
                inner = ty if "::" in ty else trait
            module = inner.split("::")[1] if inner.count("::") >= 2 else "(crate root)"
            groups[module] = groups.get(module, 0) + size
    table([(m, n, f"{100 * n / text_abi:.0f} %") for m, n in sorted(groups.items(), key=lambda kv: -kv[1])],
          ("module", "bytes", "share"))

    for b in ("minimal", "demo"):
        print(f"\n== instructions per event, `{b}` (exact: single-step log, {outs[b].reps} calls of each kind)")
        print_instructions(outs[b], per_kind[b])
        irqs = counted[b][1]
        if irqs:
            what = "counts the reload" + (", writes an instant and a counter sample through its own writer"
                                          if b == "demo" else "")
            print(f"the SysTick interrupt ({what}) ran {len(irqs)} times: {min(irqs)}..{max(irqs)} instructions, "
                  f"median {statistics.median(irqs):g}, first {irqs[0]}; left out of the counts above")

    print_frames(frames, slice_begin_bytes(outs["minimal"]), slice_begin)

    # ---- sizes
    print(f"\n== size ({TARGET}, bytes)")
    rows = []
    for s in SECTIONS:
        a = sec["skeleton"].get(s, (0, 0))[1]
        row = [s, a]
        for b in ("minimal", "demo"):
            v = sec[b].get(s, (0, 0))[1]
            row += [v, f"{v - a:+d}"]
        rows.append(tuple(row))
    table(rows, ("section", "skeleton", "minimal", "added", "demo", "added"))

    print("\n.text by crate (sum of symbol sizes; LTO inlines across crates, so code")
    print("inlined into the firmware's functions counts for the firmware)")
    rows = []
    crates = sorted(set().union(*(by[b] for b in ("skeleton", "minimal", "demo"))), key=lambda c: -by["demo"].get(c, 0))
    for crate in crates:
        a = by["skeleton"].get(crate, 0)
        row = [crate, a]
        for b in ("minimal", "demo"):
            v = by[b].get(crate, 0)
            added = sec[b][".text"][1] - sec["skeleton"][".text"][1]
            row += [v, f"{v - a:+d}", f"{100 * (v - a) / added:.1f} %" if added else "-"]
        rows.append(tuple(row))
    table(rows, ("crate", "skeleton", "minimal", "added", "share", "demo", "added", "share"))

    print("\n== RAM")
    rows = []
    for b in HOST_READ + ("demo",):
        s = outs[b].state
        rows.append((b, s["interning"], s["tracks"], s["sites"], s["writer"], s["in_place"], s["arbiter"]))
    table(rows, ("binary", "interned (N)", "tracks (T)", "call sites (S)", "writer state", "of it InPlaceWriter (with its arbiter)", "of it arbiter"))

    print("\n== region placement (the static named REGION: header, ring, SMB)")
    rows = []
    for b in HOST_READ + ("demo", "demo-bss"):
        name, addr, size, gap, align = smb_placement(elf[b])
        rows.append((b, name, f"{addr:#010x}", size, align, gap))
    table(rows, ("binary", "section", "address", "size", "align", "gap before"))

    print("\n== runs (QEMU mps2-an386, Cortex-M4, -icount shift=0): exit status 0 for " + ", ".join(BINARIES))
    for s in summaries:
        print(s)
    print("instants' and minimal's chunks were read from their regions in the file QEMU backs PSRAM with, as a "
          "host would; the demo's last drained chunk is in its file too")


if __name__ == "__main__":
    try:
        main()
    except ReportError as e:
        print(f"\nfirmware report FAILED: {e}", file=sys.stderr)
        sys.exit(1)
