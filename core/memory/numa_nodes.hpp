// Which NUMA nodes host memory may be placed on. With libnuma (SWIFTKV_WITH_NUMA) the machine's
// configured nodes; without it the documented fallback: node 0 only, and no binding.
#pragma once

#include <cstdint>

namespace swiftkv {

struct NumaNodes {
  bool numa_supported;  // built with libnuma and the kernel supports NUMA
  int32_t max_node;     // highest configured node; 0 without NUMA support
};

NumaNodes numa_nodes() noexcept;

}  // namespace swiftkv
