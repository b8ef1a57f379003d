#include "serving_group.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>
#include <utility>

#include "log.h"

namespace loaderx::daemon {

namespace {

uint64_t RoundUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

// Upper estimate of one batch's bytes, for sizing a ring before the first
// batch exists. Dense is exact; ragged assumes records up to twice the mean.
uint64_t EstimateBatchBytes(const std::vector<std::shared_ptr<const Store>>& streams,
                            uint64_t batch) {
  uint64_t total = 0;
  for (const auto& s : streams) {
    const Schema& sc = s->schema();
    if (sc.kind == Kind::kDense) {
      total += RoundUp(batch * sc.DenseItemBytes(), kBatchAlignment);
    } else {
      uint64_t mean = s->size() ? (s->nbytes() + s->size() - 1) / s->size() : 0;
      total += RoundUp(2 * mean * batch, kBatchAlignment);
      total += RoundUp(batch * sc.ndim * 8, kBatchAlignment);
      total += RoundUp((batch + 1) * 8, kBatchAlignment);
    }
  }
  return std::max<uint64_t>(total, kBatchAlignment);
}

std::string Quoted(const std::string& name) { return "group '" + name + "'"; }

// "2.0 s"
std::string Seconds(std::chrono::steady_clock::duration d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", std::chrono::duration<double>(d).count());
  return buf;
}

}  // namespace

// The allocator of a group with a live bound (serving_group.h "Live bound"): a
// producer passes to the ring only while fewer than `max_live` slots are
// live (those the ring counts plus producers admitted but not yet in it),
// or for a step up to the one the group holds the gate open for, or once
// the pipeline was sought since it came (a stale step). Every event that can let a step
// pass wakes a waiting producer: a slot freed in the ring (its free hook calls Wake), an
// admitted producer that got no slot, and the group's own SetOpen, Flush and Cancel.
// Lock order: Group::mu_, then mu_, then the ring's.
class LiveGate final : public BatchAllocator {
 public:
  LiveGate(std::shared_ptr<RingAllocator> ring, uint32_t max_live)
      : ring_(std::move(ring)), max_live_(max_live) {}

  Result<std::shared_ptr<BatchMemory>> Allocate(uint64_t step, uint64_t bytes) override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      bool queued = false;
      const uint64_t epoch = epoch_;
      while (!cancelled_ && !(open_ && step <= open_through_) && epoch == epoch_ &&
             ring_->slots_in_use() + admitted_ >= max_live_) {
        if (!queued) {
          gated_.insert(step);
          queued = true;
        }
        cv_.wait(lock);
      }
      if (queued) gated_.erase(gated_.find(step));
      if (cancelled_) return Status::Cancelled("loader closed");
      ++admitted_;
    }
    Result<std::shared_ptr<BatchMemory>> got = ring_->Allocate(step, bytes);
    {
      std::lock_guard<std::mutex> lock(mu_);
      --admitted_;
    }
    if (!got.ok()) cv_.notify_all();  // the live count fell by the slot it did not get
    return got;
  }

  // A slot was freed (the ring's free hook). Taking mu_ orders the wake after
  // a waiter's check: the waiter holds mu_ from its check into wait().
  void Wake() {
    { std::lock_guard<std::mutex> lock(mu_); }
    cv_.notify_all();
  }

  void Cancel() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      cancelled_ = true;
    }
    cv_.notify_all();
    ring_->Cancel();
  }

  // Open: steps up to `through` pass whatever is live.
  void SetOpen(bool open, uint64_t through) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (open_ == open && open_through_ == through) return;
      open_ = open;
      open_through_ = through;
    }
    if (open) cv_.notify_all();
  }

  // The pipeline was sought: every producer waiting now makes a stale step
  // (the pipeline frees it unseen), and one of them may hold back the
  // sought step (prefetch counts it): let them all pass.
  void Flush() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++epoch_;
    }
    cv_.notify_all();
  }

  // Whether a producer waits at the gate for a step at or before `step`.
  bool Holds(uint64_t step) const {
    std::lock_guard<std::mutex> lock(mu_);
    return !gated_.empty() && *gated_.begin() <= step;
  }

 private:
  const std::shared_ptr<RingAllocator> ring_;
  const uint32_t max_live_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  // Guarded by mu_.
  bool open_ = false;
  uint64_t open_through_ = 0;
  uint64_t epoch_ = 0;  // +1 per Flush
  bool cancelled_ = false;
  uint32_t admitted_ = 0;          // passed the gate, not yet back from the ring
  std::multiset<uint64_t> gated_;  // steps whose producers wait at the gate
};

