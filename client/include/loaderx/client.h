// The loaderx daemon client: batches from loaderxd, mapped zero-copy.
//
//   auto client = loaderx::Client::Connect(path);          // hello, version check
//   auto loader = client->OpenLoader(spec);                // passes store fds
//   auto view = (*loader)->NextUntil(deadline);            // the seam (batch_source.h)
//   loaderx::client::Batch batch(std::move(**view), **loader);  // typed accessors
//   const float* x = static_cast<const float*>(batch.Dense(0).data);
//   (*loader)->SeekUntil(1000, deadline); (*loader)->Close();
//
// Each Loader has its own connection and its own ring (a sealed memfd mapped
// read-only; the members of a group map their group's one ring). The daemon
// pushes ready batches while this process holds fewer than the loader's
// lease cap (protocol 1.2), so NextUntil usually finds its batch already
// in the socket: one receive, no round trip. A batch is
// a set of views into one ring slot plus a Lease; the slot goes back to the
// daemon when the last holder of the Lease (the Batch, or any zero-copy
// owner such as a NumPy array's base) lets go. A writable batch of
// NextUntil (the seam's private copy-on-write view) never blocks the cap:
// when `lease_cap()` batches are held and another is asked for, the oldest
// such batch moves out of the ring into this process's own pages (same
// address, same bytes) and its slot goes back (`batches_moved_out()`
// counts them). Batches that stay views of the shared ring (shared_view)
// cannot move: asking for more than the cap of those is ResourceExhausted,
// never a hang. Batches stay readable after Close() and even after the
// daemon died: the mapping belongs to this process.
//
// The client opens the store files itself (Store::OpenFileSet) and passes the
// fds, so the daemon reads nothing this process could not read.
//
// Failure: if the daemon dies, a blocked NextUntil returns Status::Daemon within
// kDeadPeerDetection (the socket hangs up; the wait polls every kPollInterval
// anyway). A forked child inherits nothing usable: every call in the child
// returns Status::Daemon and the child's copy of the socket is closed at fork,
// so it can neither keep the parent's session alive nor speak for it.
//
// Thread-safety: one thread at a time may call NextUntil/SeekUntil; Close()
// may be called from any thread, also while NextUntil blocks (which then
// returns Cancelled). Batches and Leases may be destroyed on any thread.
//
// This header and what it includes are the whole installed API of the
// client (docs/cpp-client.md): no wire-protocol, ring or socket type
// appears here. The socket, the ring mapping, the lock and everything the
// protocol keeps per connection live in client::Connection, which this
// header only names (client/src/connection.h).
#pragma once

#include <sys/types.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "loaderx/batch_source.h"
#include "loaderx/fd.h"
#include "loaderx/group.h"
#include "loaderx/loader.h"
#include "loaderx/sampler.h"
#include "loaderx/status.h"
#include "loaderx/store.h"
#include "loaderx/timeouts.h"

