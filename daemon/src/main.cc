// loaderxd: the loaderx daemon. See docs/daemon.md.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "config.h"
#include "loaderx/unix_socket.h"
#include "log.h"
#include "server.h"
#include "systemd.h"

namespace {

using loaderx::Result;
using loaderx::Status;
using loaderx::UniqueFd;
using namespace loaderx::daemon;

// Until the daemon detaches, a failure also reaches the terminal when the
// log goes to a file.
bool g_on_terminal_too = false;

int Fail(const Status& st) {
  LogLine(LogLevel::kError, st.ToString());
  if (g_on_terminal_too) std::fprintf(stderr, "loaderxd: error: %s\n", st.ToString().c_str());
  return 1;
}

// Creates the socket's directory if missing: 0755 for root (the socket's own
// 0660 mode and group do the gating), 0700 for a user daemon.
Status EnsureSocketDir(const std::string& socket_path) {
  std::filesystem::path dir = std::filesystem::path(socket_path).parent_path();
  if (dir.empty() || std::filesystem::exists(dir)) return Status::OK();
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::IOError(dir.string() + ": " + ec.message());
  ::chmod(dir.c_str(), ::geteuid() == 0 ? 0755 : 0700);
  return Status::OK();
}

// Opens and locks the pid file (the lock is held for the daemon's life, so a
// second daemon with the same pid file is refused naming the first's pid).
// The pid itself is written by WritePid once the daemon has detached.
Result<UniqueFd> LockPidFile(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOCTTY, 0644));
  if (!fd.valid()) return Status::FromErrno(path + ": cannot open pid file", errno);
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    char buf[32] = {};
    ssize_t n = ::pread(fd.get(), buf, sizeof buf - 1, 0);
    std::string other = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
    while (!other.empty() && (other.back() == '\n' || other.back() == ' ')) other.pop_back();
    return Status::AlreadyExists(path + ": pid file is locked by a running loaderxd" +
                                 (other.empty() ? std::string() : " (pid " + other + ")"));
  }
  return fd;
}

Status WritePid(const UniqueFd& fd, const std::string& path) {
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd.get(), 0) != 0 ||
      ::pwrite(fd.get(), pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    return Status::FromErrno(path + ": cannot write pid file", errno);
  }
  return Status::OK();
}

// Classic detach for non-systemd use: the parent returns only once the child
// listens (or failed), so `loaderxd && client` never races the socket.
// Returns the fd the child writes its readiness byte to (-1 in foreground).
int Detach() {
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC) != 0) return -1;
  pid_t pid = ::fork();
  if (pid < 0) return -1;
  if (pid > 0) {
    ::close(pipefd[1]);
    char ok = 0;
    ssize_t n = ::read(pipefd[0], &ok, 1);
    ::_exit(n == 1 && ok == 1 ? 0 : 1);
  }
  ::close(pipefd[0]);
  ::setsid();
  // Nothing of the daemon reaches the terminal that started it any more:
  // log lines go to --log-file (or nowhere; docs/daemon.md "Logging").
  int devnull = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  if (devnull >= 0) {
    ::dup2(devnull, STDIN_FILENO);
    ::dup2(devnull, STDOUT_FILENO);
    ::dup2(devnull, STDERR_FILENO);
    ::close(devnull);
  }
  if (::chdir("/") != 0) {
    // Not fatal: only avoids pinning the working directory's mount.
  }
  return pipefd[1];
}

// The listening socket: the one systemd passed (socket activation), else our
// own at config.socket_path (*own_socket: unlinked at exit).
Result<UniqueFd> Listen(const Config& config, bool* own_socket) {
  LX_ASSIGN_OR_RETURN(std::optional<UniqueFd> activated, TakeListenFd());
  if (activated.has_value()) {
    LX_LOG(kInfo) << "using the socket passed by systemd";
    return std::move(*activated);
  }
  LX_RETURN_IF_ERROR(EnsureSocketDir(config.socket_path));
  LX_ASSIGN_OR_RETURN(UniqueFd listener,
                      loaderx::ListenSeqpacket(config.socket_path, config.socket_mode));
  *own_socket = true;
  return listener;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  std::string help;
  auto parsed = ParseArgs(args, &help);
  if (!help.empty()) {
    std::fputs(help.c_str(), stdout);
    return 0;
  }
  if (!parsed.ok()) {
    std::fprintf(stderr, "loaderxd: %s\n", parsed.status().message().c_str());
    return 2;
  }
  Config config = std::move(parsed).value();
  SetLogLevel(config.log_level);
  // Paths are taken relative to where loaderxd started (it then chdirs to /).
  std::error_code ec;
  for (std::string* p : {&config.log_file, &config.pid_file}) {
    if (!p->empty()) *p = std::filesystem::absolute(*p, ec).string();
  }
  if (config.check_config) {
    std::printf("loaderxd: configuration OK (socket %s, memory limit %llu bytes)\n",
                config.socket_path.c_str(), static_cast<unsigned long long>(config.memory_limit));
    return 0;
  }

  // Both before detaching, so a bad path is reported on the terminal (the
  // pid file first: a second daemon refused for it must not write into the
  // first one's log).
  UniqueFd pid_file;
  if (!config.pid_file.empty()) {
    auto locked = LockPidFile(config.pid_file);
    if (!locked.ok()) return Fail(locked.status());
    pid_file = std::move(locked).value();
  }
  if (!config.log_file.empty()) {
    Status opened = OpenLogFile(config.log_file);
    if (!opened.ok()) return Fail(opened);
    g_on_terminal_too = true;
  }

  bool own_socket = false;
  auto listening = Listen(config, &own_socket);
  if (!listening.ok()) return Fail(listening.status());
  UniqueFd listener = std::move(listening).value();
  const bool under_systemd = std::getenv("NOTIFY_SOCKET") != nullptr;
  int ready_fd = (config.foreground || under_systemd) ? -1 : Detach();
  if (ready_fd >= 0) g_on_terminal_too = false;  // stderr is /dev/null now
  if (pid_file.valid()) {
    Status written = WritePid(pid_file, config.pid_file);
    if (!written.ok()) return Fail(written);
  }

  loaderx::daemon::Server server(config, std::move(listener));
  LX_LOG(kInfo) << "serving on " << config.socket_path << " (protocol " << loaderx::kProtocolMajor
                << "." << loaderx::kProtocolMinor << ", pid " << ::getpid() << ")";
  if (ready_fd >= 0) {
    char ok = 1;
    ssize_t ignored = ::write(ready_fd, &ok, 1);
    (void)ignored;
    ::close(ready_fd);
  }
  (void)Notify("READY=1\nSTATUS=serving on " + config.socket_path);

  // The watchdog keep-alive (WATCHDOG=1 at half the period systemd asked
  // for) is sent by the server's io loop (Server::Impl::Tick), so a stuck io
  // thread gets the daemon restarted.
  Status st = server.Run(/*handle_signals=*/true);
  (void)Notify("STOPPING=1");
  if (own_socket) ::unlink(config.socket_path.c_str());
  if (pid_file.valid()) ::unlink(config.pid_file.c_str());  // still locked: ours
  if (!st.ok()) return Fail(st);
  LX_LOG(kInfo) << "stopped cleanly";
  return 0;
}