Status Group::MemberSpec::Validate() const {
  if (mode != GroupMode::kShard) {
    if (ranks_count != 0 || replicas != 1) {
      return Status::InvalidArgument("ranks and replicas are for shard groups");
    }
    return Status::OK();
  }
  const uint64_t w = sampler.world_size;
  const uint64_t f = ranks_first, c = RankCount();
  const std::string range = "ranks " + std::to_string(f) + ".." + std::to_string(f + c - 1) +
                            " (ranks_first " + std::to_string(f) + ", ranks_count " +
                            std::to_string(c) + ")";
  if (c == 0 || f >= w || c > w - f) {
    return Status::InvalidArgument(range + " are not ranks of world_size " + std::to_string(w));
  }
  if (w % c != 0 || f % c != 0) {
    return Status::InvalidArgument(
        range + " are not an aligned part of world_size " + std::to_string(w) +
        ": ranks_count must divide world_size and ranks_first (each node serves its own "
        "equal, consecutive block of ranks)");
  }
  if (sampler.rank < f || sampler.rank >= f + c) {
    return Status::InvalidArgument("rank " + std::to_string(sampler.rank) +
                                   " is not one of this group's " + range);
  }
  if (replicas == 0) return Status::InvalidArgument("replicas must be at least 1");
  return Status::OK();
}

SamplerSpec Group::PipelineSpec(const MemberSpec& spec) {
  SamplerSpec s = spec.sampler;
  if (spec.mode == GroupMode::kShard) {
    // The served ranks' rows of each global batch, drawn as one batch
    // (sampler.h: a rank-(F / C) sampler of world W / C with batch C * B is
    // the concatenation of ranks F..F + C - 1's batches).
    const uint64_t count = spec.RankCount();
    s.batch_size = spec.sampler.batch_size * count;
    s.world_size = spec.sampler.world_size / count;
    s.rank = spec.ranks_first / count;
  }
  return s;
}

Result<RingGeometry> Group::Geometry(const MemberSpec& spec, const Options& options) {
  const uint32_t slots = Slots(options);
  uint64_t payload = options.ring_bytes;
  if (payload == 0) {
    const uint64_t batch = EstimateBatchBytes(spec.streams, PipelineSpec(spec).batch_size);
    if (batch > (uint64_t{1} << 46) / (2 * uint64_t{slots})) {
      return Status::ResourceExhausted("batch of ~" + std::to_string(batch) +
                                       " bytes is too large for a ring");
    }
    // Variable-size batches (a ragged stream) fragment a first-fit payload:
    // k live regions of at most M bytes leave k + 1 holes, each of which can
    // be just short of the next request, so only (2k + 1) * M bytes
    // guarantee a fit. With at most slots - 1 regions live beside the one
    // being allocated that is (2 * slots - 1) * M (serving_group.h, "Ring sizing").
    bool ragged = false;
    for (const auto& st : spec.streams) ragged |= st->schema().kind == Kind::kRagged;
    payload = batch * (ragged ? 2 * uint64_t{slots} - 1 : slots);
  }
  return RingGeometry::Compute(slots, payload);
}

Result<std::shared_ptr<Group>> Group::Create(std::string name, MemberSpec spec,
                                             const Options& options, RingCharge charge) {
  LX_ASSIGN_OR_RETURN(RingGeometry g, Geometry(spec, options));
  LX_ASSIGN_OR_RETURN(std::shared_ptr<RingAllocator> ring,
                      RingAllocator::Create(g.slot_count, g.payload_bytes, options.incarnation,
                                            options.session, std::move(charge)));
  PipelineOptions po;
  po.start_step = options.start_step;
  po.prefetch = options.prefetch;
  po.num_threads = options.threads;
  po.gather_nice = options.gather_nice;
  std::shared_ptr<LiveGate> gate;
  if (options.max_live != 0 && spec.mode == GroupMode::kBroadcast) {
    gate = std::make_shared<LiveGate>(ring, options.max_live);
    // Weak: client leases may keep the ring after the group and its gate are gone.
    ring->SetFreeHook([weak = std::weak_ptr<LiveGate>(gate)] {
      if (const std::shared_ptr<LiveGate> g = weak.lock()) g->Wake();
    });
  }
  std::shared_ptr<BatchAllocator> allocator = ring;
  if (gate) allocator = gate;
  LX_ASSIGN_OR_RETURN(std::unique_ptr<Pipeline> pipeline,
                      Pipeline::Create(spec.streams, PipelineSpec(spec), po, allocator));
  return std::shared_ptr<Group>(new Group(std::move(name), std::move(spec), options,
                                          std::move(ring), std::move(gate), std::move(pipeline)));
}

