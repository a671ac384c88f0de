// A consumer built on the real Perfetto consumer IPC client: runs one tracing
// session from a binary TraceConfig and writes the trace to a file.
//
//   real-consumer --config PATH --out PATH [--socket PATH]
//                 [--write-into-file] [--timeout-ms N] [--flush-timeout-ms N]
//
// The socket defaults to $PERFETTO_CONSUMER_SOCK_NAME. With
// --write-into-file the service itself streams the trace into --out (the fd is
// passed with EnableTracing; the config must set write_into_file); otherwise
// the consumer reads the buffers when the session ends and writes them.
//
// The session ends when the service ends it (duration_ms, max_file_size_bytes)
// or when the harness says so. Commands, one per line on stdin:
//   flush        Flush (mid-session); reports {"event":"flush","ok":...}
//   read PATH    ReadBuffers now and write what was returned to PATH
//   stop         Flush, then DisableTracing, then read and write --out
//   disable      DisableTracing with no flush first, then read and write --out
// End of stdin means "stop". Progress is reported as JSON lines on stdout:
// connected, started (all data sources started), flush, read, done, error.
// Exit status: 0 done, 2 usage or session error, 3 timeout.
//
//   real-consumer --clone-id N | --clone-name NAME --out PATH [--socket PATH]
//
// instead snapshots a running session with CloneSession (by id or by
// unique_session_name), passing --out as the output descriptor (as
// perfetto_cmd does), and reports {"event":"cloned","success":...,"error":...,
// "uuid_lsb":...,"was_write_into_file":...}; then, unless the service wrote
// the snapshot into --out itself, ReadBuffers into --out and "done". A failed
// clone exits 2 after its "cloned" line.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <deque>

#include "driver_util.h"
#include "perfetto_internal.h"

namespace {

using shmtrace_interop::EmitLine;
using shmtrace_interop::FailWith;
using shmtrace_interop::Flags;
using shmtrace_interop::JsonEscape;

constexpr char kDriver[] = "real-consumer";

bool ReadWholeFile(const std::string& path, std::string* out) {
  FILE* f = fopen(path.c_str(), "rb");
  if (!f)
    return false;
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), f)) > 0)
    out->append(buf, n);
  bool ok = !ferror(f);
  fclose(f);
  return ok;
}

// Serializes packets as a `Trace` proto: field 1 preamble + payload each.
bool WritePackets(const std::string& path,
                  std::vector<perfetto::TracePacket>* packets,
                  uint64_t* bytes) {
  FILE* f = fopen(path.c_str(), "wb");
  if (!f)
    return false;
  bool ok = true;
  *bytes = 0;
  for (perfetto::TracePacket& packet : *packets) {
    char* preamble;
    size_t preamble_size;
    std::tie(preamble, preamble_size) = packet.GetProtoPreamble();
    ok = ok && fwrite(preamble, 1, preamble_size, f) == preamble_size;
    *bytes += preamble_size;
    for (const perfetto::Slice& slice : packet.slices()) {
      ok = ok && fwrite(slice.start, 1, slice.size, f) == slice.size;
      *bytes += slice.size;
    }
  }
  ok = fclose(f) == 0 && ok;
  return ok;
}

class Session : public perfetto::Consumer {
 public:
  Session(perfetto::base::UnixTaskRunner* task_runner,
          perfetto::TraceConfig config,
          std::string out_path,
          bool write_into_file,
          uint32_t flush_timeout_ms)
      : task_runner_(task_runner),
        config_(std::move(config)),
        out_path_(std::move(out_path)),
        write_into_file_(write_into_file),
        flush_timeout_ms_(flush_timeout_ms) {}

  // Clone mode: snapshot session `tsid` (if not 0) or `name` instead.
  void SetClone(uint64_t tsid, std::string name) {
    cloning_ = true;
    clone_tsid_ = tsid;
    clone_name_ = std::move(name);
  }

  void Connect(const std::string& socket) {
    endpoint_ =
        perfetto::ConsumerIPCClient::Connect(socket.c_str(), this, task_runner_);
  }

  int exit_code() const { return exit_code_; }

  // A line from stdin, or EOF (`eof`), which means "stop".
  void OnCommand(const std::string& line, bool eof) {
    if (eof) {
      pending_.push_back("stop");
    } else if (!line.empty()) {
      pending_.push_back(line);
    }
    RunPendingCommands();
  }

  void Fail(const std::string& message, int code) {
    if (finished_)
      return;
    finished_ = true;
    exit_code_ = code;
    FailWith(kDriver, message);
    task_runner_->Quit();
  }

  // perfetto::Consumer:
  void OnConnect() override {
    connected_ = true;
    EmitLine("{\"event\":\"connected\"}");
    if (cloning_)
      return StartClone();
    endpoint_->ObserveEvents(
        perfetto::ObservableEvents::TYPE_ALL_DATA_SOURCES_STARTED);
    if (write_into_file_) {
      int fd = open(out_path_.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC,
                    0644);
      if (fd < 0)
        return Fail("cannot create " + out_path_, 2);
      endpoint_->EnableTracing(config_, perfetto::base::ScopedFile(fd));
    } else {
      endpoint_->EnableTracing(config_);
    }
    enabled_ = true;
    RunPendingCommands();
  }

