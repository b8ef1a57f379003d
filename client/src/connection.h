// Connection: one socket to loaderxd speaking this build's protocol (kProtocolMajor.
// kProtocolMinor, loaderx/wire.h), the ring mapping and push queue of the loader opened on
// it, and fork safety. It is the session's transport and inbox (requests and their replies,
// pushed items in arrival order, generations, liveness); what it sends without a reply is
// its NoteOutbox (note_outbox.h), the batches held as private views its HeldViews
// (held_views.h), the private ring mappings its PrivateRings (private_rings.h). The ready
// queue stays here: its lock orders a take's report against CloseLoader on another thread.
//
// The protocol (docs/protocol.md): requests carry an id their reply echoes;
// batches are pushed by the daemon under the loader's credit, each tagged
// with its generation (a seek the daemon accepts starts a new one), into
// the loader's shared-memory push queue (AttachQueue; on the socket when
// the loader has none: a 1.3 daemon, or LoaderSpec::push_queue false).
// Every frame is read by Pump(), the queue's before the socket's: a reply is
// matched to the request waiting for it by id (a reply to an abandoned
// request is dropped), a pushed batch or step error joins the ready queue in
// arrival order, unless it belongs to an older generation, in which case its
// slot is released unread at once. Nothing is ever "owed": a wait that ends
// early (deadline, WaitHook, Ctrl-C) leaves the socket as it was, and the
// next wait reads on.
//
// Waits are ONE blocking recvmsg per attempt, bounded by SO_RCVTIMEO =
// kPollInterval (or less near a deadline), so a dead daemon (hang-up),
// Close() from another thread (shutdown of the socket) and the caller's
// WaitHook are all noticed promptly, and a frame already queued costs a
// single syscall.
//
// Fork: every live socket fd is registered in a fixed lock-free table; a
// pthread_atfork child handler closes them all in the child and records the
// child's pid, and every method checks that pid (a load, not a getpid
// syscall per call), so a forked child can neither keep the session alive
// nor send on it.
//
// Thread-safety: the receiving methods (Call, StartSeek, AwaitSeek, Pump,
// TakeReady) are called by one thread at a time (the loader's caller);
// Release, CloseLoader and Shutdown may be called from any thread at any
// time.
#pragma once

#include <sys/types.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "held_views.h"
#include "loaderx/client.h"
#include "loaderx/fd.h"
#include "loaderx/push_queue.h"
#include "loaderx/ring.h"
#include "loaderx/unix_socket.h"
#include "loaderx/wire.h"
#include "note_outbox.h"
#include "private_rings.h"

namespace loaderx::client {

struct Reply {
  Message msg;
  std::vector<UniqueFd> fds;
};

// A pushed item, in arrival order: a batch (its lease, which holds what the
// daemon announced of it) or the error of a step whose gather failed.
struct Pushed {
  uint64_t gen = 0;
  Status error;             // the step's error; lease unset then
  uint64_t step_after = 0;  // the loader's step once this item is returned
  std::shared_ptr<Lease> lease;
};

// The storage of a connection's Leases (and their shared_ptr control
// blocks): fixed blocks, so that taking a batch calls no allocator. A Lease
// lives as long as the caller keeps its batch, on any thread, so blocks are
// handed out by the receiving thread and given back from any thread (a flag
// per block); a Lease that does not fit, or finds every block taken (more
// leases alive than a credit allows), comes from the heap instead.
class LeasePool {
 public:
  static constexpr size_t kBlocks = 64;
  static constexpr size_t kBlockBytes = 512;
  LeasePool();
  ~LeasePool();
  LeasePool(const LeasePool&) = delete;
  LeasePool& operator=(const LeasePool&) = delete;
  // Receiving thread only (callers serialised, as Connection's receivers).
  void* Allocate(size_t bytes);
  // Any thread: false if `p` is not one of this pool's blocks.
  bool Deallocate(void* p);