Group::Group(std::string name, MemberSpec spec, const Options& options,
             std::shared_ptr<RingAllocator> ring, std::shared_ptr<LiveGate> gate,
             std::unique_ptr<Pipeline> pipeline)
    : name_(std::move(name)),
      spec_(std::move(spec)),
      options_(options),
      ring_(std::move(ring)),
      gate_(std::move(gate)),
      pipeline_(std::move(pipeline)),
      positions_(GroupPositions::Config{
          .name = name_,
          .mode = spec_.mode,
          .world_size = spec_.sampler.world_size,
          .ranks_first = spec_.ranks_first,
          .rank_count = spec_.RankCount(),
          .replicas = spec_.replicas,
          .max_skew = options.max_skew,
          .start_step = options.start_step,
      }) {}

Group::~Group() { Close(); }

void Group::Wake() {
  std::lock_guard<std::mutex> lock(mu_);
  cv_.notify_all();
}

void Group::Close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    closed_ = true;
  }
  cv_.notify_all();
  pipeline_->Close();  // unlocked: waits for running gathers
  std::lock_guard<std::mutex> lock(mu_);
  positions_.DropAll();
  SyncHeld();
}

Status Group::CheckCompatible(const MemberSpec& spec) const {
  auto differs = [&](const std::string& field, const std::string& mine, const std::string& theirs) {
    return Status::InvalidArgument(Quoted(name_) + ": " + field + " " + mine +
                                   " differs from the group's " + theirs +
                                   " (every member must pass the same stores (and mixture), "
                                   "batch_size, mode, seed, world_size, group_mode, ranks and "
                                   "replicas)");
  };
  if (spec.mode != spec_.mode) {
    return differs("group_mode", GroupModeName(spec.mode), GroupModeName(spec_.mode));
  }
  if (spec.mix_counts != spec_.mix_counts) {
    auto list = [](const std::vector<uint64_t>& counts) {
      if (counts.empty()) return std::string("none (no mixture)");
      std::string out = "[";
      for (size_t k = 0; k < counts.size(); ++k) {
        out += (k ? ", " : "") + std::to_string(counts[k]);
      }
      return out + "]";
    };
    return differs("mixture counts", list(spec.mix_counts), list(spec_.mix_counts));
  }
  if (spec.streams.size() != spec_.streams.size()) {
    return differs("number of streams", std::to_string(spec.streams.size()),
                   std::to_string(spec_.streams.size()));
  }
  for (size_t j = 0; j < spec.streams.size(); ++j) {
    // The store registry hands out one Store per set of passed files (the
    // (device, inode) of each) while it is in use, and the group keeps its
    // stores in use: identity is equality, so a member that passed even one
    // other file (say, its own data shard) is refused, never served ours.
    if (spec.streams[j] != spec_.streams[j]) {
      return differs("stream " + std::to_string(j), "'" + spec.streams[j]->label() + "'",
                     "'" + spec_.streams[j]->label() + "' (another file)");
    }
  }
  const SamplerSpec& a = spec.sampler;
  const SamplerSpec& b = spec_.sampler;
  if (a.segments != b.segments) {
    auto list = [](const std::vector<SamplerSegment>& segments) {
      if (segments.empty()) return std::string("none (one segment)");
      std::string out = "[";
      for (size_t k = 0; k < segments.size(); ++k) {
        out += (k ? ", " : "") + std::string("step ") + std::to_string(segments[k].start_step) +
               ": " + std::to_string(segments[k].size) + " positions";
      }
      return out + "]";
    };
    return differs("mixture schedule segments", list(a.segments), list(b.segments));
  }
  if (a.batch_size != b.batch_size) {
    return differs("batch_size", std::to_string(a.batch_size), std::to_string(b.batch_size));
  }
  if (a.mode != b.mode) return differs("mode", SamplerModeName(a.mode), SamplerModeName(b.mode));
  if (a.seed != b.seed) return differs("seed", std::to_string(a.seed), std::to_string(b.seed));
  if (a.world_size != b.world_size) {
    return differs("world_size", std::to_string(a.world_size), std::to_string(b.world_size));
  }
  if (spec.ranks_first != spec_.ranks_first || spec.RankCount() != spec_.RankCount()) {
    auto range = [](const MemberSpec& s) {
      return std::to_string(s.ranks_first) + ".." +
             std::to_string(s.ranks_first + s.RankCount() - 1);
    };
    return differs("ranks", range(spec), range(spec_));
  }
  if (spec.replicas != spec_.replicas) {
    return differs("replicas", std::to_string(spec.replicas), std::to_string(spec_.replicas));
  }
  // Broadcast members receive the same batches, so they must be one rank.
  if (spec_.mode == GroupMode::kBroadcast && a.rank != b.rank) {
    return differs("rank", std::to_string(a.rank), std::to_string(b.rank));
  }
  return Status::OK();
}

