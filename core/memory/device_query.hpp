// How many CUDA devices this process can use. Two implementations provide it: cuda_device_query.cu
// (CUDA builds) and device_query_nocuda.cpp (builds without CUDA, always 0).
#pragma once

#include <cstdint>

namespace swiftkv {

// 0 without a driver or a device; throws Error(SWIFTKV_ECUDA) when the driver is there and fails.
uint32_t usable_cuda_devices();

// True when this build can use CUDA at all.
bool built_with_cuda() noexcept;

}  // namespace swiftkv
