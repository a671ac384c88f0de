#!/usr/bin/env python3
"""Size and instructions-per-event report of the firmware example.

Builds the three binaries of this package (release profile: opt-level "s",
fat LTO, panic=abort), then prints:

* .text / .rodata / .bss of the skeleton (same runtime, loop and output, no
  shmtrace) and of the demo, and what the demo adds, by crate (symbol sizes
  from `arm-none-eabi-nm`), with the share of shmtrace_abi and of
  compiler_builtins' mem* functions;
* where the SMB lies and the alignment gap before it, in `.shmtrace` (demo)
  and in `.bss` (demo-bss);
* the exact number of instructions each event kind of the firmware's table
  costs on the Cortex-M4 (QEMU mps2-an386): QEMU runs the demo with
  `-singlestep -d exec,nochain`, which logs one `Trace` line per executed
  instruction, and the report counts the lines from the entry of
  `markers::begin` to the entry of `markers::end` around every call (min,
  median, max over all calls of a kind; "net" subtracts the median of the
  `markers_only` row, the markers' own cost), and the share spent in mem*
  functions. A second run under `-icount shift=0` (one instruction per
  nanosecond) cross-checks the counts with the SysTick ticks the firmware
  summed around the same calls.

It also runs every binary normally and checks its semihosting exit status
and output: the chunks the demo drained from its SMB are decoded here
(chunk header, fragments, patches, TracePacket/TrackEvent fields) and must
hold exactly the events the firmware says it wrote; the demo's SMB lies in
PSRAM backed by a host file, where its last chunk's payload must be visible.

This is a benchmark printout, not a test: it fails (exit status 1) only if
the firmware does not build or run, or the counts do not match.

Needs: cargo with the thumbv7em-none-eabihf target, qemu-system-arm (7.2)
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
from pathlib import Path

HERE = Path(__file__).resolve().parent
TARGET = "thumbv7em-none-eabihf"
# cargo runs in HERE, so a relative CARGO_TARGET_DIR is relative to it.
ELF_DIR = HERE / os.environ.get("CARGO_TARGET_DIR", "target") / TARGET / "release"
TOOLS = ("cargo", "qemu-system-arm", "arm-none-eabi-nm", "arm-none-eabi-size", "arm-none-eabi-objdump")

QEMU = [
    "qemu-system-arm", "-M", "mps2-an386", "-cpu", "cortex-m4",
    "-display", "none", "-monitor", "none", "-serial", "none",
    "-semihosting-config", "enable=on,target=native",
]
QEMU_TIMEOUT = 120
# mps2-an386's PSRAM (the machine's main RAM, memory.x region PSRAM).
PSRAM_BASE = 0x2100_0000
PSRAM_SIZE = 16 << 20
# QEMU's mps2 boards clock SysTick's "core" source at SYSCLK = 25 MHz
# (hw/arm/mps2.c); -icount shift=0 executes one instruction per virtual
# nanosecond, so one tick is 40 instructions.
INSNS_PER_TICK = 1_000_000_000 // 25_000_000

SECTIONS = (".text", ".rodata", ".data", ".bss", ".shmtrace")
# Chunk header `packets` flags (Perfetto SMB ABI v1).
FIRST_CONTINUES = 0x1
LAST_CONTINUES = 0x2
DROPPED_FRAGMENT = 0x0FFF_FFFF
# TracePacket / TrackEvent fields the check reads.
PACKET_TRACK_EVENT = 11
PACKET_INTERNED_DATA = 12
INTERNED_EVENT_NAMES = 2
EVENT_TYPE = 9
EVENT_NAME_IID = 10
EVENT_NAME = 23
EVENT_COUNTER_VALUE = 30
EVENT_TYPES = {1: "slice_begin", 2: "slice_end", 3: "instant", 4: "counter"}
NAMED_KINDS = ("slice_begin", "instant")

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
        return crate if crate not in ("skeleton", "demo", "demo_bss") else "the binary"
    if name.startswith("__") and ("div" in name or "mod" in name or "aeabi" in name):
        return "compiler_builtins"
    if name in ("Reset", "DefaultHandler_", "DefaultPreInit", "HardFault_", "main"):
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
    """(section, address, size, gap before it, section alignment) of `SMB`."""
    syms = symbols(elf)
    addr, size, _, _ = find_symbol(syms, "SMB")
    for name, (start, length) in section_table(elf).items():
        if start <= addr < start + length:
            break
    else:
        raise ReportError(f"{elf}: SMB at {addr:#x} is in no section")
    ends = [a + s for a, s, _, _ in syms if start <= a < addr and s > 0]
    gap = addr - max(ends, default=start)
    return name, addr, size, gap, section_alignment(elf, name)


# ------------------------------------------------------------------ running


def qemu(elf, *extra, stdout_path=None):
    cmd = QEMU + list(extra) + ["-kernel", str(elf)]
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


class Output:
    """The firmware's semihosting lines (see src/lib.rs)."""

    def __init__(self, name, text):
        self.name = name
        self.kinds = None
        self.reps = None
        self.chunks = []  # bytes of each drained chunk, in drain order
        self.patches = []  # (writer, chunk_id, offset, data, has_more)
        self.calls = {}
        self.ticks = {}
        self.dropped = None
        self.state = None
        done = False
        for line in text.splitlines():
            word, _, rest = line.partition(" ")
            args = rest.split()
            if word == "kinds":
                self.kinds = args
            elif word == "reps":
                self.reps = int(args[0])
            elif word == "chunk":
                length, hexed = int(args[0]), args[1] if len(args) > 1 else ""
                data = bytes.fromhex(hexed)
                if len(data) > length:
                    raise ReportError(f"{name}: chunk line longer than its length")
                self.chunks.append(data + bytes(length - len(data)))
            elif word == "patch":
                writer, chunk_id, offset = int(args[0]), int(args[1]), int(args[2])
                self.patches.append((writer, chunk_id, offset, bytes.fromhex(args[3]), args[4] == "1"))
            elif word in ("calls", "systick"):
                pairs = dict(a.split("=") for a in args)
                (self.calls if word == "calls" else self.ticks).update({k: int(v) for k, v in pairs.items()})
            elif word == "dropped":
                self.dropped = int(args[0])
            elif word == "state":
                self.state = int(args[0])
            elif word == "done":
                done = True
            elif word == "error":
                raise ReportError(f"{name}: firmware error: {rest}")
        if not done or self.kinds is None or self.reps is None or self.dropped is None:
            raise ReportError(f"{name}: incomplete output:\n{text[-2000:]}")
        for kind in self.kinds:
            if self.calls.get(kind) != self.reps:
                raise ReportError(f"{name}: {self.calls.get(kind)} calls of {kind}, expected {self.reps}")


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
    """(field, value) pairs of a protobuf message (bytes for length-delimited)."""
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


