// loaderxd groups end to end: C++ clients sharing one pipeline of an
// in-process daemon (docs/daemon.md "Groups").
#include "serving_group.h"

#include <chrono>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <thread>
#include <tuple>

#include "daemon_fixture.h"
#include "loaderx/loader.h"

namespace loaderx::testing {
namespace {

using client::LoaderSpec;
using std::chrono::milliseconds;

constexpr uint32_t kSkew = 4;

class GroupTest : public DaemonFixture {
 protected:
  void SetUp() override {
    daemon::Config config;
    config.max_skew = kSkew;
    // These cases drive members in turn from one thread and test the skew
    // window; the live bound (default 2) would make a member more than a
    // step ahead wait for the other (tests/integration/test_group_memory.py).
    config.group_live_batches = 0;
    StartDaemon(config);
  }

  LoaderSpec Spec(GroupMode mode, uint64_t rank = 0, uint64_t world = 1, bool ragged = false) {
    if (dense_.empty()) dense_ = MakeDenseStore(dir_.Sub("dense"), 120, Codec::kZstd);
    if (ragged && ragged_.empty()) ragged_ = MakeRaggedStore(dir_.Sub("ragged"), 120);
    LoaderSpec s;
    s.stores = {dense_};
    if (ragged) s.stores.push_back(ragged_);
    s.batch_size = 4;
    s.mode = SamplerMode::kCyclic;
    s.seed = 11;
    s.rank = rank;
    s.world_size = world;
    s.group = "g";
    s.group_mode = mode;
    s.prefetch = 2;
    s.shared_view = true;  // views of the shared ring, never moved out at the cap
    return s;
  }

  std::unique_ptr<client::Loader> Open(const LoaderSpec& spec) {
    auto c = Connect();
    auto l = c->OpenLoader(spec);
    EXPECT_TRUE(l.ok()) << l.status().ToString();
    return l.ok() ? std::move(l).value() : nullptr;
  }

  Status OpenStatus(const LoaderSpec& spec) {
    auto c = Connect();
    return c->OpenLoader(spec).status();
  }

  // Asserts that the daemon batch holds exactly the embedded batch's arrays.
  void ExpectSameArrays(const client::Batch& got, const EmbeddedRef& want,
                        const std::string& what) {
    ASSERT_EQ(got.step(), want.view.step) << what;
    ASSERT_EQ(got.batch_size(), want.layout.batch_size) << what;
    const uint8_t* base = want.base();
    for (size_t j = 0; j < want.layout.streams.size(); ++j) {
      const StreamLayout& l = want.layout.streams[j];
      if (l.kind == Kind::kDense) {
        client::ArrayView v = got.Dense(j);
        EXPECT_EQ(v.shape[0], want.layout.batch_size) << what;
        EXPECT_EQ(std::memcmp(v.data, base + l.values_offset, l.values_bytes), 0) << what;
        continue;
      }
      const auto* offsets = reinterpret_cast<const uint64_t*>(base + l.offsets_offset);
      const auto* shapes = reinterpret_cast<const uint64_t*>(base + l.shapes_offset);
      for (uint64_t k = 0; k < want.layout.batch_size; ++k) {
        client::ArrayView r = got.Record(j, k);
        ASSERT_EQ(r.shape, std::vector<uint64_t>({shapes[k]})) << what << " record " << k;
        EXPECT_EQ(
            std::memcmp(r.data, base + l.values_offset + offsets[k], offsets[k + 1] - offsets[k]),
            0)
            << what << " record " << k;
      }
    }
  }

  std::vector<uint8_t> BytesOf(const client::Batch& b) {
    const uint8_t* p = b.lease()->base();
    return std::vector<uint8_t>(p, p + 64);
  }

  void ShardRanksMatchEmbedded(uint64_t world, bool ragged) {
    std::vector<std::unique_ptr<client::Loader>> ranks;
    for (uint64_t r = 0; r < world; ++r) {
      ranks.push_back(Open(Spec(GroupMode::kShard, r, world, ragged)));
      ASSERT_TRUE(ranks.back());
    }
    for (uint64_t step = 0; step < 12; ++step) {
      for (uint64_t r = 0; r < world; ++r) {
        auto b = TakeBatch(*ranks[r]);
        ASSERT_TRUE(b.ok()) << b.status().ToString();
        ExpectSameArrays(*b, EmbeddedBatch(Spec(GroupMode::kShard, r, world, ragged), step),
                         "rank " + std::to_string(r) + " step " + std::to_string(step));
      }
    }
    // One global batch per step, whatever the number of ranks: the 12
    // consumed, and the one the push window lets run ahead of them
    // (daemon::Group::kPushAhead; max_skew and the credit allow more).
    EXPECT_EQ(SettledStat("batches_gathered", 12 + daemon::Group::kPushAhead),
              12u + daemon::Group::kPushAhead);
    // Served counts what the callers took, not what was pushed.
    EXPECT_EQ(SettledStat("batches_served", 12 * world), 12u * world);
  }