void Group::SyncHeld() {
  // positions_ only ever drops held steps from the front (Trim) or all of
  // them, so the batches to drop are a prefix of held_.
  while (!held_.empty() && !positions_.holds(held_.begin()->first)) DropHeld(held_.begin());
}

void Group::DropHeld(std::map<uint64_t, Held>::iterator it) {
  if (it->second.memory) ring_->EndRetain(it->second.slot);
  held_.erase(it);  // frees the slot unless a member still leases it
}

void Group::UpdateGate() {
  if (!gate_) return;
  // Open for steps up to S only, and only while S is not gathered yet: once
  // it is held the slowest gets it without a new slot, and a gate open past
  // S would let the pipeline start S + 1 while members still hold S - 1
  // (the producer wakes as soon as S leaves the pipeline, before the group
  // re-evaluates this).
  const uint64_t slowest = positions_.Slowest();
  bool open = false;
  if (slowest >= positions_.produced()) {
    for (const auto& [sid, m] : members_) {
      const uint64_t consumed = positions_.consumed(sid);
      open |= consumed == slowest && positions_.pushed(sid) == consumed && m.caller_waits;
    }
  }
  gate_->SetOpen(open, slowest);
}

bool Group::GateHolds(uint64_t pushed) const {
  return gate_ && pushed >= positions_.produced() && pushed > positions_.Slowest() &&
         gate_->Holds(pushed);
}

std::optional<Status> Group::PeerWait(uint64_t id, Member& me, uint64_t pushed, bool live_bound,
                                      std::chrono::milliseconds poll,
                                      std::chrono::milliseconds* wait) {
  *wait = poll;
  if (positions_.consumed(id) != pushed || !me.caller_waits) {
    // Its caller still has batches queued, or is not blocked in next()
    // (between calls, say in an eval): not waiting for peers.
    me.waiting = false;
    return std::nullopt;
  }
  const auto now = std::chrono::steady_clock::now();
  if (!me.waiting) {
    me.waiting = true;
    me.waiting_since = now;
  }
  const auto waited = now - me.waiting_since;
  NoteStall(waited, me.info.timeout);
  if (!live_bound && positions_.shard()) {
    if (std::optional<Status> dead = DeadPeerHoldingBack(id, me, pushed)) return dead;
  }
  if (me.info.timeout.count() > 0 && waited >= me.info.timeout) {
    me.waiting = false;
    me.caller_waits = false;  // this refusal is pushed to it
    UpdateGate();
    return PeerTimeout(id, me, pushed, live_bound);
  }
  if (me.info.timeout.count() > 0) {
    *wait = std::min(poll, std::chrono::ceil<std::chrono::milliseconds>(me.info.timeout - waited));
  }
  return std::nullopt;
}

std::optional<Status> Group::DeadPeerHoldingBack(uint64_t id, Member& me, uint64_t pushed) {
  // A position holding this one back whose last member's process is gone
  // cannot come back by itself: say so now ("Dead peers").
  for (const uint64_t p : positions_.Behind(id, pushed)) {
    const GroupPositions::Position& pos = positions_.positions()[p];
    if (pos.member != 0 || !pos.joined || pos.left.pid <= 0) continue;
    if (auto told = me.told_gone.find(p);
        told != me.told_gone.end() && told->second == pos.leaves) {
      continue;  // told already: wait for a new member of the position
    }
    const std::string fate = PeerFate(pos.left.pid, pos.left.uid);
    if (fate == kStillRunning) continue;
    me.told_gone[p] = pos.leaves;
    me.waiting = false;
    me.caller_waits = false;  // this refusal is pushed to it
    UpdateGate();
    return DeadPeer(id, pushed, p, fate);
  }
  return std::nullopt;
}

Status Group::PeerTimeout(uint64_t id, const Member& me, uint64_t pushed, bool live_bound) const {
  const std::string who = Quoted(name_) + ": " +
                          (positions_.shard() ? positions_.PositionName(positions_.position_of(id))
                                              : "member session " + std::to_string(id)) +
                          " waited its group_timeout of " + Seconds(me.info.timeout) +
                          " for step " + std::to_string(pushed) + ", which needs ";
  const uint32_t skew = options_.max_skew;
  if (live_bound) {
    // The ring's live batches are the slowest members' to free.
    const uint64_t slowest = positions_.Slowest();
    return Status::Timeout(who + positions_.Describe(positions_.At(slowest)) +
                           " to move on from step " + std::to_string(slowest) +
                           " first (the group keeps at most " + std::to_string(options_.max_live) +
                           " batches live: group-live-batches " +
                           std::to_string(options_.max_live) + ")");
  }
  // The positions (members) holding this one back.
  return Status::Timeout(who + positions_.Describe(positions_.Behind(id, pushed)) +
                         " to reach step " + std::to_string(pushed - skew) + " first (max-skew " +
                         std::to_string(skew) + ")");
}

