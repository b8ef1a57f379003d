#include "loaderx/unix_socket.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>

namespace loaderx {

namespace {

Status MakeAddress(const std::string& path, sockaddr_un* addr) {
  std::memset(addr, 0, sizeof(*addr));
  addr->sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr->sun_path)) {
    return Status::InvalidArgument("socket path '" + path + "' is empty or longer than " +
                                   std::to_string(sizeof(addr->sun_path) - 1) + " bytes");
  }
  std::memcpy(addr->sun_path, path.data(), path.size());
  return Status::OK();
}

// A failed send(2)/sendmsg(2)/sendmmsg(2): the peer gone, its queue full, or
// another error.
Status SendError(int err, const char* call) {
  if (err == EPIPE || err == ECONNRESET || err == ENOTCONN) {
    return Status::Daemon("peer closed the connection");
  }
  if (err == EAGAIN || err == EWOULDBLOCK) {
    return Status::ResourceExhausted("peer is not reading its socket (send queue full)");
  }
  return Status::FromErrno(call, err);
}

Result<UniqueFd> NewSocket() {
  int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::FromErrno("socket(AF_UNIX, SOCK_SEQPACKET)", errno);
  return UniqueFd(fd);
}

}  // namespace

Result<UniqueFd> ConnectSeqpacket(const std::string& path) {
  sockaddr_un addr;
  LX_RETURN_IF_ERROR(MakeAddress(path, &addr));
  LX_ASSIGN_OR_RETURN(UniqueFd fd, NewSocket());
  int rc;
  do {
    rc = ::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    int err = errno;
    if (err == ENOENT) return Status::Daemon(path + ": no socket here (is loaderxd running?)");
    if (err == ECONNREFUSED) {
      return Status::Daemon(path + ": connection refused (no loaderxd is accepting)");
    }
    return Status::FromErrno("connect " + path, err);
  }
  return fd;
}

Result<UniqueFd> ListenSeqpacket(const std::string& path, mode_t mode, int backlog) {
  sockaddr_un addr;
  LX_RETURN_IF_ERROR(MakeAddress(path, &addr));
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return Status::AlreadyExists(path + ": exists and is not a socket");
    }
    Result<UniqueFd> probe = ConnectSeqpacket(path);
    if (probe.ok()) return Status::AlreadyExists(path + ": another loaderxd is serving here");
    ::unlink(path.c_str());  // stale socket of a dead daemon
  }
  LX_ASSIGN_OR_RETURN(UniqueFd fd, NewSocket());
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return Status::FromErrno("bind " + path, errno);
  }
  if (::chmod(path.c_str(), mode) != 0) return Status::FromErrno("chmod " + path, errno);
  if (::listen(fd.get(), backlog) != 0) return Status::FromErrno("listen " + path, errno);
  return fd;
}

