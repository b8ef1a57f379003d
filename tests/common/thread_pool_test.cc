// Tests of ThreadPool (common/internal/loaderx/thread_pool.h): every index runs
// exactly once, on the workers and the caller only, nested use cannot
// deadlock, and the destructor drains the queue.
#include "loaderx/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

namespace loaderx {
namespace {

using namespace std::chrono_literals;

// Runs ParallelFor(n) on `pool`, returning how often each index ran and the
// threads that ran them.
struct Recorded {
  std::vector<int> counts;
  std::set<std::thread::id> threads;
};
Recorded ParallelForRecording(ThreadPool& pool, size_t n) {
  Recorded r;
  r.counts.assign(n, 0);
  std::mutex mu;
  pool.ParallelFor(n, [&](size_t i) {
    std::lock_guard<std::mutex> lock(mu);
    ++r.counts[i];
    r.threads.insert(std::this_thread::get_id());
  });
  return r;
}

TEST(ThreadPoolTest, ParallelForRunsEveryIndexExactlyOnce) {
  for (size_t threads : {1u, 3u}) {
    ThreadPool pool(threads);
    for (size_t n : {0u, 1u, 2u, 1000u}) {
      const Recorded r = ParallelForRecording(pool, n);
      EXPECT_EQ(r.counts, std::vector<int>(n, 1)) << "n " << n << " threads " << threads;
      EXPECT_LE(r.threads.size(), threads + 1) << "the workers and the caller only";
    }
  }
}

TEST(ThreadPoolTest, ManyCallersAtOnceEachGetEveryIndexOnce) {
  ThreadPool pool(2);
  std::atomic<int> total{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&] {
      for (int rep = 0; rep < 20; ++rep) {
        const Recorded r = ParallelForRecording(pool, 16);
        if (r.counts == std::vector<int>(16, 1)) ++total;
      }
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(total.load(), 4 * 20);
}

TEST(ThreadPoolTest, NestedParallelForFromAWorkerCompletes) {
  ThreadPool pool(1);  // the only worker is busy in the outer task
  std::promise<int> done;
  pool.Submit([&] {
    std::atomic<int> sum{0};
    pool.ParallelFor(10, [&](size_t i) { sum += static_cast<int>(i); });
    done.set_value(sum.load());
  });
  auto f = done.get_future();
  ASSERT_EQ(f.wait_for(10s), std::future_status::ready) << "nested ParallelFor hung";
  EXPECT_EQ(f.get(), 45);
}

TEST(ThreadPoolTest, DestructorRunsQueuedTasks) {
  std::atomic<int> ran{0};
  {
    ThreadPool pool(1);
    for (int i = 0; i < 100; ++i) pool.Submit([&] { ++ran; });
  }
  EXPECT_EQ(ran.load(), 100);
}

}  // namespace
}  // namespace loaderx
