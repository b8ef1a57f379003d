#include "session.h"

#include <linux/sockios.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/post.hpp>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include "lease_ledger.h"
#include "loaderx/loader.h"
#include "loaderx/mix.h"
#include "loaderx/push_queue.h"
#include "loaderx/sampler.h"
#include "serving_group.h"

namespace loaderx::daemon {

namespace asio = boost::asio;

namespace {

// Requests a client may have queued before it is considered abusive. A
// well-behaved client has at most one outstanding request and a `close`
// (releases are not queued).
constexpr size_t kMaxQueuedRequests = 8;
// How often a worker blocked on the pipeline re-checks for shutdown.
constexpr auto kWorkerPoll = std::chrono::milliseconds(50);
// How often a worker waiting for a batch to push (or for room in the socket
// to push it) re-checks for a request, a `close` or shutdown: the bound on
// how long a `seek` waits behind a batch that is not gathered yet.
constexpr auto kPushPoll = std::chrono::milliseconds(10);
static_assert(kPushPoll <= kWorkerPoll);
// How long an open of a shard rank whose member is still live waits for that
// member to leave before it is refused (Group::AwaitRankFree): a loader
// closed and reopened at once has its close read after the new open.
constexpr auto kRankHandover = std::chrono::milliseconds(500);
// Frames handled per readiness wake-up before yielding to other connections.
constexpr int kFramesPerWakeup = 64;
// Shutdown's reason for an end-of-file on the socket.
constexpr const char* kHungUp = "client hung up";

}  // namespace

class SessionImpl final : public Session, public std::enable_shared_from_this<SessionImpl> {
 public:
  SessionImpl(SessionContext& ctx, Socket socket, uint64_t id, PeerCred cred)
      : ctx_(ctx), socket_(std::move(socket)), fd_(socket_.native_handle()), id_(id), cred_(cred) {}

  ~SessionImpl() override {
    if (worker_.joinable()) worker_.join();
  }

  void Start() override { ArmRead(); }

  // io thread (Server::Impl::Tick): "still alive" to a client that may be
  // waiting: a request of its is outstanding, or the worker waits for a
  // batch to push under its credit. Only when the client has read
  // everything sent to it (SIOCOUTQ: no unread bytes), so an idle client's
  // socket never fills with heartbeats and a heartbeat it reads is fresh.
  // Never blocks.
  void Heartbeat() override {
    if (shut_ || !heartbeat_) return;
    if (outstanding_.load(std::memory_order_relaxed) == 0 &&
        !awaiting_batch_.load(std::memory_order_relaxed)) {
      return;
    }
    int unread = 0;
    if (::ioctl(fd_, SIOCOUTQ, &unread) != 0 || unread != 0) return;
    (void)Send(HeartbeatMsg{});
  }

  // io thread. Idempotent.
  void Shutdown(const std::string& why) override {
    if (shut_) return;
    shut_ = true;
    // The connection is over: it stops counting now, not once its worker
    // has wound down, so a client that hangs up and connects again (a stats
    // poll after connect()'s check) never meets its own previous connection.
    Uncount();
    // A hang-up is the normal end of a session (a stats poll is a hello and
    // a hang-up): only a session with a loader logs it, when it leaves.
    if (!shut_quietly_ && why != kHungUp) {
      LX_LOG(kDebug) << "session " << id_ << " (pid " << cred_.pid << ", uid " << cred_.uid
                     << ") closing: " << why;
    }
    boost::system::error_code ec;
    socket_.cancel(ec);
    if (!worker_.joinable()) {
      asio::post(ctx_.io, [&ctx = ctx_, id = id_] { ctx.finish(id); });
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      closing_ = true;
      end_reason_ = why;
    }
    cv_.notify_all();
    WakePush();
  }

  // A push waiting in the group (for a batch, or for peers) sees a request,
  // a `close` or the session's end now, not at its next poll: a member
  // whose client hung up leaves its group (and frees its rank) at once.
  // Without mu_ (the group calls PushInterrupted under its own lock).
  void WakePush() {
    std::shared_ptr<Group> group;
    {
      std::lock_guard<std::mutex> lock(mu_);
      group = member_of_;
    }
    if (group) group->Wake();
  }

  // io thread, from Finish: the worker has exited (or never ran).
  void Close() override {
    if (worker_.joinable()) worker_.join();
    boost::system::error_code ec;
    socket_.close(ec);
    Uncount();
  }

 private:
  struct Request {
    Message msg;
    std::vector<UniqueFd> fds;
  };

  // io thread: gives the session's count back to its uid, once.
  void Uncount() {
    if (counted_) ctx_.accounts.RemoveSession(cred_.uid);
    counted_ = false;
  }

  void ArmRead() {
    socket_.async_wait(Socket::wait_read,
                       [self = shared_from_this()](const boost::system::error_code& ec) {
                         if (ec || self->shut_) return;
                         self->OnReadable();
                       });
  }

