#include "connection.h"

#include <pthread.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>

#include "loaderx/memfd.h"
#include "loaderx/unix_socket.h"

namespace loaderx::client {

namespace {

// Live socket fds of this process, closed in a forked child. Fixed size and
// lock-free: the child handler runs in a process where another thread may
// have held any lock at fork time.
constexpr size_t kForkTableSize = 1024;
// Entries hold fd + 1 so that zero-initialisation means "empty".
std::atomic<int> g_fork_fds[kForkTableSize];
// This process's pid, kept current by the fork handler: CheckProcess runs on
// every request and release, and getpid() is a real syscall in glibc >= 2.25.
// 0 until the first connection registers the handler. Relaxed: fork() is the
// synchronisation point (the child's handler runs before any child code).
// Covers every fork(3) (os.fork, multiprocessing); a raw clone(2) child that
// skips the atfork handlers would also keep the sockets, so it is not
// supported either way.
std::atomic<pid_t> g_pid{0};

void CloseInChild() {
  g_pid.store(::getpid(), std::memory_order_relaxed);
  for (auto& slot : g_fork_fds) {
    int fd = slot.exchange(0, std::memory_order_relaxed) - 1;
    if (fd >= 0) ::close(fd);
  }
}

pid_t CurrentPid() {
  pid_t pid = g_pid.load(std::memory_order_relaxed);
  return pid != 0 ? pid : ::getpid();
}

int RegisterForFork(int fd) {
  static std::once_flag once;
  std::call_once(once, [] {
    g_pid.store(::getpid(), std::memory_order_relaxed);
    ::pthread_atfork(nullptr, nullptr, &CloseInChild);
  });
  for (size_t i = 0; i < kForkTableSize; ++i) {
    int expected = 0;
    // Relaxed: fork() itself is the synchronisation point with the handler.
    if (g_fork_fds[i].compare_exchange_strong(expected, fd + 1, std::memory_order_relaxed)) {
      return static_cast<int>(i);
    }
  }
  return -1;  // table full: fork protection degrades to the pid check
}

}  // namespace

Connection::Connection(UniqueFd fd, std::string path)
    : fd_(std::move(fd)), path_(std::move(path)), owner_pid_(::getpid()) {
  fork_slot_ = RegisterForFork(fd_.get());
}

Connection::~Connection() {
  if (CurrentPid() != owner_pid_) {
    fd_.Release();  // closed by the fork handler; the number may be reused
    return;
  }
  if (fork_slot_ >= 0) g_fork_fds[fork_slot_].store(0, std::memory_order_relaxed);
}

Result<std::shared_ptr<Connection>> Connection::Open(const std::string& path) {
  LX_ASSIGN_OR_RETURN(UniqueFd fd, ConnectSeqpacket(path));
  std::shared_ptr<Connection> c(new Connection(std::move(fd), path));
  HelloMsg hello;
  hello.client_version = LOADERX_CLIENT_VERSION;
  Result<Reply> r = c->Call(hello, {}, nullptr, false);
  if (!r.ok()) return r.status().WithContext(path);
  if (auto* err = std::get_if<ErrorMsg>(&r->msg)) {
    // A version or cap refusal: keep the daemon's code and words.
    return err->ToStatus().WithContext(path + ": loaderxd refused the connection");
  }
  auto* ok = std::get_if<HelloOkMsg>(&r->msg);
  if (ok == nullptr) return Status::Protocol(path + ": expected hello_ok");
  if (ok->major != kProtocolMajor) {
    return Status::Protocol(path + ": loaderxd speaks protocol " + std::to_string(ok->major) + "." +
                            std::to_string(ok->minor) + ", this client " +
                            std::to_string(kProtocolMajor) + "." + std::to_string(kProtocolMinor));
  }
  c->hello_ = *ok;
  return c;
}

Status Connection::CheckProcess() const {
  if (CurrentPid() != owner_pid_) {
    return Status::Daemon("this loaderxd session belongs to process " + std::to_string(owner_pid_) +
                          "; a forked child cannot use it (open a new loader in the child)");
  }
  return Status::OK();
}

Status Connection::SendMessage(const Message& m, std::span<const int> fds) {
  std::vector<uint8_t> bytes = EncodeMessage(m);
  Status st = SendFrame(fd_.get(), bytes, fds);
  if (!st.ok() && shut_down()) return Status::Cancelled("loader closed");
  if (st.code() == Status::Code::kDaemon) {
    return Status::Daemon(path_ + ": loaderxd closed the connection (stopped or crashed)");
  }
  return st;
}

Result<Reply> Connection::AwaitReply(const WaitHook& hook,
                                     std::optional<std::chrono::steady_clock::time_point> deadline,
                                     bool* owed, bool* timed_out) {
  using Clock = std::chrono::steady_clock;
  *owed = false;
  if (timed_out) *timed_out = false;
  const std::chrono::microseconds spin = spin_wait();
  const Clock::time_point spin_end =
      spin.count() > 0 ? Clock::now() + spin : Clock::time_point::min();
  while (true) {
    if (closed()) return Status::Cancelled("loader closed");
    const Clock::time_point now = Clock::now();
    // Spinning: non-blocking receives (no hook: a spin is far shorter than
    // kPollInterval), never past the caller's deadline.
    const bool spinning = now < spin_end && (!deadline || now < *deadline);
    auto wait = spinning ? std::chrono::milliseconds(0) : kPollInterval;
    if (deadline && !spinning) {
      auto left = std::chrono::ceil<std::chrono::milliseconds>(*deadline - now);
      wait = std::clamp(left, std::chrono::milliseconds(0), kPollInterval);
    }
    LX_ASSIGN_OR_RETURN(Frame f, Receive(wait));
    if (f.would_block) {
      if (spinning) continue;
      const auto liveness = liveness_timeout();
      if (hello_.heartbeat_ms != 0 && Clock::now() - last_heard_ > liveness) {
        *owed = true;  // if the daemon resumes, the next call collects the reply
        return Status::Daemon(path_ + ": loaderxd sent nothing (no reply, no heartbeat) for " +
                              std::to_string(liveness.count()) +
                              " ms (stopped, hung or swapped out?); liveness timeout " +
                              std::to_string(liveness.count()) + " ms");
      }
      if (hook) {
        Status st = hook();
        if (!st.ok()) {
          *owed = true;
          return st;
        }
      }
      if (deadline && Clock::now() >= *deadline) {
        *owed = true;
        if (timed_out) *timed_out = true;
        return Status::Cancelled("timed out waiting for loaderxd");
      }
      continue;
    }
    if (f.eof) {
      if (shut_down()) return Status::Cancelled("loader closed");
      return Status::Daemon(path_ + ": loaderxd closed the connection (stopped or crashed)");
    }
    last_heard_ = Clock::now();
    LX_ASSIGN_OR_RETURN(Message m, DecodeMessage(f.bytes));
    if (std::holds_alternative<HeartbeatMsg>(m)) continue;  // alive; the reply is still due
    if (!f.fds.empty() && !std::holds_alternative<OpenedMsg>(m)) {
      return Status::Protocol(std::string("'") + MessageName(m) + "' reply carried fds");
    }
    return Reply{std::move(m), std::move(f.fds)};
  }
}

Result<Reply> Connection::Call(const Message& req, std::span<const int> fds, const WaitHook& hook,
                               bool reuse_owed,
                               std::optional<std::chrono::steady_clock::time_point> deadline,
                               bool* timed_out) {
  LX_RETURN_IF_ERROR(CheckProcess());
  std::lock_guard<std::mutex> lock(call_mu_);
  if (timed_out) *timed_out = false;
  if (closed()) return Status::Cancelled("loader closed");
  if (owed_) {
    bool owed = false;
    if (reuse_owed && owed_index_ == req.index()) {
      Result<Reply> r = AwaitReply(hook, deadline, &owed, timed_out);
      owed_ = owed;
      return r;
    }
    // Collect and drop the owed reply; an owed batch goes straight back.
    Result<Reply> stale = AwaitReply(hook, deadline, &owed, timed_out);
    if (!stale.ok()) {
      owed_ = owed;
      return stale.status();
    }
    owed_ = false;
    if (auto* b = std::get_if<BatchMsg>(&stale->msg)) Release(b->slot, b->seq);
  }
  LX_RETURN_IF_ERROR(FlushReleases());  // releases must precede the request
  LX_RETURN_IF_ERROR(SendMessage(req, fds));
  last_heard_ = std::chrono::steady_clock::now();  // the liveness clock starts now
  owed_index_ = req.index();
  bool owed = false;
  Result<Reply> r = AwaitReply(hook, deadline, &owed, timed_out);
  // Only an early end (hook abort, deadline) leaves the reply owed.
  owed_ = owed;
  return r;
}

bool Connection::Owes(const Message& req) {
  std::lock_guard<std::mutex> lock(call_mu_);
  return owed_ && owed_index_ == req.index();
}

Status Connection::SendAhead(const Message& req) {
  LX_RETURN_IF_ERROR(CheckProcess());
  std::lock_guard<std::mutex> lock(call_mu_);
  if (owed_ || closed()) return Status::OK();
  LX_RETURN_IF_ERROR(FlushReleases());  // releases must precede the request
  LX_RETURN_IF_ERROR(SendMessage(req, {}));
  last_heard_ = std::chrono::steady_clock::now();
  owed_ = true;
  owed_index_ = req.index();
  return Status::OK();
}

Result<Frame> Connection::Receive(std::chrono::milliseconds wait) {
  if (wait.count() <= 0) return RecvFrame(fd_.get(), kMaxFrameBytes, 1, /*nonblocking=*/true);
  // A blocking receive bounded by SO_RCVTIMEO (EAGAIN when it expires, which
  // RecvFrame reports as would_block): one syscall whether or not the reply
  // is already queued. Set only when the bound changes (rarely: waits are
  // sliced at kPollInterval).
  if (recv_timeout_ms_ != wait.count()) {
    timeval tv{static_cast<time_t>(wait.count() / 1000),
               static_cast<suseconds_t>((wait.count() % 1000) * 1000)};
    if (::setsockopt(fd_.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) != 0) {
      return Status::FromErrno("setsockopt(SO_RCVTIMEO)", errno);
    }
    recv_timeout_ms_ = wait.count();
  }
  return RecvFrame(fd_.get(), kMaxFrameBytes, 1);
}

void Connection::Release(uint32_t slot, uint64_t seq) {
  if (CurrentPid() != owner_pid_ || shut_down()) return;
  std::lock_guard<std::mutex> lock(release_mu_);
  // Never block here: this runs in destructors (in Python, with the GIL
  // held). If the socket is full (a stopped daemon), keep the release for
  // the next request, which sends it first. If the daemon is gone, so is
  // the slot.
  if (pending_releases_.empty()) {
    Status st =
        SendFrame(fd_.get(), EncodeMessage(ReleaseMsg{slot, seq}), {}, /*nonblocking=*/true);
    if (st.code() != Status::Code::kResourceExhausted) return;
  }
  pending_releases_.push_back(ReleaseMsg{slot, seq});
}

Status Connection::FlushReleases() {
  std::vector<ReleaseMsg> pending;
  {
    std::lock_guard<std::mutex> lock(release_mu_);
    pending.swap(pending_releases_);
  }
  for (const ReleaseMsg& r : pending) LX_RETURN_IF_ERROR(SendMessage(r, {}));
  return Status::OK();
}

void Connection::CloseLoader() {
  if (closed_.exchange(true, std::memory_order_seq_cst)) return;  // also after Shutdown()
  if (CurrentPid() != owner_pid_) return;
  if (leases_held.load(std::memory_order_seq_cst) == 0) return Shutdown();
  // Batches are still viewed here: hanging up now would let the daemon
  // reuse their slots. Ask it to stop the loader instead; the socket closes
  // with the last lease. If the socket is full (a stalled daemon) the
  // session simply lingers until then: late, never unsafe.
  // Sent even with releases still queued (it may overtake them: the daemon
  // applies releases after `close` alike), so the loader leaves its group now.
  std::lock_guard<std::mutex> lock(release_mu_);
  (void)SendFrame(fd_.get(), EncodeMessage(CloseMsg{}), {}, /*nonblocking=*/true);
}

void Connection::LeaseEnded() {
  if (closed() && leases_held.load(std::memory_order_seq_cst) == 0) Shutdown();
}

void Connection::Shutdown() {
  closed_.store(true, std::memory_order_seq_cst);
  if (shut_.exchange(true, std::memory_order_acq_rel)) return;
  if (CurrentPid() == owner_pid_) ::shutdown(fd_.get(), SHUT_RDWR);
}

Status Connection::AttachRing(UniqueFd fd, uint64_t bytes, uint32_t slot_count) {
  LX_RETURN_IF_ERROR(
      CheckSealedMemfd(fd.get(), kRingSeals, bytes).WithContext("ring from loaderxd"));
  LX_ASSIGN_OR_RETURN(ring_, MappedRegion::Map(fd.get(), bytes));
  LX_ASSIGN_OR_RETURN(geometry_, ValidateRing(ring_.data(), bytes));
  if (geometry_.slot_count != slot_count) {
    return Status::Protocol("ring has " + std::to_string(geometry_.slot_count) +
                            " slots, the open reply said " + std::to_string(slot_count));
  }
  ring_fd_ = std::move(fd);
  return Status::OK();
}

}  // namespace loaderx::client
