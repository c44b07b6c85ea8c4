// The CUDA twin of host_memory.hpp: cudaHostRegister for DMA-ready host pages, and the device's
// host NUMA node from the runtime.
#include <cuda_runtime_api.h>

#include <cstring>
#include <string>

#include "core/common/error.hpp"
#include "core/memory/device_query.hpp"
#include "core/memory/host_memory.hpp"

namespace swiftkv {

bool page_lock(void *p, size_t size) {
  if (usable_cuda_devices() == 0) return false;
  // Portable: every context in the process may DMA from it, not only the current device's.
  const cudaError_t err = cudaHostRegister(p, size, cudaHostRegisterPortable);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    fail(SWIFTKV_ECUDA, std::string("cudaHostRegister of ") + std::to_string(size) +
                            " bytes failed: " + cudaGetErrorName(err) + ": " +
                            cudaGetErrorString(err));
  }
  return true;
}

void page_unlock(void *p) noexcept {
  if (cudaHostUnregister(p) != cudaSuccess) (void)cudaGetLastError();
}

int32_t device_numa_node(int32_t device) noexcept {
  int node = -1;
  if (cudaDeviceGetAttribute(&node, cudaDevAttrHostNumaId, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  return node;
}

void copy_bytes(void *dst, int32_t dst_device, const void *src, int32_t src_device, size_t n) {
  if (n == 0) return;
  if (dst_device < 0 && src_device < 0) {
    std::memcpy(dst, src, n);
    return;
  }
  // Unified addressing tells the runtime where each side lives. cudaMemcpy synchronises with the
  // legacy default stream: the bytes are at dst when it returns.
  const cudaError_t err = cudaMemcpy(dst, src, n, cudaMemcpyDefault);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    fail(SWIFTKV_ECUDA, std::string("cudaMemcpy of ") + std::to_string(n) + " bytes failed: " +
                            cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
  }
}

}  // namespace swiftkv