Status SendFrame(int fd, std::span<const uint8_t> bytes, std::span<const int> fds,
                 bool nonblocking) {
  if (fds.size() > kMaxFrameFds) {
    return Status::InvalidArgument("frame carries " + std::to_string(fds.size()) +
                                   " fds, more than " + std::to_string(kMaxFrameFds));
  }
  iovec iov{const_cast<uint8_t*>(bytes.data()), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> control;
  if (!fds.empty()) {
    control.assign(CMSG_SPACE(sizeof(int) * fds.size()), 0);
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  int flags = MSG_NOSIGNAL | (nonblocking ? MSG_DONTWAIT : 0);
  ssize_t n;
  do {
    n = ::sendmsg(fd, &msg, flags);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return SendError(errno, "sendmsg");
  if (static_cast<size_t>(n) != bytes.size()) {
    return Status::Internal("short SEQPACKET send");  // cannot happen for SEQPACKET
  }
  return Status::OK();
}

Result<size_t> SendFrames(int fd, std::span<const std::span<const uint8_t>> frames,
                          bool nonblocking) {
  constexpr size_t kMax = 8;
  if (frames.size() > kMax) return Status::InvalidArgument("SendFrames: at most 8 frames");
  std::array<iovec, kMax> iov{};
  std::array<mmsghdr, kMax> msgs{};
  for (size_t i = 0; i < frames.size(); ++i) {
    iov[i] = iovec{const_cast<uint8_t*>(frames[i].data()), frames[i].size()};
    msgs[i].msg_hdr.msg_iov = &iov[i];
    msgs[i].msg_hdr.msg_iovlen = 1;
  }
  const int flags = MSG_NOSIGNAL | (nonblocking ? MSG_DONTWAIT : 0);
  size_t sent = 0;
  while (sent < frames.size()) {
    const int n =
        ::sendmmsg(fd, msgs.data() + sent, static_cast<unsigned>(frames.size() - sent), flags);
    if (n < 0) {
      const int err = errno;
      if (err == EINTR) continue;
      if (sent > 0 && (err == EAGAIN || err == EWOULDBLOCK)) break;
      return SendError(err, "sendmmsg");
    }
    for (int k = 0; k < n; ++k) {
      if (msgs[sent + k].msg_len != frames[sent + k].size()) {
        return Status::Internal("short SEQPACKET send");  // cannot happen for SEQPACKET
      }
    }
    sent += static_cast<size_t>(n);
  }
  return sent;
}

Result<Frame> RecvFrame(int fd, size_t max_bytes, size_t max_fds, bool nonblocking) {
  Frame frame;
  // A per-thread scratch buffer (one spare byte so an oversized frame is
  // detected even where MSG_TRUNC is not reported): receiving must not
  // allocate and zero kMaxFrameBytes per message on the hand-off path.
  thread_local std::vector<uint8_t> scratch;
  thread_local std::vector<char> control;
  if (scratch.size() < max_bytes + 1) scratch.resize(max_bytes + 1);
  if (control.empty()) control.resize(CMSG_SPACE(sizeof(int) * kMaxFrameFds));
  iovec iov{scratch.data(), max_bytes + 1};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control.data();
  msg.msg_controllen = control.size();
  int flags = MSG_CMSG_CLOEXEC | (nonblocking ? MSG_DONTWAIT : 0);
  ssize_t n;
  bool reset = false;
  while (true) {
    n = ::recvmsg(fd, &msg, flags);
    if (n >= 0 || errno == EINTR) {
      if (n >= 0) break;
      continue;
    }
    // A peer that closed its socket with frames of ours still unread makes
    // AF_UNIX report ECONNRESET once, ahead of the frames it sent before
    // closing (the error is cleared by reporting it). Those frames are
    // still queued and are read on: a client's last releases, `consumed`
    // notes and `close` reach the daemon, not just its hang-up. The next
    // receive returns them, then end-of-file.
    if (errno == ECONNRESET && !reset) {
      reset = true;
      continue;
    }
    break;
  }
  if (n < 0) {
    int err = errno;
    if (err == EAGAIN || err == EWOULDBLOCK) {
      frame.would_block = true;
      return frame;
    }
    if (err == ECONNRESET) {
      frame.eof = true;
      return frame;
    }
    return Status::FromErrno("recvmsg", err);
  }
  // Take ownership of every received fd first, so each path below closes them.
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int received;
      std::memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      frame.fds.emplace_back(received);
    }
  }
  if (msg.msg_flags & MSG_CTRUNC) {
    return Status::Protocol("frame carried more fds than the receiver accepts");
  }
  if ((msg.msg_flags & MSG_TRUNC) || static_cast<size_t>(n) > max_bytes) {
    return Status::Protocol("frame larger than " + std::to_string(max_bytes) + " bytes");
  }
  if (frame.fds.size() > max_fds) {
    return Status::Protocol("frame carried " + std::to_string(frame.fds.size()) + " fds, at most " +
                            std::to_string(max_fds) + " expected");
  }
  if (n == 0 && frame.fds.empty()) {
    frame.eof = true;  // SEQPACKET: a zero-length read is the peer's hang-up
  }
  frame.bytes.assign(scratch.data(), scratch.data() + n);
  return frame;
}

Result<bool> WaitReadable(int fd, int timeout_ms) {
  pollfd p{fd, POLLIN, 0};
  int rc;
  do {
    rc = ::poll(&p, 1, timeout_ms);
  } while (rc < 0 && errno == EINTR);
  if (rc < 0) return Status::FromErrno("poll", errno);
  return rc > 0;
}

Result<PeerCred> GetPeerCred(int fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return Status::FromErrno("getsockopt(SO_PEERCRED)", errno);
  }
  return PeerCred{cred.pid, cred.uid, cred.gid};
}

}  // namespace loaderx
