// PipelineOptions::gather_nice: the pipeline's gather threads (producers and
// pool helpers) and only they run at the creator's nice value plus the
// increment. Threads are told apart through /proc/self/task, as `ps -L`
// would: the threads that appear with a Pipeline are its threads.
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "loaderx/loader.h"
#include "loaderx/store.h"
#include "source_test_util.h"
#include "store_test_util.h"

namespace loaderx {
namespace {

// tid -> nice of every thread of this process.
std::map<int, int> ThreadNices() {
  std::map<int, int> out;
  DIR* dir = ::opendir("/proc/self/task");
  if (dir == nullptr) return out;
  while (dirent* e = ::readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream in(std::string("/proc/self/task/") + e->d_name + "/stat");
    std::string line;
    if (!std::getline(in, line)) continue;  // the thread just exited
    // Fields after "(comm)": state is field 3, nice field 19 (proc(5)).
    std::istringstream rest(line.substr(line.rfind(')') + 2));
    std::string field;
    for (int i = 3; i <= 19 && rest >> field; ++i) {
    }
    out[std::stoi(e->d_name)] = std::stoi(field);
  }
  ::closedir(dir);
  return out;
}

int OwnNice() { return ::getpriority(PRIO_PROCESS, ::gettid()); }

std::shared_ptr<const Store> SmallStore(const testing::TempDir& dir) {
  auto w =
      StoreWriter::Create(dir.Sub("s"), testing::DenseSchema("<u4", {4}), WriteOptions{}).value();
  std::vector<uint32_t> data(4 * 64, 7);
  EXPECT_TRUE(w->AppendDense(data.data(), 64).ok());
  EXPECT_TRUE(w->Publish().ok());
  return Store::Open(dir.Sub("s")).value();
}

SamplerSpec Spec(uint64_t n) {
  SamplerSpec s;
  s.n = n;
  s.batch_size = 8;
  return s;
}

// The nices of the threads that were not there before, once there are
// `count` of them and all have left their start-up (bounded wait).
std::map<int, int> NewThreads(const std::map<int, int>& before, size_t count, int want_nice) {
  std::map<int, int> fresh;
  for (int i = 0; i < 500; ++i) {
    fresh.clear();
    for (const auto& [tid, nice] : ThreadNices()) {
      if (!before.contains(tid)) fresh[tid] = nice;
    }
    if (fresh.size() == count &&
        std::all_of(fresh.begin(), fresh.end(), [&](auto& t) { return t.second == want_nice; })) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return fresh;
}

TEST(GatherPriorityTest, GatherThreadsAndOnlyThemRunAtTheIncrement) {
  testing::TempDir dir;
  auto store = SmallStore(dir);
  const int base = OwnNice();
  const int want = std::min(base + 5, kMaxGatherNice);
  const std::map<int, int> before = ThreadNices();
  PipelineOptions o;
  o.prefetch = 1;     // one producer ...
  o.num_threads = 3;  // ... and two pool helpers: both kinds of gather thread
  o.gather_nice = 5;
  auto pipe = Pipeline::Create({store}, Spec(store->size()), o).value();

  std::map<int, int> fresh = NewThreads(before, 3, want);
  ASSERT_EQ(fresh.size(), 3u);
  for (const auto& [tid, nice] : fresh) EXPECT_EQ(nice, want) << "thread " << tid;
  // Every other thread, this one included, keeps its priority.
  for (const auto& [tid, nice] : ThreadNices()) {
    if (!fresh.contains(tid) && before.contains(tid)) EXPECT_EQ(nice, before.at(tid)) << tid;
  }
  EXPECT_EQ(OwnNice(), base);
  // And the batches are what they are without the option.
  auto b = testing::NextBatch(*pipe);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b->step, 0u);
  pipe->Close();
}

TEST(GatherPriorityTest, ZeroLeavesGatherThreadsAtTheCreatorsPriority) {
  testing::TempDir dir;
  auto store = SmallStore(dir);
  const int base = OwnNice();
  const std::map<int, int> before = ThreadNices();
  PipelineOptions o;
  o.prefetch = 1;
  o.num_threads = 2;
  o.gather_nice = 0;
  auto pipe = Pipeline::Create({store}, Spec(store->size()), o).value();
  ASSERT_TRUE(testing::NextBatch(*pipe).ok());  // every thread is past its start-up
  std::map<int, int> fresh = NewThreads(before, 2, base);
  ASSERT_EQ(fresh.size(), 2u);
  for (const auto& [tid, nice] : fresh) EXPECT_EQ(nice, base) << "thread " << tid;
  pipe->Close();
}

TEST(GatherPriorityTest, OutOfRangeIncrementIsInvalidArgumentNamingIt) {
  testing::TempDir dir;
  auto store = SmallStore(dir);
  for (int bad : {-1, kMaxGatherNice + 1}) {
    PipelineOptions o;
    o.gather_nice = bad;
    auto pipe = Pipeline::Create({store}, Spec(store->size()), o);
    ASSERT_FALSE(pipe.ok()) << bad;
    EXPECT_EQ(pipe.status().code(), Status::Code::kInvalidArgument);
    EXPECT_NE(pipe.status().message().find("gather_nice"), std::string::npos)
        << pipe.status().message();
  }
}

}  // namespace
}  // namespace loaderx