 private:
  alignas(64) std::array<std::atomic<bool>, kBlocks> used_{};
  size_t next_ = 0;  // where the next search starts (receiving thread)
  alignas(64) std::array<std::array<std::byte, kBlockBytes>, kBlocks> blocks_;
};

// The allocator std::allocate_shared<Lease> is given: the pool's blocks,
// the heap when they do not serve. It holds the pool alive, so a Lease that
// outlives its Connection still gives its block back into live memory.
template <typename T>
struct LeaseAllocator {
  using value_type = T;
  explicit LeaseAllocator(std::shared_ptr<LeasePool> p) : pool(std::move(p)) {}
  template <typename U>
  LeaseAllocator(const LeaseAllocator<U>& o) : pool(o.pool) {}  // NOLINT: rebinding
  T* allocate(size_t n) {
    static_assert(alignof(T) <= 64);
    if (void* p = pool->Allocate(n * sizeof(T))) return static_cast<T*>(p);
    return static_cast<T*>(::operator new(n * sizeof(T)));
  }
  void deallocate(T* p, size_t) {
    if (!pool->Deallocate(p)) ::operator delete(p);
  }
  template <typename U>
  bool operator==(const LeaseAllocator<U>& o) const {
    return pool == o.pool;
  }
  std::shared_ptr<LeasePool> pool;
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  // connect(2) + hello exchange; Protocol error naming both versions if the
  // daemon speaks another major or a minor below kMinProtocolMinor.
  static Result<std::shared_ptr<Connection>> Open(const std::string& path);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Sends `req` (open or stats; its id is assigned here) and waits for the
  // reply with that id, queueing pushed items meanwhile. If the wait ends
  // early the request is abandoned: its reply is dropped when it comes.
  Result<Reply> Call(Message req, std::span<const int> fds, const WaitHook& hook);

  // Seek: sends `seek {id, step}`. The outcome is learnt by AwaitSeek. At
  // most one seek is in flight; StartSeek REQUIRES none (AwaitSeek first).
  Status StartSeek(uint64_t step);
  // The step of the seek in flight, if any.
  std::optional<uint64_t> seek_in_flight() const { return seek_step_; }
  // Waits for the reply of the seek in flight: its outcome (OK: accepted,
  // the generation moved on and every queued item of an older one was
  // released; an error: refused, nothing moved), std::nullopt if `deadline`
  // passed first, a non-OK Result if the wait failed (hook, hang-up); in
  // both the seek stays in flight.
  Result<std::optional<Status>> AwaitSeek(
      const WaitHook& hook, std::optional<std::chrono::steady_clock::time_point> deadline);

  // The oldest queued pushed item of the current generation, if any.
  std::optional<Pushed> TakeReady();
  bool has_ready();
  // Reads one frame (waiting at most until `deadline` / while `hook` says
  // OK) and files it: false if the deadline passed with nothing read.
  // Heartbeats count as heard and are read on. Daemon error on hang-up or
  // after liveness_timeout of silence. Notes a full socket queued (releases,
  // consumed) are sent first, and while waiting as soon as the socket has
  // room: no request may come to carry them (1.2 has none per batch), and
  // the daemon pushes nothing until it has read them.
  Result<bool> Pump(const WaitHook& hook,
                    std::optional<std::chrono::steady_clock::time_point> deadline);
  // Files one frame already in the socket, without waiting (no liveness
  // check): false if there is none.
  Result<bool> PumpQueued();

  // The caller is blocked in next() with nothing queued at `step` (its
  // consumed position): sends `consumed {gen, step, waiting: true}` once per
  // position (the daemon's group timeout and `waiting` count only such
  // waits, as 1.1 counted a blocked `next`), and restarts the liveness
  // clock as a request does. Receiver thread.
  void AnnounceWait(uint64_t step);
  bool wait_announced() const { return wait_announced_; }

  // Fire-and-forget release of a slot lease (no reply).
  void Release(uint32_t slot, uint64_t seq);
  // Fire-and-forget `consumed {gen, step}` (no reply): the caller took the
  // item of generation `gen` and takes `step` next. Called by TakeReady.
  void Consumed(uint64_t gen, uint64_t step);
  // The same, deferred (docs/protocol.md "Consumed positions"): kept until
  // the next frame this client sends (a release, usually of the batch the
  // caller held while it drew this one: both go in one sendmmsg), a request,
  // `close`, or a wait, whichever comes first. Supersedes an older deferred
  // position (positions only move on, and a seek sends it first).
  void DeferConsumed(uint64_t gen, uint64_t step);
  // Whether takes may be deferred at all: not for a group member, whose
  // position its peers wait on (set once by OpenLoader, before any take).
  void set_defer_takes(bool on) { defer_takes_ = on; }
  // Ends the session from any thread; wakes a blocked wait with Cancelled.
  void Shutdown();
  bool shut_down() const { return shut_.load(std::memory_order_acquire); }
  // Closes the loader from any thread, never blocking. Queued pushed items
  // are released; requests are refused from now on (a blocked wait returns
  // Cancelled within kPollInterval). With no lease alive this is
  // Shutdown(); otherwise the daemon is sent `close` (it stops pushing and
  // leaves the group but keeps this session's leases) and the socket stays
  // open, still carrying releases, until the last lease is gone
  // (LeaseEnded), so the daemon never reuses a slot this process still views.
  void CloseLoader();
  // True once CloseLoader() or Shutdown() ran: no request is sent any more.
  bool closed() const { return closed_.load(std::memory_order_seq_cst); }
  // Called by ~Lease after its release: hangs up once a closed loader's last
  // lease is gone.
  void LeaseEnded();
  // Daemon error when called in a forked child.
  Status CheckProcess() const;