  std::string dense_, ragged_;
};

TEST_F(GroupTest, ShardOfTwoDenseRanksAreByteIdenticalToEmbeddedRanks) {
  ShardRanksMatchEmbedded(2, false);
}

TEST_F(GroupTest, ShardOfThreeDenseAndRaggedRanksAreByteIdenticalToEmbeddedRanks) {
  ShardRanksMatchEmbedded(3, true);
}

TEST_F(GroupTest, ShardOfTwoRaggedRanksSliceTheOffsetTables) { ShardRanksMatchEmbedded(2, true); }

TEST_F(GroupTest, BroadcastMembersShareOneRingAndOneGatherPerStep) {
  std::vector<std::unique_ptr<client::Loader>> members;
  for (int i = 0; i < 3; ++i) members.push_back(Open(Spec(GroupMode::kBroadcast, 0, 1, true)));
  const uint64_t ring = members[0]->ring_bytes();
  EXPECT_EQ(Stat("groups"), 1u);
  EXPECT_EQ(Stat("group_members"), 3u);
  EXPECT_EQ(Stat("loaders"), 3u);
  EXPECT_EQ(Stat("ring_bytes"), ring);  // charged once, not per member
  EXPECT_EQ(Stat("uid_ring_bytes"), ring);
  for (uint64_t step = 0; step < 15; ++step) {
    std::vector<client::Batch> got;
    for (auto& m : members) {
      auto b = TakeBatch(*m);
      ASSERT_TRUE(b.ok()) << b.status().ToString();
      ExpectSameArrays(*b, EmbeddedBatch(Spec(GroupMode::kBroadcast, 0, 1, true), step), "member");
      got.push_back(std::move(b).value());
    }
    EXPECT_EQ(BytesOf(got[1]), BytesOf(got[0]));
    EXPECT_EQ(BytesOf(got[2]), BytesOf(got[0]));
  }
  // 15 consumed by every member, and the push window ahead (see above).
  EXPECT_EQ(SettledStat("batches_gathered", 15 + daemon::Group::kPushAhead),
            15u + daemon::Group::kPushAhead);
  EXPECT_EQ(SettledStat("batches_served", 45), 45u);
}

TEST_F(GroupTest, LateBroadcastJoinerStartsAtTheCurrentStepByDefault) {
  auto a = Open(Spec(GroupMode::kBroadcast));
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(TakeBatch(*a).ok());
  auto b = Open(Spec(GroupMode::kBroadcast));
  EXPECT_EQ(b->step(), 5u);
  auto got = TakeBatch(*b);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ExpectSameArrays(*got, EmbeddedBatch(Spec(GroupMode::kBroadcast), 5), "joiner");
}

TEST_F(GroupTest, LateJoinerAtAStepTheGroupDroppedIsOutOfRange) {
  auto a = Open(Spec(GroupMode::kBroadcast));
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(TakeBatch(*a).ok());
  LoaderSpec late = Spec(GroupMode::kBroadcast);
  late.join = GroupJoin::kStartStep;
  late.start_step = 3;
  Status st = OpenStatus(late);
  EXPECT_EQ(st.code(), Status::Code::kIndexError) << st.ToString();
  EXPECT_NE(st.message().find("no longer holds step 3"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("oldest step it still holds is 5"), std::string::npos);
}

TEST_F(GroupTest, LateJoinerAheadOfProductionWaitsForItsStartStep) {
  auto a = Open(Spec(GroupMode::kBroadcast));
  ASSERT_TRUE(TakeBatch(*a).ok());  // a at step 1
  LoaderSpec ahead = Spec(GroupMode::kBroadcast);
  ahead.join = GroupJoin::kStartStep;
  ahead.start_step = 1 + kSkew;  // within the skew of a
  auto b = Open(ahead);
  EXPECT_EQ(b->step(), 1u + kSkew);
  auto got = TakeBatch(*b);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ExpectSameArrays(*got, EmbeddedBatch(ahead, 1 + kSkew), "ahead");
  // a still gets every step in between (the group held them for it).
  for (uint64_t step = 1; step <= 2 + kSkew; ++step) {
    auto x = TakeBatch(*a);
    ASSERT_TRUE(x.ok());
    EXPECT_EQ(x->step(), step);
  }
}

TEST_F(GroupTest, LateShardRankGetsTheBatchesKeptForItFromTheStart) {
  auto r0 = Open(Spec(GroupMode::kShard, 0, 2));
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(TakeBatch(*r0).ok());
  auto r1 = Open(Spec(GroupMode::kShard, 1, 2));  // join=start_step 0 by default
  EXPECT_EQ(r1->step(), 0u);
  for (uint64_t step = 0; step < 6; ++step) {
    auto b = TakeBatch(*r1);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    ExpectSameArrays(*b, EmbeddedBatch(Spec(GroupMode::kShard, 1, 2), step), "late rank");
  }
  LoaderSpec cur = Spec(GroupMode::kShard, 1, 2);
  cur.join = GroupJoin::kCurrent;
  r1->Close();
  // The rank is free again; join=current starts at the oldest step held
  // (rank 0's cursor 3: rank 1's frozen cursor 6 needs nothing older).
  std::unique_ptr<client::Loader> again;
  for (int i = 0; i < 200 && !again; ++i) {
    auto c = Connect();
    auto l = c->OpenLoader(cur);
    if (l.ok())
      again = std::move(l).value();
    else
      std::this_thread::sleep_for(milliseconds(10));  // r1's leave is asynchronous
  }
  ASSERT_TRUE(again);
  EXPECT_EQ(again->step(), 3u);
}

TEST_F(GroupTest, EverySpecFieldMismatchIsRefusedNamingBothValues) {
  LoaderSpec base = Spec(GroupMode::kShard, 0, 2);
  auto first = Open(base);
  auto refused = [&](LoaderSpec s, const std::string& field, const std::string& mine,
                     const std::string& theirs) {
    Status st = OpenStatus(s);
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << field << ": " << st.ToString();
    EXPECT_NE(st.message().find(field + " " + mine), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("group's " + theirs), std::string::npos) << st.message();
  };
  LoaderSpec s = base;
  s.rank = 1;
  s.batch_size = 8;
  refused(s, "batch_size", "8", "4");
  s = base;
  s.rank = 1;
  s.seed = 12;
  refused(s, "seed", "12", "11");
  s = base;
  s.rank = 1;
  s.mode = SamplerMode::kIID;
  refused(s, "mode", "IID", "Cyclic");
  s = base;
  s.rank = 1;
  s.world_size = 3;
  refused(s, "world_size", "3", "2");
  s = base;
  s.group_mode = GroupMode::kBroadcast;
  refused(s, "group_mode", "broadcast", "shard");
  s = base;
  s.rank = 1;
  s.stores = {MakeDenseStore(dir_.Sub("other"), 120)};
  refused(s, "stream 0", "'" + s.stores[0] + "'", "'" + dense_ + "'");
  s = base;
  s.rank = 1;
  s.stores.push_back(dense_);
  refused(s, "number of streams", "2", "1");
  // Broadcast members must be the same rank (they receive the same batches).
  LoaderSpec b = Spec(GroupMode::kBroadcast, 0, 2);
  b.group = "b";
  auto bf = Open(b);
  b.rank = 1;
  refused(b, "rank", "1", "0");
  // A group of another name is another group.
  s = base;
  s.group = "h";
  s.batch_size = 8;
  EXPECT_TRUE(OpenStatus(s).ok());
}

TEST_F(GroupTest, SecondLiveMemberForOneRankIsRefused) {
  auto r1 = Open(Spec(GroupMode::kShard, 1, 2));
  Status st = OpenStatus(Spec(GroupMode::kShard, 1, 2));
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("rank 1 of 2 is already taken"), std::string::npos) << st.message();
  EXPECT_TRUE(OpenStatus(Spec(GroupMode::kShard, 0, 2)).ok());
}

// Protocol 1.3 sends the per-batch messages as binary frames: a 1.2 client
// (msgpack `batch`/`release`/`consumed` maps) and a 1.1 client (which would
// send `next` and expect replies in order) are refused at hello, naming both
// versions and what 1.3 changed.
TEST_F(GroupTest, Protocol12And11ClientsAreRefusedNamingBothVersions) {
  uint64_t refused = 0;
  for (uint32_t minor : {2u, 1u}) {
    auto fd = ConnectSeqpacket(socket_).value();
    ASSERT_TRUE(SendFrame(fd.get(), EncodeMessage(HelloMsg{1, minor, "loaderx old"})).ok());
    auto reply = DecodeMessage(RecvFrame(fd.get())->bytes).value();
    ASSERT_TRUE(std::holds_alternative<ErrorMsg>(reply));
    const ErrorMsg& err = std::get<ErrorMsg>(reply);
    EXPECT_EQ(err.code, static_cast<uint32_t>(Status::Code::kProtocol));
    const std::string want = "protocol version mismatch: client speaks 1." + std::to_string(minor) +
                             ", loaderxd " LOADERX_DAEMON_VERSION " speaks 1." +
                             std::to_string(kProtocolMinor) +
                             " (protocol 1.3 sends batch, release and consumed as "
                             "binary frames; older clients are not served: upgrade the client)";
    EXPECT_EQ(err.message, want);
    EXPECT_FALSE(err.id.has_value());
    EXPECT_FALSE(err.gen.has_value());
    EXPECT_TRUE(RecvFrame(fd.get())->eof);  // and the connection is closed
    EXPECT_EQ(Stat("refused"), ++refused);
  }
}

TEST_F(GroupTest, BadGroupNamesAreRefusedByTheClient) {
  LoaderSpec s = Spec(GroupMode::kBroadcast);
  s.group = std::string(kMaxGroupName + 1, 'x');
  Status st = OpenStatus(s);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("group must be 1..256 UTF-8 bytes, got 257"), std::string::npos)
      << st.message();
  s.group = std::string(kMaxGroupName, 'x');
  EXPECT_TRUE(OpenStatus(s).ok());
}

TEST_F(GroupTest, BroadcastMemberLeavingMidRunLetsTheOthersGoOn) {
  auto a = Open(Spec(GroupMode::kBroadcast));
  // Alone, a is pushed its window (step 0) before b joins.
  EXPECT_EQ(SettledStat("slots_held", 1), 1u);
  auto b = Open(Spec(GroupMode::kBroadcast));  // joins at 0: the group holds 0
  auto held = TakeBatch(*b).value();
  auto mine = TakeBatch(*a).value();
  // Each took step 0 (one slot, leased by both) and is pushed step 1.
  EXPECT_EQ(SettledStat("slots_held", 4), 4u);
  mine.Reset();
  b->Close();  // b stops at step 1: without it leaving, a would wait at 1 + kSkew
  EXPECT_TRUE(WaitStat("group_members", 1));
  // b still views step 0, so its lease outlives its membership: the group
  // must not reuse that slot while a goes round the ring. Alone, a is pushed
  // its window (step 1) beyond its position 1: 1 + 1 leases.
  EXPECT_EQ(SettledStat("slots_held", 2), 2u);
  for (uint64_t step = 1; step < 1 + 5 * kSkew; ++step) {
    auto x = TakeBatchFor(*a, milliseconds(5000));
    ASSERT_TRUE(x.ok() && x->has_value()) << "step " << step;
    EXPECT_EQ((*x)->step(), step);
  }
  EXPECT_EQ(held.step(), 0u);
  ExpectSameArrays(held, EmbeddedBatch(Spec(GroupMode::kBroadcast), 0), "held past close");
  held.Reset();                          // b's last lease: its session ends
  EXPECT_TRUE(WaitStat("sessions", 1));  // a (the stats query is not counted)
  // What is left is a's window, pushed unread.
  EXPECT_EQ(SettledStat("slots_held", 1), 1u);
}

TEST_F(GroupTest, ShardRankLeavingFreezesItsCursorUntilTheRankRejoins) {
  auto r0 = Open(Spec(GroupMode::kShard, 0, 2));
  auto r1 = Open(Spec(GroupMode::kShard, 1, 2));
  ASSERT_TRUE(TakeBatch(*r1).ok());
  r1->Close();  // rank 1 frozen at step 1
  EXPECT_TRUE(WaitStat("group_members", 1));
  for (uint64_t step = 0; step <= 1 + kSkew; ++step) {
    auto x = TakeBatchFor(*r0, milliseconds(5000));
    ASSERT_TRUE(x.ok() && x->has_value()) << "step " << step;
  }
  // Now kSkew + 1 ahead of the frozen rank: rank 0 waits, without error.
  auto waiting = TakeBatchFor(*r0, milliseconds(300));
  ASSERT_TRUE(waiting.ok()) << waiting.status().ToString();
  EXPECT_FALSE(waiting->has_value());
  // A process rejoining as rank 1 at its frozen step lets both go on.
  LoaderSpec back = Spec(GroupMode::kShard, 1, 2);
  back.start_step = 1;
  auto r1b = Open(back);
  ASSERT_TRUE(r1b);
  for (uint64_t step = 1; step < 4 + kSkew; ++step) {
    auto b = TakeBatch(*r1b);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    ExpectSameArrays(*b, EmbeddedBatch(back, step), "rejoined rank");
  }
  auto x = TakeBatch(*r0);  // the request that waited is answered now
  ASSERT_TRUE(x.ok()) << x.status().ToString();
  EXPECT_EQ(x->step(), 2u + kSkew);
}

// Protocol 1.1's meaning of the group timeout, kept by 1.2's `waiting`
// flag: a member waits for peers only while its caller is blocked in
// next(). Rank 0, max_skew ahead of rank 1, pauses (no next()) three times
// its group_timeout: no error; the batch comes as soon as rank 1 moves.
// Blocked in next(), it gets the GroupTimeout error after its timeout.
TEST_F(GroupTest, GroupTimeoutCountsOnlyTheTimeTheCallerIsBlockedInNext) {
  LoaderSpec s0 = Spec(GroupMode::kShard, 0, 2);
  s0.group_timeout = milliseconds(300);
  auto r0 = Open(s0);
  auto r1 = Open(Spec(GroupMode::kShard, 1, 2));  // stays at step 0 for now
  for (uint64_t step = 0; step <= kSkew; ++step) {
    auto b = TakeBatch(*r0);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    EXPECT_EQ(b->step(), step);
  }
  // Step kSkew + 1 needs rank 1 at step 1. Rank 0's caller pauses.
  std::this_thread::sleep_for(milliseconds(900));
  ASSERT_TRUE(TakeBatch(*r1).ok());  // rank 1 takes step 0
  auto b = TakeBatchFor(*r0, milliseconds(5000));
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  ASSERT_TRUE(b->has_value());
  EXPECT_EQ((*b)->step(), kSkew + 1);
  // Blocked in next() for step kSkew + 2 (rank 1 is at 1): the timeout.
  auto timed_out = TakeBatchFor(*r0, milliseconds(5000));
  ASSERT_FALSE(timed_out.ok());
  EXPECT_EQ(timed_out.status().code(), Status::Code::kTimeout) << timed_out.status().ToString();
  EXPECT_NE(timed_out.status().message().find("rank 0 waited its group_timeout of 0.3 s for step " +
                                              std::to_string(kSkew + 2)),
            std::string::npos)
      << timed_out.status().ToString();
  EXPECT_EQ(r0->step(), kSkew + 2);  // nothing moved
  // Rank 1 moves on: rank 0's next next() gets the step.
  ASSERT_TRUE(TakeBatch(*r1).ok());
  auto after = TakeBatchFor(*r0, milliseconds(5000));
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  ASSERT_TRUE(after->has_value());
  EXPECT_EQ((*after)->step(), kSkew + 2);
}

TEST_F(GroupTest, CloseUnblocksAMemberWaitingOnSkew) {
  auto r0 = Open(Spec(GroupMode::kShard, 0, 2));  // rank 1 never joins
  for (uint64_t step = 0; step <= kSkew; ++step) ASSERT_TRUE(TakeBatch(*r0).ok());
  auto pending = std::async(std::launch::async, [&] { return TakeBatch(*r0).status(); });
  EXPECT_EQ(pending.wait_for(milliseconds(300)), std::future_status::timeout);  // waits
  r0->Close();
  ASSERT_EQ(pending.wait_for(milliseconds(3000)), std::future_status::ready);
  EXPECT_EQ(pending.get().code(), Status::Code::kCancelled);
  EXPECT_TRUE(WaitStat("groups", 0));
}

TEST_F(GroupTest, LastMemberLeavingClosesTheGroupAndFreesItsRing) {
  {
    auto a = Open(Spec(GroupMode::kBroadcast));
    auto b = Open(Spec(GroupMode::kBroadcast));
    auto x = TakeBatch(*a).value();
    auto y = TakeBatch(*b).value();
    EXPECT_GT(Stat("ring_bytes"), 0u);
    a->Close();
    EXPECT_TRUE(WaitStat("group_members", 1));
    EXPECT_GT(Stat("ring_bytes"), 0u);  // b still uses it
  }
  EXPECT_TRUE(WaitStat("ring_bytes", 0));
  EXPECT_TRUE(WaitStat("groups", 0));
  EXPECT_TRUE(WaitStat("loaders", 0));
  EXPECT_TRUE(WaitStat("slots_held", 0));
  // The name is free: a new group of another spec may take it.
  LoaderSpec other = Spec(GroupMode::kShard, 0, 2);
  EXPECT_TRUE(OpenStatus(other).ok());
}

TEST_F(GroupTest, OnlyMemberSeekMovesThePipelineOthersMoveTheirCursor) {
  auto a = Open(Spec(GroupMode::kBroadcast));
  ASSERT_TRUE(SeekTo(*a, 50).ok());  // alone: exact resume anywhere
  auto x = TakeBatch(*a).value();
  ExpectSameArrays(x, EmbeddedBatch(Spec(GroupMode::kBroadcast), 50), "sought");
  auto b = Open(Spec(GroupMode::kBroadcast));
  EXPECT_EQ(b->step(), 51u);
  // Two members: a seek only moves that member, within what the group holds.
  ASSERT_TRUE(SeekTo(*a, 53).ok());
  auto y = TakeBatch(*a).value();
  ExpectSameArrays(y, EmbeddedBatch(Spec(GroupMode::kBroadcast), 53), "cursor seek");
  Status gone = SeekTo(*a, 10);
  EXPECT_EQ(gone.code(), Status::Code::kIndexError) << gone.ToString();
  EXPECT_NE(gone.message().find("oldest step it still holds is 51"), std::string::npos)
      << gone.message();
  EXPECT_EQ(a->step(), 54u);  // a refused seek does not move
  auto z = TakeBatch(*b).value();
  ExpectSameArrays(z, EmbeddedBatch(Spec(GroupMode::kBroadcast), 51), "b unaffected");
}

TEST_F(GroupTest, RefusedSeekWithBatchesPushedBeforeItSkipsNothing) {
  // Found by tests/integration/test_daemon_model.py (in 1.1, with a `next`
  // sent ahead): the batch of step 51 is in the socket when the seek is
  // refused; it must be the next batch, not dropped.
  auto a = Open(Spec(GroupMode::kBroadcast));
  EXPECT_EQ(SettledStat("batches_gathered", 1), 1u);  // alone: its push window, 0
  ASSERT_TRUE(SeekTo(*a, 50).ok());
  // Then (generation 1) 50.
  EXPECT_EQ(SettledStat("batches_gathered", 2), 2u);
  auto b = Open(Spec(GroupMode::kBroadcast));  // joins at 50: the group holds 50..
  auto x = TakeBatch(*a).value();              // 50
  ExpectSameArrays(x, EmbeddedBatch(Spec(GroupMode::kBroadcast), 50), "before the seek");
  // a keeps x and is pushed 51; b (consumed 50) is pushed 50. Only x was
  // taken.
  EXPECT_EQ(SettledStat("slots_held", 3), 3u);
  EXPECT_EQ(Stat("batches_served"), 1u);
  EXPECT_EQ(a->step(), 51u);
  Status gone = SeekTo(*a, 10);
  EXPECT_EQ(gone.code(), Status::Code::kIndexError) << gone.ToString();
  EXPECT_EQ(a->step(), 51u);
  auto y = TakeBatch(*a).value();
  ExpectSameArrays(y, EmbeddedBatch(Spec(GroupMode::kBroadcast), 51), "after the refused seek");
  EXPECT_EQ(a->step(), 52u);
  // An accepted seek releases what was pushed before it, unread.
  ASSERT_TRUE(SeekTo(*a, 51).ok());
  auto z = TakeBatch(*a).value();
  ExpectSameArrays(z, EmbeddedBatch(Spec(GroupMode::kBroadcast), 51), "after the seek");
  auto w = TakeBatch(*b).value();
  ExpectSameArrays(w, EmbeddedBatch(Spec(GroupMode::kBroadcast), 50), "b unaffected");
}

TEST_F(GroupTest, CloseReleasesPushedBatchesNotTaken) {
  LoaderSpec spec = Spec(GroupMode::kBroadcast);
  spec.leases = 3;
  auto a = Open(spec);
  auto b = Open(spec);
  { auto x = TakeBatch(*a).value(); }           // 0, freed; 1 pushed
  EXPECT_EQ(SettledStat("slots_held", 2), 2u);  // a: 1; b: 0 (their push windows)
  a->Close();  // nothing viewed here: the session ends, the pushed lease with it
  EXPECT_TRUE(WaitStat("slots_held", 1));
  EXPECT_TRUE(WaitStat("group_members", 1));
  EXPECT_TRUE(WaitStat("sessions", 1));  // b (the stats query is not counted)
}

TEST_F(GroupTest, CursorSeekDuringARefetchNeverLandsBelowTheRefetchedStep) {
  // Race: a re-seeking fetch (every member ahead of what was produced) runs
  // unlocked; a member seeking meanwhile to a step between the old produced
  // step and the fetch target used to be accepted, and its next `next` then
  // failed with Internal ("produced but is not held"). The seek must either
  // precede the fetch (then the fetch starts at it) or be refused.
  int refused = 0;
  for (int attempt = 0; attempt < 30; ++attempt) {
    LoaderSpec spec = Spec(GroupMode::kBroadcast);
    spec.group = "race" + std::to_string(attempt);
    auto a = Open(spec);
    ASSERT_TRUE(SeekTo(*a, 5).ok());  // alone: produced = 5, nothing held
    auto b = Open(spec);              // joins at 5
    ASSERT_EQ(b->step(), 5u);
    ASSERT_TRUE(SeekTo(*a, 10).ok());  // cursor seeks, both ahead of production
    ASSERT_TRUE(SeekTo(*b, 12).ok());
    auto fetched =
        std::async(std::launch::async, [&] { return TakeBatchFor(*a, milliseconds(5000)); });
    std::this_thread::sleep_for(std::chrono::microseconds(200 * (attempt % 5)));
    Status st = SeekTo(*b, 6);
    auto x = fetched.get();
    ASSERT_TRUE(x.ok() && x->has_value()) << x.status().ToString();
    ExpectSameArrays(**x, EmbeddedBatch(spec, 10), "a");
    if (!st.ok()) {
      EXPECT_EQ(st.code(), Status::Code::kIndexError) << st.ToString();
      ++refused;
      continue;
    }
    auto y = TakeBatchFor(*b, milliseconds(5000));
    ASSERT_TRUE(y.ok() && y->has_value()) << "attempt " << attempt << ": " << y.status().ToString();
    ExpectSameArrays(**y, EmbeddedBatch(spec, 6), "b");
  }
  RecordProperty("refused", refused);
}

TEST_F(GroupTest, SeekingBackToAHeldStepRedeliversTheSameSlotSafely) {
  auto a = Open(Spec(GroupMode::kBroadcast));
  auto b = Open(Spec(GroupMode::kBroadcast));  // keeps steps 0.. held
  auto first = TakeBatch(*a).value();
  auto copy = BytesOf(first);
  ASSERT_TRUE(SeekTo(*a, 0).ok());
  auto again = TakeBatch(*a).value();
  EXPECT_EQ(again.step(), 0u);
  EXPECT_EQ(again.lease()->base(), first.lease()->base());  // the same slot
  // a: first and again (one slot, two leases) and step 1 pushed (its
  // window); b: step 0 pushed. Step 1 of generation 0, pushed before the
  // seek, went back unread.
  EXPECT_EQ(SettledStat("slots_held", 4), 4u);
  first.Reset();
  // The other delivery still holds the slot.
  EXPECT_EQ(SettledStat("slots_held", 3), 3u);
  EXPECT_TRUE(WaitStat("stale_releases", 0));
  for (int i = 0; i < 30; ++i) {  // everyone moves on; the slot must not be reused
    ASSERT_TRUE(TakeBatchFor(*b, milliseconds(5000)).ok());
    ASSERT_TRUE(TakeBatchFor(*a, milliseconds(5000)).ok());
  }
  EXPECT_EQ(BytesOf(again), copy);
}

TEST_F(GroupTest, SlowestMemberAlwaysProgressesWhileOthersRunAheadHoldingLeases) {
  LoaderSpec spec = Spec(GroupMode::kBroadcast);
  spec.leases = 2;
  auto slow = Open(spec);
  auto fast = Open(spec);
  std::deque<client::Batch> slow_held, fast_held;
  for (uint64_t step = 0; step < 40; ++step) {
    // fast runs as far ahead as the skew allows, keeping its last 2 batches.
    while (true) {
      if (fast_held.size() == 2) fast_held.pop_front();
      auto f = TakeBatchFor(*fast, milliseconds(100));
      ASSERT_TRUE(f.ok()) << f.status().ToString();
      if (!f->has_value()) break;  // waiting for slow: the skew bound
      EXPECT_LE((*f)->step(), step + kSkew);
      fast_held.push_back(std::move(**f));
    }
    if (slow_held.size() == 2) slow_held.pop_front();
    auto s = TakeBatchFor(*slow, milliseconds(5000));
    ASSERT_TRUE(s.ok()) << "step " << step << ": " << s.status().ToString();
    ASSERT_TRUE(s->has_value()) << "slowest member stalled at step " << step;
    EXPECT_EQ((*s)->step(), step);
    slow_held.push_back(std::move(**s));
  }
}

}  // namespace
}  // namespace loaderx::testing

