// The NUMA node query behind host-memory placement. libnuma when the build has it; otherwise one
// node, 0, because memory then comes from wherever the kernel's default policy puts it.
#include "core/memory/numa_nodes.hpp"

#if defined(SWIFTKV_HAVE_NUMA)
#include <numa.h>
#endif

namespace swiftkv {

NumaNodes numa_nodes() noexcept {
#if defined(SWIFTKV_HAVE_NUMA)
  if (numa_available() >= 0) return NumaNodes{true, static_cast<int32_t>(numa_max_node())};
#endif
  return NumaNodes{false, 0};
}

}  // namespace swiftkv
