// The no-CUDA stand-in of host_memory.hpp for builds without CUDA: nothing to page-lock for, no
// device to be near.
#include "core/memory/host_memory.hpp"

#include <cstring>

#include "core/common/error.hpp"

namespace swiftkv {

bool page_lock(void *, size_t) { return false; }
void page_unlock(void *) noexcept {}
int32_t device_numa_node(int32_t) noexcept { return -1; }

void copy_bytes(void *dst, int32_t dst_device, const void *src, int32_t src_device, size_t n) {
  if (dst_device >= 0 || src_device >= 0) {
    fail(SWIFTKV_ENODEV, "a copy to or from device memory needs a CUDA build");
  }
  if (n != 0) std::memcpy(dst, src, n);
}

}  // namespace swiftkv