  void OnDisconnect() override {
    Fail(connected_ ? "the service closed the consumer connection"
                    : "cannot connect to the consumer socket",
         2);
  }

  void OnTracingDisabled(const std::string& error) override {
    if (!error.empty())
      return Fail("tracing session failed: " + error, 2);
    disabled_ = true;
    if (write_into_file_) {
      struct stat st {};
      uint64_t size =
          stat(out_path_.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size)
                                            : 0;
      return Finish(size);
    }
    // A mid-session read still in flight starts the final one when it ends.
    if (!reading_)
      StartFinalRead();
  }

  void OnTraceData(std::vector<perfetto::TracePacket> packets,
                   bool has_more) override {
    for (perfetto::TracePacket& packet : packets)
      read_packets_.push_back(std::move(packet));
    if (has_more)
      return;
    uint64_t bytes = 0;
    size_t count = read_packets_.size();
    if (!WritePackets(read_path_, &read_packets_, &bytes))
      return Fail("cannot write " + read_path_, 2);
    read_packets_.clear();
    reading_ = false;
    if (final_read_)
      return Finish(bytes, count);
    EmitLine("{\"event\":\"read\",\"path\":\"" + JsonEscape(read_path_) +
             "\",\"packets\":" + std::to_string(count) +
             ",\"bytes\":" + std::to_string(bytes) + "}");
    busy_ = false;
    if (disabled_)
      return StartFinalRead();
    RunPendingCommands();
  }

  void OnSessionCloned(const OnSessionClonedArgs& args) override {
    EmitLine(std::string("{\"event\":\"cloned\",\"success\":") +
             (args.success ? "true" : "false") + ",\"error\":\"" +
             JsonEscape(args.error) + "\",\"uuid_lsb\":" +
             std::to_string(args.uuid.lsb()) + ",\"was_write_into_file\":" +
             (args.was_write_into_file ? "true" : "false") + "}");
    if (!args.success)
      return Fail("CloneSession failed: " + args.error, 2);
    if (args.was_write_into_file) {
      struct stat st {};
      uint64_t size =
          stat(out_path_.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size)
                                            : 0;
      return Finish(size);
    }
    StartFinalRead();
  }

  void OnDetach(bool) override {}
  void OnAttach(bool, const perfetto::TraceConfig&) override {}
  void OnTraceStats(bool, const perfetto::TraceStats&) override {}

  void OnObservableEvents(const perfetto::ObservableEvents& events) override {
    if (events.all_data_sources_started())
      EmitLine("{\"event\":\"started\"}");
  }

 private:
  void RunPendingCommands() {
    while (enabled_ && !busy_ && !finished_ && !stopping_ &&
           !pending_.empty()) {
      std::string command = pending_.front();
      pending_.pop_front();
      if (disabled_) {
        // The service already ended the session; the final read is underway.
        continue;
      }
      if (command == "flush") {
        busy_ = true;
        endpoint_->Flush(flush_timeout_ms_, [this](bool ok) {
          EmitLine(std::string("{\"event\":\"flush\",\"ok\":") +
                   (ok ? "true" : "false") + "}");
          busy_ = false;
          RunPendingCommands();
        });
      } else if (command.rfind("read ", 0) == 0) {
        if (write_into_file_) {
          Fail("'read' is not available with --write-into-file", 2);
          return;
        }
        busy_ = true;
        StartRead(command.substr(5));
      } else if (command == "stop") {
        stopping_ = true;
        endpoint_->Flush(flush_timeout_ms_, [this](bool ok) {
          EmitLine(std::string("{\"event\":\"flush\",\"ok\":") +
                   (ok ? "true" : "false") + ",\"final\":true}");
          endpoint_->DisableTracing();
        });
      } else if (command == "disable") {
        // What the producers hold reaches the session only if they commit
        // it when their data source stops.
        stopping_ = true;
        endpoint_->DisableTracing();
      } else {
        Fail("unknown command '" + command + "'", 2);
        return;
      }
    }
  }

  void StartClone() {
    int fd =
        open(out_path_.c_str(), O_CREAT | O_TRUNC | O_RDWR | O_CLOEXEC, 0644);
    if (fd < 0)
      return Fail("cannot create " + out_path_, 2);
    perfetto::ConsumerEndpoint::CloneSessionArgs args;
    args.tsid = clone_tsid_;
    args.unique_session_name = clone_name_;
    args.output_file_fd = perfetto::base::ScopedFile(fd);
    endpoint_->CloneSession(std::move(args));
  }

  void StartRead(const std::string& path) {
    reading_ = true;
    read_path_ = path;
    endpoint_->ReadBuffers();
  }