  void OnReadable() {
    for (int i = 0; i < kFramesPerWakeup && !shut_; ++i) {
      Result<Frame> frame = RecvFrame(fd_, kMaxFrameBytes, kMaxFrameFds, /*nonblocking=*/true);
      if (!frame.ok()) return ProtocolViolation(frame.status());
      if (frame->would_block) break;
      if (frame->eof) return Shutdown(kHungUp);
      HandleFrame(std::move(frame).value());
    }
    if (!shut_) ArmRead();
  }

  void ProtocolViolation(const Status& st) {
    ctx_.counters.protocol_errors.fetch_add(1, std::memory_order_relaxed);
    // A hostile client must not be able to flood the log (stderr can block
    // the io thread when its reader is slow): a few lines per window, then a
    // count of what was suppressed.
    if (uint64_t suppressed; ctx_.violation_log.Allow(&suppressed)) {
      LX_LOG(kWarning) << "session " << id_ << " (pid " << cred_.pid << ", uid " << cred_.uid
                       << "): " << st.ToString()
                       << (suppressed
                               ? " (" + std::to_string(suppressed) + " similar messages suppressed)"
                               : std::string());
    }
    shut_quietly_ = true;
    Shutdown("protocol violation");
  }

  void HandleFrame(Frame frame) {
    Result<Message> decoded = DecodeMessage(frame.bytes);
    if (!decoded.ok()) return ProtocolViolation(decoded.status());
    Message& msg = decoded.value();
    const bool is_open = std::holds_alternative<OpenMsg>(msg);
    if (!frame.fds.empty() && !is_open) {
      return ProtocolViolation(
          Status::Protocol(std::string("'") + MessageName(msg) + "' must not carry fds"));
    }
    if (!hello_done_) {
      auto* hello = std::get_if<HelloMsg>(&msg);
      if (hello == nullptr) {
        return ProtocolViolation(
            Status::Protocol(std::string("expected hello, got '") + MessageName(msg) + "'"));
      }
      return HandleHello(*hello);
    }
    if (auto* rel = std::get_if<ReleaseMsg>(&msg)) return HandleRelease(*rel);
    if (auto* c = std::get_if<ConsumedMsg>(&msg)) return HandleConsumed(*c);
    if (is_open || std::holds_alternative<SeekMsg>(msg) || std::holds_alternative<StatsMsg>(msg) ||
        std::holds_alternative<CloseMsg>(msg)) {
      if (is_open && frame.fds.size() != std::get<OpenMsg>(msg).TotalFds()) {
        return ProtocolViolation(
            Status::Protocol("open announced " + std::to_string(std::get<OpenMsg>(msg).TotalFds()) +
                             " fds but carried " + std::to_string(frame.fds.size())));
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (queue_.size() >= kMaxQueuedRequests) {
          return ProtocolViolation(Status::Protocol("too many outstanding requests"));
        }
        // A `close` also cancels a `seek` the worker is waiting on (answered
        // with a Cancelled error) and stops pushing, so it never waits
        // behind either.
        if (std::holds_alternative<CloseMsg>(msg)) loader_closing_ = true;
        queue_.push_back(Request{std::move(msg), std::move(frame.fds)});
        outstanding_.fetch_add(1, std::memory_order_relaxed);
      }
      cv_.notify_all();
      WakePush();
      return;
    }
    ProtocolViolation(Status::Protocol(std::string("unexpected message '") + MessageName(msg) +
                                       "' from a client"));
  }

  void HandleHello(const HelloMsg& hello) {
    if (hello.major != kProtocolMajor || hello.minor < kMinProtocolMinor) {
      ctx_.counters.refused.fetch_add(1, std::memory_order_relaxed);
      const std::string why =
          hello.major != kProtocolMajor
              ? "major versions must match"
              : "protocol 1." + std::to_string(kMinProtocolMinor) +
                    " sends batch, release and consumed as binary frames; older clients are "
                    "not served: upgrade the client";
      Status st = Status::Protocol(
          "protocol version mismatch: client speaks " + std::to_string(hello.major) + "." +
          std::to_string(hello.minor) + ", loaderxd " LOADERX_DAEMON_VERSION " speaks " +
          std::to_string(kProtocolMajor) + "." + std::to_string(kProtocolMinor) + " (" + why + ")");
      if (uint64_t suppressed; ctx_.violation_log.Allow(&suppressed)) {
        LX_LOG(kInfo) << "refused pid " << cred_.pid << " (uid " << cred_.uid
                      << "): " << st.message();
      }
      (void)Send(ErrorMsg::From(st));
      return Shutdown(st.message());
    }
    Status cap = ctx_.accounts.AddSession(cred_.uid);
    if (!cap.ok()) {
      ctx_.counters.refused.fetch_add(1, std::memory_order_relaxed);
      if (uint64_t suppressed; ctx_.violation_log.Allow(&suppressed)) {
        LX_LOG(kWarning) << "refused pid " << cred_.pid << ": " << cap.message();
      }
      (void)Send(ErrorMsg::From(cap));
      return Shutdown(cap.message());
    }
    counted_ = true;
    hello_done_ = true;
    heartbeat_ = true;  // every client served speaks 1.2 or later
    if (!Send(HelloOkMsg{kProtocolMajor, kProtocolMinor, LOADERX_DAEMON_VERSION, ctx_.incarnation,
                         id_, heartbeat_ ? kHeartbeatIntervalMs : 0})
             .ok()) {
      return Shutdown("cannot reply to hello");
    }
    worker_ = std::thread([self = shared_from_this()] { self->WorkerLoop(); });
  }

