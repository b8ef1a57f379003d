#include "config.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <map>

#include "loaderx/loader.h"

namespace loaderx::daemon {

namespace {

constexpr const char* kUsage =
    "usage: loaderxd [options]\n"
    "  --socket PATH         listening socket (default: /run/loaderx/loaderxd.sock as root,\n"
    "                        $XDG_RUNTIME_DIR/loaderx/loaderxd.sock otherwise)\n"
    "  --threads N           gather threads per loader (0 = all cores)\n"
    "  --memory-limit SIZE   total shared ring memory, e.g. 8G\n"
    "  --memory-per-uid SIZE ring memory per client uid (default: memory limit)\n"
    "  --sessions-per-uid N  connections per client uid (default 64)\n"
    "  --max-leases N        batches one client may hold at once (default 64)\n"
    "  --max-prefetch N      prefetch cap per loader (default 64)\n"
    "  --max-skew N          steps a group member may run ahead of the slowest (default 8)\n"
    "  --group-prefetch N    cap on a named group's prefetch, 0 = none (default 1)\n"
    "  --group-live-batches N  batches a broadcast group's ring keeps live at once,\n"
    "                        0 = no bound but the skew (default 2)\n"
    "  --socket-mode OCTAL   socket permissions (default 0660)\n"
    "  --gather-nice N       gather threads run N nice levels below the daemon's\n"
    "                        other threads, 0..19 (default 0: same priority)\n"
    "  --group-timeout SECONDS  how long a group member waits for the others before its\n"
    "                        next fails naming them, 0.1..86400 (default 300)\n"
    "  --config FILE         read `key = value` settings (same names, no dashes)\n"
    "  --check-config        validate the configuration and exit\n"
    "  --foreground          do not detach (always the case under systemd)\n"
    "  --log-level LEVEL     debug | info | warning | error (default info)\n"
    "  --log-file PATH       append log lines (with UTC timestamps) to PATH instead of stderr\n"
    "  --pid-file PATH       write the daemon's pid to PATH (locked while it runs)\n"
    "  --help, --version\n";

std::string Fmt(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", x);
  return buf;
}

Result<uint64_t> ParseUint(const std::string& key, const std::string& v, uint64_t max) {
  if (v.empty() || !std::all_of(v.begin(), v.end(), [](char c) {
        return std::isdigit(static_cast<unsigned char>(c));
      })) {
    return Status::InvalidArgument(key + ": '" + v + "' is not a non-negative integer");
  }
  errno = 0;
  unsigned long long x = std::strtoull(v.c_str(), nullptr, 10);
  if (errno == ERANGE || x > max) {
    return Status::InvalidArgument(key + ": " + v + " exceeds " + std::to_string(max));
  }
  return static_cast<uint64_t>(x);
}

// Seconds with an optional fraction ("300", "0.5") in [lo, hi], as ms.
Result<std::chrono::milliseconds> ParseSeconds(const std::string& key, const std::string& v,
                                               double lo, double hi) {
  const bool digits = !v.empty() && v.find_first_not_of("0123456789.") == std::string::npos &&
                      std::count(v.begin(), v.end(), '.') <= 1 && v != ".";
  double x = digits ? std::strtod(v.c_str(), nullptr) : -1;
  if (!digits || x < lo || x > hi) {
    return Status::InvalidArgument(key + ": '" + v + "' is not a number of seconds in " + Fmt(lo) +
                                   ".." + Fmt(hi));
  }
  return std::chrono::milliseconds(std::llround(x * 1000));
}

// Applies one setting. `from_cli` settings are remembered so a file cannot
// override them.
Status Apply(Config& c, const std::string& key, const std::string& v) {
  if (key == "socket") {
    if (v.empty()) return Status::InvalidArgument("socket: empty path");
    c.socket_path = v;
  } else if (key == "threads") {
    LX_ASSIGN_OR_RETURN(uint64_t n, ParseUint(key, v, 1024));
    c.threads = static_cast<uint32_t>(n);
  } else if (key == "memory-limit") {
    LX_ASSIGN_OR_RETURN(c.memory_limit, ParseSize(v));
    if (c.memory_limit < (1u << 20)) return Status::InvalidArgument("memory-limit: below 1M");
  } else if (key == "memory-per-uid") {
    LX_ASSIGN_OR_RETURN(c.memory_per_uid, ParseSize(v));
  } else if (key == "sessions-per-uid") {
    LX_ASSIGN_OR_RETURN(uint64_t n, ParseUint(key, v, 1 << 16));
    if (n == 0) return Status::InvalidArgument("sessions-per-uid: must be >= 1");
    c.sessions_per_uid = static_cast<uint32_t>(n);
  } else if (key == "max-leases") {
    LX_ASSIGN_OR_RETURN(uint64_t n, ParseUint(key, v, 1024));
    if (n == 0) return Status::InvalidArgument("max-leases: must be >= 1");
    c.max_leases = static_cast<uint32_t>(n);
  } else if (key == "max-prefetch") {
    LX_ASSIGN_OR_RETURN(uint64_t n, ParseUint(key, v, 1024));
    if (n == 0) return Status::InvalidArgument("max-prefetch: must be >= 1");
    c.max_prefetch = static_cast<uint32_t>(n);
  } else if (key == "max-skew") {
    LX_ASSIGN_OR_RETURN(uint64_t n, ParseUint(key, v, 1024));
    c.max_skew = static_cast<uint32_t>(n);
  } else if (key == "group-prefetch") {
    LX_ASSIGN_OR_RETURN(uint64_t n, ParseUint(key, v, 1024));
    c.group_prefetch = static_cast<uint32_t>(n);
  } else if (key == "group-live-batches") {
    LX_ASSIGN_OR_RETURN(uint64_t n, ParseUint(key, v, 1024));
    c.group_live_batches = static_cast<uint32_t>(n);
  } else if (key == "gather-nice") {
    LX_ASSIGN_OR_RETURN(uint64_t n, ParseUint(key, v, kMaxGatherNice));
    c.gather_nice = static_cast<int>(n);
  } else if (key == "group-timeout") {
    LX_ASSIGN_OR_RETURN(c.group_timeout, ParseSeconds(key, v, 0.1, 86400));
  } else if (key == "socket-mode") {
    if (v.empty() || v.find_first_not_of("01234567") != std::string::npos || v.size() > 4) {
      return Status::InvalidArgument("socket-mode: '" + v + "' is not an octal mode");
    }
    c.socket_mode = static_cast<mode_t>(std::strtoul(v.c_str(), nullptr, 8)) & 0777;
  } else if (key == "log-file" || key == "pid-file") {
    if (v.empty()) return Status::InvalidArgument(key + ": empty path");
    (key == "log-file" ? c.log_file : c.pid_file) = v;
  } else if (key == "log-level") {
    if (!ParseLogLevel(v, &c.log_level)) {
      return Status::InvalidArgument("log-level: '" + v + "' is not debug|info|warning|error");
    }
  } else {
    return Status::InvalidArgument("unknown setting '" + key + "'");
  }
  return Status::OK();
}

std::string Trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t\r");
  return s.substr(b, e - b + 1);
}

Status ApplyFile(Config& c, const std::string& path,
                 const std::map<std::string, std::string>& cli) {
  std::ifstream in(path);
  if (!in) return Status::NotFound(path + ": cannot open config file");
  std::string line;
  for (int lineno = 1; std::getline(in, line); ++lineno) {
    size_t hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    line = Trim(line);
    if (line.empty()) continue;
    size_t eq = line.find('=');
    if (eq == std::string::npos) {
      return Status::InvalidArgument(path + ":" + std::to_string(lineno) +
                                     ": expected key = value");
    }
    std::string key = Trim(line.substr(0, eq));
    if (cli.count(key)) continue;  // the command line wins
    Status st = Apply(c, key, Trim(line.substr(eq + 1)));
    if (!st.ok()) return st.WithContext(path + ":" + std::to_string(lineno));
  }
  return Status::OK();
}

}  // namespace

