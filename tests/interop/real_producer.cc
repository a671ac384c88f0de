// A producer built on the real Perfetto SDK (public C API, system backend):
// registers the `track_event` data source with the categories below and, once
// a session enables them, emits a known mix of track events from N threads.
//
//   real-producer [--socket PATH] [--threads N] [--iterations N] [--phases P]
//                 [--large-kb K] [--large-every M] [--iteration-sleep-us U]
//                 [--shmem-kb S] [--start-timeout-ms T] [--stop-timeout-ms T]
//                 [--fidelity 0|1]
//
// The socket defaults to $PERFETTO_PRODUCER_SOCK_NAME. Each thread runs
// `iterations` iterations per phase; one iteration emits, on the thread's
// track: slice "outer" { slice "inner" { instant "tick", instant "flow_out"
// (starts a flow), instant "flow_in" (terminates it) }, and, every
// `large-every` iterations, instant "large" carrying a `large-kb` KiB string }
// plus one int and one double counter on per-thread counter tracks. Debug
// annotations cover int, string, double, bool, uint and pointer values.
//
// With --fidelity 1 each thread also emits, first in every phase, what the
// producer fidelity test compares with our producer's (interop_producer
// --fidelity 1 emits the same): slice "fidelity" carrying every annotation
// type (and a nested dict and array, written as raw DebugAnnotation fields:
// the C API has no nested arguments), inside it an instant with a dynamic
// name "dyn.<thread>" and an int argument with the dynamic name
// "arg.<thread>", slice "on_named" on the named track "fidelity.named" (id 7,
// child of the process track), slice "on_global" on the named track
// "fidelity.global" (id 3, no parent), slice "flowing" starting a
// process-scoped and a global flow that instant "flow_sink" terminates, an
// int counter on "fidelity.bytes" (unit SIZE_BYTES, multiplier 1024), the
// values -7, INT64_MIN and INT64_MAX on the thread's "interop.int.t<n>", an
// incremental int counter on "fidelity.delta" (unit COUNT) and a double
// counter on "fidelity.fps" (unit_name "fps", categories ["interop.counter"]).
// Then, outside that slice: events at explicit times, each with the uint
// argument "time_base_ns" = b, the SDK's "now" when it starts: instant
// "ts.base" at b (BOOTTIME), slice "ts.slice" from b+3000 (the incremental
// clock type) to b+5000 (BOOTTIME) with an int counter on
// "fidelity.timed" at b+4000 inside it, where a session enables the "slow"
// category "fidelity.earlier" instant "ts.earlier" in it at b+1000 (before
// the previous event), and instant "ts.mono" at MONOTONIC 2 ms after b;
// slice "on_process" on the process track; from the second phase instant
// "on_peer" on the next worker's thread track; slice "on_inner" on the
// nested named tracks process > "fidelity.outer" (id 1, children ordered
// explicitly) > "fidelity.inner" (id 2, rank 5); instant "on_leaf" on the
// global "fidelity.root" (id 4) > "fidelity.leaf" (id 3); instant
// "dyncat.instant" in the dynamic category "interop.dynamic" and slice
// "dyncat.slice" in "interop.cdyn"; in odd phases instant "xflow_out"
// starting a flow that instant "xflow_in" of the previous worker ends in
// the next phase; a double counter on "fidelity.latency" under
// "fidelity.outer" (unit TIME_NS, multiplier 1000) and an int counter on
// "fidelity.thread_counter" under the thread's track.
//
// Between phases the worker threads stay alive (so their trace writers keep
// their current chunks) and the producer waits for a line on stdin. The
// workers exit before the last phase is reported; then the producer waits
// until the session stops (the categories are disabled).
//
// Progress is JSON lines on stdout: {"event":"enabled"}, then per phase
// {"event":"phase", "phase":p, "emitted":{...}} with the cumulative counts of
// what was emitted while the session was enabled, and finally
// {"event":"stopped"}. Exit status: 0 ok, 2 usage error, 3 timeout.

#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "driver_util.h"
#include "perfetto_c.h"

#define INTEROP_CATEGORIES(C)                                    \
  C(cat_interop, "interop", "Nested slices and instants")        \
  C(cat_flow, "interop.flow", "Flow begin and end instants")     \
  C(cat_counter, "interop.counter", "Int and double counters")   \
  C(cat_large, "interop.large", "Instants with huge annotations")   \
  C(cat_earlier, "fidelity.earlier", "An event earlier than the last", "slow")

PERFETTO_TE_CATEGORIES_DEFINE(INTEROP_CATEGORIES)

