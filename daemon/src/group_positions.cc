// Contract: group_positions.h (rules and reasons: serving_group.h).
#include "group_positions.h"

#include <algorithm>
#include <limits>
#include <utility>

namespace loaderx::daemon {

namespace {
constexpr uint64_t kNone = std::numeric_limits<uint64_t>::max();
}  // namespace

GroupPositions::GroupPositions(Config config)
    : config_(std::move(config)),
      replicas_(config_.mode == GroupMode::kShard ? config_.replicas : 1),
      produced_(config_.start_step) {
  if (shard()) {
    // Members that have not joined yet still need every batch from the start.
    Position p;
    p.consumed = p.pushed = config_.start_step;
    positions_.assign(config_.rank_count * replicas_, p);
  }
}

std::string GroupPositions::Quoted() const { return "group '" + config_.name + "'"; }

uint64_t& GroupPositions::ConsumedOf(Member& m) {
  return shard() ? positions_[m.position].consumed : m.consumed;
}
uint64_t& GroupPositions::PushedOf(Member& m) {
  return shard() ? positions_[m.position].pushed : m.pushed;
}
uint64_t GroupPositions::ConsumedOf(const Member& m) const {
  return shard() ? positions_[m.position].consumed : m.consumed;
}
uint64_t GroupPositions::PushedOf(const Member& m) const {
  return shard() ? positions_[m.position].pushed : m.pushed;
}

uint64_t GroupPositions::consumed(uint64_t id) const { return ConsumedOf(members_.at(id)); }
uint64_t GroupPositions::pushed(uint64_t id) const { return PushedOf(members_.at(id)); }

std::vector<uint64_t> GroupPositions::Cursors() const {
  std::vector<uint64_t> out;
  out.reserve(positions_.size());
  for (const Position& p : positions_) out.push_back(p.consumed);
  return out;
}

uint64_t GroupPositions::Slowest() const {
  uint64_t slowest = kNone;
  if (shard()) {
    for (const Position& p : positions_) slowest = std::min(slowest, p.consumed);
    return slowest;
  }
  for (const auto& [id, m] : members_) slowest = std::min(slowest, m.consumed);
  return slowest;
}

uint64_t GroupPositions::SlowestOthers(uint64_t id) const {
  uint64_t slowest = kNone;
  if (shard()) {
    const uint64_t mine = members_.at(id).position;
    for (uint64_t p = 0; p < positions_.size(); ++p) {
      if (p != mine) slowest = std::min(slowest, positions_[p].consumed);
    }
    return slowest;
  }
  for (const auto& [sid, other] : members_) {
    if (sid != id) slowest = std::min(slowest, other.consumed);
  }
  return slowest;
}

uint64_t GroupPositions::OldestAvailable() const {
  // Every step in [slowest, produced_) is held, so the oldest held one is
  // the oldest still deliverable; with none held, production goes on from
  // produced_ (re-seeking forward if nobody needs it).
  return held_.empty() ? produced_ : *held_.begin();
}

uint64_t GroupPositions::FetchTarget() const { return std::max(produced_, Slowest()); }

bool GroupPositions::NotStarted(uint64_t id) const {
  const uint64_t step = pushed(id);
  return !holds(step) && step < OldestAvailable();
}

bool GroupPositions::SkewBlocked(uint64_t id) const {
  const uint64_t others = SlowestOthers(id);
  return others != kNone && pushed(id) > others + config_.max_skew;
}

std::vector<uint64_t> GroupPositions::Behind(uint64_t id, uint64_t step) const {
  std::vector<uint64_t> behind;
  if (shard()) {
    const uint64_t mine = members_.at(id).position;
    for (uint64_t p = 0; p < positions_.size(); ++p) {
      if (p != mine && positions_[p].consumed + config_.max_skew < step) behind.push_back(p);
    }
    return behind;
  }
  for (const auto& [sid, m] : members_) {
    if (sid != id && m.consumed + config_.max_skew < step) behind.push_back(sid);
  }
  return behind;
}

std::vector<uint64_t> GroupPositions::At(uint64_t step) const {
  std::vector<uint64_t> who;
  if (shard()) {
    for (uint64_t p = 0; p < positions_.size(); ++p) {
      if (positions_[p].consumed == step) who.push_back(p);
    }
    return who;
  }
  for (const auto& [sid, m] : members_) {
    if (m.consumed == step) who.push_back(sid);
  }
  return who;
}

uint64_t GroupPositions::Hold() {
  held_.insert(produced_);
  return produced_++;
}

void GroupPositions::Pushed(uint64_t id) { ++PushedOf(members_.at(id)); }

Result<uint64_t> GroupPositions::Consume(uint64_t id, uint64_t step) {
  Member& m = members_.at(id);
  uint64_t& consumed = ConsumedOf(m);
  const uint64_t pushed = PushedOf(m);
  if (step < consumed || step > pushed) {
    return Status::Protocol("consumed step " + std::to_string(step) + " is outside [" +
                            std::to_string(consumed) + ", " + std::to_string(pushed) +
                            "] (the consumed position and the steps pushed)");
  }
  const uint64_t before = consumed;
  consumed = step;
  if (step != before) Trim();
  return before;
}

void GroupPositions::Trim() {
  const uint64_t slowest = Slowest();
  while (!held_.empty() && *held_.begin() < slowest) held_.erase(held_.begin());
}

Result<uint64_t> GroupPositions::FreePosition(uint64_t rank) const {
  const uint64_t first = FirstPosition(rank);
  uint64_t position = first;
  while (position < first + replicas_ && positions_[position].member != 0) ++position;
  if (position != first + replicas_) return position;
  std::string sessions;
  for (uint64_t p = first; p < first + replicas_; ++p) {
    sessions += (p == first ? "" : ", ") + std::to_string(positions_[p].member);
  }
  return Status::InvalidArgument(Quoted() + ": rank " + std::to_string(rank) + " of " +
                                 std::to_string(config_.world_size) +
                                 " is already taken by session" + (replicas_ > 1 ? "s " : " ") +
                                 sessions + " (each rank may have " + std::to_string(replicas_) +
                                 " live member" + (replicas_ > 1 ? "s: replicas " : "") +
                                 (replicas_ > 1 ? std::to_string(replicas_) : "") + ")");
}

Result<uint64_t> GroupPositions::Join(uint64_t id, int32_t pid, uint64_t rank, GroupJoin join,
                                      uint64_t start_step) {
  if (join == GroupJoin::kDefault) join = shard() ? GroupJoin::kStartStep : GroupJoin::kCurrent;
  uint64_t position = 0;
  if (shard()) {
    LX_ASSIGN_OR_RETURN(position, FreePosition(rank));
  }
  const uint64_t oldest = OldestAvailable();
  uint64_t cursor = oldest;
  if (join == GroupJoin::kStartStep && !members_.empty()) {
    // Shard: accepted "not started" (serving_group.h, "Start and resume").
    if (start_step < oldest && !shard()) return Gone(start_step);
    cursor = start_step;
  } else if (members_.empty()) {
    cursor = start_step;  // the creator (produced_ == its start_step)
  }
  // A member joining "not started" is held to its replicas when it seeks.
  if (cursor >= oldest || members_.empty()) {
    LX_RETURN_IF_ERROR(SameStartAsReplicas(id, position, cursor));
  }
  Member m;
  m.pid = pid;
  m.position = position;
  m.start = cursor;
  m.consumed = cursor;
  m.pushed = cursor;
  if (shard()) {
    Position& p = positions_[position];
    m.rank_before = p.consumed;
    p.consumed = cursor;
    p.pushed = cursor;
    p.member = id;
    p.joined = true;
  }
  members_[id] = m;
  Trim();
  return cursor;
}

void GroupPositions::Leave(uint64_t id, Departure departure) {
  auto it = members_.find(id);
  if (it == members_.end()) return;
  // Shard: the position's consumed position stays where it was (frozen), so
  // the batches it still needs are kept for a member rejoining as that
  // rank; what was pushed but not consumed was never taken.
  if (shard()) {
    Position& p = positions_[it->second.position];
    p.member = 0;
    // A member that never got its step ("Start and resume") took nothing:
    // its position needs what it needed before the join, and nothing
    // older than the group still holds.
    const uint64_t oldest = OldestAvailable();
    if (p.consumed < oldest) p.consumed = std::max(it->second.rank_before, oldest);
    p.pushed = p.consumed;
    p.left = std::move(departure);
    ++p.leaves;
  }
  members_.erase(it);
  Trim();
}

Status GroupPositions::SeekAmongPeers(uint64_t id, uint64_t step) {
  Member& m = members_.at(id);
  const uint64_t oldest = OldestAvailable();
  if (step < oldest) return Gone(step);
  if (shard() && ConsumedOf(m) < oldest) {
    // Not started ("Start and resume"): it starts now, with its replicas.
    LX_RETURN_IF_ERROR(SameStartAsReplicas(id, m.position, step));
  }
  m.start = step;
  ConsumedOf(m) = step;
  PushedOf(m) = step;
  Trim();
  return Status::OK();
}

void GroupPositions::Restart(uint64_t id, uint64_t step) {
  held_.clear();
  produced_ = step;
  // Positions without a live member follow: the group restarts at `step`.
  for (Position& p : positions_) p.consumed = p.pushed = step;
  Member& m = members_.at(id);
  m.start = step;
  m.consumed = step;
  m.pushed = step;
}

Status GroupPositions::SameStartAsReplicas(uint64_t id, uint64_t position, uint64_t step) const {
  if (!shard() || replicas_ == 1) return Status::OK();
  // The replicas of a rank (one data-parallel replica's model-parallel
  // ranks) start at the same step: one that has not moved since it
  // started elsewhere says they restored different checkpoints.
  for (const auto& [sid, other] : members_) {
    if (sid == id || RankOf(other.position) != RankOf(position) || other.start == step ||
        positions_[other.position].consumed != other.start) {
      continue;
    }
    return Status::InvalidArgument(
        Quoted() + ": " + PositionName(position) + " would start at step " + std::to_string(step) +
        ", but " + PositionName(other.position) + " (pid " + std::to_string(other.pid) +
        ") started at step " + std::to_string(other.start) +
        ": the replicas of a rank must start at the same step");
  }
  return Status::OK();
}

bool GroupPositions::ServesRank(uint64_t rank) const {
  return shard() && rank >= config_.ranks_first && rank - config_.ranks_first < config_.rank_count;
}

bool GroupPositions::RankHasFreePosition(uint64_t rank) const {
  const uint64_t first = FirstPosition(rank);
  for (uint64_t p = first; p < first + replicas_; ++p) {
    if (positions_[p].member == 0) return true;
  }
  return false;
}

std::string GroupPositions::PositionName(uint64_t position) const {
  std::string out = "rank " + std::to_string(RankOf(position));
  if (replicas_ > 1) out += " replica " + std::to_string(position % replicas_);
  return out;
}

std::string GroupPositions::Describe(const std::vector<uint64_t>& who) const {
  std::string out;
  for (size_t i = 0; i < who.size(); ++i) {
    if (i != 0) out += i + 1 == who.size() ? " and " : ", ";
    if (shard()) {
      const Position& p = positions_[who[i]];
      out += PositionName(who[i]);
      if (p.member != 0) {
        auto it = members_.find(p.member);
        out += " (pid " + std::to_string(it == members_.end() ? 0 : it->second.pid) + ", at step " +
               std::to_string(p.consumed) + ")";
      } else if (p.joined) {
        out += " (left at step " + std::to_string(p.consumed) + ")";
      } else {
        out += " (not joined)";
      }
    } else {
      auto it = members_.find(who[i]);
      out += "member session " + std::to_string(who[i]);
      if (it != members_.end()) {
        out += " (pid " + std::to_string(it->second.pid) + ", at step " +
               std::to_string(it->second.consumed) + ")";
      }
    }
  }
  return out;
}

Status GroupPositions::Gone(uint64_t step) const {
  return Status::IndexError(Quoted() + " no longer holds step " + std::to_string(step) +
                            " (out of range): the oldest step it still holds is " +
                            std::to_string(OldestAvailable()) +
                            "; start at or after it, or join=\"current\"");
}

}  // namespace loaderx::daemon