def packets(out):
    """The TracePackets in the drained chunks, patches applied."""
    chunks = {}
    for data in out.chunks:
        chunk_id, writer = struct.unpack_from("<IH", data)
        chunks[(writer, chunk_id)] = bytearray(data)
    for writer, chunk_id, offset, data, _more in out.patches:
        chunk = chunks.get((writer, chunk_id))
        if chunk is None or 8 + offset + 4 > len(chunk):
            raise ReportError(f"patch for unknown chunk {chunk_id} or out of range")
        chunk[8 + offset:8 + offset + 4] = data
    result, dropped, partial = [], 0, None
    for key in sorted(chunks):
        data = chunks[key]
        (bits,) = struct.unpack_from("<H", data, 6)
        count, flags = bits & 0x3FF, bits >> 10
        i = 8
        for n in range(count):
            size, i = varint(data, i)
            if size == DROPPED_FRAGMENT:
                dropped, partial = dropped + 1, None
                break
            frag, i = bytes(data[i:i + size]), i + size
            if i > len(data):
                raise ReportError(f"chunk {key}: fragment runs past the chunk")
            if n == 0 and flags & FIRST_CONTINUES:
                if partial is None:
                    raise ReportError(f"chunk {key}: continues a packet that did not begin")
                partial += frag
            else:
                if partial is not None:
                    raise ReportError(f"chunk {key}: a packet did not continue")
                partial = frag
            if n == count - 1 and flags & LAST_CONTINUES:
                continue
            if partial:
                result.append(partial)
            partial = None
    if partial is not None:
        raise ReportError("the last packet never ended")
    return result, dropped