Status Group::DeadPeer(uint64_t id, uint64_t pushed, uint64_t position,
                       const std::string& fate) const {
  const GroupPositions::Position& pos = positions_.positions()[position];
  const std::string how = pos.left.how.empty() ? "" : " (" + pos.left.how + ")";
  const std::string rr = positions_.PositionName(position);
  const std::string left = std::to_string(pos.consumed);
  const uint32_t skew = options_.max_skew;
  return Status::Timeout(
      Quoted(name_) + ": " + positions_.PositionName(positions_.position_of(id)) +
      " cannot take step " + std::to_string(pushed) + ", which needs " + rr + " to reach step " +
      std::to_string(pushed - skew) + " first (max-skew " + std::to_string(skew) + "), but " + rr +
      " left at step " + left + how + " and its process " + std::to_string(pos.left.pid) + " " +
      fate + ": restart " + rr + " at step " + left +
      " or later (its checkpoint), or restart the job");
}

Result<uint64_t> Group::Join(uint64_t id, const MemberInfo& info, GroupJoin join,
                             uint64_t start_step) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return Status::Cancelled(Quoted(name_) + " is closing");
  LX_ASSIGN_OR_RETURN(const uint64_t cursor,
                      positions_.Join(id, info.pid, info.rank, join, start_step));
  Member m;
  m.info = info;
  members_[id] = m;
  SyncHeld();
  NoteProgress();
  UpdateGate();
  cv_.notify_all();
  return cursor;
}

bool Group::Leave(uint64_t id, const std::string& how) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = members_.find(id);
  if (it != members_.end()) {
    positions_.Leave(id, {it->second.info.pid, it->second.info.uid, how});
    members_.erase(it);
    SyncHeld();
    NoteProgress();
    UpdateGate();
  }
  cv_.notify_all();
  return members_.empty();
}

bool Group::AwaitRankFree(uint64_t rank, std::chrono::milliseconds max) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!positions_.ServesRank(rank)) return true;
  return cv_.wait_for(lock, max, [&] { return closed_ || positions_.RankHasFreePosition(rank); });
}

Delivery Group::Slice(const Held& h, uint64_t step, uint64_t rank) const {
  Delivery d;
  d.step = step;
  d.error = h.error;
  if (!h.error.ok()) return d;
  auto* memory = static_cast<RingMemory*>(h.memory.get());
  d.slot = h.slot;
  d.seq = h.seq;
  d.offset = memory->ring_offset();
  d.total_bytes = h.layout.total_bytes;
  d.memory = h.memory;
  d.streams = h.layout.streams;
  d.batch_size = h.layout.batch_size;
  if (spec_.mode != GroupMode::kShard) return d;
  // Rows [(rank - F) * B, (rank - F + 1) * B) of the served ranks' batch,
  // described in place.
  const uint64_t b = spec_.sampler.batch_size;
  const uint64_t first = (rank - spec_.ranks_first) * b;
  const uint8_t* base = memory->data();
  for (size_t j = 0; j < d.streams.size(); ++j) {
    StreamLayout& l = d.streams[j];
    if (l.kind == Kind::kDense) {
      const uint64_t row = h.layout.batch_size ? l.values_bytes / h.layout.batch_size : 0;
      l.values_offset += first * row;
      l.values_bytes = b * row;
      continue;
    }
    // Ragged: the shape and offset tables are sliced; the slice's offsets
    // stay relative to the global values start, so the values section moves
    // to offsets[first] and the client reads offsets relative to their first.
    const uint32_t ndim = spec_.streams[j]->schema().ndim;
    uint64_t lo, hi;
    std::memcpy(&lo, base + l.offsets_offset + first * 8, 8);
    std::memcpy(&hi, base + l.offsets_offset + (first + b) * 8, 8);
    l.shapes_offset += first * ndim * 8;
    l.offsets_offset += first * 8;
    l.values_offset += lo;
    l.values_bytes = hi - lo;
  }
  d.batch_size = b;
  return d;
}

Result<Delivery> Group::Next(uint64_t id, const std::function<bool()>& closing,
                             std::chrono::milliseconds poll) {
  std::unique_lock<std::mutex> lock(mu_);
  // Whatever ends this call, the member no longer waits (stats).
  struct NotWaiting {
    Group* g;
    uint64_t id;
    ~NotWaiting() {
      if (auto it = g->members_.find(id); it != g->members_.end()) it->second.waiting = false;
    }
  } not_waiting{this, id};
  while (true) {
    if (closed_ || closing()) return Status::Cancelled("loader closed");
    if (std::optional<Result<Delivery>> r = TryPush(id, lock, poll)) return *std::move(r);
  }
}