  // The caller took an item (docs/protocol.md "Consumed positions"). Applied
  // here, in the connection's frame order, so a later request on this
  // connection sees it; the group's lock orders it against seeks.
  void HandleConsumed(const ConsumedMsg& c) {
    std::shared_ptr<Group> group;
    {
      std::lock_guard<std::mutex> lock(mu_);
      group = member_of_;
    }
    if (!group) return;  // no loader open (or closed): nothing to keep
    Result<Group::ConsumedResult> r = group->Consumed(id_, c.gen, c.step, c.waiting);
    if (!r.ok()) return ProtocolViolation(r.status());
    // A client with a push queue that waits is woken by a `heartbeat` once
    // its queue has an item: now, if one was written since it last looked,
    // else by the worker's next write (PushQueued). mu_ orders the two.
    Result<bool> wake = WakeIfQueued(c.waiting);
    if (!wake.ok()) return ProtocolViolation(wake.status());
    if (*wake) SendWakeup();
    if (!r->current) return;
    leases_.Taken(c.gen, c.step);  // no longer "pushed unread" (a `close` drops only those)
    ctx_.counters.batches_served.fetch_add(r->batches, std::memory_order_relaxed);
    // The caller has seen a pushed refusal (or took a batch): push again.
    {
      std::lock_guard<std::mutex> lock(mu_);
      push_blocked_ = false;
    }
    cv_.notify_all();
  }

  void HandleRelease(const ReleaseMsg& rel) {
    if (!leases_.Release(rel.slot, rel.seq)) {  // stale, duplicated or forged: ignored
      ctx_.counters.stale_releases.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    ctx_.counters.slots_held.fetch_sub(1, std::memory_order_relaxed);
    ctx_.counters.releases.fetch_add(1, std::memory_order_relaxed);
    // Credit came back: the worker may push again. Taking mu_ orders this
    // wake-up after the worker's check of the ledger (no lost wake-up).
    {
      std::lock_guard<std::mutex> lock(mu_);
      push_blocked_ = false;
    }
    cv_.notify_all();
  }

  // io thread (HandleConsumed): true if a waiting client must be woken now;
  // otherwise remembers whether it waits.
  Result<bool> WakeIfQueued(bool waiting) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!push_queue_) return false;
    client_waits_ = false;
    if (!waiting) return false;
    LX_ASSIGN_OR_RETURN(uint64_t unread, push_queue_->Unread());
    if (unread > 0) return true;
    client_waits_ = true;
    return false;
  }

  // Replies and heartbeats: never block on a client that does not read
  // (that is its problem, and the worker/io thread must stay free).
  Status Send(const Message& m, std::span<const int> fds = {}) {
    std::vector<uint8_t> bytes = EncodeMessage(m);
    return SendFrame(fd_, bytes, fds, /*nonblocking=*/true);
  }

  // Worker: a pushed batch or step error. The socket holds at most the
  // credit's batches plus one heartbeat and the replies, so it is full only
  // if the client stopped reading; then the push waits for room (polling for
  // the session's end), and the client finds it when it reads again.
  //
  // With a push queue (protocol 1.4) every pushed item goes into the queue
  // instead, so batches and step errors keep one order; the socket keeps
  // the replies. A full queue (the client stopped reading) waits the same
  // way. A client that said it waits gets a `heartbeat` after the write.
  Status Push(const Message& m) {
    std::vector<uint8_t> bytes = EncodeMessage(m);
    if (push_queue_) return PushQueued(bytes);
    while (true) {
      Status st = SendFrame(fd_, bytes, {}, /*nonblocking=*/true);
      if (st.code() != Status::Code::kResourceExhausted) return st;
      if (LoaderClosing()) return Status::Cancelled("loader closed");
      pollfd p{fd_, POLLOUT, 0};
      (void)::poll(&p, 1, static_cast<int>(kPushPoll.count()));
    }
  }

