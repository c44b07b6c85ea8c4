// The host twin of host_memory.hpp for builds without CUDA: nothing to page-lock for, no device
// to be near.
#include "core/memory/host_memory.hpp"

namespace swiftkv {

bool page_lock(void *, size_t) { return false; }
void page_unlock(void *) noexcept {}
int32_t device_numa_node(int32_t) noexcept { return -1; }

}  // namespace swiftkv