std::optional<Result<Delivery>> Group::TryPush(uint64_t id, std::unique_lock<std::mutex>& lock,
                                               std::chrono::milliseconds poll) {
  auto mit = members_.find(id);
  if (mit == members_.end()) return Status::Internal("not a member of " + Quoted(name_));
  Member& me = mit->second;
  const uint64_t pushed = positions_.pushed(id);
  if (pushed - positions_.consumed(id) >= std::min(options_.leases, kPushAhead)) {
    // The client holds the whole credit unread (or released batches it
    // never took): nothing more until it consumes. Not a wait for peers.
    me.waiting = false;
    cv_.wait_for(lock, poll);
    return std::nullopt;
  }
  if (positions_.NotStarted(id)) {
    // A shard member that never got its step ("Start and resume"): it may
    // still seek; once its caller waits in next(), that step is an error.
    me.waiting = false;
    if (!me.caller_waits) {
      cv_.wait_for(lock, poll);
      return std::nullopt;
    }
    me.caller_waits = false;  // this refusal is pushed to it
    return positions_.Gone(pushed);
  }
  if (positions_.SkewBlocked(id)) {  // too far ahead: wait for the slowest
    std::chrono::milliseconds wait = poll;
    if (std::optional<Status> st = PeerWait(id, me, pushed, /*live_bound=*/false, poll, &wait)) {
      return *st;  // logged by the server, with the member's pid
    }
    cv_.wait_for(lock, wait);
    return std::nullopt;
  }
  // At the live bound the member waits for its peers too, but for the
  // pipeline to deliver (the gate opens on a ring free the group is not
  // told of), so the wait below is the fetch's.
  std::chrono::milliseconds fetch_wait = poll;
  if (GateHolds(pushed)) {
    if (std::optional<Status> st =
            PeerWait(id, me, pushed, /*live_bound=*/true, poll, &fetch_wait)) {
      return *st;
    }
  } else {
    me.waiting = false;
  }
  if (positions_.holds(pushed)) return Deliver(id, me);
  if (pushed < positions_.produced() && pushed >= positions_.Slowest()) {
    return Status::Internal(Quoted(name_) + ": step " + std::to_string(pushed) +
                            " was produced but is not held");
  }
  if (fetching_) {  // another member waits on the pipeline for everyone
    cv_.wait_for(lock, poll);
    return std::nullopt;
  }
  if (std::optional<Status> st = Fetch(lock, fetch_wait)) return *st;
  return std::nullopt;
}

Delivery Group::Deliver(uint64_t id, Member& me) {
  const uint64_t pushed = positions_.pushed(id);
  Delivery d = Slice(held_.at(pushed), pushed, me.info.rank);
  d.gen = me.gen;
  positions_.Pushed(id);
  me.caller_waits = false;  // an item is on its way to the caller
  UpdateGate();
  cv_.notify_all();
  return d;
}

std::optional<Status> Group::Fetch(std::unique_lock<std::mutex>& lock,
                                   std::chrono::milliseconds wait) {
  // Fetch the next step for the whole group. Nobody needs steps below the
  // slowest consumed position: skip them by seeking instead of gathering them.
  fetching_ = true;
  const uint64_t target = positions_.FetchTarget();
  const uint64_t before = positions_.produced();
  const bool reseek = target != before;
  // Production goes on from `target` as of now, not once the fetch is
  // back: a member seeking (or joining) meanwhile must be refused below
  // it, since the steps it skips are never produced.
  positions_.ProduceFrom(target);
  UpdateGate();
  lock.unlock();
  Status sought = reseek ? SeekPipeline(target) : Status::OK();
  Result<std::optional<BatchView>> got = std::optional<BatchView>();
  if (sought.ok()) got = pipeline_->NextUntil(BatchSource::Clock::now() + wait);
  lock.lock();
  fetching_ = false;
  cv_.notify_all();
  if (closed_) return Status::Cancelled("loader closed");
  if (!sought.ok()) {
    positions_.ProduceFrom(before);
    UpdateGate();
    return sought;
  }
  return HoldFetched(std::move(got));
}

Status Group::SeekPipeline(uint64_t step) {
  // The pipeline's seek never waits for anything but in-flight frees, so it
  // settles before any deadline (loader.h).
  Result<bool> sought = pipeline_->SeekUntil(step, BatchSource::Clock::time_point::max());
  if (gate_) gate_->Flush();
  return sought.status();
}