  // Liveness (protocol 1.2): a wait that hears nothing from the daemon (no
  // frame: batch, reply or heartbeat) for `timeout` since the wait began or
  // the last frame arrived returns Status::Daemon; nothing is lost, so if
  // the daemon resumes the next call reads on. Any thread; applies from the
  // next wait on.
  void set_liveness_timeout(std::chrono::milliseconds timeout) {
    liveness_ms_.store(timeout.count(), std::memory_order_relaxed);
  }
  std::chrono::milliseconds liveness_timeout() const {
    return std::chrono::milliseconds(liveness_ms_.load(std::memory_order_relaxed));
  }

  const HelloOkMsg& hello() const { return hello_; }
  const std::string& path() const { return path_; }

  // Ring of the loader opened on this connection (set once by OpenLoader,
  // before the reply's pushed batches are read).
  Status AttachRing(UniqueFd fd, uint64_t bytes, uint32_t slot_count);
  // Protocol 1.4: the loader's push queue (loaderx/push_queue.h), set once
  // by OpenLoader like the ring. From then on pushed items are read from
  // it (Pump and PumpQueued look there before the socket).
  Status AttachQueue(UniqueFd fd, uint64_t bytes);
  const uint8_t* ring_base() const { return ring_.data(); }
  int ring_fd() const { return ring_fd_.get(); }  // kept for private slot mappings
  const RingGeometry& geometry() const { return geometry_; }

  // Writable (copy-on-write) batch views without a mapping per batch
  // (private_rings.h); attached with the ring. Any thread.
  PrivateRings& private_rings() { return private_rings_; }

  // Held batches beyond the lease cap: every lease whose batch is a private
  // view (a writable batch from NextUntil) is listed here until ~Lease
  // (held_views.h). MoveOutOldestView moves the oldest listed view out of
  // the ring and gives its slot back (its release, then the count). Any
  // thread.
  HeldViews& held_views() { return views_; }
  bool MoveOutOldestView();  // false: no view to move
  // Batches moved out so far (stats). Relaxed: a counter.
  std::atomic<uint64_t> views_moved_out{0};

  // Leases alive in this process (queued pushed batches, Batches and their
  // zero-copy owners) and not moved out. Seq_cst: ordered against closed_
  // (see there).
  std::atomic<uint32_t> leases_held{0};

 private:
  Connection(UniqueFd fd, std::string path);
  Status SendMessage(const Message& m, std::span<const int> fds);
  // Sends a request: queued releases first, then `m`; the liveness clock
  // starts.
  Status SendRequest(const Message& m, std::span<const int> fds);
  // One recvmsg that waits at most `wait` (0: does not wait). The caller
  // is the only receiver.
  Result<Frame> Receive(std::chrono::milliseconds wait);
  // Files one decoded frame (see the header comment).
  Status File(Message m, std::vector<UniqueFd> fds);
  // Files a pushed batch: its lease, described by `b`, joins the ready queue
  // (or is released at once if `b` is of an older generation).
  Status FileBatch(const BatchMsg& b);
  // Files a pushed item (a batch's lease or a step's error).
  Status FilePushed(Pushed item);
  // Files a received frame (see Pump): false for a heartbeat.
  Result<bool> Take(Frame f);
  // Files what the push queue holds, oldest first, up to an item of a
  // generation whose seek reply is still in the socket: false if nothing
  // was filed. Receiver thread.
  Result<bool> DrainQueue();
  // Sends a release or consumed through the outbox (notes_), unless this is
  // a forked child or the session is shut down.
  void SendNote(const Message& note);
  // Sends the notes that found the socket full (blocking).
  Status FlushReleases();
  // Pump's wait while notes are queued: until the socket is readable (then
  // the frame is read) or writable (then the notes go), at most `wait`.
  Result<Frame> ReceiveOrFlush(std::chrono::milliseconds wait);
  // Releases every queued item (CloseLoader, or a seek accepted: older
  // generations). Items are destroyed outside ready_mu_.
  void DropReady(bool older_only);

