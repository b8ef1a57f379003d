// GroupPositions: the group's step rules without threads, pipeline or ring
// (daemon/src/group_positions.h). The scenarios follow GroupModel of
// tests/integration/test_daemon_model.py, the reference behaviour, step for
// step: exact cursors, held sets, fetch targets and refusals.
#include "group_positions.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <set>
#include <vector>

namespace loaderx::daemon {
namespace {

using Config = GroupPositions::Config;
using Held = std::set<uint64_t>;
using Steps = std::vector<uint64_t>;

constexpr uint64_t kNone = std::numeric_limits<uint64_t>::max();

Config Broadcast(uint32_t skew, uint64_t start = 0) {
  Config c;
  c.name = "g";
  c.mode = GroupMode::kBroadcast;
  c.max_skew = skew;
  c.start_step = start;
  return c;
}

Config Shard(uint64_t world, uint32_t skew, uint64_t first = 0, uint64_t count = 0,
             uint32_t replicas = 1, uint64_t start = 0) {
  Config c;
  c.name = "g";
  c.mode = GroupMode::kShard;
  c.world_size = world;
  c.ranks_first = first;
  c.rank_count = count != 0 ? count : world;
  c.replicas = replicas;
  c.max_skew = skew;
  c.start_step = start;
  return c;
}

// GroupModel.push: fetches (FetchTarget, then hold) until the member's push
// cursor is held, then pushes it. Returns the step pushed.
uint64_t Push(GroupPositions& g, uint64_t id) {
  EXPECT_FALSE(g.SkewBlocked(id));
  EXPECT_FALSE(g.NotStarted(id));
  const uint64_t step = g.pushed(id);
  while (!g.holds(step)) {
    g.ProduceFrom(g.FetchTarget());
    g.Hold();
  }
  g.Pushed(id);
  return step;
}

// Push then consume (the caller took it): the member moves one step.
void Take(GroupPositions& g, uint64_t id) {
  const uint64_t step = Push(g, id);
  ASSERT_EQ(g.Consume(id, step + 1).value(), step);
}

TEST(GroupPositionsTest, SoloBroadcastHoldsOnlyWhatItsMemberStillNeeds) {
  GroupPositions g(Broadcast(0, 5));
  EXPECT_EQ(g.produced(), 5u);
  EXPECT_EQ(g.Slowest(), kNone);  // no member yet
  ASSERT_EQ(g.Join(1, 11, 0, GroupJoin::kDefault, 5).value(), 5u);
  EXPECT_EQ(g.SlowestOthers(1), kNone);  // never gated by itself
  EXPECT_EQ(g.FetchTarget(), 5u);
  EXPECT_EQ(Push(g, 1), 5u);
  EXPECT_EQ(g.held(), (Held{5}));
  EXPECT_EQ(g.produced(), 6u);
  EXPECT_EQ(g.pushed(1), 6u);
  EXPECT_EQ(g.consumed(1), 5u);
  ASSERT_EQ(g.Consume(1, 6).value(), 5u);
  EXPECT_EQ(g.held(), Held{});
  EXPECT_EQ(g.OldestAvailable(), 6u);
  EXPECT_TRUE(g.SeekMovesPipeline());
}

TEST(GroupPositionsTest, ConsumedOutsideConsumedAndPushedIsAProtocolError) {
  GroupPositions g(Broadcast(0));
  ASSERT_TRUE(g.Join(1, 11, 0, GroupJoin::kDefault, 0).ok());
  Take(g, 1);  // consumed 1
  Push(g, 1);  // pushed 2
  Result<uint64_t> below = g.Consume(1, 0);
  ASSERT_EQ(below.status().code(), Status::Code::kProtocol);
  EXPECT_EQ(below.status().message(),
            "consumed step 0 is outside [1, 2] (the consumed position and the steps pushed)");
  EXPECT_EQ(g.Consume(1, 3).status().code(), Status::Code::kProtocol);
  EXPECT_EQ(g.consumed(1), 1u);
  ASSERT_EQ(g.Consume(1, 1).value(), 1u);  // no move: nothing trimmed
  EXPECT_EQ(g.held(), (Held{1}));
}

TEST(GroupPositionsTest, BroadcastJoinCurrentStartsAtTheOldestHeldStep) {
  GroupPositions g(Broadcast(4));
  ASSERT_EQ(g.Join(1, 11, 0, GroupJoin::kDefault, 0).value(), 0u);
  Take(g, 1);
  Push(g, 1);
  EXPECT_EQ(g.held(), (Held{1}));  // step 0 trimmed: nobody needs it
  ASSERT_EQ(g.Join(2, 22, 0, GroupJoin::kDefault, 0).value(), 1u);  // default: current
  EXPECT_EQ(g.consumed(2), 1u);
  EXPECT_EQ(g.pushed(2), 1u);
  EXPECT_EQ(g.start(2), 1u);
  EXPECT_FALSE(g.SeekMovesPipeline());
}

TEST(GroupPositionsTest, BroadcastStartStepTheGroupDroppedIsRefused) {
  GroupPositions g(Broadcast(4));
  ASSERT_TRUE(g.Join(1, 11, 0, GroupJoin::kDefault, 0).ok());
  Take(g, 1);
  Take(g, 1);
  Push(g, 1);
  EXPECT_EQ(g.held(), (Held{2}));
  Result<uint64_t> r = g.Join(2, 22, 0, GroupJoin::kStartStep, 1);
  ASSERT_EQ(r.status().code(), Status::Code::kIndexError);
  EXPECT_EQ(r.status().message(),
            "group 'g' no longer holds step 1 (out of range): the oldest step it still holds "
            "is 2; start at or after it, or join=\"current\"");
  EXPECT_EQ(g.members(), 1u);
  // A held or future step is honoured exactly; the held set stays.
  ASSERT_EQ(g.Join(2, 22, 0, GroupJoin::kStartStep, 7).value(), 7u);
  EXPECT_EQ(g.held(), (Held{2}));
  EXPECT_EQ(g.Slowest(), 2u);
}

TEST(GroupPositionsTest, BroadcastSkewBlocksTheMemberAheadOfTheSlowest) {
  GroupPositions g(Broadcast(2));
  ASSERT_TRUE(g.Join(1, 11, 0, GroupJoin::kDefault, 0).ok());
  ASSERT_TRUE(g.Join(2, 22, 0, GroupJoin::kCurrent, 0).ok());
  for (int i = 0; i < 3; ++i) Take(g, 1);  // steps 0..2: 2 <= 0 + skew
  EXPECT_EQ(g.pushed(1), 3u);
  EXPECT_TRUE(g.SkewBlocked(1));  // 3 > 0 + 2
  EXPECT_FALSE(g.SkewBlocked(2));
  EXPECT_EQ(g.SlowestOthers(1), 0u);
  EXPECT_EQ(g.SlowestOthers(2), 3u);
  EXPECT_EQ(g.Behind(1, 3), (Steps{2}));
  EXPECT_EQ(g.Behind(2, 3), Steps{});
  EXPECT_EQ(g.At(0), (Steps{2}));
  EXPECT_EQ(g.Describe(g.Behind(1, 3)), "member session 2 (pid 22, at step 0)");
  EXPECT_EQ(g.held(), (Held{0, 1, 2}));  // member 2 still needs them
  Take(g, 2);
  EXPECT_EQ(g.held(), (Held{1, 2}));
  EXPECT_FALSE(g.SkewBlocked(1));  // 3 <= 1 + 2
  EXPECT_EQ(g.produced(), 3u);
  EXPECT_EQ(g.FetchTarget(), 3u);
}

TEST(GroupPositionsTest, BroadcastLeaveForgetsTheCursorAndTrims) {
  GroupPositions g(Broadcast(4));
  ASSERT_TRUE(g.Join(1, 11, 0, GroupJoin::kDefault, 0).ok());
  ASSERT_TRUE(g.Join(2, 22, 0, GroupJoin::kCurrent, 0).ok());
  Take(g, 1);
  Take(g, 1);
  EXPECT_EQ(g.held(), (Held{0, 1}));
  g.Leave(2, {});
  EXPECT_EQ(g.held(), Held{});  // member 1 is at 2, nothing produced past it
  EXPECT_EQ(g.members(), 1u);
  EXPECT_FALSE(g.is_member(2));
  EXPECT_EQ(g.OldestAvailable(), 2u);
  g.Leave(1, {});
  EXPECT_EQ(g.Slowest(), kNone);
  g.Leave(1, {});  // no longer a member: nothing happens
  EXPECT_EQ(g.members(), 0u);
}

TEST(GroupPositionsTest, SeekAmongPeersMovesOnlyTheMemberAndRefusesDroppedSteps) {
  GroupPositions g(Broadcast(4));
  ASSERT_TRUE(g.Join(1, 11, 0, GroupJoin::kDefault, 0).ok());
  ASSERT_TRUE(g.Join(2, 22, 0, GroupJoin::kCurrent, 0).ok());
  Take(g, 1);
  Take(g, 1);
  Take(g, 2);
  EXPECT_EQ(g.held(), (Held{1}));
  Status gone = g.SeekAmongPeers(2, 0);
  ASSERT_EQ(gone.code(), Status::Code::kIndexError);
  EXPECT_EQ(gone.message(),
            "group 'g' no longer holds step 0 (out of range): the oldest step it still holds "
            "is 1; start at or after it, or join=\"current\"");
  EXPECT_EQ(g.consumed(2), 1u);
  ASSERT_TRUE(g.SeekAmongPeers(2, 10).ok());
  EXPECT_EQ(g.consumed(2), 10u);
  EXPECT_EQ(g.pushed(2), 10u);
  EXPECT_EQ(g.start(2), 10u);
  EXPECT_EQ(g.held(), Held{});  // both past step 1 now
  EXPECT_EQ(g.produced(), 2u);
  ASSERT_TRUE(g.SeekAmongPeers(1, 12).ok());
  // Production lags the slowest: the next fetch skips to it.
  EXPECT_EQ(g.FetchTarget(), 10u);
  EXPECT_EQ(Push(g, 2), 10u);
  EXPECT_EQ(g.held(), (Held{10}));
  EXPECT_EQ(g.produced(), 11u);
  EXPECT_EQ(Push(g, 1), 12u);
  EXPECT_EQ(g.held(), (Held{10, 11, 12}));
}

TEST(GroupPositionsTest, TheSoleMemberRestartsTheGroup) {
  GroupPositions g(Broadcast(4));
  ASSERT_TRUE(g.Join(1, 11, 0, GroupJoin::kDefault, 0).ok());
  Take(g, 1);
  Push(g, 1);
  EXPECT_EQ(g.held(), (Held{1}));
  ASSERT_TRUE(g.SeekMovesPipeline());
  g.Restart(1, 50);
  EXPECT_EQ(g.held(), Held{});
  EXPECT_EQ(g.produced(), 50u);
  EXPECT_EQ(g.consumed(1), 50u);
  EXPECT_EQ(g.pushed(1), 50u);
  EXPECT_EQ(g.start(1), 50u);
  EXPECT_EQ(Push(g, 1), 50u);
  g.Restart(1, 10);  // backwards too: exact resume
  EXPECT_EQ(g.OldestAvailable(), 10u);
  EXPECT_EQ(Push(g, 1), 10u);
  EXPECT_EQ(g.held(), (Held{10}));
}

TEST(GroupPositionsTest, ShardRanksNotJoinedHoldTheGroupAtTheStartStep) {
  GroupPositions g(Shard(2, 1));
  EXPECT_EQ(g.Cursors(), (Steps{0, 0}));
  ASSERT_EQ(g.Join(1, 11, 0, GroupJoin::kDefault, 0).value(), 0u);
  EXPECT_EQ(g.position_of(1), 0u);
  Take(g, 1);
  Take(g, 1);  // step 1 <= 0 + skew
  EXPECT_EQ(g.pushed(1), 2u);
  EXPECT_TRUE(g.SkewBlocked(1));  // rank 1 never joined: it sits at 0
  EXPECT_EQ(g.SlowestOthers(1), 0u);
  EXPECT_EQ(g.Behind(1, 2), (Steps{1}));
  EXPECT_EQ(g.Describe(g.Behind(1, 2)), "rank 1 (not joined)");
  EXPECT_EQ(g.held(), (Held{0, 1}));  // kept for rank 1
  EXPECT_EQ(g.Cursors(), (Steps{2, 0}));
  EXPECT_EQ(g.positions()[0].member, 1u);
  EXPECT_TRUE(g.positions()[0].joined);
  EXPECT_FALSE(g.positions()[1].joined);
  // Rank 1 joins at the start step it was kept for (default: start_step).
  ASSERT_EQ(g.Join(2, 22, 1, GroupJoin::kDefault, 0).value(), 0u);
  EXPECT_EQ(g.position_of(2), 1u);
  EXPECT_EQ(g.Describe({1}), "rank 1 (pid 22, at step 0)");
  EXPECT_EQ(Push(g, 2), 0u);  // held: no new fetch
  EXPECT_EQ(g.produced(), 2u);
  ASSERT_EQ(g.Consume(2, 1).value(), 0u);
  EXPECT_EQ(g.held(), (Held{1}));
  EXPECT_FALSE(g.SkewBlocked(1));
}

TEST(GroupPositionsTest, ShardRankTakenIsRefusedNamingItsSession) {
  GroupPositions g(Shard(2, 1));
  ASSERT_TRUE(g.Join(1, 11, 0, GroupJoin::kDefault, 0).ok());
  Result<uint64_t> r = g.Join(2, 22, 0, GroupJoin::kDefault, 0);
  ASSERT_EQ(r.status().code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            "group 'g': rank 0 of 2 is already taken by session 1 (each rank may have 1 live "
            "member)");
  EXPECT_FALSE(g.RankHasFreePosition(0));
  EXPECT_TRUE(g.RankHasFreePosition(1));
  EXPECT_EQ(g.members(), 1u);
}

TEST(GroupPositionsTest, ShardLeaveFreezesTheRankWhereItWas) {
  GroupPositions g(Shard(2, 4));
  ASSERT_TRUE(g.Join(1, 11, 0, GroupJoin::kDefault, 0).ok());
  ASSERT_TRUE(g.Join(2, 22, 1, GroupJoin::kDefault, 0).ok());
  Take(g, 2);
  Take(g, 2);
  Push(g, 2);  // pushed, never consumed
  Take(g, 1);
  EXPECT_EQ(g.held(), (Held{1, 2}));
  g.Leave(2, {22, 1000, "hung up"});
  EXPECT_EQ(g.Cursors(), (Steps{1, 2}));
  const GroupPositions::Position& p = g.positions()[1];
  EXPECT_EQ(p.pushed, 2u);  // what was pushed unread was never taken
  EXPECT_EQ(p.member, 0u);
  EXPECT_TRUE(p.joined);
  EXPECT_EQ(p.leaves, 1u);
  EXPECT_EQ(p.left.pid, 22);
  EXPECT_EQ(p.left.uid, 1000u);
  EXPECT_EQ(p.left.how, "hung up");
  EXPECT_EQ(g.Describe({1}), "rank 1 (left at step 2)");
  Take(g, 1);
  Take(g, 1);
  EXPECT_EQ(g.held(), (Held{2}));          // step 2 kept for the frozen rank
  for (int i = 0; i < 4; ++i) Take(g, 1);  // up to step 6 = 2 + 4
  EXPECT_EQ(g.held(), (Held{2, 3, 4, 5, 6}));
  EXPECT_TRUE(g.SkewBlocked(1));  // 7 > 2 + 4
  EXPECT_EQ(g.Behind(1, 7), (Steps{1}));
  // A member rejoining as rank 1 at its position takes it from there.
  ASSERT_EQ(g.Join(3, 33, 1, GroupJoin::kStartStep, 2).value(), 2u);
  EXPECT_EQ(Push(g, 3), 2u);
}

TEST(GroupPositionsTest, ShardMemberJoiningBelowTheHeldStepsIsNotStarted) {
  GroupPositions g(Shard(2, 2));
  ASSERT_TRUE(g.Join(1, 11, 0, GroupJoin::kDefault, 0).ok());
  g.Restart(1, 5);                        // alone: the group moves to its checkpoint
  EXPECT_EQ(g.Cursors(), (Steps{5, 5}));  // rank 1 (not joined) follows
  Push(g, 1);
  EXPECT_EQ(g.held(), (Held{5}));
  // Rank 1 opens at its constructor's start_step 0, below the held steps.
  ASSERT_EQ(g.Join(2, 22, 1, GroupJoin::kStartStep, 0).value(), 0u);
  EXPECT_TRUE(g.NotStarted(2));
  EXPECT_EQ(g.Slowest(), 0u);  // nothing is trimmed for it, peers wait
  ASSERT_EQ(g.Consume(1, 6).value(), 5u);
  EXPECT_EQ(g.held(), (Held{5}));
  EXPECT_EQ(g.Gone(0).message(),
            "group 'g' no longer holds step 0 (out of range): the oldest step it still holds "
            "is 5; start at or after it, or join=\"current\"");
  // It may seek to a held step (its checkpoint), not to a dropped one.
  EXPECT_EQ(g.SeekAmongPeers(2, 4).code(), Status::Code::kIndexError);
  EXPECT_TRUE(g.NotStarted(2));
  ASSERT_TRUE(g.SeekAmongPeers(2, 5).ok());
  EXPECT_FALSE(g.NotStarted(2));
  EXPECT_EQ(Push(g, 2), 5u);
}

TEST(GroupPositionsTest, ShardMemberLeavingNotStartedGivesItsPositionBack) {
  GroupPositions g(Shard(2, 2));
  ASSERT_TRUE(g.Join(1, 11, 0, GroupJoin::kDefault, 0).ok());
  g.Restart(1, 5);
  Push(g, 1);
  ASSERT_TRUE(g.Join(2, 22, 1, GroupJoin::kStartStep, 0).ok());
  g.Leave(2, {22, 0, "closed"});
  // It needed what it needed before the join (5), never less than held.
  EXPECT_EQ(g.Cursors(), (Steps{5, 5}));
  EXPECT_EQ(g.positions()[1].pushed, 5u);
  EXPECT_EQ(g.positions()[1].leaves, 1u);
  EXPECT_EQ(g.held(), (Held{5}));
}

TEST(GroupPositionsTest, NodeGroupServesItsRanksSubrangeOnly) {
  // Ranks 2..3 of world 4: the second node of a 2 x 2 job.
  GroupPositions g(Shard(4, 0, 2, 2));
  EXPECT_EQ(g.Cursors(), (Steps{0, 0}));
  EXPECT_FALSE(g.ServesRank(1));
  EXPECT_TRUE(g.ServesRank(2));
  EXPECT_TRUE(g.ServesRank(3));
  EXPECT_FALSE(g.ServesRank(4));
  ASSERT_TRUE(g.Join(1, 11, 3, GroupJoin::kDefault, 0).ok());
  EXPECT_EQ(g.position_of(1), 1u);
  EXPECT_EQ(g.PositionName(0), "rank 2");
  EXPECT_EQ(g.PositionName(1), "rank 3");
  Take(g, 1);  // skew 0: 0 <= 0
  EXPECT_TRUE(g.SkewBlocked(1));
  EXPECT_EQ(g.Describe(g.Behind(1, 1)), "rank 2 (not joined)");
  ASSERT_TRUE(g.Join(2, 22, 2, GroupJoin::kDefault, 0).ok());
  EXPECT_EQ(g.position_of(2), 0u);
  Result<uint64_t> taken = g.Join(3, 33, 2, GroupJoin::kDefault, 0);
  EXPECT_EQ(taken.status().message(),
            "group 'g': rank 2 of 4 is already taken by session 2 (each rank may have 1 live "
            "member)");
  Take(g, 2);
  EXPECT_EQ(g.held(), Held{});
  EXPECT_EQ(g.Cursors(), (Steps{1, 1}));
}

TEST(GroupPositionsTest, ReplicasShareTheirRanksStepsAndStartTogether) {
  GroupPositions g(Shard(2, 1, 0, 0, 2));
  EXPECT_EQ(g.Cursors(), (Steps{0, 0, 0, 0}));
  EXPECT_EQ(g.PositionName(3), "rank 1 replica 1");
  ASSERT_TRUE(g.Join(1, 11, 0, GroupJoin::kDefault, 0).ok());
  ASSERT_TRUE(g.Join(2, 12, 0, GroupJoin::kDefault, 0).ok());
  EXPECT_EQ(g.position_of(1), 0u);
  EXPECT_EQ(g.position_of(2), 1u);
  Result<uint64_t> third = g.Join(3, 13, 0, GroupJoin::kDefault, 0);
  EXPECT_EQ(third.status().message(),
            "group 'g': rank 0 of 2 is already taken by sessions 1, 2 (each rank may have 2 "
            "live members: replicas 2)");
  // Rank 1's replica 0 restored step 0; replica 1 another checkpoint.
  ASSERT_TRUE(g.Join(4, 21, 1, GroupJoin::kStartStep, 0).ok());
  Result<uint64_t> other = g.Join(5, 22, 1, GroupJoin::kStartStep, 1);
  ASSERT_EQ(other.status().code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(other.status().message(),
            "group 'g': rank 1 replica 1 would start at step 1, but rank 1 replica 0 (pid 21) "
            "started at step 0: the replicas of a rank must start at the same step");
  ASSERT_EQ(g.Join(5, 22, 1, GroupJoin::kStartStep, 0).value(), 0u);
  EXPECT_EQ(g.position_of(5), 3u);
  // One fetch serves every replica of a rank; the held step waits for all four.
  EXPECT_EQ(Push(g, 1), 0u);
  EXPECT_EQ(Push(g, 4), 0u);
  EXPECT_EQ(g.produced(), 1u);
  ASSERT_TRUE(g.Consume(1, 1).ok());
  ASSERT_TRUE(g.Consume(4, 1).ok());
  EXPECT_EQ(g.held(), (Held{0}));
  EXPECT_EQ(g.At(0), (Steps{1, 3}));
  EXPECT_EQ(g.Describe(g.At(0)),
            "rank 0 replica 1 (pid 12, at step 0) and rank 1 replica 1 (pid 22, at step 0)");
}

TEST(GroupPositionsTest, ReplicaThatMovedNoLongerBindsTheOthersStart) {
  GroupPositions g(Shard(1, 4, 0, 0, 2));
  ASSERT_TRUE(g.Join(1, 11, 0, GroupJoin::kDefault, 0).ok());
  Take(g, 1);
  Take(g, 1);  // replica 0 is at 2: it moved since it started at 0
  // Replica 1 may join at any step the group still holds.
  ASSERT_EQ(g.Join(2, 12, 0, GroupJoin::kStartStep, 1).value(), 1u);
  EXPECT_EQ(g.held(), (Held{1}));
  // Both positions of rank 0 are taken.
  EXPECT_EQ(g.Join(3, 13, 0, GroupJoin::kStartStep, 0).status().code(),
            Status::Code::kInvalidArgument);
  g.Leave(2, {12, 0, ""});
  EXPECT_EQ(g.Cursors(), (Steps{2, 1}));  // replica 1 frozen where it left
  // A replica joining below the held steps is not started; replica 0 moved
  // since its start, so it may seek to any held or future step.
  ASSERT_EQ(g.Join(3, 13, 0, GroupJoin::kStartStep, 0).value(), 0u);
  EXPECT_TRUE(g.NotStarted(3));
  ASSERT_TRUE(g.SeekAmongPeers(3, 2).ok());
  EXPECT_EQ(g.Cursors(), (Steps{2, 2}));
}

TEST(GroupPositionsTest, NotStartedReplicaMustSeekToItsReplicasStart) {
  GroupPositions g(Shard(2, 4, 0, 0, 2));
  ASSERT_TRUE(g.Join(1, 11, 0, GroupJoin::kDefault, 0).ok());
  g.Restart(1, 5);  // rank 0 replica 0, alone, at its checkpoint 5
  Push(g, 1);
  // Replica 1 opens at 0 (constructor), then seeks to 6: replica 0 has not
  // moved since it started at 5, so 6 is refused; 5 is accepted.
  ASSERT_EQ(g.Join(2, 12, 0, GroupJoin::kStartStep, 0).value(), 0u);
  Status st = g.SeekAmongPeers(2, 6);
  ASSERT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(st.message(),
            "group 'g': rank 0 replica 1 would start at step 6, but rank 0 replica 0 (pid 11) "
            "started at step 5: the replicas of a rank must start at the same step");
  ASSERT_TRUE(g.SeekAmongPeers(2, 5).ok());
  EXPECT_EQ(g.start(2), 5u);
}

}  // namespace
}  // namespace loaderx::daemon
