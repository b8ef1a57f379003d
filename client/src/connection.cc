#include "connection.h"

#include <poll.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <deque>

#include "loaderx/memfd.h"
#include "loaderx/unix_socket.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define LX_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(LX_ASAN)
#include <sanitizer/asan_interface.h>
#define LX_ASAN_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define LX_ASAN_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define LX_ASAN_POISON(p, n) ((void)(p), (void)(n))
#define LX_ASAN_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

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
    : fd_(std::move(fd)), notes_(fd_.get()), path_(std::move(path)), owner_pid_(::getpid()) {
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
  // The handshake has no id: hello's shape is what every version must be
  // able to read, so that a mismatch can be refused with both versions.
  HelloMsg hello;
  hello.client_version = LOADERX_CLIENT_VERSION;
  Status sent = c->SendMessage(hello, {});
  if (!sent.ok()) return sent.WithContext(path);
  Result<Frame> f = Frame{};
  const auto until = std::chrono::steady_clock::now() + kDeadPeerDetection * 10;
  do {
    f = c->Receive(kPollInterval);
    if (!f.ok()) return f.status().WithContext(path);
  } while (f->would_block && std::chrono::steady_clock::now() < until);
  if (f->would_block) return Status::Daemon(path + ": loaderxd did not answer hello");
  if (f->eof) return Status::Daemon(path + ": loaderxd closed the connection at hello");
  LX_ASSIGN_OR_RETURN(Message m, DecodeMessage(f->bytes));
  if (auto* err = std::get_if<ErrorMsg>(&m)) {
    // A version or cap refusal: keep the daemon's code and words.
    return err->ToStatus().WithContext(path + ": loaderxd refused the connection");
  }
  auto* ok = std::get_if<HelloOkMsg>(&m);
  if (ok == nullptr || !f->fds.empty()) return Status::Protocol(path + ": expected hello_ok");
  if (ok->major != kProtocolMajor || ok->minor < kMinProtocolMinor) {
    return Status::Protocol(path + ": loaderxd speaks protocol " + std::to_string(ok->major) + "." +
                            std::to_string(ok->minor) + ", this client " +
                            std::to_string(kProtocolMajor) + "." + std::to_string(kProtocolMinor) +
                            " (it needs at least " + std::to_string(kProtocolMajor) + "." +
                            std::to_string(kMinProtocolMinor) + ": upgrade loaderxd)");
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

Status Connection::SendRequest(const Message& m, std::span<const int> fds) {
  LX_RETURN_IF_ERROR(CheckProcess());
  if (closed()) return Status::Cancelled("loader closed");
  LX_RETURN_IF_ERROR(FlushReleases());             // releases precede the request
  last_heard_ = std::chrono::steady_clock::now();  // the liveness clock starts now
  return SendMessage(m, fds);
}

Result<Frame> Connection::Receive(std::chrono::milliseconds wait) {
  if (wait.count() <= 0) return RecvFrame(fd_.get(), kMaxFrameBytes, 2, /*nonblocking=*/true);
  // A blocking receive bounded by SO_RCVTIMEO (EAGAIN when it expires, which
  // RecvFrame reports as would_block): one syscall whether or not a frame
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
  return RecvFrame(fd_.get(), kMaxFrameBytes, 2);  // `opened`: the ring, the push queue
}

Result<bool> Connection::Pump(const WaitHook& hook,
                              std::optional<std::chrono::steady_clock::time_point> deadline) {
  using Clock = std::chrono::steady_clock;
  LX_RETURN_IF_ERROR(CheckProcess());
  notes_.QueueDeferred();  // nothing pushed comes while the daemon does not know the last take
  while (true) {
    if (closed()) return Status::Cancelled("loader closed");
    LX_ASSIGN_OR_RETURN(bool queued, DrainQueue());
    if (queued) return true;
    auto wait = kPollInterval;
    if (deadline) {
      auto left = std::chrono::ceil<std::chrono::milliseconds>(*deadline - Clock::now());
      wait = std::clamp(left, std::chrono::milliseconds(0), kPollInterval);
    }
    Result<Frame> got = Frame{};
    if (notes_.queued()) {
      got = ReceiveOrFlush(wait);
    } else {
      got = Receive(wait);
    }
    LX_ASSIGN_OR_RETURN(Frame f, std::move(got));
    if (f.would_block) {
      const auto liveness = liveness_timeout();
      if (hello_.heartbeat_ms != 0 && Clock::now() - last_heard_ > liveness) {
        return Status::Daemon(path_ +
                              ": loaderxd sent nothing (no batch, reply or heartbeat) for " +
                              std::to_string(liveness.count()) +
                              " ms (stopped, hung or swapped out?); liveness timeout " +
                              std::to_string(liveness.count()) + " ms");
      }
      if (hook) LX_RETURN_IF_ERROR(hook());
      if (deadline && Clock::now() >= *deadline) return false;
      continue;
    }
    LX_ASSIGN_OR_RETURN(bool filed, Take(std::move(f)));
    if (filed) return true;
  }
}

Result<bool> Connection::PumpQueued() {
  LX_RETURN_IF_ERROR(CheckProcess());
  while (true) {
    if (closed()) return Status::Cancelled("loader closed");
    if (notes_.queued()) (void)notes_.TrySendQueued();
    LX_ASSIGN_OR_RETURN(bool queued, DrainQueue());
    if (queued) return true;
    LX_ASSIGN_OR_RETURN(Frame f, Receive(std::chrono::milliseconds(0)));
    if (f.would_block) return false;
    LX_ASSIGN_OR_RETURN(bool filed, Take(std::move(f)));
    if (filed) return true;
  }
}

Result<bool> Connection::Take(Frame f) {
  if (f.eof) {
    if (shut_down()) return Status::Cancelled("loader closed");
    return Status::Daemon(path_ + ": loaderxd closed the connection (stopped or crashed)");
  }
  last_heard_ = std::chrono::steady_clock::now();
  LX_ASSIGN_OR_RETURN(Message m, DecodeMessage(f.bytes));
  if (std::holds_alternative<HeartbeatMsg>(m)) return false;  // alive; read on
  LX_RETURN_IF_ERROR(File(std::move(m), std::move(f.fds)));
  return true;
}

Result<bool> Connection::DrainQueue() {
  if (!push_queue_.attached()) return false;
  bool filed = false;
  while (true) {
    LX_ASSIGN_OR_RETURN(bool got, push_queue_.Peek(&queue_frame_));
    if (!got) break;
    // A batch (the common case) is decoded into one reused message, so
    // filing it allocates nothing; anything else must be a step's error.
    const bool batch = IsBatchFrame(queue_frame_);
    std::optional<Message> error;
    uint64_t gen = 0;
    if (batch) {
      LX_RETURN_IF_ERROR(DecodeBatchFrame(queue_frame_, &queue_batch_));
      gen = queue_batch_.gen;
    } else {
      LX_ASSIGN_OR_RETURN(error, DecodeMessage(queue_frame_));
      const auto* e = std::get_if<ErrorMsg>(&*error);
      if (e == nullptr || !e->gen || e->id) {
        return Status::Protocol(std::string("the push queue holds a '") + MessageName(*error) +
                                "' frame (only pushed batches and step errors are queued)");
      }
      gen = *e->gen;
    }
    // Pushed after a seek the daemon accepted: its `ok`, in the socket, is
    // filed first (File refuses a generation the loader has not reached).
    if (gen > gen_ && seek_id_ != 0) break;
    push_queue_.Pop();
    LX_RETURN_IF_ERROR(batch ? FileBatch(queue_batch_) : File(std::move(*error), {}));
    filed = true;
  }
  if (filed) last_heard_ = std::chrono::steady_clock::now();
  return filed;
}

Result<Frame> Connection::ReceiveOrFlush(std::chrono::milliseconds wait) {
  if (notes_.TrySendQueued()) return Receive(wait);  // all sent: a plain wait
  // Still queued: wait for either direction. A seqpacket socket polls
  // writable once the daemon has read enough of what we sent.
  pollfd p{fd_.get(), POLLIN | POLLOUT, 0};
  int rc;
  do {
    rc = ::poll(&p, 1, static_cast<int>(wait.count()));
  } while (rc < 0 && errno == EINTR);
  if (rc < 0) return Status::FromErrno("poll", errno);
  if (rc > 0 && (p.revents & POLLOUT) && !(p.revents & (POLLIN | POLLHUP | POLLERR))) {
    (void)notes_.TrySendQueued();
  }
  return Receive(std::chrono::milliseconds(0));  // a frame, or would_block
}

Status Connection::File(Message m, std::vector<UniqueFd> fds) {
  if (!fds.empty() && !std::holds_alternative<OpenedMsg>(m)) {
    return Status::Protocol(std::string("'") + MessageName(m) + "' from loaderxd carried fds");
  }
  // Pushed: a batch, or a step's error (an error with a generation).
  if (const auto* b = std::get_if<BatchMsg>(&m)) return FileBatch(*b);
  if (auto* e = std::get_if<ErrorMsg>(&m); e != nullptr && e->gen) {
    Pushed item;
    item.gen = *e->gen;
    item.error = e->ToStatus();
    item.step_after = e->step;
    return FilePushed(std::move(item));
  }
  // A reply: matched by id.
  uint64_t id = 0;
  if (auto* o = std::get_if<OpenedMsg>(&m))
    id = o->id;
  else if (auto* k = std::get_if<OkMsg>(&m))
    id = k->id;
  else if (auto* r = std::get_if<StatsReplyMsg>(&m))
    id = r->id;
  else if (auto* e = std::get_if<ErrorMsg>(&m))
    id = e->id.value_or(0);
  else
    return Status::Protocol(std::string("unexpected '") + MessageName(m) + "' from loaderxd");
  if (id == 0 || id >= next_id_) {
    return Status::Protocol(std::string("'") + MessageName(m) + "' from loaderxd answers id " +
                            std::to_string(id) + ", which was never sent");
  }
  if (id == seek_id_) {
    if (auto* ok = std::get_if<OkMsg>(&m)) {
      if (ok->gen != gen_ + 1) {
        return Status::Protocol("seek accepted with generation " + std::to_string(ok->gen) +
                                ", expected " + std::to_string(gen_ + 1));
      }
      gen_ = ok->gen;
      seek_outcome_ = Status::OK();
      wait_announced_ = false;  // a new position (the daemon forgot the flag)
      DropReady(/*older_only=*/true);
      seek_pending_.store(false, std::memory_order_seq_cst);
    } else if (auto* err = std::get_if<ErrorMsg>(&m)) {
      seek_outcome_ = err->ToStatus();
      seek_pending_.store(false, std::memory_order_seq_cst);
    } else {
      return Status::Protocol(std::string("expected ok or error after seek, got ") +
                              MessageName(m));
    }
    seek_id_ = 0;
    return Status::OK();
  }
  if (id == awaited_id_) {
    reply_ = Reply{std::move(m), std::move(fds)};
    awaited_id_ = 0;
  }
  // Otherwise the reply of an abandoned request (its wait ended early).
  return Status::OK();
}

Status Connection::FileBatch(const BatchMsg& b) {
  if (ring_base() == nullptr) return Status::Protocol("a batch arrived before the loader opened");
  if (b.slot >= geometry_.slot_count || b.offset > geometry_.total_bytes) {
    return Status::Protocol("batch from loaderxd names slot " + std::to_string(b.slot) +
                            " at offset " + std::to_string(b.offset) + " of a ring of " +
                            std::to_string(geometry_.slot_count) + " slots");
  }
  Pushed item;
  item.gen = b.gen;
  item.step_after = b.step + 1;
  // Owned from now on: dropped anywhere below, the slot goes back.
  item.lease = std::allocate_shared<Lease>(LeaseAllocator<Lease>(lease_pool_), shared_from_this(),
                                           b.slot, b.seq, ring_base() + b.offset);
  Lease& l = *item.lease;
  l.step_ = b.step;
  l.offset_ = b.offset;
  l.batch_size_ = b.batch_size;
  l.total_bytes_ = b.total_bytes;
  l.num_streams_ = static_cast<uint32_t>(b.streams.size());
  if (b.streams.size() > Lease::kInlineStreams) {
    l.more_layout_ = std::make_unique<StreamLayout[]>(b.streams.size());
  }
  for (size_t j = 0; j < b.streams.size(); ++j) {
    const StreamLayoutMsg& s = b.streams[j];  // kind is 0 or 1 (DecodeBatchFrame)
    (l.more_layout_ ? l.more_layout_[j] : l.inline_layout_[j]) =
        StreamLayout{static_cast<Kind>(s.kind), s.values_offset, s.values_bytes, s.shapes_offset,
                     s.offsets_offset};
  }
  return FilePushed(std::move(item));
}

Status Connection::FilePushed(Pushed item) {
  // A seek's new generation starts after its `ok`, which was filed first.
  if (item.gen > gen_) {
    return Status::Protocol("pushed item of generation " + std::to_string(item.gen) +
                            ", the loader is at " + std::to_string(gen_));
  }
  if (item.gen < gen_) return Status::OK();  // before an accepted seek: released unread
  std::lock_guard<std::mutex> lock(ready_mu_);
  if (closed()) {
    // Pushed before the daemon read our `close`: it drops this lease.
    if (item.lease && !seek_pending_.load(std::memory_order_seq_cst)) item.lease->Forget();
    return Status::OK();
  }
  ready_.push_back(std::move(item));
  return Status::OK();
}

LeasePool::LeasePool() {
  // Under ASan a free block is poisoned, so a Lease used after its last
  // owner let go is reported as it would be on the heap.
  LX_ASAN_POISON(blocks_.data(), sizeof(blocks_));
}

LeasePool::~LeasePool() { LX_ASAN_UNPOISON(blocks_.data(), sizeof(blocks_)); }

void* LeasePool::Allocate(size_t bytes) {
  if (bytes > kBlockBytes) return nullptr;
  for (size_t n = 0; n < kBlocks; ++n) {
    const size_t i = (next_ + n) % kBlocks;
    // Acquire: pairs with the release in Deallocate, so the block's last
    // use (on whatever thread) is over before it is reused here.
    if (!used_[i].load(std::memory_order_acquire)) {
      used_[i].store(true, std::memory_order_relaxed);  // only this thread sets flags
      next_ = (i + 1) % kBlocks;
      LX_ASAN_UNPOISON(blocks_[i].data(), kBlockBytes);
      return blocks_[i].data();
    }
  }
  return nullptr;
}

bool LeasePool::Deallocate(void* p) {
  const auto at = reinterpret_cast<uintptr_t>(p);
  const auto first = reinterpret_cast<uintptr_t>(blocks_.front().data());
  if (at < first || at - first >= sizeof(blocks_)) return false;
  const size_t i = (at - first) / kBlockBytes;
  LX_ASAN_POISON(blocks_[i].data(), kBlockBytes);
  used_[i].store(false, std::memory_order_release);
  return true;
}

// A Lease and its shared_ptr control block (two counts, a vtable pointer and
// the allocator) fit a block; were they to outgrow it, every Lease would
// come from the heap again.
static_assert(sizeof(Lease) + 64 <= LeasePool::kBlockBytes);

Result<Reply> Connection::Call(Message req, std::span<const int> fds, const WaitHook& hook) {
  const uint64_t id = next_id_++;
  std::visit(
      [id](auto& m) {
        if constexpr (requires { m.id = id; }) m.id = id;
      },
      req);
  LX_RETURN_IF_ERROR(SendRequest(req, fds));
  awaited_id_ = id;
  reply_.reset();
  while (!reply_) {
    Result<bool> got = Pump(hook, std::nullopt);
    if (!got.ok()) {
      awaited_id_ = 0;  // abandoned: its reply is dropped when it comes
      return got.status();
    }
  }
  Reply r = std::move(*reply_);
  reply_.reset();
  return r;
}

Status Connection::StartSeek(uint64_t step) {
  if (seek_id_ != 0) return Status::Internal("a seek is already in flight");
  const uint64_t id = next_id_;
  seek_pending_.store(true, std::memory_order_seq_cst);
  Status sent = SendRequest(SeekMsg{id, step}, {});
  if (!sent.ok()) {
    seek_pending_.store(false, std::memory_order_seq_cst);
    return sent;
  }
  ++next_id_;
  seek_id_ = id;
  seek_step_ = step;
  seek_outcome_.reset();
  return Status::OK();
}

Result<std::optional<Status>> Connection::AwaitSeek(
    const WaitHook& hook, std::optional<std::chrono::steady_clock::time_point> deadline) {
  while (!seek_outcome_) {
    if (seek_id_ == 0) return Status::Internal("no seek in flight");
    LX_ASSIGN_OR_RETURN(bool read, Pump(hook, deadline));
    if (!read && !seek_outcome_) return std::optional<Status>();
  }
  std::optional<Status> outcome = std::move(seek_outcome_);
  seek_outcome_.reset();
  seek_step_.reset();
  return outcome;
}

std::optional<Pushed> Connection::TakeReady() {
  std::lock_guard<std::mutex> lock(ready_mu_);
  if (ready_.empty()) return std::nullopt;
  Pushed p = std::move(ready_.front());
  ready_.pop_front();
  // This `consumed` has no waiting flag: the caller no longer waits.
  wait_announced_ = false;
  // Group positions follow what the caller takes (docs/protocol.md
  // "Consumed positions"). Reported (or deferred) under ready_mu_: a
  // CloseLoader on another thread either still finds this item queued or
  // sends its `close` after this `consumed`, so the daemon never drops the
  // lease of a taken batch.
  //
  // A caller still holding an earlier batch (a training loop's `for batch
  // in loader` holds the previous one until next() returns) releases it
  // soon: the take is then reported with that release, one syscall (and one
  // wake-up of the daemon) instead of two, and none inside next(). A caller
  // holding nothing else is reported at once, so the daemon pushes the next
  // batch while the caller works on this one, and so is a group member's
  // take (its peers' progress waits on its position).
  uint32_t queued_leases = 0;
  for (const Pushed& q : ready_) queued_leases += q.lease != nullptr ? 1 : 0;
  const uint32_t own = p.lease != nullptr ? 1 : 0;
  const bool holds_another = leases_held.load(std::memory_order_seq_cst) > own + queued_leases;
  if (defer_takes_ && holds_another && defer_cooldown_ == 0) {
    if (++defer_streak_ >= kDeferStreak) {  // deferrals keep paying: a miss costs less
      defer_backoff_ = std::max(kDeferCooldownMin, defer_backoff_ / 2);
      defer_streak_ = 0;
    }
    DeferConsumed(p.gen, p.step_after);
  } else {
    if (defer_cooldown_ > 0) --defer_cooldown_;
    Consumed(p.gen, p.step_after);
  }
  return p;
}

bool Connection::has_ready() {
  std::lock_guard<std::mutex> lock(ready_mu_);
  return !ready_.empty();
}

void Connection::DropReady(bool older_only) {
  std::deque<Pushed> dropped;  // destroyed (released) outside ready_mu_
  {
    std::lock_guard<std::mutex> lock(ready_mu_);
    if (!older_only) {
      // The loader closes: the daemon drops the leases of every batch it
      // pushed and the caller did not take (its consumed position says
      // which), including those still in the socket, so these send no
      // release. With a seek in flight some may be of a generation the
      // daemon already left (it counts those as released unread): they are
      // released (a refused seek makes those releases stale, which is
      // harmless).
      if (!seek_pending_.load(std::memory_order_seq_cst)) {
        for (Pushed& p : ready_) {
          if (p.lease) p.lease->Forget();
        }
      }
      dropped.swap(ready_);
    } else {
      while (!ready_.empty() && ready_.front().gen < gen_) {
        dropped.push_back(std::move(ready_.front()));
        ready_.pop_front();
      }
    }
  }
}

void Connection::Release(uint32_t slot, uint64_t seq) { SendNote(ReleaseMsg{slot, seq}); }

void Connection::Consumed(uint64_t gen, uint64_t step) { SendNote(ConsumedMsg{gen, step}); }

void Connection::DeferConsumed(uint64_t gen, uint64_t step) {
  if (CurrentPid() != owner_pid_ || shut_down()) return;
  notes_.Defer(ConsumedMsg{gen, step});
}

void Connection::AnnounceWait(uint64_t step) {
  if (wait_announced_) return;
  wait_announced_ = true;
  last_heard_ = std::chrono::steady_clock::now();  // a wait starts, as for a request
  if (notes_.DropIfDeferred(gen_, step)) {
    // The caller is back before anything carried its last take, so the
    // daemon could not push: this note reports the take too, and the next
    // takes are reported at once for a while (this caller holds batches
    // across next() calls without releasing any).
    defer_cooldown_ = defer_backoff_;
    defer_backoff_ = std::min(kDeferCooldownMax, 2 * defer_backoff_);
    defer_streak_ = 0;
  }
  SendNote(ConsumedMsg{gen_, step, /*waiting=*/true});
}

void Connection::SendNote(const Message& note) {
  if (CurrentPid() != owner_pid_ || shut_down()) return;
  notes_.Send(note);
}

Status Connection::FlushReleases() {
  for (const Message& r : notes_.TakeAll()) LX_RETURN_IF_ERROR(SendMessage(r, {}));
  return Status::OK();
}

void Connection::CloseLoader() {
  if (closed_.exchange(true, std::memory_order_seq_cst)) return;  // also after Shutdown()
  if (CurrentPid() != owner_pid_) return;
  // Pushed batches nobody took: their leases end first, so that what is
  // counted below is what the caller still views.
  DropReady(/*older_only=*/false);
  if (leases_held.load(std::memory_order_seq_cst) == 0) return Shutdown();
  // Batches are still viewed here: hanging up now would let the daemon
  // reuse their slots. Ask it to stop the loader instead; the socket closes
  // with the last lease. If the socket is full (a stalled daemon) the
  // session simply lingers until then: late, never unsafe.
  // Notes queued by a full socket go first, in order: a `close` overtaking a
  // `consumed` would make the daemon drop the lease of a batch the caller
  // took. If they cannot all go without blocking, neither can `close`: the
  // session lingers (and the loader stays a member) until the hang-up.
  notes_.SendAllThen(CloseMsg{});
}

bool Connection::MoveOutOldestView() {
  const bool moved = views_.MoveOutOldest([this](Lease* lease) {
    // As ~Lease: the release goes out before the count drops.
    Release(lease->slot_, lease->seq_);
    leases_held.fetch_sub(1, std::memory_order_seq_cst);
  });
  if (moved) views_moved_out.fetch_add(1, std::memory_order_relaxed);
  return moved;
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
  private_rings_.Attach(ring_fd_.get(), ring_.size());
  return Status::OK();
}

Status Connection::AttachQueue(UniqueFd fd, uint64_t bytes) {
  LX_ASSIGN_OR_RETURN(push_queue_, PushQueueReader::Attach(std::move(fd), bytes));
  return Status::OK();
}

}  // namespace loaderx::client