def check_events(out):
    """Decodes the drained packets; returns the number of each event kind."""
    pkts, dropped = packets(out)
    names, events = {}, {k: 0 for k in EVENT_TYPES.values()}
    counter_values, setup = [], 0
    for pkt in pkts:
        f = list(fields(pkt))
        for field, value in f:
            if field == PACKET_INTERNED_DATA:
                for sub, entry in fields(value):
                    if sub == INTERNED_EVENT_NAMES:
                        e = dict(fields(entry))
                        names[e.get(1)] = e.get(2, b"").decode()
        te = [v for k, v in f if k == PACKET_TRACK_EVENT]
        if not te:
            setup += 1
            continue
        e = dict(fields(te[0]))
        kind = EVENT_TYPES.get(e.get(EVENT_TYPE))
        if kind is None:
            raise ReportError(f"track event of type {e.get(EVENT_TYPE)}")
        events[kind] += 1
        if kind in NAMED_KINDS and EVENT_NAME not in e and names.get(e.get(EVENT_NAME_IID)) is None:
            raise ReportError(f"{kind} without a name (name_iid {e.get(EVENT_NAME_IID)} not interned)")
        if kind == "counter":
            v = e.get(EVENT_COUNTER_VALUE)
            counter_values.append(v - (1 << 64) if v is not None and v >= 1 << 63 else v)
    if dropped or out.dropped:
        raise ReportError(f"{out.name}: packets lost (firmware: {out.dropped}, drop sentinels: {dropped})")
    for kind, n in events.items():
        if n != out.calls.get(kind, 0):
            raise ReportError(f"{out.name}: drained {n} {kind} events, firmware wrote {out.calls.get(kind, 0)}")
    # The loop passes `rep - 32` as the counter value (src/lib.rs, `run`).
    if out.calls.get("counter") and counter_values != [r - 32 for r in range(out.reps)]:
        raise ReportError(f"{out.name}: counter values {counter_values} differ from the firmware's")
    return events, setup


# ------------------------------------------------------------------ counting


def count_windows(log, syms, kinds):
    """Instruction counts between the markers, per kind, and how many of
    them ran in mem* functions."""
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

    windows, inside, n, mem = [], False, 0, 0
    with open(log, errors="replace") as f:
        for line in f:
            if not line.startswith("Trace"):
                continue
            lb = line.find("[")
            pc = int(line[lb + 1:line.find("]", lb)].split("/")[1], 16)
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
    per_kind = {k: [] for k in kinds}
    for i, w in enumerate(windows):
        per_kind[kinds[i % len(kinds)]].append(w)
    return windows, per_kind


# ------------------------------------------------------------------ report


