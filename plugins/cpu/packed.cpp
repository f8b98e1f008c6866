// The store of packed constant inputs: see packed.hpp.
#include "packed.hpp"

#include <mutex>
#include <unordered_map>
#include <vector>

namespace backplane::cpu::packed {

std::atomic<bool> g_enabled{true};

namespace {

struct Entry {
  uint64_t offset;
  std::string key;
  std::shared_ptr<const void> obj;
};

// Never destroyed: a host that keeps its runtime in a static frees buffers
// after this library's static destructors would have run.
struct Store {
  std::mutex mu;
  std::unordered_map<uint64_t, std::vector<Entry>> by_buffer;
};
Store& store() {
  static Store* s = new Store();
  return *s;
}

}  // namespace

std::shared_ptr<const void> find(const Call& c, size_t i, const std::string& key) {
  Store& s = store();
  std::lock_guard<std::mutex> lk(s.mu);
  auto it = s.by_buffer.find(c.in[i].buffer_handle);
  if (it == s.by_buffer.end()) return nullptr;
  for (const Entry& e : it->second)
    if (e.offset == c.in[i].byte_offset && e.key == key) return e.obj;
  return nullptr;
}

std::shared_ptr<const void> keep(const Call& c, size_t i, const std::string& key, std::shared_ptr<const void> obj) {
  Store& s = store();
  {
    std::lock_guard<std::mutex> lk(s.mu);
    auto& list = s.by_buffer[c.in[i].buffer_handle];
    for (const Entry& e : list)
      if (e.offset == c.in[i].byte_offset && e.key == key) return e.obj;
    list.push_back({c.in[i].byte_offset, key, obj});
  }
  // Which packed form a kernel made says which path it takes (Winograd,
  // oneDNN): BACKPLANE_LOG=0 shows it, and the tests read it.
  if (const bp_host_api* h = c.host(); h && h->log) {
    const std::string m = std::string("cpu: ") + (c.op ? c.op : "?") + ": input " + std::to_string(i) + " kept packed as " + key;
    h->log(h->host_ctx, BP_LOG_DEBUG, bp_string{m.data(), m.size()});
  }
  return obj;
}

void drop(uint64_t handle) noexcept {
  std::vector<Entry> gone;  // destroyed outside the lock
  Store& s = store();
  {
    std::lock_guard<std::mutex> lk(s.mu);
    auto it = s.by_buffer.find(handle);
    if (it == s.by_buffer.end()) return;
    gone.swap(it->second);
    s.by_buffer.erase(it);
  }
}

void clear() noexcept {
  std::unordered_map<uint64_t, std::vector<Entry>> gone;
  Store& s = store();
  {
    std::lock_guard<std::mutex> lk(s.mu);
    gone.swap(s.by_buffer);
  }
}

size_t count() noexcept {
  Store& s = store();
  std::lock_guard<std::mutex> lk(s.mu);
  size_t n = 0;
  for (const auto& [h, list] : s.by_buffer) n += list.size();
  return n;
}

}  // namespace backplane::cpu::packed