namespace {

using shmtrace_interop::EmitLine;
using shmtrace_interop::FailWith;
using shmtrace_interop::Flags;
using shmtrace_interop::MonotonicMs;

constexpr char kDriver[] = "real-producer";

// What one thread emitted; summed over threads for the report.
struct Counts {
  uint64_t slice_begin = 0;
  uint64_t slice_end = 0;
  uint64_t instant = 0;
  uint64_t counter_int = 0;
  uint64_t counter_double = 0;
  uint64_t flow_begin = 0;
  uint64_t flow_end = 0;
  uint64_t large = 0;
  uint64_t large_bytes = 0;
  uint64_t arg_int = 0;
  uint64_t arg_uint = 0;
  uint64_t arg_double = 0;
  uint64_t arg_bool = 0;
  uint64_t arg_string = 0;
  uint64_t arg_pointer = 0;
  uint64_t skipped_disabled = 0;

  void Add(const Counts& o) {
    slice_begin += o.slice_begin;
    slice_end += o.slice_end;
    instant += o.instant;
    counter_int += o.counter_int;
    counter_double += o.counter_double;
    flow_begin += o.flow_begin;
    flow_end += o.flow_end;
    large += o.large;
    large_bytes += o.large_bytes;
    arg_int += o.arg_int;
    arg_uint += o.arg_uint;
    arg_double += o.arg_double;
    arg_bool += o.arg_bool;
    arg_string += o.arg_string;
    arg_pointer += o.arg_pointer;
    skipped_disabled += o.skipped_disabled;
  }

  std::string Json() const {
    auto f = [](const char* k, uint64_t v) {
      return std::string("\"") + k + "\":" + std::to_string(v);
    };
    return "{" + f("slice_begin", slice_begin) + "," +
           f("slice_end", slice_end) + "," + f("instant", instant) + "," +
           f("counter_int", counter_int) + "," +
           f("counter_double", counter_double) + "," +
           f("flow_begin", flow_begin) + "," + f("flow_end", flow_end) + "," +
           f("large", large) + "," + f("large_bytes", large_bytes) + "," +
           f("arg_int", arg_int) + "," + f("arg_uint", arg_uint) + "," +
           f("arg_double", arg_double) + "," + f("arg_bool", arg_bool) + "," +
           f("arg_string", arg_string) + "," + f("arg_pointer", arg_pointer) +
           "," + f("skipped_disabled", skipped_disabled) + "}";
  }
};

struct Options {
  uint64_t threads;
  uint64_t iterations;
  uint64_t phases;
  uint64_t large_kb;
  uint64_t large_every;
  uint64_t iteration_sleep_us;
  bool fidelity;
};

bool Enabled(const PerfettoTeCategory& cat) {
  return PERFETTO_TE_IS_CATEGORY_ENABLED(cat);
}

// Hands phases to the workers and collects their counts.
class PhaseGate {
 public:
  explicit PhaseGate(size_t workers) : counts_(workers), tids_(workers) {}

  // Worker side: blocks until phase `phase` may run; false means "exit".
  bool WaitForPhase(uint64_t phase) {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return released_phase_ >= phase || exit_; });
    return released_phase_ >= phase;
  }

  void PhaseDone(size_t worker, const Counts& counts) {
    std::lock_guard<std::mutex> lock(mutex_);
    counts_[worker] = counts;
    done_workers_++;
    cv_.notify_all();
  }

  // Main side: runs one phase and returns the cumulative counts.
  Counts RunPhase(uint64_t phase) {
    std::unique_lock<std::mutex> lock(mutex_);
    done_workers_ = 0;
    released_phase_ = phase;
    cv_.notify_all();
    cv_.wait(lock, [&] { return done_workers_ == counts_.size(); });
    Counts total;
    for (const Counts& c : counts_)
      total.Add(c);
    return total;
  }

  void ReleaseExit() {
    std::lock_guard<std::mutex> lock(mutex_);
    exit_ = true;
    cv_.notify_all();
  }

  // Worker `worker`'s thread id, once it has run a phase (0 before).
  void SetTid(size_t worker, int64_t tid) {
    std::lock_guard<std::mutex> lock(mutex_);
    tids_[worker] = tid;
  }
  int64_t Tid(size_t worker) {
    std::lock_guard<std::mutex> lock(mutex_);
    return tids_[worker];
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  uint64_t released_phase_ = 0;
  size_t done_workers_ = 0;
  bool exit_ = false;
  std::vector<Counts> counts_;
  std::vector<int64_t> tids_;
};