  UniqueFd fd_;
  // Releases and consumed notes on fd_ (note_outbox.h): queued while the
  // socket is full; Pump and the next request send the queue.
  NoteOutbox notes_;
  const std::string path_;
  const pid_t owner_pid_;
  int fork_slot_ = -1;  // index in the fork table, -1 if not registered
  HelloOkMsg hello_;
  // Set by Shutdown (any thread); read by waits. Release/acquire: a waiter
  // that sees it knows the socket was shut down on purpose.
  std::atomic<bool> shut_{false};
  // Set by CloseLoader and Shutdown. Seq_cst with leases_held: a lease created while the
  // loader closes is either seen by CloseLoader (the socket stays open) or
  // sees closed() itself (Pump drops it).
  std::atomic<bool> closed_{false};

  // Relaxed: a tuning value, read once per wait; no other data hangs on it.
  std::atomic<int64_t> liveness_ms_{kDefaultLivenessTimeout.count()};

  // Receiver state: the caller's thread only (see Thread-safety).
  uint64_t next_id_ = 1;        // id of the next request
  uint64_t awaited_id_ = 0;     // the Call waiting for its reply (0: none)
  std::optional<Reply> reply_;  // that reply, once filed
  uint64_t seek_id_ = 0;        // the seek in flight (0: none)
  std::optional<uint64_t> seek_step_;
  std::optional<Status> seek_outcome_;
  uint64_t gen_ = 0;  // the generation of batches returned now
  // AnnounceWait sent its note for the current position (cleared when an
  // item is taken or a seek is accepted).
  bool wait_announced_ = false;
  // A seek is sent and not answered yet (seek_id_ != 0), for CloseLoader
  // on any thread.
  std::atomic<bool> seek_pending_{false};
  // When the last frame arrived (a batch, reply or heartbeat). One clock
  // for every wait, however the caller slices it (the Python binding waits
  // in slices to see signals): a daemon that is waited on sends a heartbeat
  // at most every heartbeat_ms, keeping one unread, so a new wait reads a
  // fresh frame at once if the daemon is alive.
  std::chrono::steady_clock::time_point last_heard_ = std::chrono::steady_clock::now();
  // SO_RCVTIMEO currently set on fd_ (ms, 0 = never set).
  int64_t recv_timeout_ms_ = 0;

  // Pushed items not yet taken, in arrival order. Guarded by ready_mu_
  // (CloseLoader drops them from any thread).
  std::mutex ready_mu_;
  std::deque<Pushed> ready_;

  // Takes left to report at once after a deferral did not pay (a *miss*:
  // the caller came back for the next item before anything carried the
  // deferred one, so the daemon had not pushed it: a caller holding several
  // batches). The cooldown after a miss is the back-off, which doubles with
  // each miss (kDeferCooldownMin .. kDeferCooldownMax takes) and halves
  // after kDeferStreak deferrals in a row without one: a training loop
  // (which never misses) defers again after a few takes, a caller that
  // keeps missing pays a miss once per 256 takes. Receiver thread only.
  static constexpr uint32_t kDeferCooldownMin = 8;
  static constexpr uint32_t kDeferCooldownMax = 256;
  static constexpr uint32_t kDeferStreak = 64;
  bool defer_takes_ = true;
  uint32_t defer_cooldown_ = 0;
  uint32_t defer_backoff_ = kDeferCooldownMin;
  uint32_t defer_streak_ = 0;

  MappedRegion ring_;  // read-only
  UniqueFd ring_fd_;
  RingGeometry geometry_;
  // Protocol 1.4 (AttachQueue): receiver thread only, as the socket reads.
  PushQueueReader push_queue_;
  std::vector<uint8_t> queue_frame_;  // the entry being filed (reused)
  BatchMsg queue_batch_;              // its batch, decoded (reused)
  std::shared_ptr<LeasePool> lease_pool_ = std::make_shared<LeasePool>();

  PrivateRings private_rings_;
  HeldViews views_;
};

}  // namespace loaderx::client
