#include "log.h"

#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <utility>

#include "loaderx/fd.h"

namespace loaderx::daemon {

namespace {
// Only ordering needed: none (a level change may be seen slightly late).
std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
// The log file, or -1 (stderr). Set once before other threads log; relaxed
// is enough because thread creation orders it before their first read.
std::atomic<int> g_file{-1};

// "2026-12-01T14:03:07.123Z"
std::string Timestamp() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()) % 1000;
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<int>(ms.count()));
  return buf;
}
}  // namespace

bool ParseLogLevel(std::string_view s, LogLevel* out) {
  if (s == "debug")
    *out = LogLevel::kDebug;
  else if (s == "info")
    *out = LogLevel::kInfo;
  else if (s == "warning")
    *out = LogLevel::kWarning;
  else if (s == "error")
    *out = LogLevel::kError;
  else
    return false;
  return true;
}

void SetLogLevel(LogLevel level) {
  g_level.store(static_cast<int>(level), std::memory_order_relaxed);
}

bool LogEnabled(LogLevel level) {
  return static_cast<int>(level) >= g_level.load(std::memory_order_relaxed);
}

Status OpenLogFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOCTTY, 0640);
  if (fd < 0) return Status::FromErrno(path + ": cannot open log file", errno);
  UniqueFd old(g_file.exchange(fd, std::memory_order_relaxed));  // closes a previous one
  return Status::OK();
}

void LogLine(LogLevel level, const std::string& line) {
  static constexpr const char* kName[] = {"debug: ", "", "warning: ", "error: "};
  const int file = g_file.load(std::memory_order_relaxed);
  std::string out;
  if (file >= 0) {
    // A file has no journal to add time and pid: the line carries them.
    out = Timestamp() + " loaderxd[" + std::to_string(::getpid()) + "]: ";
    out += level == LogLevel::kInfo ? "info: " : kName[static_cast<int>(level)];
  } else {
    // sd-daemon(3) priority prefixes: journald files each line at its level.
    // Only when stderr is the journal (systemd sets JOURNAL_STREAM); a
    // terminal gets plain level names.
    static const bool kJournal = std::getenv("JOURNAL_STREAM") != nullptr;
    static constexpr const char* kPrefix[] = {"<7>", "<6>", "<4>", "<3>"};
    out = kJournal ? kPrefix[static_cast<int>(level)] : "";
    out += "loaderxd: ";
    if (!kJournal) out += kName[static_cast<int>(level)];
  }
  out += line;
  out += '\n';
  ssize_t ignored = ::write(file >= 0 ? file : STDERR_FILENO, out.data(), out.size());
  (void)ignored;
}

std::string PeerFate(pid_t pid, uid_t uid) {
  if (pid <= 0) return "is unknown";
  // Plain read(2): the process may vanish mid-read (ESRCH), which a
  // std::ifstream reports by throwing.
  std::string stat;
  const std::string path = "/proc/" + std::to_string(pid) + "/stat";
  if (UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC)); fd.valid()) {
    char buf[1024];
    ssize_t n;
    while ((n = ::read(fd.get(), buf, sizeof buf)) > 0) stat.append(buf, static_cast<size_t>(n));
    if (n < 0) stat.clear();
  }
  if (stat.empty()) return "has exited";
  // Fields after the command (which may hold spaces and parentheses): from
  // the last ')' on, field 3 is the state, 9 the flags, 52 the exit code.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return "has exited";
  std::istringstream rest(stat.substr(close + 1));
  std::string field;
  std::string state;
  unsigned long flags = 0;
  long exit_code = -1;
  for (int n = 3; rest >> field; ++n) {
    if (n == 3) state = field;
    if (n == 9) flags = std::strtoul(field.c_str(), nullptr, 10);
    if (n == 52) exit_code = std::strtol(field.c_str(), nullptr, 10);
  }
  constexpr unsigned long kPfExiting = 0x4;  // <linux/sched.h> PF_EXITING
  const bool exiting = state == "Z" || state == "X" || (flags & kPfExiting) != 0;
  if (!exiting) return kStillRunning;
  if (exit_code < 0) return "has exited";
  const int sig = static_cast<int>(exit_code & 0x7f);
  if (sig != 0) {
    const char* abbrev = ::sigabbrev_np(sig);
    return "was killed by signal " + std::to_string(sig) +
           (abbrev ? std::string(" (SIG") + abbrev + ")" : std::string());
  }
  const int status = static_cast<int>((exit_code >> 8) & 0xff);
  if (status == 0 && uid != ::geteuid()) return "has exited";
  return "exited with status " + std::to_string(status);
}

bool LogThrottle::Allow(uint64_t* suppressed) {
  const auto now = std::chrono::steady_clock::now();
  if (now - window_start_ > window_) {
    window_start_ = now;
    allowed_in_window_ = 0;
  }
  if (allowed_in_window_ >= per_window_) {
    ++suppressed_;
    return false;
  }
  ++allowed_in_window_;
  *suppressed = std::exchange(suppressed_, 0);
  return true;
}

}  // namespace loaderx::daemon
