#include "thread_pool.hpp"

#include <sched.h>

#include <algorithm>
#include <atomic>

namespace backplane::detail {

namespace {
thread_local bool t_inside_pool = false;
}

unsigned available_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

ThreadPool::ThreadPool(unsigned threads) : threads_(std::max(1u, threads)) {
  for (unsigned i = 1; i < threads_; ++i) workers_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(m_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, void (*fn)(void*, int64_t, int64_t), void* user) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t max_chunks = (n + grain - 1) / grain;
  std::unique_lock<std::mutex> submit(submit_, std::defer_lock);
  if (threads_ == 1 || max_chunks < 2 || t_inside_pool || !submit.try_lock()) {
    fn(user, 0, n);
    return;
  }
  // Chunks: a few per thread so uneven work balances, never below `grain`.
  const int64_t chunks = std::min<int64_t>(max_chunks, static_cast<int64_t>(threads_) * 4);
  {
    std::lock_guard<std::mutex> lk(m_);
    fn_ = fn;
    user_ = user;
    n_ = n;
    chunks_ = chunks;
    next_chunk_ = 0;
    pending_ = chunks;
    ++generation_;
  }
  wake_.notify_all();
  // The caller works too.
  t_inside_pool = true;
  for (;;) {
    int64_t c;
    {
      std::lock_guard<std::mutex> lk(m_);
      if (next_chunk_ >= chunks_) break;
      c = next_chunk_++;
    }
    fn(user, c * n / chunks, (c + 1) * n / chunks);
    std::lock_guard<std::mutex> lk(m_);
    if (--pending_ == 0) done_.notify_all();
  }
  t_inside_pool = false;
  std::unique_lock<std::mutex> lk(m_);
  done_.wait(lk, [&] { return pending_ == 0; });
  fn_ = nullptr;
}

void ThreadPool::worker(unsigned) {
  t_inside_pool = true;
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lk(m_);
  for (;;) {
    wake_.wait(lk, [&] { return stop_ || (generation_ != seen && fn_ != nullptr && next_chunk_ < chunks_); });
    if (stop_) return;
    seen = generation_;
    while (fn_ != nullptr && next_chunk_ < chunks_) {
      const int64_t c = next_chunk_++;
      auto* fn = fn_;
      void* user = user_;
      const int64_t n = n_, chunks = chunks_;
      lk.unlock();
      fn(user, c * n / chunks, (c + 1) * n / chunks);
      lk.lock();
      if (--pending_ == 0) done_.notify_all();
    }
  }
}

}  // namespace backplane::detail
