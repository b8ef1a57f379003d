// Connection: one socket to loaderxd with its request/reply discipline, the
// ring mapping of the loader opened on it, and fork safety.
//
// Replies are awaited with ONE blocking recvmsg per attempt, bounded by
// SO_RCVTIMEO = kPollInterval (or less near a deadline), so a dead daemon
// (hang-up), Close() from another thread (shutdown of the socket) and the
// caller's WaitHook (Ctrl-C) are all noticed promptly, and a reply that is
// already queued costs a single syscall (no poll first). A request whose
// wait was aborted leaves its reply "owed"; the next call collects it first.
//
// Spin (off by default, Loader::set_spin_wait): a wait may first poll the
// socket with non-blocking receives for up to spin_wait(), so a reply that
// arrives within it is taken without the sleep and wake-up of a blocking
// recvmsg, at the price of a busy core meanwhile (docs/daemon.md
// "Performance" has the measurement and the decision).
//
// Fork: every live socket fd is registered in a fixed lock-free table; a
// pthread_atfork child handler closes them all in the child and records the
// child's pid, and every method checks that pid (a load, not a getpid
// syscall per call), so a forked child can neither keep the session alive
// nor send on it.
//
// Thread-safety: Call/AwaitOwed serialise on call_mu_; Release and Shutdown
// may be called from any thread at any time.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "loaderx/client.h"
#include "loaderx/fd.h"
#include "loaderx/ring.h"
#include "loaderx/unix_socket.h"
#include "loaderx/wire.h"

namespace loaderx::client {

struct Reply {
  Message msg;
  std::vector<UniqueFd> fds;
};

class Connection {
 public:
  // connect(2) + hello exchange.
  static Result<std::shared_ptr<Connection>> Open(const std::string& path);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Sends `req` (with fds) and waits for its reply. If a previous reply is
  // owed it is collected and handed to `discard` first (or, when
  // `reuse_owed` is set and the owed request was the same kind, returned as
  // this call's reply without sending again).
  // `deadline` (optional) bounds the wait: when it passes the reply stays
  // owed and *timed_out is set (the status is then Cancelled("timed out")).
  Result<Reply> Call(const Message& req, std::span<const int> fds, const WaitHook& hook,
                     bool reuse_owed,
                     std::optional<std::chrono::steady_clock::time_point> deadline = std::nullopt,
                     bool* timed_out = nullptr);
  // Sends `req` now and leaves its reply owed without waiting for it
  // (request ahead): the next Call of the same kind with reuse_owed collects
  // it, typically already queued in the socket. No-op if a reply is owed.
  Status SendAhead(const Message& req);
  // True if the reply to a request of `req`'s type is owed (sent ahead, or
  // its wait ended early): the next Call collects it before anything else.
  bool Owes(const Message& req);
  // Fire-and-forget release of a slot lease (no reply).
  void Release(uint32_t slot, uint64_t seq);
  // Ends the session from any thread; wakes a blocked Call with Cancelled.
  void Shutdown();
  bool shut_down() const { return shut_.load(std::memory_order_acquire); }
  // Closes the loader from any thread, never blocking. Requests are refused
  // from now on (a blocked Call returns Cancelled within kPollInterval). With
  // no lease alive this is Shutdown(); otherwise the daemon is sent `close`
  // (it stops the loader but keeps this session's leases) and the socket
  // stays open, still carrying releases, until the last lease is gone
  // (LeaseEnded), so the daemon never reuses a slot this process still views.
  void CloseLoader();
  // True once CloseLoader() or Shutdown() ran: no request is sent any more.
  bool closed() const { return closed_.load(std::memory_order_seq_cst); }
  // Called by ~Lease after its release: hangs up once a closed loader's last
  // lease is gone.
  void LeaseEnded();
  // Daemon error when called in a forked child.
  Status CheckProcess() const;
  // How long a wait polls before blocking (0: never; see the header
  // comment). Any thread; applies from the next wait on.
  void set_spin_wait(std::chrono::microseconds spin) {
    spin_wait_us_.store(spin.count(), std::memory_order_relaxed);
  }
  std::chrono::microseconds spin_wait() const {
    return std::chrono::microseconds(spin_wait_us_.load(std::memory_order_relaxed));
  }