// The --fidelity events (see the top of the file); `pointee` gives the
// pointer annotation a value.
void EmitFidelity(size_t index, uint64_t phase, const int* pointee,
                  Counts* counts) {
  PERFETTO_TE(
      cat_interop, PERFETTO_TE_SLICE_BEGIN("fidelity"),
      PERFETTO_TE_ARG_BOOL("b_true", true), PERFETTO_TE_ARG_BOOL("b_false", false),
      PERFETTO_TE_ARG_INT64("i_neg", -5),
      PERFETTO_TE_ARG_INT64("i_min", INT64_MIN),
      PERFETTO_TE_ARG_UINT64("u_max", UINT64_MAX),
      PERFETTO_TE_ARG_DOUBLE("d_frac", 0.25),
      PERFETTO_TE_ARG_DOUBLE("d_neg", -1.5e300),
      PERFETTO_TE_ARG_STRING("s_text", "text"),
      PERFETTO_TE_ARG_STRING("s_empty", ""),
      PERFETTO_TE_ARG_POINTER("p", reinterpret_cast<uintptr_t>(pointee)),
      // DebugAnnotation: name 10, dict_entries 11, array_values 12,
      // bool 2, int 4, double 5, string 6.
      PERFETTO_TE_PROTO_FIELDS(
          PERFETTO_TE_PROTO_FIELD_NESTED(
              4, PERFETTO_TE_PROTO_FIELD_CSTR(10, "dict"),
              PERFETTO_TE_PROTO_FIELD_NESTED(
                  11, PERFETTO_TE_PROTO_FIELD_CSTR(10, "x"),
                  PERFETTO_TE_PROTO_FIELD_VARINT(4, 1)),
              PERFETTO_TE_PROTO_FIELD_NESTED(
                  11, PERFETTO_TE_PROTO_FIELD_CSTR(10, "label"),
                  PERFETTO_TE_PROTO_FIELD_CSTR(6, "hi"))),
          PERFETTO_TE_PROTO_FIELD_NESTED(
              4, PERFETTO_TE_PROTO_FIELD_CSTR(10, "arr"),
              PERFETTO_TE_PROTO_FIELD_NESTED(
                  12, PERFETTO_TE_PROTO_FIELD_DOUBLE(5, 1.5)),
              PERFETTO_TE_PROTO_FIELD_NESTED(
                  12, PERFETTO_TE_PROTO_FIELD_VARINT(2, 1)))));
  counts->slice_begin++;
  counts->arg_bool += 2;
  counts->arg_int += 2;
  counts->arg_uint++;
  counts->arg_double += 2;
  counts->arg_string += 2;
  counts->arg_pointer++;

  const std::string dyn = "dyn." + std::to_string(index);
  const std::string dyn_arg = "arg." + std::to_string(index);
  PERFETTO_TE(cat_interop, PERFETTO_TE_INSTANT(dyn.c_str()),
              PERFETTO_TE_ARG_INT64(dyn_arg.c_str(), 7));
  counts->instant++;
  counts->arg_int++;

  const uint64_t process = PerfettoTeProcessTrackUuid();
  PERFETTO_TE(cat_interop, PERFETTO_TE_SLICE_BEGIN("on_named"),
              PERFETTO_TE_NAMED_TRACK("fidelity.named", 7, process));
  PERFETTO_TE(cat_interop, PERFETTO_TE_SLICE_END(),
              PERFETTO_TE_NAMED_TRACK("fidelity.named", 7, process));
  counts->slice_begin++;
  counts->slice_end++;
  PERFETTO_TE(cat_interop, PERFETTO_TE_SLICE_BEGIN("on_global"),
              PERFETTO_TE_NAMED_TRACK("fidelity.global", 3,
                                      PerfettoTeGlobalTrackUuid()));
  PERFETTO_TE(cat_interop, PERFETTO_TE_SLICE_END(),
              PERFETTO_TE_NAMED_TRACK("fidelity.global", 3,
                                      PerfettoTeGlobalTrackUuid()));
  counts->slice_begin++;
  counts->slice_end++;

  // Unique per thread and phase, apart from the script's flows.
  const uint64_t flow_id = (uint64_t{0xF1D0} << 32) | (index << 16) | phase;
  PERFETTO_TE(cat_flow, PERFETTO_TE_SLICE_BEGIN("flowing"),
              PERFETTO_TE_FLOW(PerfettoTeProcessScopedFlow(flow_id)),
              PERFETTO_TE_FLOW(PerfettoTeGlobalFlow(flow_id)));
  PERFETTO_TE(cat_flow, PERFETTO_TE_SLICE_END());
  PERFETTO_TE(cat_flow, PERFETTO_TE_INSTANT("flow_sink"),
              PERFETTO_TE_TERMINATING_FLOW(PerfettoTeProcessScopedFlow(flow_id)),
              PERFETTO_TE_TERMINATING_FLOW(PerfettoTeGlobalFlow(flow_id)));
  counts->slice_begin++;
  counts->slice_end++;
  counts->instant++;
  counts->flow_begin += 2;
  counts->flow_end += 2;

  // TrackDescriptor: parent_uuid 5, name 2, counter 8; CounterDescriptor:
  // categories 2, unit 3, unit_multiplier 4, unit_name 6.
  PERFETTO_TE(cat_counter, PERFETTO_TE_COUNTER(), PERFETTO_TE_INT_COUNTER(3),
              PERFETTO_TE_PROTO_TRACK(
                  PerfettoTeCounterTrackUuid("fidelity.bytes", process),
                  PERFETTO_TE_PROTO_FIELD_VARINT(5, process),
                  PERFETTO_TE_PROTO_FIELD_CSTR(2, "fidelity.bytes"),
                  PERFETTO_TE_PROTO_FIELD_NESTED(
                      8, PERFETTO_TE_PROTO_FIELD_VARINT(
                             3, perfetto_protos_CounterDescriptor_UNIT_SIZE_BYTES),
                      PERFETTO_TE_PROTO_FIELD_VARINT(4, 1024))));
  counts->counter_int++;
  // Negative and extreme values on the counter track the matrix's script
  // already described.
  const std::string int_track = "interop.int.t" + std::to_string(index);
  for (int64_t v : {int64_t{-7}, INT64_MIN, INT64_MAX}) {
    PERFETTO_TE(cat_counter, PERFETTO_TE_COUNTER(), PERFETTO_TE_INT_COUNTER(v),
                PERFETTO_TE_COUNTER_TRACK(int_track.c_str(), process));
    counts->counter_int++;
  }
  // CounterDescriptor.is_incremental 5.
  PERFETTO_TE(cat_counter, PERFETTO_TE_COUNTER(), PERFETTO_TE_INT_COUNTER(1),
              PERFETTO_TE_PROTO_TRACK(
                  PerfettoTeCounterTrackUuid("fidelity.delta", process),
                  PERFETTO_TE_PROTO_FIELD_VARINT(5, process),
                  PERFETTO_TE_PROTO_FIELD_CSTR(2, "fidelity.delta"),
                  PERFETTO_TE_PROTO_FIELD_NESTED(
                      8, PERFETTO_TE_PROTO_FIELD_VARINT(
                             3, perfetto_protos_CounterDescriptor_UNIT_COUNT),
                      PERFETTO_TE_PROTO_FIELD_VARINT(5, 1))));
  counts->counter_int++;
  PERFETTO_TE(cat_counter, PERFETTO_TE_COUNTER(),
              PERFETTO_TE_DOUBLE_COUNTER(59.5),
              PERFETTO_TE_PROTO_TRACK(
                  PerfettoTeCounterTrackUuid("fidelity.fps", process),
                  PERFETTO_TE_PROTO_FIELD_VARINT(5, process),
                  PERFETTO_TE_PROTO_FIELD_CSTR(2, "fidelity.fps"),
                  PERFETTO_TE_PROTO_FIELD_NESTED(
                      8, PERFETTO_TE_PROTO_FIELD_CSTR(2, "interop.counter"),
                      PERFETTO_TE_PROTO_FIELD_CSTR(6, "fps"))));
  counts->counter_double++;

  PERFETTO_TE(cat_interop, PERFETTO_TE_SLICE_END());
  counts->slice_end++;
}

