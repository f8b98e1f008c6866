// place(): one device per runnable node (see lowering.hpp).
//
// The rule, in the order it is applied:
//  1. A pinned node runs on its pin (lower() already refused a pin that
//     cannot run it).
//  2. Every other node runs on the first device of the list that can run it.
//  3. A cheap node (anything but matmul, conv2d, selective_scan and vendor
//     ops) whose neighbours sit on another of its candidates moves there when
//     that strictly lowers the bytes crossing devices around it. Repeated
//     until nothing moves (a few passes at most).
//  4. A graph input lives where its first consumer runs.
#include <algorithm>

#include "lowering.hpp"

namespace backplane::detail {

namespace {

struct Edges {
  // Per node: (producer node or -1, bytes) for each input; consumer nodes.
  std::vector<std::vector<std::pair<int, uint64_t>>> in;
  std::vector<std::vector<int>> out;
};

Edges edges_of(const Lowered& l) {
  Edges e;
  e.in.resize(l.nodes.size());
  e.out.resize(l.nodes.size());
  for (size_t i = 0; i < l.nodes.size(); ++i)
    for (int v : l.nodes[i].inputs) {
      if (v < 0) continue;
      const int p = l.roots[l.values[v].root].producer;
      e.in[i].emplace_back(p, l.values[v].bytes());
      if (p >= 0 && (e.out[p].empty() || e.out[p].back() != static_cast<int>(i)))
        e.out[p].push_back(static_cast<int>(i));
    }
  return e;
}

}  // namespace

void place(Lowered& l) {
  const std::vector<Device*>& list = l.devices;
  auto dev = [&](int node) { return l.nodes[node].candidates[l.nodes[node].chosen].device; };
  for (auto& n : l.nodes) {
    n.chosen = 0;
    Device* d = n.candidates[0].device;
    if (n.pinned)
      n.reason = "pinned";
    else if (d == list.front())
      n.reason = "first device of the list";
    else
      n.reason = "first device of the list that runs it (" + list.front()->name() + " " +
                 n.first_refusal.substr(0, n.first_refusal.find("; it offers:")) + ")";
  }

  // Bytes crossing devices around node i if it ran on d.
  const Edges e = edges_of(l);
  auto cost = [&](size_t i, Device* d) {
    uint64_t bytes = 0;
    for (const auto& [p, b] : e.in[i])
      if (p >= 0 && dev(p) != d) bytes += b;
    std::vector<Device*> seen;
    const uint64_t out_bytes = l.values[l.nodes[i].output].bytes();
    for (int c : e.out[i]) {
      Device* cd = dev(c);
      if (cd != d && std::find(seen.begin(), seen.end(), cd) == seen.end()) {
        seen.push_back(cd);
        bytes += out_bytes;
      }
    }
    return bytes;
  };
  for (int pass = 0; pass < 4; ++pass) {
    bool moved = false;
    for (size_t i = 0; i < l.nodes.size(); ++i) {
      LNode& n = l.nodes[i];
      if (n.pinned || n.heavy || n.candidates.size() < 2) continue;
      const uint64_t before = cost(i, dev(static_cast<int>(i)));
      uint64_t best = before;
      int best_c = n.chosen;
      for (size_t c = 0; c < n.candidates.size(); ++c) {
        const uint64_t b = cost(i, n.candidates[c].device);
        if (b < best) {
          best = b;
          best_c = static_cast<int>(c);
        }
      }
      if (best_c != n.chosen) {
        n.reason = n.candidates[0].device->name() + " could run it; " + n.candidates[best_c].device->name() +
                   " keeps it beside its neighbours and moves " + std::to_string(before - best) +
                   " fewer bytes";
        n.chosen = best_c;
        moved = true;
      }
    }
    if (!moved) break;
  }

  for (auto& r : l.roots)
    if (r.producer >= 0) r.device = l.nodes[r.producer].candidates[l.nodes[r.producer].chosen].device;
  // Graph inputs and constants: where their first consumer runs.
  for (size_t i = 0; i < l.nodes.size(); ++i)
    for (int v : l.nodes[i].inputs) {
      if (v < 0) continue;
      LRoot& r = l.roots[l.values[v].root];
      if (r.producer < 0 && r.device == nullptr) r.device = dev(static_cast<int>(i));
    }
  for (auto& r : l.roots)
    if (r.device == nullptr) r.device = list.front();
}

}  // namespace backplane::detail
