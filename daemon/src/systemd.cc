#include "systemd.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace loaderx::daemon {

namespace {
bool EnvIsOurPid(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return true;  // unset: not restricted to a pid
  return std::strtoll(v, nullptr, 10) == ::getpid();
}
}  // namespace

Status Notify(const std::string& state) {
  const char* path = std::getenv("NOTIFY_SOCKET");
  if (path == nullptr || *path == '\0') return Status::OK();
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  size_t len = std::strlen(path);
  if (len >= sizeof(addr.sun_path) || (path[0] != '/' && path[0] != '@')) {
    return Status::InvalidArgument("NOTIFY_SOCKET: unsupported address");
  }
  std::memcpy(addr.sun_path, path, len);
  if (path[0] == '@') addr.sun_path[0] = '\0';  // abstract namespace
  UniqueFd fd(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return Status::FromErrno("socket(NOTIFY_SOCKET)", errno);
  socklen_t alen = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + len);
  ssize_t n = ::sendto(fd.get(), state.data(), state.size(), MSG_NOSIGNAL,
                       reinterpret_cast<sockaddr*>(&addr), alen);
  if (n < 0) return Status::FromErrno("sd_notify", errno);
  return Status::OK();
}

Result<std::optional<UniqueFd>> TakeListenFd() {
  const char* pid = std::getenv("LISTEN_PID");
  const char* fds = std::getenv("LISTEN_FDS");
  if (pid == nullptr || fds == nullptr) return std::optional<UniqueFd>();
  bool ours = std::strtoll(pid, nullptr, 10) == ::getpid();
  long count = std::strtol(fds, nullptr, 10);
  ::unsetenv("LISTEN_PID");
  ::unsetenv("LISTEN_FDS");
  ::unsetenv("LISTEN_FDNAMES");
  if (!ours) return std::optional<UniqueFd>();
  if (count != 1) {
    return Status::InvalidArgument("socket activation passed " + std::to_string(count) +
                                   " fds; loaderxd expects exactly one");
  }
  constexpr int kFirst = 3;  // SD_LISTEN_FDS_START
  int type = 0, accepting = 0;
  socklen_t l1 = sizeof(type), l2 = sizeof(accepting);
  if (::getsockopt(kFirst, SOL_SOCKET, SO_TYPE, &type, &l1) != 0 || type != SOCK_SEQPACKET ||
      ::getsockopt(kFirst, SOL_SOCKET, SO_ACCEPTCONN, &accepting, &l2) != 0 || !accepting) {
    return Status::InvalidArgument(
        "socket activation: fd 3 is not a listening SOCK_SEQPACKET socket "
        "(use ListenSequentialPacket= in loaderxd.socket)");
  }
  ::fcntl(kFirst, F_SETFD, FD_CLOEXEC);
  return std::optional<UniqueFd>(UniqueFd(kFirst));
}

uint64_t WatchdogUsec() {
  const char* v = std::getenv("WATCHDOG_USEC");
  if (v == nullptr || !EnvIsOurPid("WATCHDOG_PID")) return 0;
  return std::strtoull(v, nullptr, 10);
}

}  // namespace loaderx::daemon
