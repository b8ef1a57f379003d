// loaderxd's server: accepts clients on a SOCK_SEQPACKET socket and serves
// each connection's loader out of a shared-memory ring.
//
// The server owns what its sessions share and the io loop they run on; each
// concern has its own file:
//  * session.h: one connection (its frames, its worker thread, its requests
//    and pushes) and lease_ledger.h, what its client holds;
//  * accounts.h: per-uid sessions and ring memory, and their caps;
//  * group_registry.h: the groups (serving_group.h) by (uid, name), and solo loaders';
//  * store_registry.h: stores shared between clients that passed the same files.
// This file is the listener: it accepts connections (a socket it was handed,
// from ListenSeqpacket or systemd's socket activation), handles SIGTERM and
// SIGINT, and runs the io loop, whose tick sends the heartbeats and the
// systemd watchdog ping (so a stuck io thread gets the daemon restarted).
//
// Failure containment: whatever one client does ends that client's session
// only (session.h). On return from Run every session is closed and every
// ring released.
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
  // with `detail` the status document `uid` may see (status.h). `observer`:
  // the request comes from a session of `uid` with no loader open, which is
  // left out of the session counts (`sessions`, `uid_sessions`, `uids`).
  StatsReplyMsg Stats(uint32_t uid, bool detail = false, bool observer = false);
  uint64_t incarnation() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace loaderx::daemon