  Status PushQueued(std::span<const uint8_t> frame) {
    bool wake = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      while (true) {
        LX_ASSIGN_OR_RETURN(bool written, push_queue_->Write(frame));
        if (written) break;
        if (closing_ || loader_closing_) return Status::Cancelled("loader closed");
        cv_.wait_for(lock, kPushPoll);
      }
      wake = std::exchange(client_waits_, false);
    }
    if (!wake) return Status::OK();
    SendWakeup();
    return Status::OK();
  }
  // A lost wake-up costs at most one heartbeat interval (the client reads
  // its queue on every frame), so a full socket is not an error here.
  void SendWakeup() {
    ctx_.counters.queue_wakeups.fetch_add(1, std::memory_order_relaxed);
    (void)Send(HeartbeatMsg{});
  }

  // ---- worker thread ----------------------------------------------------

  // Requests in arrival order; between them, while the client holds fewer
  // batches than its credit, pushes the next batch (docs/protocol.md).
  void WorkerLoop() {
    while (true) {
      std::optional<Request> req;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return closing_ || !queue_.empty() || CanPushLocked(); });
        if (closing_) break;
        if (!queue_.empty()) {
          req = std::move(queue_.front());
          queue_.pop_front();
        }
      }
      Status sent = req ? Answer(*req) : PushNext();
      if (req) outstanding_.fetch_sub(1, std::memory_order_relaxed);  // answered (or failed)
      if (!sent.ok() && sent.code() != Status::Code::kCancelled) {
        // Nothing more is sent. The session ends when the io thread has read
        // the client's last frames: a client that hung up (the send found
        // the socket closed) may have sent releases before it did, and they
        // must meet their leases, not a dropped ledger.
        {
          std::lock_guard<std::mutex> lock(mu_);
          peer_gone_ = true;
        }
        if (sent.code() == Status::Code::kDaemon) {
          LX_LOG(kDebug) << "session " << id_ << ": client hung up";
        } else {
          LX_LOG(kInfo) << "session " << id_ << ": " << sent.ToString();
          asio::post(ctx_.io, [self = shared_from_this()] { self->Shutdown("reply failed"); });
        }
      }
    }
    // Group first: the pipeline must be stopped before the leased slots are
    // freed, or a gather still running could reuse one.
    if (group_) LeaveGroup(EndReason());
    DropLeases();
    asio::post(ctx_.io, [&ctx = ctx_, id = id_] { ctx.finish(id); });
  }

  Status Answer(Request& req) {
    request_ = MessageName(req.msg);
    return std::visit(
        [&](auto& m) -> Status {
          using T = std::decay_t<decltype(m)>;
          if constexpr (std::is_same_v<T, OpenMsg>) return DoOpen(m, std::move(req.fds));
          if constexpr (std::is_same_v<T, SeekMsg>) return DoSeek(m);
          if constexpr (std::is_same_v<T, StatsMsg>) {
            StatsReplyMsg reply = ctx_.stats(cred_.uid, m.detail, /*observer=*/!group_);
            reply.id = m.id;
            return Send(reply);
          }
          if constexpr (std::is_same_v<T, CloseMsg>) {
            LeaveGroup("closed its loader");  // no reply (1.2): pushing stops
            DropUnread();
            return Status::OK();
          }
          return Status::Internal("unreachable");
        },
        req.msg);
  }

  // REQUIRES mu_ (worker thread: group_ is its own). Lock order: mu_, then
  // the ledger's.
  bool CanPushLocked() {
    if (!group_ || loader_closing_ || peer_gone_ || push_blocked_) return false;
    return leases_.held() < lease_cap_;
  }
  // A push's wait gives way to a request, a `close` or the session's end.
  bool PushInterrupted() {
    std::lock_guard<std::mutex> lock(mu_);
    return closing_ || loader_closing_ || !queue_.empty();
  }

  // One batch (or the error of its step) at the member's cursor, pushed.
  Status PushNext() {
    awaiting_batch_.store(true, std::memory_order_relaxed);
    Result<Delivery> got = group_->Next(
        id_, [this] { return PushInterrupted(); }, kPushPoll);
    awaiting_batch_.store(false, std::memory_order_relaxed);
    if (!got.ok()) {
      if (got.status().code() == Status::Code::kCancelled && PushInterrupted()) {
        return Status::OK();  // the request (or the end) comes first
      }
      // Not a step's error (the ring refused, the group timeout): pushed
      // once, then nothing until the client takes it (`consumed`), releases
      // a batch or seeks.
      {
        std::lock_guard<std::mutex> lock(mu_);
        push_blocked_ = true;
      }
      LogRefused(got.status(), "next");
      // Its step is the caller's once it takes this error: after what was
      // pushed before it.
      ErrorMsg err = ErrorMsg::From(got.status(), group_->pushed(id_));
      err.gen = group_->generation(id_);
      return Push(err);
    }
    Delivery& d = got.value();
    if (!d.error.ok()) {
      LX_LOG(kWarning) << "session " << id_ << " (pid " << cred_.pid << "): step " << d.step
                       << " failed: " << d.error.ToString();
      ErrorMsg err = ErrorMsg::From(d.error, d.step + 1);
      err.gen = d.gen;
      return Push(err);
    }
    BatchMsg batch;
    batch.gen = d.gen;
    batch.step = d.step;
    batch.slot = d.slot;
    batch.seq = d.seq;
    batch.offset = d.offset;
    batch.batch_size = d.batch_size;
    batch.total_bytes = d.total_bytes;
    for (const StreamLayout& l : d.streams) {
      batch.streams.push_back(StreamLayoutMsg{static_cast<uint32_t>(l.kind), l.values_offset,
                                              l.values_bytes, l.shapes_offset, l.offsets_offset});
    }
    // Registered before the batch leaves, so its release cannot be early.
    leases_.Add(d.gen, d.step, batch.slot, d.seq, std::move(d.memory));
    // batches_served counts batches consumed (HandleConsumed), not pushed.
    ctx_.counters.slots_held.fetch_add(1, std::memory_order_relaxed);
    return Push(batch);
  }

  bool Closing() {
    std::lock_guard<std::mutex> lock(mu_);
    return closing_;
  }
  // The session ends, or the client closed its loader: waits give up.
  bool LoaderClosing() {
    std::lock_guard<std::mutex> lock(mu_);
    return closing_ || loader_closing_;
  }
  // A wait cancelled by `close` is answered (the session goes on, holding
  // its leases); one cancelled because the session ends is not.
  Status Cancelled(const Status& st, uint64_t id) {
    if (Closing()) return Status::Cancelled("session closing");
    return Error(st, id);
  }

  // A `close`: the batches pushed and not taken (the consumed position says
  // which, also those still in the socket) are the daemon's to drop; the
  // client forgets its queued ones without releasing them. Leases of
  // batches the caller took stay until released or the hang-up.
  void DropUnread() {
    ctx_.counters.slots_held.fetch_sub(leases_.DropUnread(), std::memory_order_relaxed);
  }

  // Drops this session's leases: its client is gone (hang-up), so nothing
  // views those slots any more.
  void DropLeases() {
    // The leases go first: a closed group's ring whose last holders they
    // were gives its charge back before a stats reader sees the slots gone.
    const uint32_t held = leases_.DropAll();
    ctx_.counters.slots_held.fetch_sub(held, std::memory_order_relaxed);
  }

  // Why this session's loader ends without a `close` (worker thread).
  std::string EndReason() {
    std::string why;
    {
      std::lock_guard<std::mutex> lock(mu_);
      why = end_reason_;
    }
    if (why == kHungUp) {
      // A client that holds no batch closes its loader by closing the
      // connection (client/src/connection.cc); its process lives on.
      const std::string fate = PeerFate(cred_.pid, cred_.uid);
      if (fate == kStillRunning) {
        return "closed its connection (process " + std::to_string(cred_.pid) + " " + fate + ")";
      }
      return "hung up without closing its loader: process " + std::to_string(cred_.pid) + " " +
             fate;
    }
    return why.empty() ? "reply failed" : why;
  }

  // Leaves the group; the last member closes it (pipeline stopped, held
  // batches dropped). The session's leases stay: after a `close` the client
  // may still view those slots (they are dropped on hang-up), and while a
  // closed group's ring is leased its bytes stay charged to the uid.
  void LeaveGroup(const std::string& how) {
    if (!group_) return;
    const bool named = !group_->name().empty();
    LX_LOG(kInfo) << "session " << id_ << " (pid " << cred_.pid << ", uid " << cred_.uid << ") "
                  << (named ? "left group '" + group_->name() + "'" : std::string("closed"))
                  << (named && group_->mode() == GroupMode::kShard
                          ? " as rank " + std::to_string(rank_)
                          : std::string())
                  << " at step " << group_->cursor(id_) << ": " << how;
    const bool last = ctx_.groups.Leave(cred_.uid, id_, group_, how);
    if (last && named) {
      LX_LOG(kInfo) << "group '" << group_->name() << "' closed: its last member left ("
                    << group_->batches_gathered() << " batches gathered)";
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      member_of_.reset();
    }
    group_.reset();
  }

  // Every refused request (or push) is logged with its reason, except a wait
  // that a `close` cancelled (the client asked for it).
  void LogRefused(const Status& st, const char* what) {
    if (st.code() == Status::Code::kCancelled) return;
    const LogLevel level =
        st.code() == Status::Code::kTimeout ? LogLevel::kWarning : LogLevel::kInfo;
    if (LogEnabled(level)) {
      LogLine(level, "session " + std::to_string(id_) + " (pid " + std::to_string(cred_.pid) +
                         ", uid " + std::to_string(cred_.uid) + "): " + what +
                         " refused: " + st.ToString());
    }
  }

  // The failed reply to request `id`.
  Status Error(const Status& st, uint64_t id) {
    LogRefused(st, request_);
    ErrorMsg err = ErrorMsg::From(st, group_ ? group_->cursor(id_) : 0);
    err.id = id;
    return Send(err);
  }

  // `open` (docs/protocol.md): checks the request, opens its stores, joins
  // or creates the group and answers. Each part refuses with the status the
  // client is sent; the checks run in this order.
  Status DoOpen(const OpenMsg& m, std::vector<UniqueFd> fds) {
    if (group_) return Error(Status::State("a loader is already open on this connection"), m.id);
    if (LoaderClosing()) {
      return Error(Status::State("the loader of this connection was closed; open a new connection"),
                   m.id);
    }
    Result<Group::MemberSpec> spec = MemberSpecOf(m, std::move(fds));
    if (!spec.ok()) return Error(spec.status(), m.id);
    const Group::Options options = OptionsOf(m);
    if (!m.group.empty() && m.group_mode == GroupMode::kShard) AwaitRankHandover(m);
    // Protocol 1.4: made before the join, so a failure leaves nothing to undo.
    std::optional<PushQueueWriter> queue;
    if (m.push_queue) {
      Result<PushQueueWriter> made = PushQueueWriter::Create(kPushQueueDataBytes);
      if (!made.ok()) return Error(made.status(), m.id);
      queue = std::move(made).value();
    }
    Result<GroupRegistry::Joined> joined = JoinGroup(m, *spec, options);
    if (!joined.ok()) return Error(joined.status(), m.id);
    return SendOpened(m, *spec, options, *joined, std::move(queue));
  }

  // The stores of the request's streams, in order, from its fds: a
  // mixture's K parts of one stream arrive as K consecutive entries
  // (wire.h, StreamRole; the decoder checked the shape).
  Result<std::vector<std::shared_ptr<const Store>>> OpenStreams(const OpenMsg& m,
                                                                std::vector<UniqueFd> fds) {
    size_t next_fd = 0;
    auto take = [&] { return std::move(fds[next_fd++]); };
    const size_t k = m.mix_datasets != 0 ? m.mix_datasets : m.mix_counts.size();
    if (k != 0) LX_RETURN_IF_ERROR(ValidateMixCounts(m.mix_counts, k));
    std::vector<std::shared_ptr<const Store>> streams;
    std::vector<std::shared_ptr<const Store>> parts;
    for (const StreamFilesMsg& s : m.streams) {
      Result<std::shared_ptr<const Store>> store = std::shared_ptr<const Store>();
      if (s.role == StreamRole::kMixSource) {
        store = ctx_.stores.GetMixed({}, m.mix_counts, k);
      } else {
        StoreFiles files;
        files.label = s.label;
        files.meta = take();
        files.index = take();
        if (s.has_shapes) files.shapes = take();
        if (s.has_dict) files.dict = take();
        for (uint32_t i = 0; i < s.data_files; ++i) files.data.push_back(take());
        store = ctx_.stores.Get(std::move(files));
        if (store.ok() && s.role == StreamRole::kMixPart) {
          parts.push_back(std::move(store).value());
          if (parts.size() < k) continue;
          store = ctx_.stores.GetMixed(std::move(parts), m.mix_counts);
          parts.clear();
        }
      }
      if (!store.ok()) return store.status();
      if (!streams.empty() && store.value()->size() != streams[0]->size()) {
        return Status::InvalidArgument("streams differ in length: " + streams[0]->label() +
                                       " has " + std::to_string(streams[0]->size()) + " records, " +
                                       store.value()->label() + " has " +
                                       std::to_string(store.value()->size()));
      }
      streams.push_back(std::move(store).value());
    }
    return streams;
  }

  // What the member asks of its group: its streams and sampler, checked.
  Result<Group::MemberSpec> MemberSpecOf(const OpenMsg& m, std::vector<UniqueFd> fds) {
    Group::MemberSpec spec;
    spec.mode = m.group.empty() ? GroupMode::kBroadcast : m.group_mode;
    if (m.mix_datasets != 0 || !m.mix_counts.empty()) spec.mix_counts = m.mix_counts;
    LX_ASSIGN_OR_RETURN(spec.streams, OpenStreams(m, std::move(fds)));
    SamplerSpec& ss = spec.sampler;
    ss.n = spec.streams[0]->size();
    ss.batch_size = m.batch_size;
    ss.mode = static_cast<SamplerMode>(m.mode);
    ss.seed = m.seed;
    ss.rank = m.rank;
    ss.world_size = m.world_size;
    for (size_t i = 0; i + 2 < m.segments.size(); i += 3) {
      ss.segments.push_back(SamplerSegment{m.segments[i], m.segments[i + 1], m.segments[i + 2]});
    }
    LX_RETURN_IF_ERROR(ss.Validate());
    spec.ranks_first = m.ranks_first;
    spec.ranks_count = m.ranks_count;
    spec.replicas = m.replicas;
    LX_RETURN_IF_ERROR(spec.Validate());
    // The pipeline of a shard group draws the global batch.
    const uint64_t drawn = Group::PipelineSpec(spec).batch_size;
    if (drawn > (uint64_t{1} << 32)) {
      return Status::InvalidArgument("batch_size " + std::to_string(drawn) +
                                     (drawn != m.batch_size ? " (batch_size * world_size)" : "") +
                                     " is too large");
    }
    return spec;
  }

  // The group's settings from the request within this daemon's limits.
  Group::Options OptionsOf(const OpenMsg& m) {
    Group::Options options;
    options.leases = std::clamp<uint32_t>(m.leases, 1, ctx_.config.max_leases);
    options.prefetch = std::clamp<uint32_t>(m.prefetch, 1, ctx_.config.max_prefetch);
    // A named group's pipeline runs at most --group-prefetch batches ahead
    // (docs/daemon.md "Memory"): its members already hold the batches behind.
    if (!m.group.empty() && ctx_.config.group_prefetch != 0) {
      options.prefetch = std::min(options.prefetch, ctx_.config.group_prefetch);
    }
    // A solo loader is its group's only member: no skew to absorb, so its
    // ring is prefetch + leases + 1 slots, as before groups existed.
    options.max_skew = m.group.empty() ? 0 : ctx_.config.max_skew;
    // A named broadcast group keeps at most --group-live-batches batches
    // live (Group "Live bound"); solo loaders keep their prefetch.
    options.max_live = m.group.empty() ? 0 : ctx_.config.group_live_batches;
    options.threads = ctx_.config.threads;
    options.gather_nice = ctx_.config.gather_nice;
    options.ring_bytes = m.ring_bytes;
    options.incarnation = ctx_.incarnation;
    options.session = id_;
    options.start_step = m.start_step;
    options.gathered = &ctx_.counters.batches_gathered;
    return options;
  }

  // A rank closed and reopened at once: its old member's close or hang-up
  // may still be unread on the other connection. Gives it kRankHandover to
  // leave (outside groups_mu_, which the leave takes); a rank still taken
  // then is refused by the join.
  void AwaitRankHandover(const OpenMsg& m) {
    std::shared_ptr<Group> existing = ctx_.groups.Find(cred_.uid, m.group);
    if (existing) (void)existing->AwaitRankFree(m.rank, kRankHandover);
  }

  // Joins the request's group, or creates it (a solo loader's is unnamed).
  Result<GroupRegistry::Joined> JoinGroup(const OpenMsg& m, const Group::MemberSpec& spec,
                                          const Group::Options& options) {
    GroupRegistry::Joiner who;
    who.uid = cred_.uid;
    who.session = id_;
    who.name = m.group;
    who.info.rank = m.rank;
    who.info.pid = cred_.pid;
    who.info.uid = cred_.uid;
    // A solo loader waits for nobody; a member for its peers, at most this.
    if (!m.group.empty()) {
      who.info.timeout = m.group_timeout_ms != 0 ? std::chrono::milliseconds(m.group_timeout_ms)
                                                 : ctx_.config.group_timeout;
    }
    who.join = m.join;
    who.start_step = m.start_step;
    // A new group's ring is charged to this uid before it is made, and the
    // ring owns the charge from then on (accounts.h).
    return ctx_.groups.Join(who, spec, [&]() -> Result<std::shared_ptr<Group>> {
      LX_ASSIGN_OR_RETURN(RingGeometry geometry, Group::Geometry(spec, options));
      Result<RingCharge> charge = ctx_.accounts.ChargeRing(cred_.uid, geometry.total_bytes);
      if (!charge.ok()) {
        ctx_.counters.refused.fetch_add(1, std::memory_order_relaxed);
        return charge.status();
      }
      LX_ASSIGN_OR_RETURN(std::shared_ptr<Group> made,
                          Group::Create(m.group, spec, options, std::move(charge).value()));
      if (made->ring()->geometry().total_bytes != geometry.total_bytes) {
        return Status::Internal("ring size differs from its estimate");
      }
      return made;
    });
  }

  // This session is now the member: records it and sends `opened` with the
  // ring's fd (and the push queue's).
  Status SendOpened(const OpenMsg& m, const Group::MemberSpec& spec, const Group::Options& options,
                    GroupRegistry::Joined joined, std::optional<PushQueueWriter> queue) {
    const bool named = !m.group.empty();
    group_ = std::move(joined.group);
    {
      std::lock_guard<std::mutex> lock(mu_);
      member_of_ = group_;
    }
    rank_ = m.rank;
    // A member may hold at most what the ring was sized for (serving_group.h).
    lease_cap_ = std::min(options.leases, group_->lease_cap());
    OpenedMsg reply;
    reply.id = m.id;
    reply.n = spec.sampler.n;
    reply.slot_count = group_->slot_count();
    reply.ring_bytes = group_->ring()->geometry().total_bytes;
    reply.leases = lease_cap_;
    if (named) reply.step = joined.first_step;  // protocol 1.1: only group opens carry it
    for (const auto& s : spec.streams) {
      const Schema& sc = s->schema();
      reply.streams.push_back(StreamSchemaMsg{static_cast<uint32_t>(sc.kind), sc.dtype.str,
                                              sc.item_shape, sc.ndim, s->size()});
    }
    LX_LOG(kInfo) << "session " << id_ << " (pid " << cred_.pid << ", uid " << cred_.uid
                  << ") opened a loader over " << spec.streams.size()
                  << " stream(s), n=" << spec.sampler.n << " batch=" << spec.sampler.batch_size
                  << (named ? std::string(joined.created ? " creating" : " joining") + " group '" +
                                  m.group + "' (" + GroupModeName(spec.mode) +
                                  (spec.mode == GroupMode::kShard
                                       ? ", rank " + std::to_string(m.rank) + " of " +
                                             std::to_string(m.world_size)
                                       : std::string()) +
                                  ")"
                            : std::string())
                  << " at step " << joined.first_step << " ring=" << reply.ring_bytes
                  << "B slots=" << reply.slot_count;
    const int reply_fds[2] = {group_->ring()->fd(), queue ? queue->fd() : -1};
    if (queue) {
      reply.queue_bytes = queue->total_bytes();
      std::lock_guard<std::mutex> lock(mu_);
      push_queue_ = std::move(queue);  // pushes start once this reply is sent (same thread)
    }
    return Send(reply, std::span<const int>(reply_fds, reply.queue_bytes != 0 ? 2 : 1));
  }

  Status DoSeek(const SeekMsg& m) {
    if (!group_) return Error(Status::State("no loader is open on this connection"), m.id);
    Status st = group_->Seek(
        id_, m.step, [this] { return LoaderClosing(); }, kWorkerPoll);
    if (st.code() == Status::Code::kCancelled) return Cancelled(st, m.id);
    if (!st.ok()) return Error(st, m.id);
    // Accepted: batches pushed from now on belong to the new generation;
    // those already sent are released unread by the client.
    {
      std::lock_guard<std::mutex> lock(mu_);
      push_blocked_ = false;
    }
    leases_.ForgetUnread();  // those of older generations are the client's to release, unread
    return Send(OkMsg{m.id, m.step, group_->generation(id_)});
  }

  SessionContext& ctx_;
  Socket socket_;
  const int fd_;
  const uint64_t id_;
  const PeerCred cred_;
  // io thread only.
  bool shut_ = false;
  bool shut_quietly_ = false;  // already logged (or suppressed) by ProtocolViolation
  bool hello_done_ = false;
  bool heartbeat_ = false;  // io thread: the client said minor >= 2 in hello
  // Requests queued or being answered. Relaxed: only decides whether a
  // heartbeat is worth sending; nothing else is ordered by it.
  std::atomic<uint32_t> outstanding_{0};
  // The worker waits for a batch to push. Relaxed, as outstanding_.
  std::atomic<bool> awaiting_batch_{false};
  bool counted_ = false;
  std::thread worker_;

  std::mutex mu_;
  std::condition_variable cv_;   // queue_ gained a request, or closing_
  std::deque<Request> queue_;    // guarded by mu_
  bool closing_ = false;         // guarded by mu_
  bool loader_closing_ = false;  // a `close` arrived; guarded by mu_
  bool peer_gone_ = false;       // a send failed: nothing more is sent; guarded by mu_
  // A push failed for no step of its own (the ring refused): nothing is
  // pushed until a release or an accepted seek; guarded by mu_.
  bool push_blocked_ = false;
  // Protocol 1.4: this loader's pushed items go through its push queue
  // (loaderx/push_queue.h), made by DoOpen; written by the worker, its head
  // read by the io thread. client_waits_: the client's last `consumed` said
  // it waits and no wake-up was sent since. Both guarded by mu_.
  std::optional<PushQueueWriter> push_queue_;
  bool client_waits_ = false;

  std::string end_reason_;  // why Shutdown ended the session; guarded by mu_
  // group_ for the io thread (`consumed` frames); guarded by mu_.
  std::shared_ptr<Group> member_of_;

  // Worker thread only.
  const char* request_ = "";      // the request being answered (for logs)
  uint64_t rank_ = 0;             // of this session's loader
  std::shared_ptr<Group> group_;  // the group this session's loader is a member of
  uint32_t lease_cap_ = 0;

  LeaseLedger leases_;
};

std::shared_ptr<Session> Session::Create(SessionContext& ctx, Socket socket, uint64_t id,
                                         PeerCred cred) {
  return std::make_shared<SessionImpl>(ctx, std::move(socket), id, cred);
}

}  // namespace loaderx::daemon
