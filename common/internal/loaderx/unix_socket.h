// Unix SOCK_SEQPACKET sockets with SCM_RIGHTS fd passing: the loaderxd
// transport (docs/protocol.md, "Transport").
//
// SEQPACKET keeps message boundaries (one sendmsg = one frame = one msgpack
// message), is connection-oriented (a peer's death is a hang-up, which is how
// the daemon notices a SIGKILLed client and a client notices a dead daemon)
// and carries ancillary data. Every receive uses MSG_CMSG_CLOEXEC, so fds
// never leak into exec'd children, and wraps received fds in UniqueFd at once,
// so a frame that is rejected later still closes them.
//
// A frame longer than the receive buffer or carrying more fds than allowed is
// a protocol error (MSG_TRUNC / MSG_CTRUNC are checked), never silently cut.
//
// Thread-safety: free functions; concurrent SendFrame calls on one socket
// are atomic per frame (the kernel's guarantee for SEQPACKET), but callers
// that also receive must serialise their request/response pairs themselves.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "loaderx/fd.h"
#include "loaderx/status.h"

namespace loaderx {

// Largest frame either side accepts. Control messages are small; the largest
// is an open-loader request naming every store file (a few KiB).
inline constexpr size_t kMaxFrameBytes = size_t{256} * 1024;
// Largest number of fds in one frame (the kernel's SCM_MAX_FD is 253).
inline constexpr size_t kMaxFrameFds = 253;

struct Frame {
  std::vector<uint8_t> bytes;
  std::vector<UniqueFd> fds;
  bool eof = false;          // the peer closed the connection (no bytes)
  bool would_block = false;  // non-blocking receive found nothing
};

// Connects to a listening SEQPACKET socket at `path`. Daemon errors when
// nothing is there or a stale socket file refuses ("is loaderxd running?").
Result<UniqueFd> ConnectSeqpacket(const std::string& path);

// Binds and listens at `path`, then chmods it to `mode`. A stale socket file
// (nobody accepting) is replaced; a live one is AlreadyExists.
Result<UniqueFd> ListenSeqpacket(const std::string& path, mode_t mode, int backlog = 64);

// Sends one frame with optional fds. `nonblocking` uses MSG_DONTWAIT and
// returns ResourceExhausted when the peer's receive queue is full.
// EPIPE/ECONNRESET become Status::Daemon("peer closed the connection").
Status SendFrame(int fd, std::span<const uint8_t> bytes, std::span<const int> fds = {},
                 bool nonblocking = false);

// Sends `frames` (no fds) with one sendmmsg(2), in order: how many went.
// `nonblocking` as SendFrame; ResourceExhausted only when the queue was full
// before the first one (a later one finding it full just ends the count).
Result<size_t> SendFrames(int fd, std::span<const std::span<const uint8_t>> frames,
                          bool nonblocking = false);

// Receives one frame of at most `max_bytes` and `max_fds`. Blocking unless
// `nonblocking`. EOF and would-block are reported in the Frame, not as errors.
Result<Frame> RecvFrame(int fd, size_t max_bytes = kMaxFrameBytes, size_t max_fds = kMaxFrameFds,
                        bool nonblocking = false);

// poll(2) for readability (or hang-up) for up to `timeout_ms` (-1: forever).
// Returns true when a receive would not block.
Result<bool> WaitReadable(int fd, int timeout_ms);

struct PeerCred {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};
// SO_PEERCRED of a connected Unix socket.
Result<PeerCred> GetPeerCred(int fd);

}  // namespace loaderx
