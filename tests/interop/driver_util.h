// Small helpers shared by the interop drivers: command-line flags, monotonic
// time, JSON event lines on stdout. Only the C++ standard library.
#ifndef SHMTRACE_INTEROP_DRIVER_UTIL_H_
#define SHMTRACE_INTEROP_DRIVER_UTIL_H_

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <map>
#include <set>
#include <string>

namespace shmtrace_interop {

// `--name value` / `--name=value` flags plus bare boolean `--name` switches.
// Unknown flags are an error so a typo in a test never goes unnoticed.
class Flags {
 public:
  // `valued` and `switches` list the accepted flag names (without "--").
  Flags(int argc, char** argv, const std::set<std::string>& valued,
        const std::set<std::string>& switches) {
    for (int i = 1; i < argc; i++) {
      std::string arg = argv[i];
      if (arg.rfind("--", 0) != 0) {
        Fail("unexpected argument '" + arg + "'");
        return;
      }
      std::string name = arg.substr(2);
      std::string value;
      bool has_value = false;
      size_t eq = name.find('=');
      if (eq != std::string::npos) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
        has_value = true;
      }
      if (switches.count(name)) {
        if (has_value) {
          Fail("--" + name + " takes no value");
          return;
        }
        values_[name] = "1";
      } else if (valued.count(name)) {
        if (!has_value) {
          if (i + 1 >= argc) {
            Fail("--" + name + " needs a value");
            return;
          }
          value = argv[++i];
        }
        values_[name] = value;
      } else {
        Fail("unknown flag --" + name);
        return;
      }
    }
  }

  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  bool Has(const std::string& name) const { return values_.count(name) != 0; }

  std::string Str(const std::string& name, const std::string& fallback) const {
    auto it = values_.find(name);
    return it == values_.end() ? fallback : it->second;
  }

  // Parses an unsigned decimal flag; records an error on garbage.
  uint64_t U64(const std::string& name, uint64_t fallback) {
    auto it = values_.find(name);
    if (it == values_.end())
      return fallback;
    char* end = nullptr;
    unsigned long long v = strtoull(it->second.c_str(), &end, 10);
    if (it->second.empty() || *end != '\0' || it->second[0] == '-') {
      Fail("--" + name + " wants an unsigned integer, got '" + it->second +
           "'");
      return fallback;
    }
    return static_cast<uint64_t>(v);
  }

 private:
  void Fail(const std::string& message) {
    if (error_.empty())
      error_ = message;
  }

  std::map<std::string, std::string> values_;
  std::string error_;
};

inline uint64_t MonotonicMs() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000u +
         static_cast<uint64_t>(ts.tv_nsec) / 1000000u;
}

// Escapes a string for a JSON string literal (without the quotes).
inline std::string JsonEscape(const std::string& in) {
  std::string out;
  for (char c : in) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out;
}

// Writes one line (a complete JSON object) to stdout and flushes it: the test
// harness reads these lines as the driver's progress reports.
inline void EmitLine(const std::string& json_object) {
  fprintf(stdout, "%s\n", json_object.c_str());
  fflush(stdout);
}

// Reports a fatal usage or runtime error in the same line format, and on
// stderr for humans. Returns the exit code to use.
inline int FailWith(const char* driver, const std::string& message) {
  fprintf(stderr, "%s: error: %s\n", driver, message.c_str());
  EmitLine("{\"event\":\"error\",\"message\":\"" + JsonEscape(message) +
           "\"}");
  return 2;
}

}  // namespace shmtrace_interop

#endif  // SHMTRACE_INTEROP_DRIVER_UTIL_H_
