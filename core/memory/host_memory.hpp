// What host memory needs from CUDA: page-locking a range for DMA and the NUMA node nearest a
// device. Two implementations: cuda_host_memory.cu (CUDA builds) and host_memory_nocuda.cpp
// (without CUDA).
#pragma once

#include <cstddef>
#include <cstdint>

namespace swiftkv {

// Page-locks [p, p + size) for the GPU when this process can use a device; false (and nothing
// done) when it cannot. Throws Error(SWIFTKV_ECUDA) when the driver refuses.
bool page_lock(void *p, size_t size);
void page_unlock(void *p) noexcept;

// Copies n bytes between any two places this process can address: host memory (device -1) or
// memory of CUDA device `device`. Synchronous: it returns once the bytes are at dst (a
// cudaMemcpy, so it waits for the legacy default stream). Without CUDA only host to host works;
// a device is ENODEV. Throws Error(ECUDA) when the copy fails.
void copy_bytes(void *dst, int32_t dst_device, const void *src, int32_t src_device, size_t n);

// The host NUMA node closest to CUDA device `device`, or -1 when unknown or without CUDA.
int32_t device_numa_node(int32_t device) noexcept;

}  // namespace swiftkv
