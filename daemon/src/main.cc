// loaderxd: the loaderx daemon. See docs/daemon.md.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "config.h"
#include "log.h"
#include "loaderx/unix_socket.h"
#include "server.h"
#include "systemd.h"

namespace {

using loaderx::Status;
using loaderx::UniqueFd;
using namespace loaderx::daemon;

int Fail(const Status& st) {
  LogLine(LogLevel::kError, st.ToString());
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
  int devnull = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  if (devnull >= 0) {
    ::dup2(devnull, STDIN_FILENO);
    ::close(devnull);
  }
  if (::chdir("/") != 0) {
    // Not fatal: only avoids pinning the working directory's mount.
  }
  return pipefd[1];
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
  if (config.check_config) {
    std::printf("loaderxd: configuration OK (socket %s, memory limit %llu bytes)\n",
                config.socket_path.c_str(), static_cast<unsigned long long>(config.memory_limit));
    return 0;
  }

  auto activated = TakeListenFd();
  if (!activated.ok()) return Fail(activated.status());
  UniqueFd listener;
  bool own_socket = false;
  if (activated->has_value()) {
    listener = std::move(**activated);
    LX_LOG(kInfo) << "using the socket passed by systemd";
  } else {
    Status dir = EnsureSocketDir(config.socket_path);
    if (!dir.ok()) return Fail(dir);
    auto l = loaderx::ListenSeqpacket(config.socket_path, config.socket_mode);
    if (!l.ok()) return Fail(l.status());
    listener = std::move(l).value();
    own_socket = true;
  }
  const bool under_systemd = std::getenv("NOTIFY_SOCKET") != nullptr;
  int ready_fd = (config.foreground || under_systemd) ? -1 : Detach();

  loaderx::daemon::Server server(config, std::move(listener));
  LX_LOG(kInfo) << "serving on " << config.socket_path << " (protocol "
                << loaderx::kProtocolMajor << "." << loaderx::kProtocolMinor << ", pid "
                << ::getpid() << ")";
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
  LX_LOG(kInfo) << "stopped";
  return st.ok() ? 0 : Fail(st);
}
