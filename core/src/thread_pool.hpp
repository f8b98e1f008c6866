// The host's thread pool behind bp_host_api::parallel_for. One pool per
// Runtime, shared by every plugin, so plugins do not each spawn a thread per
// core.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace backplane::detail {

class ThreadPool {
 public:
  explicit ThreadPool(unsigned threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  unsigned size() const { return threads_; }
  // Runs fn(user, begin, end) over [0, n) in chunks of at least `grain`.
  // Nested calls and calls while another thread holds the pool run serially.
  void parallel_for(int64_t n, int64_t grain, void (*fn)(void*, int64_t, int64_t), void* user);

 private:
  void worker(unsigned index);

  unsigned threads_;
  std::vector<std::thread> workers_;
  std::mutex submit_;  // one parallel_for at a time on the pool
  std::mutex m_;
  std::condition_variable wake_, done_;
  uint64_t generation_ = 0;
  bool stop_ = false;
  // The current job.
  void (*fn_)(void*, int64_t, int64_t) = nullptr;
  void* user_ = nullptr;
  int64_t n_ = 0, chunks_ = 0;
  int64_t next_chunk_ = 0;
  int64_t pending_ = 0;
};

// The number of cores this process may use (sched affinity).
unsigned available_cores();

}  // namespace backplane::detail