namespace loaderx {

class Client;

namespace client {

inline constexpr std::chrono::milliseconds kPollInterval{50};
inline constexpr std::chrono::milliseconds kDeadPeerDetection{1000};
static_assert(kPollInterval * 4 <= kDeadPeerDetection,
              "a blocked wait must notice a dead daemon well within the promise");
// The timeouts' bounds (kDefaultLivenessTimeout, kMinLivenessTimeout,
// kMinGroupTimeout, kMaxTimeout) are in loaderx/timeouts.h.
static_assert(kPollInterval * 4 <= kMinLivenessTimeout,
              "the wait must look at the clock several times within the timeout");

class Connection;  // private (client/src)
class HeldViews;   // private (client/src)
class Loader;

// Called every kPollInterval while Client::Stats/Report wait for the daemon;
// a non-OK status aborts the wait and is returned.
using WaitHook = std::function<Status()>;

using StreamInfo = ::loaderx::StreamInfo;  // label: the store path as passed

// Who answered Connect (the hello exchange).
struct DaemonInfo {
  uint32_t major = 0;  // protocol version the daemon speaks
  uint32_t minor = 0;
  std::string daemon_version;
  uint64_t incarnation = 0;   // random per daemon start
  uint64_t session = 0;       // this connection's id in the daemon's logs and stats
  uint32_t heartbeat_ms = 0;  // 0: the daemon sends no heartbeats
};

// What Client::Report returns: the daemon's counters and its status
// document (JSON, docs/daemon.md "Status").
struct DaemonReport {
  std::vector<std::pair<std::string, uint64_t>> counters;
  std::string status;
};

struct LoaderSpec {
  std::vector<std::string> stores;  // store directories, one per stream
  // Weighted mixing (loaderx/mix.h, docs/daemon.md "Mixtures"), protocol
  // 1.2: with mix_counts non-empty (K datasets), mix_parts has one entry per
  // stream: the K store directories of a mixed stream's parts (datasets
  // 0..K-1; stores[j] is then only its label), or none for the mixture's
  // dataset-number stream (stores[j] empty) or a plain store (stores[j]).
  std::vector<uint64_t> mix_counts;
  std::vector<std::vector<std::string>> mix_parts;
  // A mixture schedule (loaderx/mix.h "Schedules"), protocol 1.6: with
  // mix_datasets = K > 0, mix_counts holds S * K counts (segment-major) and
  // segments the sampler's S segments (loaderx/sampler.h). 0 and empty: one
  // segment, K = mix_counts.size().
  uint64_t mix_datasets = 0;
  std::vector<SamplerSegment> segments;
  uint64_t batch_size = 0;
  SamplerMode mode = SamplerMode::kIID;
  uint64_t seed = 42;
  uint64_t rank = 0;
  uint64_t world_size = 1;
  uint64_t start_step = 0;
  uint32_t prefetch = 4;
  // Batches this client may hold at once: the credit under which the
  // daemon pushes (batches pushed but not yet returned by Next count).
  uint32_t leases = 8;
  uint64_t ring_bytes = 0;  // 0: the daemon sizes the ring
  // Protocol 1.1 groups (docs/daemon.md "Groups"): a non-empty name (at most
  // kMaxGroupName bytes) joins, or creates, that group of this uid. Members
  // must agree on stores, batch_size, mode, seed, world_size and group_mode.
  // kShard: this loader is rank `rank` and receives its rows of each global
  // batch; kBroadcast: every member receives the same batches. The loader's
  // first step is the daemon's answer (join = kCurrent starts where the
  // group is); step() reports it.
  std::string group;
  GroupMode group_mode = GroupMode::kShard;
  GroupJoin join = GroupJoin::kDefault;
  // How long a `next` may wait for the group's other members before it fails
  // with a Timeout status naming them (protocol 1.2), kMinGroupTimeout ..
  // kMaxTimeout, only with a group; nullopt: loaderxd's --group-timeout.
  std::optional<std::chrono::milliseconds> group_timeout;
  // Protocol 1.5, kShard only: the group serves the data-parallel ranks
  // [ranks_first, ranks_first + ranks_count) of world_size (the local ranks
  // of one node; ranks_count 0: all of them), each rank to `replicas`
  // members that receive byte-identical batches (the model-parallel ranks of
  // one data-parallel replica). Members must agree on both. Daemon errors
  // name what does not fit; a daemon older than 1.5 is refused here.
  uint64_t ranks_first = 0;
  uint64_t ranks_count = 0;
  // The stride of those ranks, as Python's range has one: only consecutive
  // ranks (1) are a group's, any other is InvalidArgument.
  int64_t ranks_step = 1;
  uint32_t replicas = 1;
  // How NextUntil's BatchView sees the slot. false (default): through a
  // private copy-on-write mapping of the slot made per batch, so the values
  // are writable like an embedded batch's (a write copies the page it
  // touches for this process only; the daemon never sees it). true: through
  // the shared ring mapping itself, read-only (no mmap per batch and no page
  // faults on first touch).
  bool shared_view = false;
  // See kDefaultLivenessTimeout; InvalidArgument below kMinLivenessTimeout.
  std::chrono::milliseconds liveness_timeout = kDefaultLivenessTimeout;
  // Protocol 1.4 (a daemon that speaks it): pushed batches reach the loader
  // through a shared-memory push queue, read with a load instead of a
  // `recvmsg` (docs/protocol.md "Push queue"). false: on the socket, as a
  // 1.3 daemon sends them (the same batches; a benchmark and debugging knob).
  bool push_queue = true;

