// loaderxd's server: accepts clients on a SOCK_SEQPACKET socket and serves
// each connection's loader out of a shared-memory ring.
//
// Groups (group.h): every open loader is a member of a Group that owns the
// Pipeline and the ring. A solo loader's group is private to its
// connection; named groups are shared by all connections of one uid that
// name them with the same spec. The last member to leave closes the group
// and returns its ring to the uid's account.
//
// Threads: one Asio io_context thread (Run's caller) accepts connections and
// reads every frame; each connection gets one worker thread after its hello
// that executes its requests in order (open, next, seek, stats, close) —
// `next` waits on the group's Pipeline, which must never block the io thread.
// `release` is applied on the io thread at once, so a release always takes
// effect before a later `next` of the same client is checked against the
// lease cap (both arrive in order on one socket).
//
// Failure containment: a malformed frame, an unknown message, fds where none
// are expected (or a wrong count), or a client that stops reading its replies
// drops THAT connection only. A connection that ends for any reason (clean
// close, SIGKILL, fork-child exit) has its leases dropped and leaves its
// group (the last member's leaving closes the pipeline and returns the
// ring memory); stats() shows it.
//
// Security: clients are identified with SO_PEERCRED; sessions and ring
// memory are capped per uid; stores are only built from fds clients pass.
//
// Thread-safety: Stop() and Stats() may be called from any thread; Run()
// from one.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "config.h"
#include "loaderx/fd.h"
#include "loaderx/status.h"
#include "loaderx/wire.h"

namespace loaderx::daemon {

class Server {
 public:
  // Takes ownership of a listening socket (ListenSeqpacket or systemd's).
  Server(const Config& config, UniqueFd listener);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Serves until Stop() (or SIGTERM/SIGINT if `handle_signals`). On return
  // every connection is closed and every ring released.
  Status Run(bool handle_signals);
  void Stop();
  // The counters a "stats" request returns, for `uid`'s per-uid values, and
  // with `detail` the status document `uid` may see (status.h).
  StatsReplyMsg Stats(uint32_t uid, bool detail = false);
  uint64_t incarnation() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace loaderx::daemon