uint64_t MonotonicNs() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000u +
         static_cast<uint64_t>(ts.tv_nsec);
}

// Events at explicit times (see the top of the file). The time base `b` is
// the SDK's own "now" (BOOTTIME), read together with MONOTONIC: read again
// while the BOOTTIME reads around the MONOTONIC one lie more than 20 us
// apart, so the MONOTONIC event's offset from `b` is known to 20 us.
void EmitExplicitTimes(Counts* counts) {
  uint64_t b = 0;
  uint64_t mono = 0;
  for (;;) {
    b = PerfettoTeGetTimestamp().value;
    mono = MonotonicNs();
    if (PerfettoTeGetTimestamp().value - b <= 20000)
      break;
  }
  auto at = [](uint32_t clock, uint64_t value) {
    struct PerfettoTeTimestamp ts;
    ts.clock_id = clock;
    ts.value = value;
    return ts;
  };
  const uint32_t kBoot = PERFETTO_TE_TIMESTAMP_TYPE_BOOT;
  const uint32_t kIncr = PERFETTO_TE_TIMESTAMP_TYPE_INCREMENTAL;
  PERFETTO_TE(cat_interop, PERFETTO_TE_INSTANT("ts.base"),
              PERFETTO_TE_TIMESTAMP(at(kBoot, b)),
              PERFETTO_TE_ARG_UINT64("time_base_ns", b));
  PERFETTO_TE(cat_interop, PERFETTO_TE_SLICE_BEGIN("ts.slice"),
              PERFETTO_TE_TIMESTAMP(at(kIncr, b + 3000)),
              PERFETTO_TE_ARG_UINT64("time_base_ns", b));
  // On a counter track this sequence has not described yet.
  PERFETTO_TE(cat_counter, PERFETTO_TE_COUNTER(), PERFETTO_TE_INT_COUNTER(7),
              PERFETTO_TE_COUNTER_TRACK("fidelity.timed",
                                        PerfettoTeProcessTrackUuid()),
              PERFETTO_TE_TIMESTAMP(at(kBoot, b + 4000)),
              PERFETTO_TE_ARG_UINT64("time_base_ns", b));
  PERFETTO_TE(cat_interop, PERFETTO_TE_SLICE_END(),
              PERFETTO_TE_TIMESTAMP(at(kBoot, b + 5000)),
              PERFETTO_TE_ARG_UINT64("time_base_ns", b));
  // Before the previous event on this thread, where a session enables it.
  if (Enabled(cat_earlier)) {
    PERFETTO_TE(cat_earlier, PERFETTO_TE_INSTANT("ts.earlier"),
                PERFETTO_TE_TIMESTAMP(at(kIncr, b + 1000)),
                PERFETTO_TE_ARG_UINT64("time_base_ns", b));
    counts->instant++;
    counts->arg_uint++;
  }
  PERFETTO_TE(cat_interop, PERFETTO_TE_INSTANT("ts.mono"),
              PERFETTO_TE_TIMESTAMP(
                  at(PERFETTO_TE_TIMESTAMP_TYPE_MONOTONIC, mono + 2000000)),
              PERFETTO_TE_ARG_UINT64("time_base_ns", b));
  counts->instant += 2;
  counts->slice_begin++;
  counts->slice_end++;
  counts->counter_int++;
  counts->arg_uint += 5;
  // The events after these run later than all of them (on the sequence's
  // clock), so that "ts.earlier" is the only step back in time.
  while (PerfettoTeGetTimestamp().value <= b + 5000) {
  }
}

