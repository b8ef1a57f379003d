// Minimal leveled logging to stderr (journald adds timestamps under systemd).
// Thread-safe: one line per call, written with a single write(2).
#pragma once

#include <sstream>
#include <string>
#include <string_view>

namespace loaderx::daemon {

enum class LogLevel : int { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// "debug" | "info" | "warning" | "error"; false if unknown.
bool ParseLogLevel(std::string_view s, LogLevel* out);
void SetLogLevel(LogLevel level);
bool LogEnabled(LogLevel level);
void LogLine(LogLevel level, const std::string& line);

}  // namespace loaderx::daemon

// LX_LOG(kInfo) << "session " << id << " opened";
#define LX_LOG(level)                                                                    \
  for (bool _lx_once = ::loaderx::daemon::LogEnabled(::loaderx::daemon::LogLevel::level); \
       _lx_once; _lx_once = false)                                                       \
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
