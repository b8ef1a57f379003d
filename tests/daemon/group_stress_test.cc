// Group members on their own threads (as DDP ranks or a sweep run them)
// against an in-process loaderxd: random next / hold / free / seek with and
// without request-ahead. Every batch must be its step's embedded batch when
// taken and still be it when dropped; nothing may hang; everything is
// reclaimed at the end. The single-threaded model test
// (tests/integration/test_daemon_model.py) cannot reach races between
// members; this one does, and runs under TSan/ASan with the other gtests.
#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <random>
#include <thread>

#include "daemon_fixture.h"
#include "loaderx/loader.h"

namespace loaderx::testing {
namespace {

using client::LoaderSpec;
using std::chrono::milliseconds;

constexpr uint32_t kSkew = 3;
constexpr uint64_t kLastStep = 40;  // each member stops once past it

// Every byte a member sees of a batch: stream 0 (dense) values, then the
// records of stream 1 (ragged).
std::vector<uint8_t> Contents(const client::Batch& b) {
  std::vector<uint8_t> out;
  auto append = [&](const client::ArrayView& v) {
    uint64_t bytes = v.itemsize;
    for (uint64_t d : v.shape) bytes *= d;
    const auto* p = static_cast<const uint8_t*>(v.data);
    out.insert(out.end(), p, p + bytes);
  };
  append(b.Dense(0));
  for (uint64_t k = 0; k < b.batch_size(); ++k) append(b.Record(1, k));
  return out;
}

std::vector<uint8_t> Contents(const EmbeddedRef& b) {
  std::vector<uint8_t> out;
  const uint8_t* base = b.base();
  for (const StreamLayout& l : b.layout.streams) {
    if (l.kind == Kind::kDense) {
      out.insert(out.end(), base + l.values_offset, base + l.values_offset + l.values_bytes);
      continue;
    }
    const auto* offsets = reinterpret_cast<const uint64_t*>(base + l.offsets_offset);
    out.insert(out.end(), base + l.values_offset + offsets[0],
               base + l.values_offset + offsets[b.layout.batch_size]);
  }
  return out;
}

class GroupStressTest : public DaemonFixture {
 protected:
  void SetUp() override {
    daemon::Config config;
    config.max_skew = kSkew;
    StartDaemon(config);
    dense_ = MakeDenseStore(dir_.Sub("dense"), 90, Codec::kZstd);
    ragged_ = MakeRaggedStore(dir_.Sub("ragged"), 90);
  }

  LoaderSpec Spec(GroupMode mode, uint64_t rank, uint64_t world) {
    LoaderSpec s;
    s.stores = {dense_, ragged_};
    s.batch_size = 3;
    s.mode = SamplerMode::kCyclic;
    s.seed = 17;
    s.rank = rank;
    s.world_size = world;
    s.group = "stress";
    s.group_mode = mode;
    s.prefetch = 2;
    s.shared_view = true;  // views of the shared ring, never moved out at the cap
    s.leases = 3;
    return s;
  }

  // Members 0..n-1 run `rounds` random operations each on their own thread.
  void Run(GroupMode mode, uint64_t members) {
    const uint64_t world = mode == GroupMode::kShard ? members : 1;
    std::vector<std::map<uint64_t, std::vector<uint8_t>>> want(members);
    for (uint64_t m = 0; m < members; ++m) {
      const uint64_t rank = mode == GroupMode::kShard ? m : 0;
      for (uint64_t step = 0; step <= kLastStep + kSkew + 2; ++step) {
        want[m][step] = Contents(EmbeddedBatch(Spec(mode, rank, world), step));
      }
    }
    std::vector<std::unique_ptr<client::Loader>> loaders;
    for (uint64_t m = 0; m < members; ++m) {
      const uint64_t rank = mode == GroupMode::kShard ? m : 0;
      LoaderSpec spec = Spec(mode, rank, world);
      auto c = Connect();
      auto l = c->OpenLoader(spec);
      ASSERT_TRUE(l.ok()) << l.status().ToString();
      loaders.push_back(std::move(l).value());
    }
    std::atomic<int> failures{0};
    std::vector<std::deque<std::pair<uint64_t, client::Batch>>> kept(members);
    auto member = [&](uint64_t m) {
      client::Loader& l = *loaders[m];
      std::mt19937 rng(static_cast<uint32_t>(1000 + m));
      auto& held = kept[m];
      auto fail = [&](const std::string& what) {
        ADD_FAILURE() << "member " << m << ": " << what;
        failures.fetch_add(1);
      };
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      while (l.step() <= kLastStep && failures.load() == 0) {
        if (std::chrono::steady_clock::now() > deadline) return fail("no progress in 60 s");
        const uint32_t op = rng() % 10;
        if (op < 7) {
          while (held.size() >= l.lease_cap()) held.pop_front();
          const uint64_t step = l.step();
          auto got = TakeBatchFor(l, milliseconds(200));
          if (!got.ok()) return fail("next: " + got.status().ToString());
          if (!got->has_value()) continue;  // waiting for the slowest: ask again
          client::Batch& b = **got;
          if (b.step() != step)
            return fail("step " + std::to_string(b.step()) + " for " + std::to_string(step));
          if (Contents(b) != want[m][step]) return fail("wrong batch at " + std::to_string(step));
          if (rng() % 2) held.emplace_back(step, std::move(b));
        } else if (op < 8) {
          held.clear();
        } else {
          const uint64_t from = l.step();
          const uint64_t to = from >= 3 ? from - 3 + rng() % 9 : rng() % 8;
          Status st = SeekTo(l, to);
          if (st.code() == Status::Code::kIndexError) {
            if (l.step() != from) return fail("a refused seek moved the loader");
          } else if (!st.ok()) {
            return fail("seek: " + st.ToString());
          } else if (l.step() != to) {
            return fail("seek landed at " + std::to_string(l.step()));
          }
        }
        for (auto& [step, b] : held) {
          if (Contents(b) != want[m][step])
            return fail("held batch of " + std::to_string(step) + " rewritten");
        }
      }
    };
    std::vector<std::thread> threads;
    for (uint64_t m = 0; m < members; ++m) threads.emplace_back(member, m);
    for (auto& t : threads) t.join();
    ASSERT_EQ(failures.load(), 0);
    // Close while holding, then check what is held once more and free it.
    for (auto& l : loaders) l->Close();
    EXPECT_TRUE(WaitStat("loaders", 0));
    for (uint64_t m = 0; m < members; ++m) {
      for (auto& [step, b] : kept[m]) {
        EXPECT_EQ(Contents(b), want[m][step]) << "member " << m << " step " << step;
      }
      kept[m].clear();
    }
    EXPECT_TRUE(WaitStat("slots_held", 0));
    EXPECT_TRUE(WaitStat("ring_bytes", 0));
    EXPECT_TRUE(WaitStat("groups", 0));
    EXPECT_TRUE(WaitStat("sessions", 0));  // (the stats query is not counted)
  }

  std::string dense_, ragged_;
};

TEST_F(GroupStressTest, ShardRanksOnTheirOwnThreadsGetTheirBatchesAndKeepThem) {
  Run(GroupMode::kShard, 3);
}

TEST_F(GroupStressTest, BroadcastMembersOnTheirOwnThreadsGetTheirBatchesAndKeepThem) {
  Run(GroupMode::kBroadcast, 3);
}

}  // namespace
}  // namespace loaderx::testing