// Tracks, dynamic categories, cross-thread flows and counters the rest of the
// --fidelity script leaves out (see the top of the file). `peer_tid` is the
// next worker (`peer`)'s thread id, 0 in the first phase.
void EmitFidelityTracks(size_t index, size_t peer, uint64_t phase,
                        int64_t peer_tid, Counts* counts) {
  const uint64_t process = PerfettoTeProcessTrackUuid();
  PERFETTO_TE(cat_interop, PERFETTO_TE_SLICE_BEGIN("on_process"),
              PERFETTO_TE_NESTED_TRACKS(PERFETTO_TE_NESTED_TRACK_PROCESS()));
  PERFETTO_TE(cat_interop, PERFETTO_TE_SLICE_END(),
              PERFETTO_TE_NESTED_TRACKS(PERFETTO_TE_NESTED_TRACK_PROCESS()));
  counts->slice_begin++;
  counts->slice_end++;
  if (peer_tid != 0) {
    // The C API has no track for another thread: its descriptor by hand,
    // as the C++ SDK's ThreadTrack::ForThread writes it (less the calling
    // thread's name, which that one adds). TrackDescriptor: parent_uuid 5,
    // thread 4; ThreadDescriptor: pid 1, tid 2.
    PERFETTO_TE(cat_interop, PERFETTO_TE_INSTANT("on_peer"),
                PERFETTO_TE_PROTO_TRACK(
                    process ^ static_cast<uint64_t>(peer_tid),
                    PERFETTO_TE_PROTO_FIELD_VARINT(5, process),
                    PERFETTO_TE_PROTO_FIELD_NESTED(
                        4, PERFETTO_TE_PROTO_FIELD_VARINT(1, getpid()),
                        PERFETTO_TE_PROTO_FIELD_VARINT(2, peer_tid))));
    counts->instant++;
  }
#define FIDELITY_OUTER                                           \
  PERFETTO_TE_NESTED_TRACK_PROCESS(),                            \
      PERFETTO_TE_NESTED_TRACK_NAMED_ORDERED(                    \
          "fidelity.outer", 1, 0, PERFETTO_TE_HL_CHILD_ORDERING_EXPLICIT)
#define FIDELITY_INNER                                                    \
  PERFETTO_TE_NESTED_TRACKS(FIDELITY_OUTER,                               \
                            PERFETTO_TE_NESTED_TRACK_NAMED_ORDERED(       \
                                "fidelity.inner", 2, 5,                   \
                                PERFETTO_TE_HL_CHILD_ORDERING_UNKNOWN))
  PERFETTO_TE(cat_interop, PERFETTO_TE_SLICE_BEGIN("on_inner"), FIDELITY_INNER);
  PERFETTO_TE(cat_interop, PERFETTO_TE_SLICE_END(), FIDELITY_INNER);
  counts->slice_begin++;
  counts->slice_end++;
  PERFETTO_TE(cat_interop, PERFETTO_TE_INSTANT("on_leaf"),
              PERFETTO_TE_NESTED_TRACKS(
                  PERFETTO_TE_NESTED_TRACK_NAMED("fidelity.root", 4),
                  PERFETTO_TE_NESTED_TRACK_NAMED("fidelity.leaf", 3)));
  counts->instant++;

  PERFETTO_TE(PERFETTO_TE_DYNAMIC_CATEGORY, PERFETTO_TE_INSTANT("dyncat.instant"),
              PERFETTO_TE_DYNAMIC_CATEGORY_STRING("interop.dynamic"));
  PERFETTO_TE(PERFETTO_TE_DYNAMIC_CATEGORY, PERFETTO_TE_SLICE_BEGIN("dyncat.slice"),
              PERFETTO_TE_DYNAMIC_CATEGORY_STRING("interop.cdyn"));
  PERFETTO_TE(PERFETTO_TE_DYNAMIC_CATEGORY, PERFETTO_TE_SLICE_END(),
              PERFETTO_TE_DYNAMIC_CATEGORY_STRING("interop.cdyn"));
  counts->instant++;
  counts->slice_begin++;
  counts->slice_end++;

  // A flow begun in an odd phase ends on another thread in the following
  // phase: the one whose next worker began it.
  const uint64_t kCross = uint64_t{0xC805} << 32;
  if (phase % 2 == 1) {
    PERFETTO_TE(cat_flow, PERFETTO_TE_INSTANT("xflow_out"),
                PERFETTO_TE_FLOW(PerfettoTeProcessScopedFlow(
                    kCross | (uint64_t{index} << 16) | phase)));
    counts->flow_begin++;
  } else {
    PERFETTO_TE(cat_flow, PERFETTO_TE_INSTANT("xflow_in"),
                PERFETTO_TE_TERMINATING_FLOW(PerfettoTeProcessScopedFlow(
                    kCross | (uint64_t{peer} << 16) | (phase - 1))));
    counts->flow_end++;
  }
  counts->instant++;

  // CounterDescriptor: unit 3, unit_multiplier 4.
  PERFETTO_TE(cat_counter, PERFETTO_TE_COUNTER(), PERFETTO_TE_DOUBLE_COUNTER(2.5),
              PERFETTO_TE_NESTED_TRACKS(
                  FIDELITY_OUTER,
                  PERFETTO_TE_NESTED_TRACK_PROTO(
                      PerfettoTeCounterTrackUuid("fidelity.latency", 0),
                      PERFETTO_TE_PROTO_FIELD_CSTR(2, "fidelity.latency"),
                      PERFETTO_TE_PROTO_FIELD_NESTED(
                          8, PERFETTO_TE_PROTO_FIELD_VARINT(
                                 3, perfetto_protos_CounterDescriptor_UNIT_TIME_NS),
                          PERFETTO_TE_PROTO_FIELD_VARINT(4, 1000)))));
  counts->counter_double++;
  PERFETTO_TE(cat_counter, PERFETTO_TE_COUNTER(), PERFETTO_TE_INT_COUNTER(42),
              PERFETTO_TE_COUNTER_TRACK("fidelity.thread_counter",
                                        PerfettoTeThreadTrackUuid()));
  counts->counter_int++;
#undef FIDELITY_INNER
#undef FIDELITY_OUTER
}