BatchLayout Group::LayoutOf(const BatchView& v, BatchMemory& memory) const {
  // loader.h: every section lies at its offset from the memory start; dense
  // values are B rows of the item size, ragged ones offsets[B] bytes
  // (offsets[0] = 0 for a whole batch); the memory is total_bytes long.
  BatchLayout layout;
  layout.batch_size = v.batch_size;
  layout.total_bytes = memory.size();
  const uint8_t* base = memory.data();
  for (size_t j = 0; j < v.streams.size(); ++j) {
    const StreamView& sv = v.streams[j];
    const Schema& schema = spec_.streams[j]->schema();
    StreamLayout l;
    l.kind = schema.kind;
    l.values_offset = static_cast<uint64_t>(sv.values - base);
    if (l.kind == Kind::kDense) {
      l.values_bytes = v.batch_size * schema.DenseItemBytes();
    } else {
      l.values_bytes = sv.offsets[v.batch_size];
      l.shapes_offset = static_cast<uint64_t>(reinterpret_cast<const uint8_t*>(sv.shapes) - base);
      l.offsets_offset = static_cast<uint64_t>(reinterpret_cast<const uint8_t*>(sv.offsets) - base);
    }
    layout.streams.push_back(l);
  }
  return layout;
}

std::optional<Status> Group::HoldFetched(Result<std::optional<BatchView>> got) {
  if (got.ok() && !got->has_value()) return std::nullopt;  // not ready yet
  if (!got.ok() && got.status().code() == Status::Code::kCancelled) return got.status();
  Held h;
  if (!got.ok()) {
    h.error = got.status();  // this step failed for every member; all move on
  } else {
    BatchView& v = **got;
    if (v.step != positions_.produced()) {
      return Status::Internal(Quoted(name_) + ": pipeline delivered step " +
                              std::to_string(v.step) + ", expected " +
                              std::to_string(positions_.produced()));
    }
    // A pipeline view's owner is the batch's memory from our allocator (loader.h).
    std::shared_ptr<BatchMemory> owner =
        std::const_pointer_cast<BatchMemory>(std::static_pointer_cast<const BatchMemory>(v.owner));
    auto* memory = dynamic_cast<RingMemory*>(owner.get());
    if (memory == nullptr) return Status::Internal("batch memory is not from the ring");
    h.layout = LayoutOf(v, *memory);
    // Published once for all members; retained until the slowest passes.
    h.seq = ring_->Publish(*memory, v.step, h.layout.total_bytes, /*retained=*/true);
    h.slot = memory->slot();
    h.memory = std::move(owner);
    ++gathered_;
    if (options_.gathered) options_.gathered->fetch_add(1, std::memory_order_relaxed);
  }
  held_.emplace(positions_.Hold(), std::move(h));
  UpdateGate();
  return std::nullopt;
}

Status Group::Seek(uint64_t id, uint64_t step, const std::function<bool()>& closing,
                   std::chrono::milliseconds poll) {
  std::unique_lock<std::mutex> lock(mu_);
  auto mit = members_.find(id);
  if (mit == members_.end()) return Status::Internal("not a member of " + Quoted(name_));
  if (!positions_.SeekMovesPipeline()) {
    LX_RETURN_IF_ERROR(positions_.SeekAmongPeers(id, step));
    ++mit->second.gen;
    mit->second.caller_waits = false;
    SyncHeld();
    NoteProgress();
    UpdateGate();
    cv_.notify_all();
    return Status::OK();
  }
  // The only member: move the pipeline itself (exact resume, as solo).
  // Wait out a fetch in flight so nothing lands after the seek.
  while (fetching_) {
    if (closed_ || closing()) return Status::Cancelled("loader closed");
    cv_.wait_for(lock, poll);
  }
  if (closed_) return Status::Cancelled("loader closed");
  fetching_ = true;
  lock.unlock();
  Status st = SeekPipeline(step);
  lock.lock();
  fetching_ = false;
  cv_.notify_all();
  if (!st.ok()) return st;
  positions_.Restart(id, step);
  SyncHeld();
  ++mit->second.gen;
  mit->second.caller_waits = false;
  NoteProgress();
  UpdateGate();
  return Status::OK();
}

