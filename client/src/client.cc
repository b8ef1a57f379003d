#include "loaderx/client.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <utility>

#include "connection.h"
#include "loaderx/unix_socket.h"

namespace loaderx {
namespace client {

static_assert(kMinLivenessTimeout == std::chrono::milliseconds{4 * kHeartbeatIntervalMs},
              "client.h spells the protocol's heartbeat interval as a literal");

namespace {

Status Bad(const std::string& what) { return Status::Protocol("batch from loaderxd: " + what); }

}  // namespace

Lease::Lease(std::shared_ptr<Connection> conn, uint32_t slot, uint64_t seq, const uint8_t* base)
    : conn_(std::move(conn)), slot_(slot), seq_(seq), base_(base) {
  conn_->leases_held.fetch_add(1, std::memory_order_seq_cst);
}

Lease::~Lease() {
  conn_->held_views().Unlist(this);  // waits for a move of this view under way
  copy_.Reset();                     // nothing may see the slot's next batch through it
  if (ring_pages_.second != 0)
    conn_->private_rings().Release(ring_, ring_pages_.first, ring_pages_.second);
  if (!moved_out_.load(std::memory_order_acquire)) {  // else released when moved out
    // The release goes out before the count drops: a Next on another thread
    // that sees the lease gone must find the release ahead of its `next` on
    // the socket, or the daemon (still counting it) would refuse at the cap.
    if (!forgotten_) conn_->Release(slot_, seq_);
    conn_->leases_held.fetch_sub(1, std::memory_order_seq_cst);
  }
  conn_->LeaseEnded();
}

ArrayView Batch::Dense(size_t j) const {
  const StreamInfo& s = (*streams_)[j];
  ArrayView v;
  v.data = values(j);
  v.dtype = s.dtype;
  v.itemsize = s.itemsize;
  v.shape.push_back(view_.batch_size);
  for (uint64_t d : s.item_shape) v.shape.push_back(d);
  return v;
}

ArrayView Batch::Record(size_t j, uint64_t k) const {
  const StreamInfo& s = (*streams_)[j];
  ArrayView v;
  v.data = values(j) + (offsets(j)[k] - offsets(j)[0]);
  v.dtype = s.dtype;
  v.itemsize = s.itemsize;
  for (uint32_t d = 0; d < s.ndim; ++d) v.shape.push_back(shapes(j)[k * s.ndim + d]);
  return v;
}

struct Loader::Impl {
  std::shared_ptr<Connection> conn;  // socket, ring mapping, protocol state and its lock
  std::shared_ptr<const std::vector<StreamInfo>> streams;
  uint64_t n = 0;
  uint32_t lease_cap = 0;
  uint64_t ring_bytes = 0;
  bool shared_view = false;
  uint64_t last_publish_ns = 0;
  // The step the next batch will have. Relaxed: read by step() from any
  // thread for display; Next/Seek are serialised by the caller.
  std::atomic<uint64_t> step{0};
};

Batch::Batch(BatchView view, const Loader& loader)
    : view_(std::move(view)),
      publish_ns_(loader.last_publish_ns()),
      streams_(loader.impl_->streams),
      // A Loader's view is owned by the batch's Lease (Loader::NextUntil).
      lease_(std::const_pointer_cast<Lease>(
          std::static_pointer_cast<const Lease>(std::move(view_.owner)))) {
  view_.owner.reset();
}

Loader::Loader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Loader::~Loader() { Close(); }

void Loader::Close() {
  if (!impl_->conn) return;
  impl_->conn->CloseLoader();  // releases the pushed batches not taken first
}

uint32_t Loader::leases_held() const {
  return impl_->conn->leases_held.load(std::memory_order_seq_cst);
}

uint64_t Loader::step() const { return impl_->step.load(std::memory_order_relaxed); }
uint64_t Loader::last_publish_ns() const { return impl_->last_publish_ns; }
const std::vector<StreamInfo>& Loader::streams() const { return *impl_->streams; }
uint64_t Loader::size() const { return impl_->n; }
uint32_t Loader::lease_cap() const { return impl_->lease_cap; }
uint64_t Loader::batches_moved_out() const {
  return impl_->conn->views_moved_out.load(std::memory_order_relaxed);
}
uint64_t Loader::ring_bytes() const { return impl_->ring_bytes; }

Result<std::shared_ptr<Lease>> Loader::TakeLease(Clock::time_point deadline, uint64_t* publish_ns) {
  LX_RETURN_IF_ERROR(impl_->conn->CheckProcess());
  if (impl_->conn->closed()) return Status::Cancelled("loader closed");
  // An interrupted seek first: until its answer is in, nobody knows whether
  // the batches queued meanwhile are still wanted.
  if (impl_->conn->seek_in_flight()) {
    LX_ASSIGN_OR_RETURN(bool settled, SettleSeek(deadline));
    if (!settled) return std::shared_ptr<Lease>();  // our deadline: the seek stays in flight
  }
  std::optional<Pushed> item;
  while (!(item = impl_->conn->TakeReady())) {
    // Nothing queued: the daemon pushes only while this process holds fewer
    // than its credit, so at the cap nothing can come.
    const uint32_t held = leases_held();
    if (held >= impl_->lease_cap) {
      // Writable batches: the oldest one held moves out of the ring and its
      // slot goes back (Connection::MoveOutOldestView).
      if (impl_->conn->MoveOutOldestView()) continue;
      return Status::ResourceExhausted(
          "holding " + std::to_string(held) + " daemon batches (lease cap " +
          std::to_string(impl_->lease_cap) +
          ") that cannot move out of the ring (shared_view batches): "
          "drop references to earlier batches (and arrays viewing them) before drawing more");
    }
    // Before the caller waits, what the socket already holds is read: only
    // if that is nothing does it wait, and the daemon is told so (its group
    // timeout counts only waits in next(), docs/protocol.md).
    const bool announce = !impl_->conn->wait_announced();
    LX_ASSIGN_OR_RETURN(
        bool read, announce ? impl_->conn->PumpQueued() : impl_->conn->Pump(nullptr, deadline));
    // Closed meanwhile (another thread): CloseLoader may not have seen a
    // lease filed just now, so the queue is dropped here (the socket may be
    // hanging up and the slot must not be used).
    if (impl_->conn->closed()) {
      impl_->conn->CloseLoader();
      return Status::Cancelled("loader closed");
    }
    if (announce) {
      if (!read) impl_->conn->AnnounceWait(impl_->step.load(std::memory_order_relaxed));
      continue;
    }
    if (!read) return std::shared_ptr<Lease>();  // deadline; whatever comes stays queued
  }
  impl_->step.store(item->step_after, std::memory_order_relaxed);
  if (!item->error.ok()) return item->error;  // the step's gather failed (still advanced)
  LX_RETURN_IF_ERROR(CheckBatch(*item->lease, publish_ns));
  return std::move(item->lease);
}

Status Loader::CheckBatch(const Lease& lease, uint64_t* publish_ns) const {
  LX_RETURN_IF_ERROR(CheckSlot(impl_->conn->ring_base(), impl_->conn->geometry(), lease.slot_,
                               lease.seq_, lease.step_, lease.offset_, lease.total_bytes_,
                               publish_ns));
  const std::vector<StreamInfo>& streams = *impl_->streams;
  const uint8_t* base = impl_->conn->ring_base() + lease.offset_;
  const uint64_t batch_size = lease.batch_size_;
  if (lease.num_streams_ != streams.size()) return Bad("wrong number of streams");
  const uint64_t total = lease.total_bytes_;
  auto inside = [&](uint64_t off, uint64_t len) { return off <= total && len <= total - off; };
  for (size_t j = 0; j < streams.size(); ++j) {
    const StreamLayout& l = lease.layout(j);
    const StreamInfo& s = streams[j];
    if (l.kind != s.kind) return Bad("stream kind mismatch");
    if (!inside(l.values_offset, l.values_bytes)) return Bad("values outside the batch");
    if (s.kind == Kind::kDense) {
      uint64_t item = s.itemsize;
      for (uint64_t d : s.item_shape) {
        if (d != 0 && item > UINT64_MAX / d) return Bad("dense item too large");
        item *= d;
      }
      if (batch_size != 0 && item > UINT64_MAX / batch_size) return Bad("dense batch too large");
      if (l.values_bytes != item * batch_size) return Bad("dense values size mismatch");
      continue;
    }
    if (batch_size > (UINT64_MAX / 8) - 1 || s.ndim > kMaxWireDims) return Bad("bad ragged sizes");
    if (l.shapes_offset % 8 || l.offsets_offset % 8) return Bad("misaligned ragged tables");
    if (!inside(l.shapes_offset, batch_size * s.ndim * 8)) return Bad("shapes outside the batch");
    if (!inside(l.offsets_offset, (batch_size + 1) * 8)) return Bad("offsets outside the batch");
    const uint64_t* offsets = reinterpret_cast<const uint64_t*>(base + l.offsets_offset);
    const uint64_t* shapes = reinterpret_cast<const uint64_t*>(base + l.shapes_offset);
    // Offsets count from offsets[0], which is 0 for a whole batch and the
    // slice's first record for a shard group member (protocol 1.1).
    if (offsets[batch_size] < offsets[0] || offsets[batch_size] - offsets[0] != l.values_bytes) {
      return Bad("offsets do not span values");
    }
    for (uint64_t k = 0; k < batch_size; ++k) {
      if (offsets[k + 1] < offsets[k]) return Bad("offsets not monotone");
      uint64_t bytes = s.itemsize;
      for (uint32_t d = 0; d < s.ndim; ++d) {
        uint64_t dim = shapes[k * s.ndim + d];
        if (dim != 0 && bytes > UINT64_MAX / dim) return Bad("record shape overflows");
        bytes *= dim;
      }
      if (bytes != offsets[k + 1] - offsets[k]) return Bad("record shape does not match its bytes");
    }
  }
  return Status::OK();
}

Result<std::optional<BatchView>> Loader::NextUntil(Clock::time_point deadline) {
  uint64_t publish_ns = 0;
  LX_ASSIGN_OR_RETURN(std::shared_ptr<Lease> lease, TakeLease(deadline, &publish_ns));
  if (!lease) return std::optional<BatchView>();
  impl_->last_publish_ns = publish_ns;
  BatchView v;
  v.step = lease->step_;
  v.batch_size = lease->batch_size_;
  v.writable = !impl_->shared_view;
  if (!impl_->shared_view) {
    // A private copy-on-write view of the pages holding the batch's
    // sections: the slot is leased (the daemon writes none of it) until
    // ~Lease, which drops the view first. Pages are the unit; their other
    // bytes (neighbouring slots) are never viewed through this batch. A shard
    // member's sections are its rows of the node's batch, which starts at the
    // slot (offset): the view starts at its first section, so the pages of
    // the other members' rows are neither walked at release nor copied when
    // the batch moves out of the ring (HeldViews::MoveOutOldest).
    const uint64_t offset = static_cast<uint64_t>(lease->base() - impl_->conn->ring_base());
    uint64_t first = UINT64_MAX, total = 0;
    for (size_t j = 0; j < lease->num_streams_; ++j) {
      const StreamLayout& l = lease->layout(j);
      first = std::min(first, l.values_offset);
      total = std::max(total, l.values_offset + l.values_bytes);
      if (l.kind == Kind::kRagged) {
        first = std::min({first, l.shapes_offset, l.offsets_offset});
        total = std::max({total, l.shapes_offset + v.batch_size * (*impl_->streams)[j].ndim * 8,
                          l.offsets_offset + (v.batch_size + 1) * 8});
      }
    }
    first = std::min(first, total);
    // Usually through one of the connection's private mappings of the whole
    // ring (no mmap per batch); a batch whose pages are taken in all of
    // them gets a mapping of its own (of the slot from its start).
    LX_ASSIGN_OR_RETURN(PrivateRings::Pages pages,
                        impl_->conn->private_rings().Acquire(offset + first, total - first));
    if (pages.base != nullptr) {
      // pages.base is ring byte offset + first of a mapping of the whole
      // ring, so the batch's first byte (ring byte offset) is in it too.
      lease->AdoptRingPages(pages.ring, pages.pages.first, pages.pages.end, pages.base - first);
    } else {
      const PrivateRings::PageRange r = PrivateRings::PagesOf(offset, total);
      LX_ASSIGN_OR_RETURN(MappedRegion copy,
                          MappedRegion::MapPrivate(impl_->conn->ring_fd(), r.end - r.first,
                                                   static_cast<off_t>(r.first)));
      uint8_t* base = copy.mutable_data() + (offset - r.first);
      lease->AdoptPrivateCopy(std::move(copy), base);
    }
    impl_->conn->held_views().List(lease.get());
  }
  uint8_t* base = impl_->shared_view ? const_cast<uint8_t*>(lease->base()) : lease->mutable_base();
  for (size_t j = 0; j < lease->num_streams_; ++j) {
    v.streams.push_back(StreamViewAt(base, lease->layout(j)));
  }
  v.owner = std::move(lease);
  return std::optional<BatchView>(std::move(v));
}

Result<bool> Loader::SeekUntil(uint64_t step, Clock::time_point deadline) {
  LX_RETURN_IF_ERROR(impl_->conn->CheckProcess());
  if (impl_->conn->closed()) return Status::Cancelled("loader closed");
  if (const std::optional<uint64_t> in_flight = impl_->conn->seek_in_flight()) {
    // The same step: this call's request is already out. Another: that
    // seek is answered first (its outcome only tells where we stand).
    Status outcome;
    LX_ASSIGN_OR_RETURN(bool settled, SettleSeek(deadline, &outcome));
    if (!settled) return false;
    if (*in_flight == step) {
      LX_RETURN_IF_ERROR(outcome);  // refused: the caller gets the refusal
      return true;
    }
  }
  LX_RETURN_IF_ERROR(impl_->conn->StartSeek(step));
  Status outcome;
  LX_ASSIGN_OR_RETURN(bool settled, SettleSeek(deadline, &outcome));
  if (!settled) return false;  // called again with `step`, it waits, not resends
  LX_RETURN_IF_ERROR(outcome);
  return true;
}

Result<bool> Loader::SettleSeek(Clock::time_point deadline, Status* outcome) {
  const std::optional<uint64_t> target = impl_->conn->seek_in_flight();
  if (!target) return true;
  LX_ASSIGN_OR_RETURN(std::optional<Status> answer, impl_->conn->AwaitSeek(nullptr, deadline));
  if (!answer) return false;
  if (answer->ok()) impl_->step.store(*target, std::memory_order_relaxed);
  if (outcome) *outcome = std::move(*answer);
  return true;
}

}  // namespace client

using client::Connection;

Client::~Client() {
  if (conn_) conn_->Shutdown();
}

Result<std::unique_ptr<Client>> Client::Connect(const std::string& path) {
  LX_ASSIGN_OR_RETURN(std::shared_ptr<Connection> conn, Connection::Open(path));
  std::unique_ptr<Client> c(new Client());
  c->path_ = path;
  const HelloOkMsg& h = conn->hello();
  c->hello_ = client::DaemonInfo{h.major,       h.minor,   h.daemon_version,
                                 h.incarnation, h.session, h.heartbeat_ms};
  c->conn_ = std::move(conn);
  return c;
}

Result<std::vector<std::pair<std::string, uint64_t>>> Client::Stats(const client::WaitHook& hook) {
  if (conn_ == nullptr) {
    LX_ASSIGN_OR_RETURN(conn_, Connection::Open(path_));
  }
  LX_ASSIGN_OR_RETURN(client::Reply r, conn_->Call(StatsMsg{}, {}, hook));
  if (auto* err = std::get_if<ErrorMsg>(&r.msg)) return err->ToStatus();
  auto* s = std::get_if<StatsReplyMsg>(&r.msg);
  if (s == nullptr) return Status::Protocol("expected stats_reply");
  return s->counters;
}

Result<client::DaemonReport> Client::Report(const client::WaitHook& hook) {
  if (conn_ == nullptr) {
    LX_ASSIGN_OR_RETURN(conn_, Connection::Open(path_));
  }
  StatsMsg ask;
  ask.detail = true;  // every daemon this client talks to speaks 1.2
  LX_ASSIGN_OR_RETURN(client::Reply r, conn_->Call(ask, {}, hook));
  if (auto* err = std::get_if<ErrorMsg>(&r.msg)) return err->ToStatus();
  auto* s = std::get_if<StatsReplyMsg>(&r.msg);
  if (s == nullptr) return Status::Protocol("expected stats_reply");
  return client::DaemonReport{std::move(s->counters), std::move(s->status)};
}

namespace client {
namespace {

// Seconds as Python prints a float the user passed ("0.05", "90000", "0").
std::string Seconds(std::chrono::milliseconds ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", std::chrono::duration<double>(ms).count());
  return buf;
}

}  // namespace

Status LoaderSpec::ValidateOptions() const {
  if (ranks_step != 1) {
    // Named as Python writes the range, its stop where the ranks end ("..."
    // past int64).
    int64_t stop = 0;
    const bool fits =
        ranks_first <= uint64_t{INT64_MAX} && ranks_count <= uint64_t{INT64_MAX} &&
        !__builtin_mul_overflow(static_cast<int64_t>(ranks_count), ranks_step, &stop) &&
        !__builtin_add_overflow(stop, static_cast<int64_t>(ranks_first), &stop);
    const std::string stop_text = fits ? std::to_string(stop) : std::string("...");
    return Status::InvalidArgument("ranks must be a range of consecutive ranks, got range(" +
                                   std::to_string(ranks_first) + ", " + stop_text + ", " +
                                   std::to_string(ranks_step) + ")");
  }
  const bool grouped = !group.empty();
  if (group.size() > kMaxGroupName) {
    return Status::InvalidArgument("group must be 1.." + std::to_string(kMaxGroupName) +
                                   " UTF-8 bytes, got " + std::to_string(group.size()));
  }
  if (!grouped && join != GroupJoin::kDefault) {
    return Status::InvalidArgument("join only applies to a group member: pass group= as well");
  }
  if (liveness_timeout < kMinLivenessTimeout || liveness_timeout > kMaxTimeout) {
    return Status::InvalidArgument("liveness_timeout must be in " + Seconds(kMinLivenessTimeout) +
                                   ".." + Seconds(kMaxTimeout) + " seconds, got " +
                                   Seconds(liveness_timeout));
  }
  if (group_timeout) {
    if (*group_timeout < kMinGroupTimeout || *group_timeout > kMaxTimeout) {
      return Status::InvalidArgument("group_timeout must be in " + Seconds(kMinGroupTimeout) +
                                     ".." + Seconds(kMaxTimeout) + " seconds, got " +
                                     Seconds(*group_timeout));
    }
    if (!grouped) {
      return Status::InvalidArgument(
          "group_timeout needs a group (a solo loader waits for nobody)");
    }
  }
  if ((ranks_count != 0 || replicas != 1) && (!grouped || group_mode != GroupMode::kShard)) {
    return Status::InvalidArgument(
        "ranks and replicas are for shard groups: pass group=... with group_mode='shard'");
  }
  if (replicas == 0) return Status::InvalidArgument("replicas must be at least 1, got 0");
  return Status::OK();
}

Status LoaderSpec::Validate() const {
  LX_RETURN_IF_ERROR(ValidateOptions());
  if (stores.empty()) return Status::InvalidArgument("loader needs at least one stream");
  if (stores.size() > kMaxWireStreams) {
    return Status::InvalidArgument("at most " + std::to_string(kMaxWireStreams) + " streams");
  }
  if (!group.empty() && group_mode == GroupMode::kBroadcast && start_step != 0 &&
      join == GroupJoin::kCurrent) {
    return Status::InvalidArgument(
        "start_step=" + std::to_string(start_step) +
        " and join='current' contradict each other: drop start_step to join where the group "
        "is, or drop join to start at start_step");
  }
  if (!mix_counts.empty() || !mix_parts.empty()) {
    if (mix_counts.empty() || mix_parts.size() != stores.size()) {
      return Status::InvalidArgument(
          "a mixture needs mix_counts and one mix_parts entry per stream (" +
          std::to_string(stores.size()) + " streams, " + std::to_string(mix_parts.size()) +
          " mix_parts entries)");
    }
    const size_t k = mix_datasets != 0 ? mix_datasets : mix_counts.size();
    for (size_t j = 0; j < stores.size(); ++j) {
      const size_t got = mix_parts[j].size();
      if (got != 0 && got != k) {
        return Status::InvalidArgument("mixed stream " + std::to_string(j) + " has " +
                                       std::to_string(got) + " parts; the mixture has " +
                                       std::to_string(k) + " datasets");
      }
    }
  }
  if (mix_datasets != 0 || !segments.empty()) {
    if (mix_datasets == 0 || mix_counts.size() % mix_datasets != 0 ||
        segments.size() != mix_counts.size() / mix_datasets) {
      return Status::InvalidArgument(
          "a mixture schedule needs mix_datasets > 0, mix_counts of one count per dataset and "
          "segment, and one segment per mix_datasets counts (" +
          std::to_string(mix_counts.size()) + " counts, " + std::to_string(segments.size()) +
          " segments, mix_datasets " + std::to_string(mix_datasets) + ")");
    }
  }
  return Status::OK();
}

}  // namespace client

namespace {

// The `open` request's settings (the streams are added by AddStreamFiles).
OpenMsg OpenRequest(const client::LoaderSpec& spec) {
  OpenMsg open;
  open.batch_size = spec.batch_size;
  open.mode = static_cast<uint32_t>(spec.mode);
  open.seed = spec.seed;
  open.rank = spec.rank;
  open.world_size = spec.world_size;
  open.start_step = spec.start_step;
  open.prefetch = spec.prefetch;
  open.leases = spec.leases;
  open.ring_bytes = spec.ring_bytes;
  if (!spec.group.empty()) {
    open.group = spec.group;
    open.group_mode = spec.group_mode;
    open.join = spec.join;
    // An explicit start_step is honoured by a broadcast member (a resumed
    // trainer joining a running sweep), never replaced by the group's step.
    if (spec.group_mode == GroupMode::kBroadcast && spec.start_step != 0 &&
        spec.join == GroupJoin::kDefault) {
      open.join = GroupJoin::kStartStep;
    }
    open.group_timeout_ms =
        spec.group_timeout ? static_cast<uint64_t>(spec.group_timeout->count()) : 0;
    open.ranks_first = spec.ranks_count != 0 ? spec.ranks_first : 0;
    open.ranks_count = spec.ranks_count;
    open.replicas = spec.replicas;
  }
  if (!spec.mix_counts.empty()) open.mix_counts = spec.mix_counts;
  if (spec.mix_datasets != 0) {
    open.mix_datasets = spec.mix_datasets;
    for (const SamplerSegment& g : spec.segments) {
      open.segments.insert(open.segments.end(), {g.start_step, g.base, g.size});
    }
  }
  return open;
}

// The store files `open` passes: opened here, with this process's rights,
// and kept open until the request is sent; the daemon gets their fds.
struct StreamFiles {
  std::vector<StoreFiles> files;
  std::vector<int> fds;
};

Status AddStore(const std::string& path, StreamRole role, OpenMsg& open, StreamFiles& out) {
  StreamFilesMsg s;
  s.label = path.size() > kMaxWireString ? path.substr(path.size() - kMaxWireString) : path;
  s.role = role;
  if (role == StreamRole::kMixSource) {
    open.streams.push_back(std::move(s));
    return Status::OK();
  }
  LX_ASSIGN_OR_RETURN(StoreFiles f, Store::OpenFileSet(path));
  s.has_shapes = f.shapes.valid();
  s.has_dict = f.dict.valid();
  s.data_files = static_cast<uint32_t>(f.data.size());
  out.fds.push_back(f.meta.get());
  out.fds.push_back(f.index.get());
  if (s.has_shapes) out.fds.push_back(f.shapes.get());
  if (s.has_dict) out.fds.push_back(f.dict.get());
  for (const UniqueFd& d : f.data) out.fds.push_back(d.get());
  open.streams.push_back(std::move(s));
  out.files.push_back(std::move(f));
  return Status::OK();
}

// Adds every stream of `spec` to `open` (a mixed stream as its parts).
Result<StreamFiles> AddStreamFiles(const client::LoaderSpec& spec, OpenMsg& open) {
  StreamFiles out;
  for (size_t j = 0; j < spec.stores.size(); ++j) {
    if (!open.mix_counts.empty() && !spec.mix_parts[j].empty()) {
      for (const std::string& part : spec.mix_parts[j]) {
        LX_RETURN_IF_ERROR(AddStore(part, StreamRole::kMixPart, open, out));
      }
    } else if (!open.mix_counts.empty() && spec.stores[j].empty()) {
      LX_RETURN_IF_ERROR(AddStore("", StreamRole::kMixSource, open, out));
    } else {
      LX_RETURN_IF_ERROR(AddStore(spec.stores[j], StreamRole::kStore, open, out));
    }
  }
  if (open.streams.size() > kMaxWireStreams) {
    return Status::InvalidArgument(
        "the mixture's streams have " + std::to_string(open.streams.size()) +
        " parts together; one loader can pass at most " + std::to_string(kMaxWireStreams));
  }
  if (out.fds.size() > kMaxFrameFds) {
    return Status::InvalidArgument("the streams have " + std::to_string(out.fds.size()) +
                                   " files together; one loader can pass at most " +
                                   std::to_string(kMaxFrameFds));
  }
  return out;
}

// The daemon's answer to `open`, checked against what was asked.
Result<OpenedMsg> Opened(client::Reply& r, const OpenMsg& open, size_t streams) {
  if (auto* err = std::get_if<ErrorMsg>(&r.msg)) return err->ToStatus();
  auto* opened = std::get_if<OpenedMsg>(&r.msg);
  const size_t want_fds = opened != nullptr && opened->queue_bytes != 0 ? 2 : 1;
  if (opened == nullptr || r.fds.size() != want_fds) {
    return Status::Protocol(want_fds == 2 ? "expected 'opened' with a ring fd and a queue fd"
                                          : "expected 'opened' with one ring fd");
  }
  if (opened->queue_bytes != 0 && !open.push_queue) {
    return Status::Protocol("'opened' carries a push queue this client did not ask for");
  }
  if (opened->streams.size() != streams) {
    return Status::Protocol("'opened' describes the wrong number of streams");
  }
  return std::move(*opened);
}

// What the loader reports of its streams: `opened`'s schemas, labelled by
// the paths the caller passed.
Result<std::shared_ptr<std::vector<client::StreamInfo>>> StreamsOf(const OpenedMsg& opened,
                                                                   const client::LoaderSpec& spec) {
  auto streams = std::make_shared<std::vector<client::StreamInfo>>();
  for (size_t j = 0; j < opened.streams.size(); ++j) {
    const StreamSchemaMsg& m = opened.streams[j];
    LX_ASSIGN_OR_RETURN(DType dtype, DType::Parse(m.dtype));
    client::StreamInfo s;
    s.label = spec.stores[j];
    s.kind = static_cast<Kind>(m.kind);
    s.dtype = dtype.str;
    s.itemsize = dtype.itemsize;
    s.item_shape = m.item_shape;
    s.ndim = m.ndim;
    s.size = m.size;
    streams->push_back(std::move(s));
  }
  return streams;
}

// A daemon whose protocol minor lacks what this loader asks for.
Status OlderDaemon(const std::string& path, uint32_t minor, const std::string& what, uint32_t needs,
                   const std::string& remedy) {
  return Status::Protocol(path + ": loaderxd speaks protocol 1." + std::to_string(minor) + "; " +
                          what + " needs 1." + std::to_string(needs) + " (" + remedy + ")");
}

}  // namespace

Result<std::unique_ptr<client::Loader>> Client::OpenLoader(const client::LoaderSpec& spec) {
  LX_RETURN_IF_ERROR(spec.Validate());
  OpenMsg open = OpenRequest(spec);
  LX_ASSIGN_OR_RETURN(StreamFiles files, AddStreamFiles(spec, open));
  // The loader gets a connection of its own: the client's (which then
  // reconnects lazily if used again), so one loader costs one session.
  std::shared_ptr<Connection> conn = std::move(conn_);
  if (conn == nullptr) {
    LX_ASSIGN_OR_RETURN(conn, Connection::Open(path_));
  }
  conn->set_liveness_timeout(spec.liveness_timeout);
  open.push_queue = spec.push_queue && conn->hello().minor >= 4;
  const uint32_t minor = conn->hello().minor;
  if ((open.ranks_count != 0 || open.replicas != 1) && minor < 5) {
    return OlderDaemon(path_, minor, "a group over part of the ranks or with replicas", 5,
                       "upgrade loaderxd");
  }
  if (open.mix_datasets != 0 && minor < 6) {
    return OlderDaemon(path_, minor, "a mixture schedule of more than one segment", 6,
                       "upgrade loaderxd, or load the mixture embedded");
  }
  conn->set_defer_takes(spec.group.empty());
  LX_ASSIGN_OR_RETURN(client::Reply r, conn->Call(open, files.fds, nullptr));
  LX_ASSIGN_OR_RETURN(OpenedMsg opened, Opened(r, open, spec.stores.size()));
  LX_RETURN_IF_ERROR(conn->AttachRing(std::move(r.fds[0]), opened.ring_bytes, opened.slot_count));
  if (opened.queue_bytes != 0) {
    LX_RETURN_IF_ERROR(conn->AttachQueue(std::move(r.fds[1]), opened.queue_bytes));
  }
  LX_ASSIGN_OR_RETURN(auto streams, StreamsOf(opened, spec));
  auto impl = std::make_unique<client::Loader::Impl>();
  impl->shared_view = spec.shared_view;
  impl->conn = std::move(conn);
  impl->streams = std::move(streams);
  impl->n = opened.n;
  impl->lease_cap = opened.leases;
  impl->ring_bytes = opened.ring_bytes;
  // A group member may start elsewhere than start_step (join="current").
  impl->step.store(opened.step.value_or(spec.start_step), std::memory_order_relaxed);
  // Owned by the loader from here on, so an error below closes it.
  std::unique_ptr<client::Loader> loader(new client::Loader(std::move(impl)));
  if (!spec.group.empty() && !opened.step) {
    return Status::Protocol("'opened' for a group member must name its first step");
  }
  return loader;
}

}  // namespace loaderx