void Worker(size_t index, const Options& opt, PhaseGate* gate) {
  Counts counts;
  const std::string thread_label = "worker-" + std::to_string(index);
  // Named like our driver's threads, so their track descriptors agree.
  pthread_setname_np(pthread_self(), thread_label.c_str());
  const std::string int_track = "interop.int.t" + std::to_string(index);
  const std::string double_track = "interop.double.t" + std::to_string(index);
  std::string blob;
  if (opt.large_kb > 0) {
    blob.resize(opt.large_kb * 1024);
    for (size_t i = 0; i < blob.size(); i++)
      blob[i] = static_cast<char>('a' + (i * 7 + index) % 26);
  }
  int pointee = 0;
  uint64_t iteration = 0;
  const size_t peer = (index + 1) % opt.threads;
  for (uint64_t phase = 1; gate->WaitForPhase(phase); phase++) {
    gate->SetTid(index, PerfettoGetThreadId());
    if (opt.fidelity && Enabled(cat_interop)) {
      EmitFidelity(index, phase, &pointee, &counts);
      EmitExplicitTimes(&counts);
      EmitFidelityTracks(index, peer, phase, phase > 1 ? gate->Tid(peer) : 0,
                         &counts);
    }
    for (uint64_t i = 0; i < opt.iterations; i++, iteration++) {
      // Everything below is emitted only while the session is enabled, so
      // the counts are exactly what reached the SDK's trace writers. The
      // category check and PERFETTO_TE's own check could only disagree if
      // the session stopped in between, which the tests never do mid-phase.
      if (!Enabled(cat_interop)) {
        counts.skipped_disabled++;
        continue;
      }
      const int64_t iter = static_cast<int64_t>(iteration);
      PERFETTO_TE(cat_interop, PERFETTO_TE_SLICE_BEGIN("outer"),
                  PERFETTO_TE_ARG_INT64("iter", iter),
                  PERFETTO_TE_ARG_STRING("thread", thread_label.c_str()));
      counts.slice_begin++;
      counts.arg_int++;
      counts.arg_string++;

      PERFETTO_TE(cat_interop, PERFETTO_TE_SLICE_BEGIN("inner"),
                  PERFETTO_TE_ARG_DOUBLE("ratio", iter / 4.0),
                  PERFETTO_TE_ARG_BOOL("even", iter % 2 == 0),
                  PERFETTO_TE_ARG_UINT64("big", 0xFFFFFFFF00000000ull + iter));
      counts.slice_begin++;
      counts.arg_double++;
      counts.arg_bool++;
      counts.arg_uint++;

      PERFETTO_TE(cat_interop, PERFETTO_TE_INSTANT("tick"),
                  PERFETTO_TE_ARG_POINTER(
                      "ptr", reinterpret_cast<uintptr_t>(&pointee)));
      counts.instant++;
      counts.arg_pointer++;

      const uint64_t flow = (static_cast<uint64_t>(index) << 32) | iteration;
      PERFETTO_TE(cat_flow, PERFETTO_TE_INSTANT("flow_out"),
                  PERFETTO_TE_FLOW(PerfettoTeProcessScopedFlow(flow)));
      counts.instant++;
      counts.flow_begin++;
      PERFETTO_TE(cat_flow, PERFETTO_TE_INSTANT("flow_in"),
                  PERFETTO_TE_TERMINATING_FLOW(PerfettoTeProcessScopedFlow(flow)));
      counts.instant++;
      counts.flow_end++;

      if (opt.large_kb > 0 && opt.large_every > 0 &&
          iteration % opt.large_every == 0) {
        PERFETTO_TE(cat_large, PERFETTO_TE_INSTANT("large"),
                    PERFETTO_TE_ARG_STRING("blob", blob.c_str()));
        counts.instant++;
        counts.large++;
        counts.large_bytes += blob.size();
        counts.arg_string++;
      }

      PERFETTO_TE(cat_interop, PERFETTO_TE_SLICE_END());
      counts.slice_end++;
      PERFETTO_TE(cat_interop, PERFETTO_TE_SLICE_END());
      counts.slice_end++;

      PERFETTO_TE(cat_counter, PERFETTO_TE_COUNTER(),
                  PERFETTO_TE_INT_COUNTER(iter * 3),
                  PERFETTO_TE_COUNTER_TRACK(int_track.c_str(),
                                            PerfettoTeProcessTrackUuid()));
      counts.counter_int++;
      PERFETTO_TE(cat_counter, PERFETTO_TE_COUNTER(),
                  PERFETTO_TE_DOUBLE_COUNTER(iter * 0.5),
                  PERFETTO_TE_COUNTER_TRACK(double_track.c_str(),
                                            PerfettoTeProcessTrackUuid()));
      counts.counter_double++;

      if (opt.iteration_sleep_us > 0)
        usleep(static_cast<useconds_t>(opt.iteration_sleep_us));
    }
    gate->PhaseDone(index, counts);
  }
}

