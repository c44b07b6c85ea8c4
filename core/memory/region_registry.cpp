// The registry of live mappings and the backend dispatch of open_region(). One mutex guards the
// table; opening is rare (once per region per process), so the lock is never on a hot path.
#include "core/memory/region_registry.hpp"

#include <mutex>
#include <random>
#include <unordered_map>

#include "core/common/error.hpp"

namespace swiftkv {

namespace {

struct Registry {
  std::mutex mu;
  std::unordered_map<std::string, std::weak_ptr<RegionMapping>> live;  // guarded by mu

  void prune_locked() {
    for (auto it = live.begin(); it != live.end();) {
      it = it->second.expired() ? live.erase(it) : std::next(it);
    }
  }
};

Registry &registry() {
  static Registry *r = new Registry;  // never destroyed: mappings may outlive static teardown
  return *r;
}

}  // namespace

const char *memory_kind_name(MemoryKind kind) noexcept {
  switch (kind) {
    case MemoryKind::host_memfd: return "host memfd";
    case MemoryKind::cuda_vmm: return "CUDA VMM";
    case MemoryKind::cuda_ipc: return "CUDA cudaMalloc + IPC handle";
    case MemoryKind::host_granules: return "host memfd granules";
    case MemoryKind::host_private: return "private host memory";
  }
  return "unknown";
}

std::string random_region_identity(const char *prefix) {
  std::random_device rd;
  std::string id(prefix);
  for (int i = 0; i < 4; ++i) id += ":" + std::to_string(rd());
  return id;
}

void register_region(const std::string &identity, const std::shared_ptr<RegionMapping> &m) {
  Registry &r = registry();
  std::lock_guard lock(r.mu);
  r.prune_locked();
  r.live[identity] = m;
}

std::shared_ptr<RegionMapping> find_or_open_region(
    const std::string &identity, const std::function<std::shared_ptr<RegionMapping>()> &open) {
  Registry &r = registry();
  std::lock_guard lock(r.mu);
  if (auto it = r.live.find(identity); it != r.live.end()) {
    if (auto m = it->second.lock()) return m;
  }
  r.prune_locked();
  std::shared_ptr<RegionMapping> m = open();
  r.live[identity] = m;
  return m;
}

std::shared_ptr<RegionMapping> open_region(const RegionExport &e, int32_t device) {
  switch (e.kind) {
    case MemoryKind::host_memfd:
    case MemoryKind::host_granules: return open_host_region(e);
    case MemoryKind::cuda_vmm:
    case MemoryKind::cuda_ipc: return open_cuda_region(e, device);
    case MemoryKind::host_private: break;  // never exported: an export of one is forged
  }
  fail_invalid("region export has an unknown memory kind " +
               std::to_string(static_cast<int32_t>(e.kind)));
}

}  // namespace swiftkv