  // The rules a spec must meet, in one place for every host: OpenLoader
  // checks them before it connects, and Python's DaemonOptions checks its
  // part when it is built. InvalidArgument names the field as the Python
  // keyword, its value and what is allowed.
  // ValidateOptions: the loaderxd options alone (group, join, timeouts,
  // ranks, replicas). Validate: those, and how they fit the loader's
  // streams, mixture and start_step.
  Status ValidateOptions() const;
  Status Validate() const;
};

// A slot lease: returns the slot to the daemon when destroyed (from the
// process that received it only).
class Lease {
 public:
  Lease(std::shared_ptr<Connection> conn, uint32_t slot, uint64_t seq, const uint8_t* base);
  ~Lease();
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;
  const uint8_t* base() const { return base_; }  // the batch's first byte
  // From now on base() is `base`, inside `copy`, a private mapping of the
  // slot, unmapped before the release is sent.
  void AdoptPrivateCopy(MappedRegion copy, uint8_t* base) {
    copy_ = std::move(copy);
    base_ = base;
  }
  // From now on base() is `base`, inside private ring mapping `ring` of
  // the connection, whose pages [first, end) this lease views until ~Lease
  // gives them back (before the release is sent).
  void AdoptRingPages(uint32_t ring, uint64_t first, uint64_t end, uint8_t* base) {
    ring_ = ring;
    ring_pages_ = {first, end};
    base_ = base;
  }
  uint8_t* mutable_base() const {
    return copy_.size() != 0 || ring_pages_.second != 0 ? const_cast<uint8_t*>(base_) : nullptr;
  }
  // The daemon drops this lease itself (a pushed batch never taken when the
  // loader closed): ~Lease sends no release.
  void Forget() { forgotten_ = true; }
  // True once the batch was moved out of the ring (Connection::
  // MoveOutOldestView): its view is this process's own copy and the slot
  // went back to the daemon, so the lease no longer counts against the cap.
  bool moved_out() const { return moved_out_.load(std::memory_order_acquire); }

 private:
  friend class Connection;  // describes the batch when it files it
  friend class HeldViews;   // moves a private view out of the ring
  friend class Loader;      // checks the description before any view
  const StreamLayout& layout(size_t j) const {
    return more_layout_ ? more_layout_[j] : inline_layout_[j];
  }
  // What loaderxd's `batch` message announced for the slot (offsets of the
  // layouts from base()). Held here, not in a message object, so that taking
  // a batch allocates nothing: the Lease itself comes from its connection's
  // pool of blocks.
  static constexpr size_t kInlineStreams = 4;
  uint64_t step_ = 0;
  uint64_t offset_ = 0;  // from the ring start
  uint64_t batch_size_ = 0;
  uint64_t total_bytes_ = 0;
  uint32_t num_streams_ = 0;
  std::array<StreamLayout, kInlineStreams> inline_layout_{};
  std::unique_ptr<StreamLayout[]> more_layout_;  // num_streams_ > kInlineStreams only
  bool forgotten_ = false;
  // A private view in its connection's list of movable views (oldest
  // first). Guarded by that list's mutex (HeldViews).
  bool listed_ = false;
  // Set once, under the list's mutex, after the view's pages were copied out and
  // before the release; release/acquire for moved_out() on other threads.
  std::atomic<bool> moved_out_{false};
  Lease* view_prev_ = nullptr;
  Lease* view_next_ = nullptr;
  MappedRegion copy_;
  uint32_t ring_ = 0;
  std::pair<uint64_t, uint64_t> ring_pages_{0, 0};  // end 0: none
  std::shared_ptr<Connection> conn_;                // keeps the socket and the ring mapping alive
  uint32_t slot_;
  uint64_t seq_;
  const uint8_t* base_;
};

// The dims of an ArrayView, held inline so that a view allocates nothing.
// Reads like a std::vector<uint64_t> (size, [], iteration, comparison) and
// converts to one.
class Dims {
 public:
  static constexpr size_t kMax = 64;  // NumPy's own limit: a batch dim and 63 item dims
  Dims() = default;
  Dims(std::initializer_list<uint64_t> dims) {
    for (uint64_t d : dims) push_back(d);
  }
  size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  const uint64_t* data() const { return d_.data(); }
  const uint64_t* begin() const { return d_.data(); }
  const uint64_t* end() const { return d_.data() + n_; }
  uint64_t operator[](size_t i) const { return d_[i]; }
  // Dims past kMax are dropped (no stream has them: stores and the wire cap
  // their rank below it).
  void push_back(uint64_t d) {
    if (n_ < kMax) d_[n_++] = d;
  }
  operator std::vector<uint64_t>() const { return {begin(), end()}; }
  friend bool operator==(const Dims& a, const Dims& b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
  }
  friend bool operator==(const Dims& a, const std::vector<uint64_t>& b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
  }

