#include "loaderx/thread_pool.h"

#include <atomic>
#include <memory>

namespace loaderx {

ThreadPool::ThreadPool(size_t threads) : ThreadPool(threads, nullptr) {}

ThreadPool::ThreadPool(size_t threads, const std::function<void()>& on_start) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  workers_.reserve(threads);
  for (size_t i = 0; i < threads; ++i) {
    workers_.emplace_back([this, on_start] {
      if (on_start) on_start();
      WorkerLoop();
    });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::Submit(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(fn));
  }
  cv_.notify_one();
}

bool ThreadPool::RunOne(std::unique_lock<std::mutex>& lock) {
  if (queue_.empty()) return false;
  auto fn = std::move(queue_.front());
  queue_.pop_front();
  lock.unlock();
  fn();
  lock.lock();
  return true;
}

void ThreadPool::WorkerLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (!RunOne(lock) && stopping_) return;
  }
}

void ThreadPool::ParallelFor(size_t n, const std::function<void(size_t)>& fn) {
  if (n == 0) return;
  if (n == 1 || workers_.empty()) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  // Helpers that start after the caller finished its share do nothing, so the
  // caller waits only for helpers that actually started: no deadlock when
  // every worker is itself inside a ParallelFor.
  struct State {
    std::atomic<size_t> next{0};  // claims indices; relaxed: fn's effects are
                                  // published by the mutex below
    std::mutex mu;
    std::condition_variable cv;
    size_t active = 0;    // guarded by mu
    bool closed = false;  // guarded by mu
  };
  auto st = std::make_shared<State>();
  const std::function<void(size_t)>* fnp = &fn;
  auto body = [st, n, fnp] {
    for (size_t i; (i = st->next.fetch_add(1, std::memory_order_relaxed)) < n;) (*fnp)(i);
  };
  const size_t helpers = std::min(n - 1, workers_.size());
  for (size_t h = 0; h < helpers; ++h) {
    Submit([st, body] {
      {
        std::lock_guard<std::mutex> lock(st->mu);
        if (st->closed) return;  // fn may be gone: never touch it
        ++st->active;
      }
      body();
      {
        std::lock_guard<std::mutex> lock(st->mu);
        --st->active;
      }
      st->cv.notify_all();
    });
  }
  body();
  std::unique_lock<std::mutex> lock(st->mu);
  st->closed = true;
  st->cv.wait(lock, [&] { return st->active == 0; });
}

ThreadPool& ThreadPool::Default() {
  static ThreadPool pool(0);
  return pool;
}

}  // namespace loaderx
