#include "server.h"

#include <unistd.h>

#include <atomic>
#include <boost/asio.hpp>
#include <boost/asio/generic/seq_packet_protocol.hpp>
#include <chrono>
#include <map>
#include <random>
#include <utility>
#include <vector>

#include "accounts.h"
#include "group_registry.h"
#include "loaderx/unix_socket.h"
#include "log.h"
#include "session.h"
#include "status.h"
#include "store_registry.h"
#include "systemd.h"

namespace loaderx::daemon {

namespace asio = boost::asio;
using SeqPacket = asio::generic::seq_packet_protocol;

namespace {

// Protocol-violation warnings logged per window at most (log-flood guard).
constexpr uint32_t kViolationLogsPerWindow = 10;
constexpr auto kViolationLogWindow = std::chrono::seconds(10);

}  // namespace

class Server::Impl {
 public:
  Impl(const Config& config, UniqueFd listener)
      : config_(config),
        accounts_(config_),
        acceptor_(io_),
        signals_(io_),
        tick_(io_),
        incarnation_(std::random_device{}() | (uint64_t{std::random_device{}()} << 32)),
        ctx_{config_,
             io_,
             incarnation_,
             stores_,
             accounts_,
             groups_,
             counters_,
             violation_log_,
             [this](uint64_t id) { Finish(id); },
             [this](uint32_t uid, bool detail, bool observer) {
               return Stats(uid, detail, observer);
             }} {
    boost::system::error_code ec;
    acceptor_.assign(SeqPacket(AF_UNIX, 0), listener.Release(), ec);
    if (ec) LX_LOG(kError) << "cannot adopt listening socket: " << ec.message();
  }

  Status Run(bool handle_signals) {
    if (!acceptor_.is_open()) return Status::Internal("listening socket not adopted");
    if (handle_signals) {
      signals_.add(SIGTERM);
      signals_.add(SIGINT);
      signals_.async_wait([this](const boost::system::error_code& ec, int sig) {
        if (ec) return;
        LX_LOG(kInfo) << "SIG" << ::sigabbrev_np(sig) << " received: shutting down";
        StopOnIo();
      });
    }
    Accept();
    watchdog_usec_ = WatchdogUsec();
    last_watchdog_ = std::chrono::steady_clock::now();
    Tick();
    // Workers post their Finish from their own threads: without this guard
    // run() could return in the gap between a Shutdown and that post, and a
    // worker would post into a destroyed io_context. Only stop() ends run().
    auto guard = asio::make_work_guard(io_);
    io_.run();
    return Status::OK();
  }

  void Stop() {
    asio::post(io_, [this] { StopOnIo(); });
  }

  void StopOnIo();
  void Accept();
  // io thread, every kHeartbeatIntervalMs: a heartbeat to every waiting 1.2
  // client and the systemd watchdog ping (at half its period), both from
  // the io loop itself, so a stuck io thread stops both: its clients raise
  // DaemonError and systemd restarts the daemon.
  void Tick();
  void Finish(uint64_t id);  // io thread: a session is fully torn down

  StatsReplyMsg Stats(uint32_t uid, bool detail, bool observer) {
    StatsReplyMsg r;
    Accounts::Snapshot acct = accounts_.Read(uid, detail);
    if (observer) {
      // The asking session is counted from its hello; an observer (no
      // loader open: `loaderx status`, a monitor) is not shown itself.
      auto leave_out = [](uint64_t& sessions) {
        if (sessions > 0) --sessions;
      };
      leave_out(acct.sessions);
      leave_out(acct.mine.sessions);
      if (auto it = acct.uids.find(uid); it != acct.uids.end()) leave_out(it->second.sessions);
    }
    const GroupRegistry::Counts groups = groups_.counts();
    const Counters& c = counters_;
    r.counters = {
        {"sessions", acct.sessions},
        {"loaders", groups.loaders},
        {"groups", groups.groups},
        {"group_members", groups.group_members},
        {"batches_gathered", c.batches_gathered.load(std::memory_order_relaxed)},
        {"ring_bytes", acct.ring_bytes},
        {"slots_held", c.slots_held.load(std::memory_order_relaxed)},
        {"stores", stores_.size()},
        {"batches_served", c.batches_served.load(std::memory_order_relaxed)},
        {"releases", c.releases.load(std::memory_order_relaxed)},
        {"stale_releases", c.stale_releases.load(std::memory_order_relaxed)},
        {"protocol_errors", c.protocol_errors.load(std::memory_order_relaxed)},
        {"refused", c.refused.load(std::memory_order_relaxed)},
        {"queue_wakeups", c.queue_wakeups.load(std::memory_order_relaxed)},
        {"uid_sessions", acct.mine.sessions},
        {"uid_ring_bytes", acct.mine.ring_bytes},
        {"memory_limit", config_.memory_limit},
        {"memory_per_uid", config_.memory_per_uid},
        {"sessions_per_uid", config_.sessions_per_uid},
        {"max_leases", config_.max_leases},
    };
    if (!detail) return r;
    StatusInput in;
    for (const auto& [u, a] : acct.uids) in.uids.push_back({u, a.sessions, a.ring_bytes});
    in.pid = ::getpid();
    in.uptime_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
    in.incarnation = incarnation_;
    in.socket_path = config_.socket_path;
    in.config = &config_;
    in.counters = r.counters;
    for (const auto& [owner, g] : groups_.All()) in.groups.push_back({owner, g->snapshot()});
    r.status = BuildStatusJson(in, uid);
    return r;
  }