Result<Group::ConsumedResult> Group::Consumed(uint64_t id, uint64_t gen, uint64_t step,
                                              bool waiting) {
  std::lock_guard<std::mutex> lock(mu_);
  ConsumedResult r;
  auto mit = members_.find(id);
  if (mit == members_.end()) return r;  // left (closed): nothing to keep
  Member& me = mit->second;
  if (gen < me.gen) return r;  // sent before a seek that moved it on
  if (gen > me.gen) {
    return Status::Protocol("consumed names generation " + std::to_string(gen) +
                            ", the loader's is " + std::to_string(me.gen));
  }
  LX_ASSIGN_OR_RETURN(const uint64_t from, positions_.Consume(id, step));
  r.current = true;
  r.steps = step - from;
  // held_ still has the steps positions_ just trimmed (SyncHeld below).
  for (uint64_t s = from; s < step; ++s) {
    auto it = held_.find(s);  // held: s >= consumed >= the slowest position
    if (it != held_.end() && it->second.error.ok()) ++r.batches;
  }
  me.served += r.steps;
  served_ += r.steps;
  const bool flag_changed = me.caller_waits != waiting;
  me.caller_waits = waiting;
  if (!waiting) me.waiting = false;  // its caller no longer waits: nor does it
  if (r.steps != 0) {
    SyncHeld();
    NoteProgress();
  }
  if (r.steps != 0 || flag_changed) UpdateGate();
  // A push waiting in Next re-evaluates now (starts or stops the clock).
  if (r.steps != 0 || flag_changed) cv_.notify_all();
  return r;
}

uint64_t Group::pushed(uint64_t id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return positions_.is_member(id) ? positions_.pushed(id) : 0;
}

uint64_t Group::generation(uint64_t id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = members_.find(id);
  return it == members_.end() ? 0 : it->second.gen;
}

uint64_t Group::batches_gathered() const {
  std::lock_guard<std::mutex> lock(mu_);
  return gathered_;
}

uint64_t Group::cursor(uint64_t id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return positions_.is_member(id) ? positions_.consumed(id) : 0;
}

void Group::NoteStall(std::chrono::steady_clock::duration waited,
                      std::chrono::milliseconds timeout) {
  std::chrono::steady_clock::duration after = kStallLogAfter;
  if (timeout.count() > 0)
    after = std::min<std::chrono::steady_clock::duration>(after, timeout / 2);
  if (waited < after) return;
  const uint64_t slowest = positions_.Slowest();
  std::string who = positions_.Describe(positions_.At(slowest));
  if (who == stall_logged_ && slowest == stall_step_) return;
  stall_logged_ = std::move(who);
  stall_step_ = slowest;
  stall_since_ = std::chrono::steady_clock::now() - waited;
  LX_LOG(kInfo) << Quoted(name_) << " waits for " << stall_logged_ << " at step " << slowest
                << " since " << Seconds(waited);
}

void Group::NoteProgress() {
  if (stall_logged_.empty()) return;
  if (!(positions_.shard() || !members_.empty()) || positions_.Slowest() == stall_step_) return;
  LX_LOG(kInfo) << Quoted(name_) << " goes on: it waited "
                << Seconds(std::chrono::steady_clock::now() - stall_since_) << " for "
                << stall_logged_ << " at step " << stall_step_;
  stall_logged_.clear();
}

Group::Snapshot Group::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  Snapshot s;
  s.name = name_;
  s.mode = spec_.mode;
  s.batch_size = spec_.sampler.batch_size;
  s.world_size = spec_.sampler.world_size;
  s.rank_cursors = positions_.Cursors();
  if (positions_.shard()) {
    s.ranks_first = spec_.ranks_first;
    s.ranks_count = spec_.RankCount();
    s.replicas = spec_.replicas;
  }
  const auto now = std::chrono::steady_clock::now();
  std::chrono::steady_clock::duration longest{0};
  for (const auto& [sid, m] : members_) {
    Snapshot::MemberRow row;
    row.session = sid;
    row.info = m.info;
    row.position = positions_.position_of(sid);
    row.cursor = positions_.consumed(sid);
    row.served = m.served;
    s.members.push_back(row);
    if (m.waiting) {
      s.waiting = true;
      longest = std::max(longest, now - m.waiting_since);
    }
  }
  if (s.waiting) {
    s.waits_at_step = positions_.Slowest();
    s.waits_for = positions_.At(s.waits_at_step);
    s.waiting_ms = static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::milliseconds>(longest).count());
  }
  s.holds = !held_.empty();
  if (s.holds) {
    s.oldest_held = held_.begin()->first;
    s.newest_held = held_.rbegin()->first;
  }
  s.produced = positions_.produced();
  s.ring_bytes = ring_->geometry().total_bytes;
  s.slots = ring_->geometry().slot_count;
  s.live_slots = ring_->slots_in_use();
  s.max_live = gate_ ? options_.max_live : 0;
  s.gathered = gathered_;
  s.served = served_;
  return s;
}

size_t Group::members() const {
  std::lock_guard<std::mutex> lock(mu_);
  return members_.size();
}

}  // namespace loaderx::daemon
