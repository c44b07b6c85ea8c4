// The per-process context: the validated configuration, the devices it uses and the host
// memory budget. The configuration is immutable after construction; the budget is one atomic
// counter. Both are safe from any thread without a lock.
#pragma once

#include "core/common/defaults.hpp"

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>

namespace swiftkv {

// The context's configuration in C++ terms, defaults applied (see swiftkv_ctx_config).
struct ContextConfig {
  uint64_t device_mask = 0;  // as given; SWIFTKV_DEVICE_MASK_ALL allowed
  uint64_t host_budget_bytes = 0;
  int32_t host_numa_node = -1;  // SWIFTKV_NUMA_NODE_AUTO
  std::optional<std::string> disk_path;
  uint64_t disk_budget_bytes = 0;
  uint64_t disk_segment_bytes = 0;  // 0: the disk tier's default
  // Group commit period; 0: at seal and close only.
  uint64_t disk_sync_ns = defaults::ns_of_ms(defaults::kCtx.disk_sync_ms);
};

class Context {
 public:
  // Validates `config` against this machine; throws Error (EINVAL, ENODEV, EUNSUPPORTED) naming
  // the field otherwise.
  explicit Context(ContextConfig config);

  const ContextConfig &config() const noexcept { return config_; }
  // The devices in use: the mask resolved against the usable devices.
  uint64_t effective_device_mask() const noexcept { return device_mask_; }
  uint32_t device_count() const noexcept;
  // True when `device` is one of the context's devices.
  bool uses_device(int32_t device) const noexcept;

  // The NUMA node host memory goes to: the configured node, or with AUTO the node of the first
  // device in use, or -1 (no binding).
  int32_t host_numa_node() const noexcept;

  // Takes `bytes` from host_budget_bytes for `what`; ENOMEM (nothing taken) when it would
  // exceed the budget. Every successful reserve is matched by one release of the same bytes.
  void reserve_host(uint64_t bytes, const std::string &what);
  void release_host(uint64_t bytes) noexcept;
  // Host bytes reserved now, by every user of the budget.
  uint64_t host_reserved() const noexcept { return host_reserved_.load(std::memory_order_relaxed); }

 private:
  ContextConfig config_;
  uint64_t device_mask_ = 0;
  std::atomic<uint64_t> host_reserved_{0};
};

}  // namespace swiftkv
