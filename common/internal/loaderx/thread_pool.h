// ThreadPool: a fixed set of worker threads for the gather pool, the store
// writer's compressors and the loader pipeline.
//
// Two ways in:
//  * Submit(fn): fire-and-forget task; runs on some worker.
//  * ParallelFor(n, fn): runs fn(0..n-1) across the workers *and the calling
//    thread*, returning when all calls finished. Safe to call from inside a
//    worker (the caller helps, so nested use cannot deadlock).
//
// Thread-safety: all methods may be called from any thread. The destructor
// drains queued tasks and joins the workers; no task may be submitted after it
// started.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace loaderx {

class ThreadPool {
 public:
  // threads == 0 means std::thread::hardware_concurrency().
  explicit ThreadPool(size_t threads);
  // As above; every worker calls `on_start` once before taking tasks (e.g.
  // to set its own scheduling priority).
  ThreadPool(size_t threads, const std::function<void()>& on_start);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  size_t size() const { return workers_.size(); }
  void Submit(std::function<void()> fn);
  // Calls fn(i) for i in [0, n); blocks until all return. Exceptions must not
  // escape fn (engine code reports through Status).
  void ParallelFor(size_t n, const std::function<void(size_t)>& fn);

  // A process-wide pool sized to the machine, created on first use.
  static ThreadPool& Default();

 private:
  void WorkerLoop();
  bool RunOne(std::unique_lock<std::mutex>& lock);

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;  // guarded by mu_
  bool stopping_ = false;                    // guarded by mu_
  std::vector<std::thread> workers_;
};

}  // namespace loaderx
