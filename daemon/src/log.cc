#include "log.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>

namespace loaderx::daemon {

namespace {
// Only ordering needed: none (a level change may be seen slightly late).
std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
}  // namespace

bool ParseLogLevel(std::string_view s, LogLevel* out) {
  if (s == "debug") *out = LogLevel::kDebug;
  else if (s == "info") *out = LogLevel::kInfo;
  else if (s == "warning") *out = LogLevel::kWarning;
  else if (s == "error") *out = LogLevel::kError;
  else return false;
  return true;
}

void SetLogLevel(LogLevel level) { g_level.store(static_cast<int>(level), std::memory_order_relaxed); }

bool LogEnabled(LogLevel level) {
  return static_cast<int>(level) >= g_level.load(std::memory_order_relaxed);
}

void LogLine(LogLevel level, const std::string& line) {
  // sd-daemon(3) priority prefixes: journald files each line at its level.
  // Only when stderr is the journal (systemd sets JOURNAL_STREAM); a
  // terminal gets plain level names.
  static const bool kJournal = std::getenv("JOURNAL_STREAM") != nullptr;
  static constexpr const char* kPrefix[] = {"<7>", "<6>", "<4>", "<3>"};
  static constexpr const char* kName[] = {"debug: ", "", "warning: ", "error: "};
  std::string out = kJournal ? kPrefix[static_cast<int>(level)] : "";
  out += "loaderxd: ";
  if (!kJournal) out += kName[static_cast<int>(level)];
  out += line;
  out += '\n';
  ssize_t ignored = ::write(STDERR_FILENO, out.data(), out.size());
  (void)ignored;
}

}  // namespace loaderx::daemon
