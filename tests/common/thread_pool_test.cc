// Tests of ThreadPool (common/include/loaderx/thread_pool.h): every index runs
// exactly once, nested use cannot deadlock, and a Callers::kWait pool never
// runs work on a caller that is not one of its workers.
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
  for (auto callers : {ThreadPool::Callers::kHelp, ThreadPool::Callers::kWait}) {
    for (size_t threads : {1u, 3u}) {
      ThreadPool pool(threads, callers);
      for (size_t n : {0u, 1u, 2u, 1000u}) {
        const Recorded r = ParallelForRecording(pool, n);
        EXPECT_EQ(r.counts, std::vector<int>(n, 1)) << "n " << n << " threads " << threads;
      }
    }
  }
}

TEST(ThreadPoolTest, WaitingCallerNeverRunsTheWorkItself) {
  ThreadPool pool(2, ThreadPool::Callers::kWait);
  for (size_t n : {1u, 2u, 50u}) {
    const Recorded r = ParallelForRecording(pool, n);
    EXPECT_FALSE(r.threads.contains(std::this_thread::get_id())) << "n " << n;
    EXPECT_LE(r.threads.size(), 2u);
  }
}

TEST(ThreadPoolTest, ManyWaitingCallersShareTheWorkersOnly) {
  ThreadPool pool(2, ThreadPool::Callers::kWait);
  std::mutex mu;
  std::set<std::thread::id> runners, callers;
  std::atomic<int> total{0};
  std::vector<std::thread> threads;
  for (int c = 0; c < 4; ++c) {
    threads.emplace_back([&] {
      {
        std::lock_guard<std::mutex> lock(mu);
        callers.insert(std::this_thread::get_id());
      }
      for (int rep = 0; rep < 20; ++rep) {
        pool.ParallelFor(16, [&](size_t) {
          ++total;
          std::lock_guard<std::mutex> lock(mu);
          runners.insert(std::this_thread::get_id());
        });
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(total.load(), 4 * 20 * 16);
  EXPECT_LE(runners.size(), 2u) << "only the pool's 2 workers may run tasks";
  for (const auto& id : callers) EXPECT_FALSE(runners.contains(id));
}

TEST(ThreadPoolTest, NestedParallelForFromAWorkerCompletesForBothModes) {
  for (auto callers : {ThreadPool::Callers::kHelp, ThreadPool::Callers::kWait}) {
    ThreadPool pool(1, callers);  // the only worker is busy in the outer task
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