  const Config config_;
  // Before io_: a session (and the rings its leases keep) that only a
  // pending handler still holds is destroyed with io_, and its rings give
  // their charges back here (accounts.h).
  Accounts accounts_;
  Counters counters_;
  asio::io_context io_;
  asio::basic_socket_acceptor<SeqPacket> acceptor_;
  asio::signal_set signals_;
  asio::steady_timer tick_;                              // io thread only
  uint64_t watchdog_usec_ = 0;                           // io thread only
  std::chrono::steady_clock::time_point last_watchdog_;  // io thread only
  const uint64_t incarnation_;
  const std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  // What sessions share; declared before conns_, so it outlives them.
  StoreRegistry stores_;
  GroupRegistry groups_;
  LogThrottle violation_log_{kViolationLogsPerWindow, kViolationLogWindow};  // io thread only
  SessionContext ctx_;
  bool stopping_ = false;                               // io thread only
  uint64_t next_id_ = 1;                                // io thread only
  std::map<uint64_t, std::shared_ptr<Session>> conns_;  // io thread only
};

void Server::Impl::Accept() {
  acceptor_.async_accept([this](const boost::system::error_code& ec, SeqPacket::socket socket) {
    if (stopping_) return;
    if (ec) {
      if (ec != asio::error::operation_aborted) {
        LX_LOG(kWarning) << "accept: " << ec.message();
        // EMFILE and friends: back off briefly instead of spinning.
        auto timer = std::make_shared<asio::steady_timer>(io_, std::chrono::milliseconds(100));
        timer->async_wait([this, timer](const boost::system::error_code&) { Accept(); });
      }
      return;
    }
    Result<PeerCred> cred = GetPeerCred(socket.native_handle());
    if (!cred.ok()) {
      LX_LOG(kWarning) << "rejecting connection: " << cred.status().ToString();
    } else {
      uint64_t id = next_id_++;
      auto conn = Session::Create(ctx_, std::move(socket), id, *cred);
      conns_.emplace(id, conn);
      conn->Start();
    }
    Accept();
  });
}

void Server::Impl::Finish(uint64_t id) {
  auto it = conns_.find(id);
  if (it == conns_.end()) return;
  std::shared_ptr<Session> conn = std::move(it->second);
  conns_.erase(it);
  conn->Close();
  if (stopping_ && conns_.empty()) io_.stop();
}

void Server::Impl::Tick() {
  if (stopping_) return;
  for (auto& [id, c] : conns_) c->Heartbeat();
  const auto now = std::chrono::steady_clock::now();
  if (watchdog_usec_ != 0 &&
      now - last_watchdog_ >= std::chrono::microseconds(watchdog_usec_ / 2)) {
    (void)Notify("WATCHDOG=1");
    last_watchdog_ = now;
  }
  tick_.expires_after(std::chrono::milliseconds(kHeartbeatIntervalMs));
  tick_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) Tick();
  });
}

void Server::Impl::StopOnIo() {
  if (stopping_) return;
  stopping_ = true;
  boost::system::error_code ec;
  tick_.cancel();
  acceptor_.close(ec);
  signals_.cancel(ec);
  if (conns_.empty()) {
    io_.stop();
    return;
  }
  // Copy: Shutdown may post Finish, which edits conns_ later on this thread.
  std::vector<std::shared_ptr<Session>> all;
  for (auto& [id, c] : conns_) all.push_back(c);
  for (auto& c : all) c->Shutdown("loaderxd is shutting down");
}

Server::Server(const Config& config, UniqueFd listener)
    : impl_(std::make_unique<Impl>(config, std::move(listener))) {}

Server::~Server() = default;

Status Server::Run(bool handle_signals) { return impl_->Run(handle_signals); }
void Server::Stop() { impl_->Stop(); }
StatsReplyMsg Server::Stats(uint32_t uid, bool detail, bool observer) {
  return impl_->Stats(uid, detail, observer);
}
uint64_t Server::incarnation() const { return impl_->incarnation_; }

}  // namespace loaderx::daemon
