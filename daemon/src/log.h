// Minimal leveled logging (docs/daemon.md "Logging").
//
// Lines go to stderr (journald adds timestamps and files each line at its
// level under systemd) or, after OpenLogFile, to that file with a UTC
// timestamp and the daemon's pid. Thread-safe: one line per call, written
// with a single write(2) (O_APPEND for the file, so lines never interleave).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <sstream>
#include <string>
#include <string_view>

#include "loaderx/status.h"

namespace loaderx::daemon {

enum class LogLevel : int { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// "debug" | "info" | "warning" | "error"; false if unknown.
bool ParseLogLevel(std::string_view s, LogLevel* out);
void SetLogLevel(LogLevel level);
bool LogEnabled(LogLevel level);
void LogLine(LogLevel level, const std::string& line);

// From now on every line goes to `path` (created 0640, appended to) instead
// of stderr. Call once, before any other thread logs. IOError naming the path.
Status OpenLogFile(const std::string& path);

// Why a client process whose socket hung up went away, as far as the kernel
// still tells: "was killed by signal 9 (SIGKILL)", "exited with status 0",
// "has exited" (already reaped) or "is still running" (it closed the socket
// but lives on). Read from /proc/PID/stat: the exit code is set before the
// process's files are closed, so it is there when the hang-up arrives. The
// kernel shows another user's exit code only to a daemon allowed to ptrace
// it (0 otherwise), so a 0 of a process of another `uid` is "has exited".
std::string PeerFate(pid_t pid, uid_t uid);
inline constexpr const char* kStillRunning = "is still running";

// A flood guard for lines a client can provoke (stderr can block its writer
// when the reader is slow): at most `per_window` lines per `window`, then a
// count of what was suppressed. Not thread-safe (the io thread's).
class LogThrottle {
 public:
  LogThrottle(uint32_t per_window, std::chrono::steady_clock::duration window)
      : per_window_(per_window), window_(window) {}
  // True if a line may be logged now; *suppressed is how many were dropped
  // since the last one allowed.
  bool Allow(uint64_t* suppressed);

 private:
  const uint32_t per_window_;
  const std::chrono::steady_clock::duration window_;
  std::chrono::steady_clock::time_point window_start_{};
  uint32_t allowed_in_window_ = 0;
  uint64_t suppressed_ = 0;
};

}  // namespace loaderx::daemon

// LX_LOG(kInfo) << "session " << id << " opened";
#define LX_LOG(level)                                                                     \
  for (bool _lx_once = ::loaderx::daemon::LogEnabled(::loaderx::daemon::LogLevel::level); \
       _lx_once; _lx_once = false)                                                        \
  ::loaderx::daemon::LogStream(::loaderx::daemon::LogLevel::level).stream()

namespace loaderx::daemon {
class LogStream {
 public:
  explicit LogStream(LogLevel level) : level_(level) {}
  ~LogStream() { LogLine(level_, os_.str()); }
  std::ostringstream& stream() { return os_; }

 private:
  LogLevel level_;
  std::ostringstream os_;
};
}  // namespace loaderx::daemon
