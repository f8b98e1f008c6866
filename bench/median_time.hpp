// The timing rule shared by `backplane bench` and the raw-Vulkan baseline
// (bench/vulkan_raw.cpp), so their numbers compare like for like. Standard
// library only: the baseline must not depend on Backplane.
#pragma once

#include <algorithm>
#include <chrono>
#include <vector>

namespace backplane::bench {

// One warm-up run (first touch of every buffer, pipeline creation), then
// batches of runs long enough (>= 1 ms) to time above clock resolution,
// until min_time seconds and at least 5 batches have passed. Returns the
// median of the batch means, in seconds per run.
template <class Run> double median_seconds(Run&& run, double min_time) {
  using clock = std::chrono::steady_clock;
  run();
  std::vector<double> times;
  const auto start = clock::now();
  int batch = 1;
  while (true) {
    const auto t0 = clock::now();
    for (int i = 0; i < batch; ++i) run();
    const double dt = std::chrono::duration<double>(clock::now() - t0).count();
    if (dt < 1e-3 && batch < (1 << 20)) {
      batch *= 10;
      continue;
    }
    times.push_back(dt / batch);
    if (std::chrono::duration<double>(clock::now() - start).count() > min_time && times.size() >= 5) break;
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace backplane::bench