  void StartFinalRead() {
    final_read_ = true;
    StartRead(out_path_);
  }

  void Finish(uint64_t bytes, size_t packets = 0) {
    if (finished_)
      return;
    finished_ = true;
    exit_code_ = 0;
    EmitLine("{\"event\":\"done\",\"path\":\"" + JsonEscape(out_path_) +
             "\",\"packets\":" + std::to_string(packets) +
             ",\"bytes\":" + std::to_string(bytes) + "}");
    task_runner_->Quit();
  }

  perfetto::base::UnixTaskRunner* task_runner_;
  perfetto::TraceConfig config_;
  std::string out_path_;
  bool write_into_file_;
  uint32_t flush_timeout_ms_;
  std::unique_ptr<perfetto::TracingService::ConsumerEndpoint> endpoint_;
  std::deque<std::string> pending_;
  std::vector<perfetto::TracePacket> read_packets_;
  std::string read_path_;
  bool connected_ = false;
  bool enabled_ = false;
  bool busy_ = false;
  bool reading_ = false;
  bool stopping_ = false;
  bool disabled_ = false;
  bool final_read_ = false;
  bool finished_ = false;
  bool cloning_ = false;
  uint64_t clone_tsid_ = 0;
  std::string clone_name_;
  int exit_code_ = 2;
};

// Splits stdin into lines and hands them to the session.
class StdinReader {
 public:
  StdinReader(perfetto::base::UnixTaskRunner* task_runner, Session* session)
      : task_runner_(task_runner), session_(session) {}

  void Start() {
    task_runner_->AddFileDescriptorWatch(STDIN_FILENO, [this] { OnReadable(); });
  }

 private:
  void OnReadable() {
    char buf[4096];
    ssize_t n = read(STDIN_FILENO, buf, sizeof(buf));
    if (n <= 0) {
      task_runner_->RemoveFileDescriptorWatch(STDIN_FILENO);
      if (!partial_.empty())
        session_->OnCommand(partial_, false);
      session_->OnCommand("", true);
      return;
    }
    partial_.append(buf, static_cast<size_t>(n));
    size_t newline;
    while ((newline = partial_.find('\n')) != std::string::npos) {
      std::string line = partial_.substr(0, newline);
      partial_.erase(0, newline + 1);
      session_->OnCommand(line, false);
    }
  }

  perfetto::base::UnixTaskRunner* task_runner_;
  Session* session_;
  std::string partial_;
};

}  // namespace

extern "C" int shmtrace_real_consumer_main(int argc, char** argv) {
  Flags flags(argc, argv,
              {"config", "out", "socket", "timeout-ms", "flush-timeout-ms",
               "clone-id", "clone-name"},
              {"write-into-file"});
  uint64_t timeout_ms = flags.U64("timeout-ms", 60000);
  uint64_t flush_timeout_ms = flags.U64("flush-timeout-ms", 10000);
  uint64_t clone_id = flags.U64("clone-id", 0);
  if (!flags.ok())
    return FailWith(kDriver, flags.error());
  const char* env_socket = getenv("PERFETTO_CONSUMER_SOCK_NAME");
  std::string socket = flags.Str("socket", env_socket ? env_socket : "");
  std::string config_path = flags.Str("config", "");
  std::string out_path = flags.Str("out", "");
  std::string clone_name = flags.Str("clone-name", "");
  bool cloning = clone_id != 0 || !clone_name.empty();
  if (socket.empty() || out_path.empty() || config_path.empty() == !cloning ||
      (clone_id != 0 && !clone_name.empty())) {
    return FailWith(kDriver,
                    "--out, a socket (--socket or PERFETTO_CONSUMER_SOCK_NAME) "
                    "and one of --config, --clone-id and --clone-name are "
                    "required");
  }
  perfetto::TraceConfig config;
  bool write_into_file = flags.Has("write-into-file");
  if (!cloning) {
    std::string config_bytes;
    if (!ReadWholeFile(config_path, &config_bytes))
      return FailWith(kDriver, "cannot read " + config_path);
    if (!config.ParseFromArray(config_bytes.data(), config_bytes.size()))
      return FailWith(kDriver, config_path + " is not a valid TraceConfig");
    if (write_into_file != config.write_into_file()) {
      return FailWith(kDriver,
                      "--write-into-file and the config's write_into_file "
                      "must agree");
    }
  }

  perfetto::base::UnixTaskRunner task_runner;
  Session session(&task_runner, std::move(config), out_path, write_into_file,
                  static_cast<uint32_t>(flush_timeout_ms));
  if (cloning)
    session.SetClone(clone_id, clone_name);
  StdinReader stdin_reader(&task_runner, &session);
  stdin_reader.Start();
  session.Connect(socket);
  task_runner.PostDelayedTask(
      [&session, timeout_ms] {
        session.Fail("the session did not end within " +
                         std::to_string(timeout_ms) + " ms",
                     3);
      },
      static_cast<uint32_t>(timeout_ms));
  task_runner.Run();
  return session.exit_code();
}