  // Liveness (protocol 1.2): a wait that hears nothing from the daemon (no
  // reply, no heartbeat) for `timeout` returns Status::Daemon; the reply
  // stays owed, so if the daemon resumes the next call still gets it. Only
  // when the daemon announced heartbeats (hello_ok heartbeat_ms > 0).
  // Any thread; applies from the next wait on.
  void set_liveness_timeout(std::chrono::milliseconds timeout) {
    liveness_ms_.store(timeout.count(), std::memory_order_relaxed);
  }
  std::chrono::milliseconds liveness_timeout() const {
    return std::chrono::milliseconds(liveness_ms_.load(std::memory_order_relaxed));
  }

  const HelloOkMsg& hello() const { return hello_; }
  const std::string& path() const { return path_; }

  // Ring of the loader opened on this connection (set once by OpenLoader).
  Status AttachRing(UniqueFd fd, uint64_t bytes, uint32_t slot_count);
  const uint8_t* ring_base() const { return ring_.data(); }
  int ring_fd() const { return ring_fd_.get(); }  // kept for private slot mappings
  const RingGeometry& geometry() const { return geometry_; }

  // Leases alive in this process (a Batch or its zero-copy owners).
  // Seq_cst: ordered against closed_ (see there).
  std::atomic<uint32_t> leases_held{0};

 private:
  Connection(UniqueFd fd, std::string path);
  // *owed is set when the wait ended early (hook abort or deadline) so the
  // reply is still to come.
  Result<Reply> AwaitReply(const WaitHook& hook,
                           std::optional<std::chrono::steady_clock::time_point> deadline,
                           bool* owed, bool* timed_out);
  Status SendMessage(const Message& m, std::span<const int> fds);
  // One recvmsg that waits at most `wait` (0: does not wait). Called with
  // call_mu_ held (the only receiver).
  Result<Frame> Receive(std::chrono::milliseconds wait);
  // Sends releases that found the socket full (blocking; called by Call).
  Status FlushReleases();

  UniqueFd fd_;
  const std::string path_;
  const pid_t owner_pid_;
  int fork_slot_ = -1;  // index in the fork table, -1 if not registered
  HelloOkMsg hello_;
  // Set by Shutdown (any thread); read by waits. Release/acquire: a waiter
  // that sees it knows the socket was shut down on purpose.
  std::atomic<bool> shut_{false};
  // Set by CloseLoader and Shutdown. Seq_cst with leases_held: a lease created while the
  // loader closes is either seen by CloseLoader (the socket stays open) or
  // sees closed() itself (NextImpl drops it).
  std::atomic<bool> closed_{false};

  // Relaxed: a tuning value, read once per wait; no other data hangs on it.
  std::atomic<int64_t> spin_wait_us_{0};
  // Relaxed, as spin_wait_us_.
  std::atomic<int64_t> liveness_ms_{kDefaultLivenessTimeout.count()};
  // When the daemon was last heard from (any frame) or a request went out;
  // guarded by call_mu_.
  std::chrono::steady_clock::time_point last_heard_{};

  std::mutex call_mu_;
  bool owed_ = false;      // guarded by call_mu_
  size_t owed_index_ = 0;  // Message index of the owed request
  // SO_RCVTIMEO currently set on fd_ (ms, 0 = never set); guarded by call_mu_.
  int64_t recv_timeout_ms_ = 0;

  std::mutex release_mu_;
  // Releases that could not be sent without blocking, oldest first; sent
  // before the next request. Guarded by release_mu_.
  std::vector<ReleaseMsg> pending_releases_;

  MappedRegion ring_;  // read-only
  UniqueFd ring_fd_;
  RingGeometry geometry_;
};

}  // namespace loaderx::client