def table(rows, header):
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    fmt = "  ".join(("{:<%d}" if i == 0 else "{:>%d}") % w for i, w in enumerate(widths))
    print(fmt.format(*header))
    for r in rows:
        print(fmt.format(*r))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--no-build", action="store_true", help="use the ELF files already built")
    ap.add_argument("--keep-log", metavar="PATH", help="keep the single-step log at PATH")
    args = ap.parse_args()

    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        raise ReportError(f"missing tools: {', '.join(missing)} (apt-get install qemu-system-arm binutils-arm-none-eabi)")
    if not args.no_build:
        print("building (release: opt-level s, fat LTO, codegen-units 1, panic=abort) ...", flush=True)
        run(["cargo", "build", "--release", "--bins"], cwd=HERE)
    elf = {b: ELF_DIR / b for b in ("skeleton", "demo", "demo-bss")}
    for path in elf.values():
        if not path.exists():
            raise ReportError(f"{path} missing")

    # ---- sizes
    sec = {b: section_table(p) for b, p in elf.items()}
    print(f"\n== size ({TARGET}, bytes)")
    rows = []
    for s in SECTIONS:
        a, b = sec["skeleton"].get(s, (0, 0))[1], sec["demo"].get(s, (0, 0))[1]
        rows.append((s, a, b, f"{b - a:+d}"))
    table(rows, ("section", "skeleton", "demo", "added"))

    syms = {b: symbols(p) for b, p in elf.items()}
    by = {b: text_by_crate(syms[b]) for b in ("skeleton", "demo")}
    added = sec["demo"][".text"][1] - sec["skeleton"][".text"][1]
    print("\n.text by crate (sum of symbol sizes; LTO inlines across crates, so code")
    print("inlined into the firmware's functions counts for the firmware)")
    rows = []
    for crate in sorted(set(by["skeleton"]) | set(by["demo"]), key=lambda c: -by["demo"].get(c, 0)):
        a, b = by["skeleton"].get(crate, 0), by["demo"].get(crate, 0)
        rows.append((crate, a, b, f"{b - a:+d}", f"{100 * (b - a) / added:.1f} %" if added else "-"))
    table(rows, ("crate", "skeleton", "demo", "added", "of added"))

    print("\n== SMB placement (the static named SMB)")
    rows = []
    for b in ("demo", "demo-bss"):
        name, addr, size, gap, align = smb_placement(elf[b])
        rows.append((b, name, f"{addr:#010x}", size, align, gap))
    table(rows, ("binary", "section", "address", "size", "align", "gap before"))
    demo_smb = smb_placement(elf["demo"])
    if not PSRAM_BASE <= demo_smb[1] < PSRAM_BASE + PSRAM_SIZE:
        raise ReportError(f"demo's SMB at {demo_smb[1]:#x} is not in PSRAM")

    with tempfile.TemporaryDirectory(prefix="shmtrace-fw-") as tmp:
        tmp = Path(tmp)
        # ---- normal runs (icount: deterministic SysTick)
        outs = {}
        for b in ("skeleton", "demo-bss"):
            outs[b] = Output(b, qemu(elf[b], "-icount", "shift=0"))
        mem_file = tmp / "psram"
        outs["demo"] = Output("demo", qemu(
            elf["demo"], "-icount", "shift=0",
            "-object", f"memory-backend-file,id=m,size=16M,mem-path={mem_file},share=on",
            "-machine", "memory-backend=m",
        ))
        if outs["skeleton"].chunks or outs["skeleton"].patches:
            raise ReportError("the skeleton drained data")
        results = {b: check_events(outs[b]) for b in ("demo", "demo-bss")}
        # The host sees the SMB: the last drained chunk's payload is in the file.
        last = outs["demo"].chunks[-1] if outs["demo"].chunks else b""
        payload = last[8:].rstrip(b"\0")
        off = demo_smb[1] - PSRAM_BASE
        with open(mem_file, "rb") as f:
            f.seek(off)
            shared = f.read(demo_smb[2])
        if len(payload) < 4 or payload not in shared:
            raise ReportError("the last drained chunk is not visible in the PSRAM backing file")

        # ---- single-step run
        log = Path(args.keep_log) if args.keep_log else tmp / "exec.log"
        ss_out = Output("demo (single-step)", qemu(elf["demo"], "-singlestep", "-d", "exec,nochain", "-D", str(log)))
        kinds = ss_out.kinds
        windows, per_kind = count_windows(log, syms["demo"], kinds)
        if len(windows) != len(kinds) * ss_out.reps:
            raise ReportError(f"{len(windows)} marker windows in the log, expected {len(kinds) * ss_out.reps}")

    events, setup = results["demo"]
    d = outs["demo"]
    print(f"\n== runs (QEMU mps2-an386, Cortex-M4): exit status 0 for skeleton, demo, demo-bss")
    print(f"demo drained {len(d.chunks)} chunks and {len(d.patches)} patches: {setup} setup packets + "
          + ", ".join(f"{events[k]} {k}" for k in events) + f", as written; 0 lost")
    print(f"its SMB lies at PSRAM offset {off:#x} of the host file QEMU shares; the last chunk's payload is there")
    print(f"RAM the tracer keeps besides the SMB (writer state, commit queue): {d.state} bytes")

    print(f"\n== instructions per event (exact: single-step log between the markers, {ss_out.reps} calls each)")
    base = statistics.median(n for n, _ in per_kind[kinds[0]])
    mean_base = statistics.mean(n for n, _ in per_kind[kinds[0]])
    ticks = d.ticks
    rows = []
    for k in kinds:
        counts = [n for n, _ in per_kind[k]]
        mem = sum(m for _, m in per_kind[k])
        med = statistics.median(counts)
        net_mean = statistics.mean(counts) - mean_base
        tick_mean = (ticks[k] - ticks[kinds[0]]) * INSNS_PER_TICK / d.reps
        # Each call's tick count is off by less than one tick.
        if abs(tick_mean - net_mean) > INSNS_PER_TICK:
            raise ReportError(f"{k}: SysTick gives {tick_mean:.0f} instructions per call, single-step {net_mean:.0f}")
        rows.append((k, min(counts), f"{med:g}", max(counts), f"{med - base:g}",
                     f"{100 * mem / sum(counts):.1f} %" if sum(counts) else "-",
                     f"{net_mean:.0f}", f"{tick_mean:.0f}"))
    table(rows, ("kind", "min", "median", "max", "net median", "in mem*", "net mean", "SysTick mean"))
    print(f"net = minus the {kinds[0]} median ({base:g}); SysTick: -icount shift=0, "
          f"{INSNS_PER_TICK} instructions per tick, summed by the firmware (agrees within one tick)")


if __name__ == "__main__":
    try:
        main()
    except ReportError as e:
        print(f"\nfirmware report FAILED: {e}", file=sys.stderr)
        sys.exit(1)