 private:
  uint32_t n_ = 0;
  std::array<uint64_t, kMax> d_;  // [0, n_) set
};

struct ArrayView {
  const void* data = nullptr;
  std::string dtype;
  uint32_t itemsize = 0;
  Dims shape;
};

// Typed accessors over one batch a Loader's NextUntil returned (a BatchView
// whose owner is the batch's Lease): its streams as arrays with dtype and
// shape, its lease and publish stamp. Move-only.
class Batch {
 public:
  Batch() = default;
  // REQUIRES: `view` is what loader.NextUntil returned last (publish_ns()
  // is loader.last_publish_ns()).
  Batch(BatchView view, const Loader& loader);
  Batch(Batch&&) noexcept = default;
  Batch& operator=(Batch&&) noexcept = default;
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;

  uint64_t step() const { return view_.step; }
  uint64_t batch_size() const { return view_.batch_size; }
  // Whether the values may be written through (BatchView::writable).
  bool writable() const { return view_.writable; }
  // When the daemon published this batch: CLOCK_MONOTONIC ns (system-wide,
  // so comparable with this process's clock; ring.h MonotonicNowNs). 0 from
  // a daemon whose ring layout predates the stamp (1.0).
  uint64_t publish_ns() const { return publish_ns_; }
  size_t num_streams() const { return view_.streams.size(); }
  // Dense stream j as one (B, *item_shape) array.
  ArrayView Dense(size_t j) const;
  // Record k of ragged stream j.
  ArrayView Record(size_t j, uint64_t k) const;
  // Raw tables of ragged stream j (see loader.h's layout).
  const uint8_t* values(size_t j) const { return view_.streams[j].values; }
  // B + 1 byte offsets; record k starts at values + offsets[k] - offsets[0]
  // (offsets[0] is 0 for a whole batch, not for a shard group's slice).
  const uint64_t* offsets(size_t j) const { return view_.streams[j].offsets; }
  const uint64_t* shapes(size_t j) const { return view_.streams[j].shapes; }  // B * ndim dims
  const std::shared_ptr<Lease>& lease() const { return lease_; }
  void Reset() { lease_.reset(); }  // lets the slot go now

 private:
  BatchView view_;  // its owner moved to lease_
  uint64_t publish_ns_ = 0;
  std::shared_ptr<const std::vector<StreamInfo>> streams_;
  std::shared_ptr<Lease> lease_;
};

// A Loader is the daemon BatchSource (batch_source.h): NextUntil returns a
// BatchView owning the Lease (writable unless LoaderSpec::shared_view).
class Loader final : public BatchSource {
 public:
  ~Loader() override;
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  uint64_t step() const override;
  // Closes the loader: NextUntil/SeekUntil return Cancelled from now on (a
  // blocked one within kPollInterval), pushed batches not yet returned are released,
  // the daemon stops pushing and its pipeline and reclaims everything not
  // leased out. Batches still held stay readable AND
  // unchanged: their slots stay leased (the session lives on, sending only
  // releases) until the last of them is freed, then the session ends.
  // Idempotent, thread-safe, never blocks.
  void Close() override;

