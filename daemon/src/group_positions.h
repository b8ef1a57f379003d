// GroupPositions: the step bookkeeping of one Group (serving_group.h), and nothing
// else: no threads, no locks, no pipeline, no ring. Group holds it under its
// mutex and asks it for every decision about steps; this class never waits.
//
// What it knows:
//  * which steps exist: `produced` (the step the pipeline delivers next)
//    and the held set (steps fetched and retained for members), contiguous
//    [slowest, produced) except right after a fetch that raced a move;
//  * every member's cursors: broadcast members each have a consumed position
//    and a push cursor; shard members share them with their *position*
//    p = (rank - F) * R + k (serving_group.h "Modes"), and a position keeps its
//    cursors when its member leaves (frozen) or before anyone joined it (the
//    start step);
//  * the rules over them (serving_group.h gives the reasons): retention (Trim drops
//    held steps below the slowest consumed position), the skew rule
//    (SkewBlocked), what may be gathered next (FetchTarget: max(produced,
//    slowest)), the oldest available step, and join / leave / seek with their
//    refusals (a rank's positions all taken, a broadcast start_step the group
//    dropped, replicas of one rank starting at different steps) and the
//    shard "not started" rule.
// Messages name the group and members as Group's statuses always did.
//
// Not thread-safe: the owner serialises every call.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "loaderx/group.h"
#include "loaderx/status.h"

namespace loaderx::daemon {

class GroupPositions {
 public:
  struct Config {
    std::string name;  // the group's name, for messages ("" for a solo loader's)
    GroupMode mode = GroupMode::kBroadcast;
    uint64_t world_size = 1;
    // Shard: the ranks served, [ranks_first, ranks_first + rank_count), and
    // members per rank. Ignored in broadcast.
    uint64_t ranks_first = 0;
    uint64_t rank_count = 1;
    uint32_t replicas = 1;
    uint32_t max_skew = 0;
    uint64_t start_step = 0;
  };
  // The last member that left a position, and how (for "Dead peers").
  struct Departure {
    int32_t pid = 0;
    uint32_t uid = 0;
    std::string how;
  };
  // Shard: one per position (rank ranks_first + p / replicas, replica
  // p % replicas).
  struct Position {
    uint64_t consumed = 0;  // consumed position (frozen while no member)
    uint64_t pushed = 0;    // push cursor
    uint64_t member = 0;    // live member id, 0 = none
    bool joined = false;    // a member has ever had this position
    uint64_t leaves = 0;    // members of it that left
    Departure left;         // the last one of them
  };

  explicit GroupPositions(Config config);

  bool shard() const { return config_.mode == GroupMode::kShard; }
  uint32_t max_skew() const { return config_.max_skew; }
  uint64_t produced() const { return produced_; }
  const std::set<uint64_t>& held() const { return held_; }
  bool holds(uint64_t step) const { return held_.contains(step); }
  size_t members() const { return members_.size(); }
  bool is_member(uint64_t id) const { return members_.contains(id); }

  // Member `id`'s consumed position / push cursor / position (0 in
  // broadcast) / the step it joined at or last sought to. REQUIRES member.
  uint64_t consumed(uint64_t id) const;
  uint64_t pushed(uint64_t id) const;
  uint64_t position_of(uint64_t id) const { return members_.at(id).position; }
  uint64_t start(uint64_t id) const { return members_.at(id).start; }
  // Shard: every position; empty in broadcast.
  const std::vector<Position>& positions() const { return positions_; }
  // Shard: the consumed position of every position; empty in broadcast.
  std::vector<uint64_t> Cursors() const;

  // The slowest consumed position (UINT64_MAX for a broadcast group with
  // no member).
  uint64_t Slowest() const;
  // The slowest consumed position of the members other than `id` (shard:
  // the other positions); UINT64_MAX if there is none.
  uint64_t SlowestOthers(uint64_t id) const;
  // The oldest step still deliverable: the oldest held one, else produced.
  uint64_t OldestAvailable() const;
  // What the next fetch gathers: steps below the slowest are never needed,
  // so production skips to it (a pipeline seek) when it lags.
  uint64_t FetchTarget() const;