namespace loaderx::testing {
namespace {

// Group::CheckCompatible, the comparison behind every refused open: each
// field of the spec, in both join orders (the group's value and the
// joiner's swapped), in shard and broadcast groups, names the field and
// both values.
struct SpecCase {
  const char* field;
  std::function<void(daemon::Group::MemberSpec&)> other;  // the second spec's difference
  const char* mine;                                       // the second spec's value
  const char* theirs;                                     // the first spec's value
};

class CheckCompatibleTest : public ::testing::TestWithParam<std::tuple<size_t, bool, GroupMode>> {
 protected:
  static std::vector<SpecCase> Cases() {
    using M = daemon::Group::MemberSpec;
    return {
        {"mode", [](M& s) { s.sampler.mode = SamplerMode::kIID; }, "IID", "Cyclic"},
        {"mode", [](M& s) { s.sampler.mode = SamplerMode::kSequential; }, "Sequential", "Cyclic"},
        {"seed", [](M& s) { s.sampler.seed = 12; }, "12", "11"},
        {"batch_size", [](M& s) { s.sampler.batch_size = 8; }, "8", "4"},
        {"world_size", [](M& s) { s.sampler.world_size = 3; }, "3", "2"},
        {"group_mode", [](M& s) { s.mode = Flip(s.mode); }, nullptr, nullptr},
        {"mixture counts",
         [](M& s) {
           s.mix_counts = {3, 1};
         },
         "[3, 1]", "none (no mixture)"},
        {"number of streams", [](M& s) { s.streams.push_back(s.streams[0]); }, "2", "1"},
    };
  }
  static GroupMode Flip(GroupMode m) {
    return m == GroupMode::kShard ? GroupMode::kBroadcast : GroupMode::kShard;
  }

