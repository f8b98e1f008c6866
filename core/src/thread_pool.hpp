// The host's thread pool behind bp_host_api::parallel_for. One pool per
// Runtime, shared by every plugin, so plugins do not each spawn a thread per
// core.
//
// A plan calls parallel_for many times in quick succession (each kernel,
// often several times), so waking sleeping workers through the kernel each
// time (a futex wake costs tens of microseconds on a small VM, more than a
// whole 128K-element add) would dominate. Workers therefore spin briefly
// after a job, watching for the next one, and only then sleep; the caller
// signals the condition variable only when a worker sleeps. Chunks are
// claimed lock-free: one atomic word holds the job's generation and the next
// chunk, so a worker can never run a chunk of one job with another's fields.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
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
  void worker();
  // Claims and runs chunks of job `gen` until none is left or the job changed.
  void run_chunks(uint64_t gen);

  unsigned threads_;
  std::vector<std::thread> workers_;
  std::mutex submit_;  // one parallel_for at a time on the pool
  // The current job: generation in the high 32 bits, next chunk in the low.
  std::atomic<uint64_t> state_{0};
  std::atomic<void (*)(void*, int64_t, int64_t)> fn_{nullptr};
  std::atomic<void*> user_{nullptr};
  std::atomic<int64_t> n_{0}, chunks_{0};
  std::atomic<int64_t> pending_{0};  // chunks not yet finished
  // Sleeping workers wait here; the caller notifies only when sleepers_ > 0.
  std::mutex m_;
  std::condition_variable wake_;
  std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};
};

// The number of cores this process may use (sched affinity).
unsigned available_cores();

// How long a waiting thread (a pool worker, a plan's submission thread, a
// Completion's waiter) watches for work before it sleeps: longer than the
// gap between two kernels of a plan, short enough not to burn a core while
// the application does something else. BACKPLANE_SPIN_US overrides it (0:
// sleep at once).
std::chrono::microseconds spin_time();
// One pause of a spin-wait loop.
void cpu_relax();

// Watches `ready` for spin_time(), pausing between looks; true as soon as it
// holds, false when the time is up (the caller then sleeps on its own
// condition variable).
template <class Ready> bool spin_until(Ready ready, bool yielding = false) {
  if (ready()) return true;
  const auto until = std::chrono::steady_clock::now() + spin_time();
  while (std::chrono::steady_clock::now() < until) {
    for (int i = 0; i < 64; ++i) {
      if (ready()) return true;
      cpu_relax();
    }
    // A waiter whose answer comes from threads of their own (a submitted
    // run, a device in another process) gives its CPU to them when there
    // are more runnable threads than cores.
    if (yielding) std::this_thread::yield();
  }
  return ready();
}

}  // namespace backplane::detail
