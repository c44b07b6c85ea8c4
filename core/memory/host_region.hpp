// The host memory backend: regions of shared memory from a memfd, so that another process can
// map the same pages (or private memory, for what only this process reads), placed on a NUMA
// node and page-locked for the GPU when one is in use.
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
  // 0: one memfd for the whole region (MemoryKind::host_memfd), exported whole. Else one memfd
  // per granule of this many bytes, a multiple of the page size (MemoryKind::host_granules):
  // committed, page-locked and exported granule by granule, as VMM device memory is, so that an
  // importer maps only the granules it is given and a decommitted granule lives on only in the
  // mappings of importers that still hold it.
  uint64_t granule = 0;
  // Ask for transparent huge pages (MADV_HUGEPAGE on the whole-file mapping; not with granules):
  // shared memory gets them where /sys/kernel/mm/transparent_hugepage/shmem_enabled is
  // "advise" (or "within_size", "always"), and 4 KiB pages otherwise. For memory read at random
  // in small pieces (a host tier of small chunks); importers map it as they map any.
  bool huge_pages = false;
  // false: private anonymous memory that only this process maps (MemoryKind::host_private), for
  // memory nobody else reads (a host tier's slabs). export_range fails with EINVAL, a fork's
  // child does not inherit the pages (MADV_DONTFORK: no copy-on-write of what the parent writes
  // while the child lives), and huge pages come where transparent_hugepage/enabled is "always"
  // or "madvise" (Debian's default), not under shmem_enabled. Not with a granule.
  bool shared = true;
};

// Throws Error: EINVAL for a zero size, a granule that is not a multiple of the page size or a
// granule of a private region, ENOMEM when the kernel refuses memory, ECUDA when page-locking
// fails.
std::shared_ptr<MemoryRegion> create_host_region(const HostRegionOptions &o);

// Allocates bytes [file_offset, file_offset + bytes) of the memfd `fd`, which is mapped shared
// at `at` (page-aligned), and maps them into this process's page tables, so that the first
// access to each page takes no fault (a fresh 64 MiB is 16384 faults, each zeroing its page,
// several times the cost of copying into it). Large ranges are made on several threads where
// that cannot move pages off their node: `numa_node` >= 0 (a binding decides) or one node online.
// Throws Error(ENOMEM) when the kernel refuses memory, with nothing of the range left allocated.
// Kernels before 5.14 (no MADV_POPULATE_WRITE): fallocate, and pages fault in on first touch.
void populate_memfd(int fd, uint64_t file_offset, std::byte *at, uint64_t bytes, int32_t numa_node);

// The NUMA node holding the page at `p` (which must be touched), or -1 when it cannot be told.
int32_t numa_node_of(const void *p) noexcept;

}  // namespace swiftkv