  TempDir dir_;
};

TEST_P(CheckCompatibleTest, NamesTheFieldAndBothValuesInEitherOrder) {
  const auto [index, swapped, mode] = GetParam();
  const SpecCase c = Cases()[index];
  daemon::Group::MemberSpec a;
  a.streams = {Store::Open(MakeDenseStore(dir_.Sub("dense"), 40)).value()};
  a.sampler = SamplerSpec{40, 4, SamplerMode::kCyclic, 11, 0, 2, {}};
  a.mode = mode;
  daemon::Group::MemberSpec b = a;
  c.other(b);
  std::string mine = c.mine ? c.mine : GroupModeName(b.mode);
  std::string theirs = c.theirs ? c.theirs : GroupModeName(a.mode);
  if (swapped) {
    std::swap(a, b);
    std::swap(mine, theirs);
  }
  daemon::Group::Options o;
  o.prefetch = 1;
  o.leases = 1;
  auto group = daemon::Group::Create("g", a, o).value();
  Status st = group->CheckCompatible(b);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << st.ToString();
  EXPECT_EQ(st.message().rfind("group 'g': " + std::string(c.field) + " " + mine +
                                   " differs from the group's " + theirs + " (",
                               0),
            0u)
      << st.message();
  EXPECT_TRUE(group->CheckCompatible(a).ok());
  // Broadcast members are one rank; shard members any rank.
  daemon::Group::MemberSpec other_rank = a;
  other_rank.sampler.rank = 1;
  Status rank = group->CheckCompatible(other_rank);
  if (a.mode == GroupMode::kShard) {
    EXPECT_TRUE(rank.ok()) << rank.ToString();
  } else {
    EXPECT_NE(rank.message().find("rank 1 differs from the group's 0"), std::string::npos)
        << rank.ToString();
  }
}

INSTANTIATE_TEST_SUITE_P(EveryField, CheckCompatibleTest,
                         ::testing::Combine(::testing::Range<size_t>(0, 8), ::testing::Bool(),
                                            ::testing::Values(GroupMode::kShard,
                                                              GroupMode::kBroadcast)));

}  // namespace
}  // namespace loaderx::testing