  // Push decisions for member `id` at its push cursor.
  // Shard "not started": its step is neither held nor producible any more.
  bool NotStarted(uint64_t id) const;
  // Skew: its push cursor is more than max_skew past the others' slowest.
  bool SkewBlocked(uint64_t id) const;
  // The members (broadcast: ids) or positions (shard) other than `id`
  // whose consumed position + max_skew < `step`: who holds its push back.
  std::vector<uint64_t> Behind(uint64_t id, uint64_t step) const;
  // The positions (shard) or member ids (broadcast) whose consumed position is `step`.
  std::vector<uint64_t> At(uint64_t step) const;

  // Production. ProduceFrom: production goes on from `step` (a fetch's
  // target, or the value it had when that fetch failed). Hold: the step
  // `produced` was fetched; it is held and production moves on.
  void ProduceFrom(uint64_t step) { produced_ = step; }
  uint64_t Hold();
  // Advances member `id`'s push cursor past a held step pushed to it.
  void Pushed(uint64_t id);
  // The caller of member `id` takes `step` next (the client's `consumed`):
  // Protocol error outside [consumed, pushed]; else moves the consumed
  // position, trims, and returns where it was.
  Result<uint64_t> Consume(uint64_t id, uint64_t step);

  // Adds member `id` (pid for messages) of `rank` and returns its first
  // step (Group::Join's rules and refusals).
  Result<uint64_t> Join(uint64_t id, int32_t pid, uint64_t rank, GroupJoin join,
                        uint64_t start_step);
  // Removes member `id` (no-op if it is none); shard: its position freezes,
  // or gets back what it needed before the join if it never started.
  void Leave(uint64_t id, Departure departure);
  // Whether a seek of member `id` moves the pipeline (it is alone).
  bool SeekMovesPipeline() const { return members_.size() <= 1; }
  // Seek of a member among several: only its positions move (IndexError
  // below the oldest available step; a member not started is held to its
  // replicas' start). Trims.
  Status SeekAmongPeers(uint64_t id, uint64_t step);
  // The sole member `id` sought the pipeline to `step`: nothing is held,
  // production, every position and its cursors restart there.
  void Restart(uint64_t id, uint64_t step);
  // Drops every held step below the slowest consumed position.
  void Trim();
  // Drops every held step (the group closed).
  void DropAll() { held_.clear(); }

  // Shard: whether `rank` is one of the group's ranks, and whether one of
  // its positions has no live member.
  bool ServesRank(uint64_t rank) const;
  bool RankHasFreePosition(uint64_t rank) const;

  // Messages.
  // "rank 3", or "rank 3 replica 1" when ranks have replicas.
  std::string PositionName(uint64_t position) const;
  // "rank 1 (not joined) and rank 3 (left at step 9)", or the member
  // sessions with their pid and step (broadcast).
  std::string Describe(const std::vector<uint64_t>& who) const;
  // IndexError: the group no longer holds `step`.
  Status Gone(uint64_t step) const;

 private:
  struct Member {
    int32_t pid = 0;
    uint64_t position = 0;  // shard: its index in positions_
    uint64_t start = 0;     // the step it joined at or last sought to
    // Shard: its position's consumed position before it joined (Leave).
    uint64_t rank_before = 0;
    // Broadcast only; shard cursors live in positions_.
    uint64_t consumed = 0;
    uint64_t pushed = 0;
  };

  uint64_t& ConsumedOf(Member& m);
  uint64_t& PushedOf(Member& m);
  uint64_t ConsumedOf(const Member& m) const;
  uint64_t PushedOf(const Member& m) const;
  uint64_t FirstPosition(uint64_t rank) const { return (rank - config_.ranks_first) * replicas_; }
  uint64_t RankOf(uint64_t position) const { return config_.ranks_first + position / replicas_; }
  // The first position of `rank` without a live member, or InvalidArgument.
  Result<uint64_t> FreePosition(uint64_t rank) const;
  // InvalidArgument if a live replica of `position`'s rank (other than
  // member `id`) that has not moved since it started started at a step
  // other than `step`.
  Status SameStartAsReplicas(uint64_t id, uint64_t position, uint64_t step) const;
  std::string Quoted() const;

  const Config config_;
  const uint64_t replicas_;  // shard: positions per rank (1 otherwise)
  uint64_t produced_;
  std::set<uint64_t> held_;
  std::map<uint64_t, Member> members_;  // member (session) id -> member
  std::vector<Position> positions_;     // shard only
};

}  // namespace loaderx::daemon