Result<uint64_t> ParseSize(const std::string& s) {
  if (s.empty()) return Status::InvalidArgument("size: empty");
  std::string digits = s;
  uint64_t mult = 1;
  switch (std::toupper(static_cast<unsigned char>(s.back()))) {
    case 'K':
      mult = uint64_t{1} << 10;
      break;
    case 'M':
      mult = uint64_t{1} << 20;
      break;
    case 'G':
      mult = uint64_t{1} << 30;
      break;
    case 'T':
      mult = uint64_t{1} << 40;
      break;
    default:
      break;
  }
  if (mult != 1) digits.pop_back();
  LX_ASSIGN_OR_RETURN(uint64_t n,
                      ParseUint("size", digits, std::numeric_limits<uint64_t>::max() / mult));
  return n * mult;
}

Result<std::string> DefaultSocketPath() {
  if (::geteuid() == 0) return std::string("/run/loaderx/loaderxd.sock");
  const char* xdg = std::getenv("XDG_RUNTIME_DIR");
  if (xdg == nullptr || *xdg == '\0') {
    return Status::InvalidArgument("XDG_RUNTIME_DIR is not set; pass --socket PATH");
  }
  return std::string(xdg) + "/loaderx/loaderxd.sock";
}

Result<Config> ParseArgs(const std::vector<std::string>& args, std::string* help) {
  Config c;
  std::map<std::string, std::string> cli;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      *help = kUsage;
      return c;
    }
    if (a == "--version") {
      *help = "loaderxd " LOADERX_DAEMON_VERSION "\n";
      return c;
    }
    if (a == "--foreground") {
      c.foreground = true;
      continue;
    }
    if (a == "--check-config") {
      c.check_config = true;
      continue;
    }
    if (a.rfind("--", 0) != 0) return Status::InvalidArgument("unexpected argument '" + a + "'");
    std::string key = a.substr(2), value;
    size_t eq = key.find('=');
    bool inline_value = eq != std::string::npos;
    if (inline_value) {
      value = key.substr(eq + 1);
      key.resize(eq);
    }
    static const char* const kKnown[] = {
        "socket",         "threads",           "memory-limit", "memory-per-uid", "sessions-per-uid",
        "max-leases",     "max-prefetch",      "max-skew",     "socket-mode",    "log-level",
        "gather-nice",    "group-timeout",     "log-file",     "pid-file",       "config",
        "group-prefetch", "group-live-batches"};
    if (std::find(std::begin(kKnown), std::end(kKnown), key) == std::end(kKnown)) {
      return Status::InvalidArgument("unknown option --" + key + " (see --help)");
    }
    if (!inline_value) {
      if (i + 1 >= args.size()) return Status::InvalidArgument(a + ": missing value");
      value = args[++i];
    }
    if (key == "config") {
      c.config_file = value;
      continue;
    }
    cli[key] = value;
  }
  for (const auto& [k, v] : cli) LX_RETURN_IF_ERROR(Apply(c, k, v));
  if (!c.config_file.empty()) LX_RETURN_IF_ERROR(ApplyFile(c, c.config_file, cli));
  if (c.socket_path.empty()) {
    LX_ASSIGN_OR_RETURN(c.socket_path, DefaultSocketPath());
  }
  if (c.memory_per_uid == 0 || c.memory_per_uid > c.memory_limit) c.memory_per_uid = c.memory_limit;
  return c;
}

}  // namespace loaderx::daemon
