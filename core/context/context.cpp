// Validation of a context's configuration against the machine: devices, NUMA node, disk
// directory and budgets. Nothing is allocated until everything has been checked.
#include "core/context/context.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>

#include "core/common/error.hpp"
#include "core/memory/device_query.hpp"
#include "core/memory/host_memory.hpp"
#include "core/memory/memory_limit.hpp"
#include "core/memory/numa_nodes.hpp"
#include "swiftkv/swiftkv.h"

namespace swiftkv {

namespace {

uint64_t resolve_devices(uint64_t mask) {
  if (mask == 0) return 0;
  const uint32_t usable = usable_cuda_devices();
  const uint64_t all = usable >= 64 ? UINT64_MAX : (uint64_t{1} << usable) - 1;
  if (mask == SWIFTKV_DEVICE_MASK_ALL) return all;
  const uint64_t missing = mask & ~all;
  if (missing != 0) {
    const int first = std::countr_zero(missing);
    fail(SWIFTKV_ENODEV, "config->device_mask names device " + std::to_string(first) +
                             " but this process can use " + std::to_string(usable) +
                             " CUDA device(s)" +
                             (built_with_cuda() ? "" : " (libswiftkv was built without CUDA)"));
  }
  return mask;
}

void check_numa_node(int32_t node) {
  if (node == SWIFTKV_NUMA_NODE_AUTO) return;
  if (node < 0) {
    fail_invalid("config->host_numa_node (" + std::to_string(node) +
                 ") is neither a node number nor SWIFTKV_NUMA_NODE_AUTO");
  }
  const NumaNodes nodes = numa_nodes();
  if (!nodes.numa_supported && node != 0) {
    fail(SWIFTKV_EUNSUPPORTED, "config->host_numa_node is " + std::to_string(node) +
                                   " but NUMA placement is unavailable (built without libnuma "
                                   "or kernel without NUMA); only 0 and AUTO are accepted");
  }
  if (node > nodes.max_node) {
    fail_invalid("config->host_numa_node is " + std::to_string(node) +
                 " but the highest NUMA node of this machine is " + std::to_string(nodes.max_node));
  }
}

void check_disk(const ContextConfig &c) {
  if (!c.disk_path) {
    if (c.disk_budget_bytes != 0) {
      fail_invalid("config->disk_budget_bytes is " + std::to_string(c.disk_budget_bytes) +
                   " but config->disk_path is NULL");
    }
    return;
  }
  const std::string &path = *c.disk_path;
  if (path.empty()) fail_invalid("config->disk_path is empty; use NULL for no disk tier");
  if (c.disk_budget_bytes == 0) {
    fail_invalid("config->disk_budget_bytes is 0 but config->disk_path is set");
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    fail_invalid("config->disk_path \"" + path + "\": " + std::strerror(errno));
  }
  if (!S_ISDIR(st.st_mode)) fail_invalid("config->disk_path \"" + path + "\" is not a directory");
  if (::access(path.c_str(), W_OK | X_OK) != 0) {
    fail_invalid("config->disk_path \"" + path + "\" is not writable: " + std::strerror(errno));
  }
}

// A host budget the process's memory cgroup cannot hold beside what it uses now would end in
// the kernel's OOM killer, not in a status: refused here, naming the limit.
void check_host_budget(uint64_t budget) {
  if (budget == 0) return;
  const std::optional<MemoryLimit> l = memory_limit();
  if (!l || budget <= l->left()) return;
  const auto mib = [](uint64_t b) { return std::to_string(b >> 20) + " MiB"; };
  fail(SWIFTKV_ENOMEM, "config->host_budget_bytes (" + mib(budget) +
                           ") does not fit in this process's memory limit: cgroup " + l->cgroup +
                           " allows " + mib(l->limit) + " and uses " + mib(l->in_use) +
                           " already, leaving " + mib(l->left()));
}

}  // namespace

Context::Context(ContextConfig config) : config_(std::move(config)) {
  check_numa_node(config_.host_numa_node);
  check_disk(config_);
  check_host_budget(config_.host_budget_bytes);
  device_mask_ = resolve_devices(config_.device_mask);
}

uint32_t Context::device_count() const noexcept {
  return static_cast<uint32_t>(std::popcount(device_mask_));
}

bool Context::uses_device(int32_t device) const noexcept {
  return device >= 0 && device < 64 && (device_mask_ >> device & 1) != 0;
}

int32_t Context::host_numa_node() const noexcept {
  if (config_.host_numa_node != SWIFTKV_NUMA_NODE_AUTO) return config_.host_numa_node;
  if (device_mask_ == 0) return -1;
  return device_numa_node(std::countr_zero(device_mask_));
}

void Context::reserve_host(uint64_t bytes, const std::string &what) {
  uint64_t used = host_reserved_.load(std::memory_order_relaxed);
  do {
    if (bytes > config_.host_budget_bytes || used > config_.host_budget_bytes - bytes) {
      fail(SWIFTKV_ENOMEM, what + " needs " + std::to_string(bytes) +
                               " bytes of host memory but the context's host_budget_bytes (" +
                               std::to_string(config_.host_budget_bytes) + ") has " +
                               std::to_string(config_.host_budget_bytes - used) + " left");
    }
  } while (!host_reserved_.compare_exchange_weak(used, used + bytes, std::memory_order_relaxed));
}

void Context::release_host(uint64_t bytes) noexcept {
  host_reserved_.fetch_sub(bytes, std::memory_order_relaxed);
}

}  // namespace swiftkv
