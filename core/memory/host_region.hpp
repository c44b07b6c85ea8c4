// The host memory backend: regions of shared memory from a memfd, so that another process can
// map the same pages, placed on a NUMA node and page-locked for the GPU when one is in use.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/memory/memory_region.hpp"

namespace swiftkv {

struct HostRegionOptions {
  uint64_t size = 0;       // bytes; rounded up to whole pages
  int32_t numa_node = -1;  // bind the pages to this node; -1: the kernel's default policy.
                           // Without libnuma only -1 and 0 are accepted and nothing is bound.
  bool page_lock = false;  // cudaHostRegister the whole region when a device is usable; a locked
                           // region is committed whole and never decommits (see .cpp)
  std::string name = "swiftkv";  // shows in /proc/<pid>/fd and /proc/<pid>/maps
};

// Throws Error: EINVAL for a zero size, ENOMEM when the kernel refuses memory, ECUDA when
// page-locking fails.
std::shared_ptr<MemoryRegion> create_host_region(const HostRegionOptions &o);

// The NUMA node holding the page at `p` (which must be touched), or -1 when it cannot be told.
int32_t numa_node_of(const void *p) noexcept;

}  // namespace swiftkv