  // BatchSource. SeekUntil's false: the seek request is out, its reply not
  // yet in (call again with the same step; it is not sent twice; another
  // step waits for that reply first, then sends its own seek).
  Result<std::optional<BatchView>> NextUntil(Clock::time_point deadline) override;
  Result<bool> SeekUntil(uint64_t step, Clock::time_point deadline) override;
  // When loaderxd published the batch NextUntil returned last (publish_ns).
  uint64_t last_publish_ns() const;

  const std::vector<StreamInfo>& streams() const override;
  uint64_t size() const;
  // The credit: batches this process may hold, including pushed ones it
  // has not taken yet.
  uint32_t lease_cap() const;
  // Held batches moved out of the ring so far to stay under the cap.
  uint64_t batches_moved_out() const;
  // Leases alive in this process: batches held by the caller (and their
  // zero-copy owners) plus pushed batches not yet returned by NextUntil.
  uint32_t leases_held() const;
  uint64_t ring_bytes() const;

 private:
  friend class ::loaderx::Client;
  friend class Batch;  // shares the stream descriptions
  // The connection, the protocol state and the lock behind it, the step
  // counter and what open answered (client/src/client.cc).
  struct Impl;
  explicit Loader(std::unique_ptr<Impl> impl);
  // The checked lease of the batch of step() (advancing; a gather error of
  // that step is returned), null if `deadline` passed first; *publish_ns is
  // its slot's stamp.
  Result<std::shared_ptr<Lease>> TakeLease(Clock::time_point deadline, uint64_t* publish_ns);
  // Waits for the answer to the seek in flight, if any (false: `deadline`
  // passed first, it stays in flight). Accepted: step() is its target;
  // *outcome is the daemon's answer (a refusal moved nothing).
  Result<bool> SettleSeek(Clock::time_point deadline, Status* outcome = nullptr);
  // Everything the lease's batch description claims, checked against the
  // ring and the schema (a buggy or hostile daemon cannot make the client
  // read outside the slot); *publish_ns is the slot's stamp.
  Status CheckBatch(const Lease& lease, uint64_t* publish_ns) const;
  std::unique_ptr<Impl> impl_;
};

}  // namespace client

class Client {
 public:
  // Connects and says hello. Daemon error if nobody answers at `path`;
  // Protocol if the daemon speaks another protocol major (message names both).
  static Result<std::unique_ptr<Client>> Connect(const std::string& path);
  ~Client();

  // Opens a loader on its own connection (the first loader takes over the
  // client's connection). Store problems come back with the
  // same Status codes as opening them embedded (NotFound, Corruption, ...).
  Result<std::unique_ptr<client::Loader>> OpenLoader(const client::LoaderSpec& spec);
  // The daemon's counters ("sessions", "slots_held", "ring_bytes", ...).
  Result<std::vector<std::pair<std::string, uint64_t>>> Stats(
      const client::WaitHook& hook = nullptr);
  // The counters and the status document (JSON, docs/daemon.md "Status"):
  // the daemon, the groups and loaders this uid may see, per-uid usage.
  // The document is empty from a daemon older than protocol 1.2.
  Result<client::DaemonReport> Report(const client::WaitHook& hook = nullptr);

  const std::string& path() const { return path_; }
  const client::DaemonInfo& hello() const { return hello_; }

 private:
  Client() = default;
  std::string path_;
  client::DaemonInfo hello_;
  // The control connection; handed to the first loader opened (one session
  // per loader) and re-established lazily when needed again.
  std::shared_ptr<client::Connection> conn_;
};

}  // namespace loaderx
