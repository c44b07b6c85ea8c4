// What host memory needs from CUDA: page-locking a range for DMA and the NUMA node nearest a
// device. Two twins: cuda_host_memory.cu (CUDA builds) and host_memory_host.cpp (without CUDA).
#pragma once

#include <cstddef>
#include <cstdint>

namespace swiftkv {

// Page-locks [p, p + size) for the GPU when this process can use a device; false (and nothing
// done) when it cannot. Throws Error(SWIFTKV_ECUDA) when the driver refuses.
bool page_lock(void *p, size_t size);
void page_unlock(void *p) noexcept;

// The host NUMA node closest to CUDA device `device`, or -1 when unknown or without CUDA.
int32_t device_numa_node(int32_t device) noexcept;

}  // namespace swiftkv
