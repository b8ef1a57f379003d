// ThreadPool: a fixed set of worker threads for the gather pool, the store
// writer's compressors and the loader pipeline.
//
// Two ways in:
//  * Submit(fn): fire-and-forget task; runs on some worker.
//  * ParallelFor(n, fn): runs fn(0..n-1) across the workers *and the calling
//    thread*, returning when all calls finished. Safe to call from inside a
//    worker (the caller helps, so nested use cannot deadlock).
//
// A pool made with Callers::kWait runs ParallelFor calls of threads that are
// not its workers on the workers alone: the caller only waits. Then at most
// size() threads run fn however many threads call in, so the pool's size is
// an exact CPU budget (the loader's producer threads gather through such a
// pool: num_threads is the number of gather threads). Calls from its own
// workers still help, so nesting cannot deadlock. REQUIRES for kWait: no task
// of the pool blocks waiting for another thread (a caller's work could wait
// behind it forever).
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
  // Whether a ParallelFor caller that is not a worker runs tasks itself.
  enum class Callers { kHelp, kWait };

  // threads == 0 means std::thread::hardware_concurrency().
  explicit ThreadPool(size_t threads, Callers callers = Callers::kHelp);
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
  // ParallelFor of a waiting (non-worker) caller of a kWait pool.
  void ParallelForOnWorkers(size_t n, const std::function<void(size_t)>& fn);

  const Callers callers_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;  // guarded by mu_
  bool stopping_ = false;                     // guarded by mu_
  std::vector<std::thread> workers_;
};

}  // namespace loaderx