bool WaitUntil(bool want_enabled, uint64_t timeout_ms) {
  const uint64_t deadline = MonotonicMs() + timeout_ms;
  while (Enabled(cat_interop) != want_enabled) {
    if (MonotonicMs() > deadline)
      return false;
    usleep(1000);
  }
  return true;
}

}  // namespace

extern "C" int shmtrace_real_producer_main(int argc, char** argv) {
  Flags flags(argc, argv,
              {"socket", "threads", "iterations", "phases", "large-kb",
               "large-every", "iteration-sleep-us", "shmem-kb",
               "start-timeout-ms", "stop-timeout-ms", "fidelity"},
              {});
  Options opt;
  opt.threads = flags.U64("threads", 1);
  opt.iterations = flags.U64("iterations", 100);
  opt.phases = flags.U64("phases", 1);
  opt.large_kb = flags.U64("large-kb", 0);
  opt.large_every = flags.U64("large-every", 10);
  opt.iteration_sleep_us = flags.U64("iteration-sleep-us", 0);
  opt.fidelity = flags.U64("fidelity", 0) != 0;
  uint64_t shmem_kb = flags.U64("shmem-kb", 0);
  uint64_t start_timeout_ms = flags.U64("start-timeout-ms", 30000);
  uint64_t stop_timeout_ms = flags.U64("stop-timeout-ms", 30000);
  if (!flags.ok())
    return FailWith(kDriver, flags.error());
  if (opt.threads == 0 || opt.threads > 64 || opt.phases == 0)
    return FailWith(kDriver, "--threads must be 1..64 and --phases >= 1");
  if (shmem_kb % 4 != 0)
    return FailWith(kDriver, "--shmem-kb must be a multiple of 4");
  if (flags.Has("socket"))
    setenv("PERFETTO_PRODUCER_SOCK_NAME", flags.Str("socket", "").c_str(), 1);
  if (!getenv("PERFETTO_PRODUCER_SOCK_NAME"))
    return FailWith(kDriver, "--socket or PERFETTO_PRODUCER_SOCK_NAME needed");

  struct PerfettoProducerInitArgs args = PERFETTO_PRODUCER_INIT_ARGS_INIT();
  args.backends = PERFETTO_BACKEND_SYSTEM;
  args.shmem_size_hint_kb = static_cast<uint32_t>(shmem_kb);
  PerfettoProducerInit(args);
  PerfettoTeInit();
  PERFETTO_TE_REGISTER_CATEGORIES(INTEROP_CATEGORIES);

  if (!WaitUntil(true, start_timeout_ms)) {
    FailWith(kDriver, "no session enabled the categories within " +
                          std::to_string(start_timeout_ms) + " ms");
    return 3;
  }
  EmitLine("{\"event\":\"enabled\",\"pid\":" + std::to_string(getpid()) + "}");

  PhaseGate gate(opt.threads);
  std::vector<std::thread> workers;
  for (size_t i = 0; i < opt.threads; i++)
    workers.emplace_back(Worker, i, std::cref(opt), &gate);
  for (uint64_t phase = 1; phase <= opt.phases; phase++) {
    if (phase > 1) {
      // Wait for the harness to say "next": any line. At end of input the
      // remaining phases run back to back.
      char line[256];
      char* got = fgets(line, sizeof(line), stdin);
      (void)got;
    }
    Counts total = gate.RunPhase(phase);
    if (phase == opt.phases) {
      // The workers exit before the last phase is reported: their trace
      // writers are destroyed and commit their last chunks first, so a
      // stop the harness sends after the report comes after those commits
      // (under shmem emulation nothing can fetch them otherwise).
      gate.ReleaseExit();
      for (std::thread& t : workers)
        t.join();
    }
    EmitLine("{\"event\":\"phase\",\"phase\":" + std::to_string(phase) +
             ",\"threads\":" + std::to_string(opt.threads) +
             ",\"emitted\":" + total.Json() + "}");
  }

  if (!WaitUntil(false, stop_timeout_ms)) {
    FailWith(kDriver, "the session did not stop within " +
                          std::to_string(stop_timeout_ms) + " ms");
    return 3;
  }
  EmitLine("{\"event\":\"stopped\"}");
  return 0;
}
