// The real Perfetto tracing service (what `traced` runs), listening on a
// producer and a consumer socket.
//
//   real-service [--producer-socket PATH] [--consumer-socket PATH]
//                [--exit-on-stdin-eof] [--enable-relay-endpoint]
//
// The producer socket may be a comma-separated list (say, one TCP address
// per network link), each listened on, as traced splits
// $PERFETTO_PRODUCER_SOCK_NAME (TokenizeProducerSockets). With
// --enable-relay-endpoint each also exposes the RelayPort service (what
// relays of other machines call), as traced's flag of the same name does.
// Socket paths default to $PERFETTO_PRODUCER_SOCK_NAME and
// $PERFETTO_CONSUMER_SOCK_NAME; one of the two must name each. Prints
// {"event":"ready"} once both sockets listen, then serves until killed or,
// with --exit-on-stdin-eof, until its stdin reaches end of input: a harness
// that holds the other end of a pipe can never leave the service behind,
// even when the harness itself is killed.

#include <unistd.h>

#include <list>

#include "driver_util.h"
#include "perfetto_internal.h"

namespace {

using shmtrace_interop::EmitLine;
using shmtrace_interop::FailWith;
using shmtrace_interop::Flags;

constexpr char kDriver[] = "real-service";

std::string FromEnv(const char* name) {
  const char* value = getenv(name);
  return value ? value : "";
}

}  // namespace

extern "C" int shmtrace_real_service_main(int argc, char** argv) {
  Flags flags(argc, argv, {"producer-socket", "consumer-socket"},
              {"exit-on-stdin-eof", "enable-relay-endpoint"});
  if (!flags.ok())
    return FailWith(kDriver, flags.error());
  std::string producer_socket =
      flags.Str("producer-socket", FromEnv("PERFETTO_PRODUCER_SOCK_NAME"));
  std::string consumer_socket =
      flags.Str("consumer-socket", FromEnv("PERFETTO_CONSUMER_SOCK_NAME"));
  if (producer_socket.empty() || consumer_socket.empty()) {
    return FailWith(kDriver,
                    "both a producer and a consumer socket are needed "
                    "(--producer-socket/--consumer-socket or "
                    "PERFETTO_PRODUCER_SOCK_NAME/PERFETTO_CONSUMER_SOCK_NAME)");
  }

  perfetto::base::UnixTaskRunner task_runner;
  std::unique_ptr<perfetto::ServiceIPCHost> host =
      perfetto::ServiceIPCHost::CreateInstance(&task_runner);
  std::list<perfetto::ListenEndpoint> producer_endpoints;
  for (const std::string& name :
       perfetto::TokenizeProducerSockets(producer_socket.c_str())) {
    producer_endpoints.emplace_back(name);
    producer_endpoints.back().expose_relay_endpoint =
        flags.Has("enable-relay-endpoint");
  }
  if (!host->Start(std::move(producer_endpoints),
                   perfetto::ListenEndpoint(consumer_socket))) {
    return FailWith(kDriver, "cannot listen on " + producer_socket + " and " +
                                 consumer_socket);
  }
  if (flags.Has("exit-on-stdin-eof")) {
    task_runner.AddFileDescriptorWatch(STDIN_FILENO, [&task_runner] {
      char buf[256];
      if (read(STDIN_FILENO, buf, sizeof(buf)) <= 0) {
        task_runner.RemoveFileDescriptorWatch(STDIN_FILENO);
        task_runner.Quit();
      }
    });
  }
  EmitLine("{\"event\":\"ready\"}");
  task_runner.Run();
  return 0;
}
