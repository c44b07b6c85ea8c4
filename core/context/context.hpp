// The per-process context: the validated configuration and the devices it uses. Later pieces
// (models, pools, tiers) hang off it. Immutable after construction, so safe to read from any
// thread without a lock.
#pragma once

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

 private:
  ContextConfig config_;
  uint64_t device_mask_ = 0;
};

}  // namespace swiftkv
