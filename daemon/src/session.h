// Session: one client connection of loaderxd, from its hello to its end.
//
// Threads: the server's io thread reads every frame of the session; after
// the hello the session gets one worker thread that executes its requests
// in order (open, seek, stats, close) and, between them, pushes its loader's
// batches while the client holds fewer than its credit (docs/protocol.md) --
// waiting on the group's Pipeline, which must never block the io thread.
// `release` and `consumed` frames are applied on the io thread at once, so
// they take effect before any later request of the same client (both arrive
// in order on one socket).
//
// Failure containment: a malformed frame, an unknown message, fds where none
// are expected (or a wrong count), or a client that stops reading its replies
// ends THAT session only. A session that ends for any reason (clean close,
// SIGKILL, fork-child exit) drops its leases (lease_ledger.h) and leaves its
// group (group_registry.h); the last member's leaving closes the group.
//
// Accounting: a session counts against its uid's sessions from its hello
// until it shuts down (hang-up, violation, daemon stop); the ring of a group
// it creates is charged to its uid (accounts.h). A stats request of a session
// with no loader open leaves that session out of the counts it returns.
//
// Thread-safety: Start, Heartbeat, Shutdown and Close are io-thread calls.
// Ownership: the SessionContext (the server's) outlives every session.
#pragma once

#include <atomic>
#include <boost/asio/generic/seq_packet_protocol.hpp>
#include <boost/asio/io_context.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "accounts.h"
#include "config.h"
#include "group_registry.h"
#include "loaderx/unix_socket.h"
#include "loaderx/wire.h"
#include "log.h"
#include "store_registry.h"

namespace loaderx::daemon {

// What the sessions count for stats (status.h). Relaxed: they order nothing.
struct Counters {
  std::atomic<uint64_t> slots_held{0};  // deliveries leased to clients
  std::atomic<uint64_t> batches_served{0};
  std::atomic<uint64_t> releases{0};
  std::atomic<uint64_t> stale_releases{0};
  std::atomic<uint64_t> protocol_errors{0};
  std::atomic<uint64_t> refused{0};
  std::atomic<uint64_t> batches_gathered{0};
  // Heartbeats sent to wake a client waiting on its push queue (1.4).
  std::atomic<uint64_t> queue_wakeups{0};
};

// What the server lends every session.
struct SessionContext {
  const Config& config;
  boost::asio::io_context& io;
  const uint64_t incarnation;
  StoreRegistry& stores;
  Accounts& accounts;
  GroupRegistry& groups;
  Counters& counters;
  LogThrottle& violation_log;  // io thread only
  // Posted to the io thread once session `id` is torn down: the server then
  // calls its Close() and forgets it.
  std::function<void(uint64_t id)> finish;
  // The reply to a `stats` request of `uid` (any thread); `observer`: the
  // asking session has no loader open, so it leaves itself out (server.h).
  std::function<StatsReplyMsg(uint32_t uid, bool detail, bool observer)> stats;
};

class Session {
 public:
  using Socket = boost::asio::generic::seq_packet_protocol::socket;

  // `id` is unique within the daemon's incarnation; `cred` is the peer's
  // SO_PEERCRED.
  static std::shared_ptr<Session> Create(SessionContext& ctx, Socket socket, uint64_t id,
                                         PeerCred cred);
  virtual ~Session() = default;

  // Starts reading frames.
  virtual void Start() = 0;
  // Every kHeartbeatIntervalMs: "still alive" to a client that may be
  // waiting (a request outstanding, or a batch to push awaited), only when
  // it has read everything sent to it. Never blocks.
  virtual void Heartbeat() = 0;
  // Ends the session (`why` for the log); ctx.finish follows once the worker
  // has left its group. Idempotent.
  virtual void Shutdown(const std::string& why) = 0;
  // From ctx.finish: joins the worker, closes the socket, uncounts the
  // session.
  virtual void Close() = 0;
};

}  // namespace loaderx::daemon
