#include "thread_pool.hpp"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace backplane::detail {

namespace {

thread_local bool t_inside_pool = false;

constexpr int kPauseSpins = 2048;

constexpr uint64_t kChunkMask = 0xffffffffu;
inline uint64_t gen_of(uint64_t s) { return s >> 32; }

}  // namespace

std::chrono::microseconds spin_time() {
  static const std::chrono::microseconds t = [] {
    const char* e = std::getenv("BACKPLANE_SPIN_US");
    if (!e || !*e) return std::chrono::microseconds(200);
    char* end = nullptr;
    const long v = std::strtol(e, &end, 10);
    return std::chrono::microseconds(end && *end == 0 && v >= 0 && v <= 1000000 ? v : 200);
  }();
  return t;
}

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

unsigned available_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

ThreadPool::ThreadPool(unsigned threads) : threads_(std::max(1u, threads)) {
  for (unsigned i = 1; i < threads_; ++i) workers_.emplace_back([this] { worker(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(m_);
    stop_.store(true);
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run_chunks(uint64_t gen) {
  uint64_t s = state_.load(std::memory_order_acquire);
  for (;;) {
    if (gen_of(s) != gen) return;
    // The job's fields, read before the claim. A successful claim proves the
    // word was still `s` (this generation, open): the caller closes the word
    // before it writes the next job's fields, so these were this job's.
    auto* fn = fn_.load(std::memory_order_relaxed);
    void* user = user_.load(std::memory_order_relaxed);
    const int64_t n = n_.load(std::memory_order_relaxed), chunks = chunks_.load(std::memory_order_relaxed);
    const auto c = static_cast<int64_t>(s & kChunkMask);
    if (c >= chunks) return;
    if (!state_.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
    fn(user, c * n / chunks, (c + 1) * n / chunks);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
    s = state_.load(std::memory_order_acquire);
  }
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
  // Close the word first (a new generation whose next chunk is past any
  // job's end), so a worker still holding the previous generation's word
  // cannot claim a chunk while the fields change; then write the fields;
  // then open the next generation at chunk 0.
  const uint64_t gen = gen_of(state_.load(std::memory_order_relaxed)) + 2;
  state_.store(((gen - 1) << 32) | kChunkMask, std::memory_order_seq_cst);
  fn_.store(fn, std::memory_order_relaxed);
  user_.store(user, std::memory_order_relaxed);
  n_.store(n, std::memory_order_relaxed);
  chunks_.store(chunks, std::memory_order_relaxed);
  pending_.store(chunks, std::memory_order_relaxed);
  state_.store(gen << 32, std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) > 0) {
    std::lock_guard<std::mutex> lk(m_);
    wake_.notify_all();
  }
  // The caller works too, then waits for the chunks others took.
  t_inside_pool = true;
  run_chunks(gen);
  t_inside_pool = false;
  for (int spins = 0; pending_.load(std::memory_order_acquire) != 0; ++spins) {
    if (spins < kPauseSpins)
      cpu_relax();
    else
      std::this_thread::yield();
  }
}

void ThreadPool::worker() {
  t_inside_pool = true;
  uint64_t seen = gen_of(state_.load(std::memory_order_acquire));
  for (;;) {
    // Spin a while for the next job...
    const auto spin = spin_time();
    const auto until = std::chrono::steady_clock::now() + spin;
    uint64_t gen = seen;
    for (int i = 0; spin.count() > 0; ++i) {
      gen = gen_of(state_.load(std::memory_order_acquire));
      if (gen != seen || stop_.load(std::memory_order_relaxed)) break;
      // Pause first (the next kernel usually comes within microseconds),
      // then yield, so a busy machine's other threads are not starved.
      if (i < kPauseSpins)
        cpu_relax();
      else
        std::this_thread::yield();
      if ((i & 63) == 63 && std::chrono::steady_clock::now() > until) break;
    }
    // ...then sleep until one comes.
    if (gen == seen) {
      std::unique_lock<std::mutex> lk(m_);
      sleepers_.fetch_add(1, std::memory_order_seq_cst);
      wake_.wait(lk, [&] {
        return stop_.load() || gen_of(state_.load(std::memory_order_seq_cst)) != seen;
      });
      sleepers_.fetch_sub(1, std::memory_order_seq_cst);
      gen = gen_of(state_.load(std::memory_order_acquire));
    }
    if (stop_.load()) return;
    seen = gen;
    run_chunks(gen);
  }
}

}  // namespace backplane::detail
