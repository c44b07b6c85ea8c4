// Shared by the CUDA sources: runtime errors as library errors, and a guard that makes a
// device current for a scope and gives the caller's back.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "core/common/error.hpp"
#include "core/memory/device_query.hpp"

namespace swiftkv {

inline void check_cuda(cudaError_t err, const std::string &what) {
  if (err == cudaSuccess) return;
  (void)cudaGetLastError();
  fail(err == cudaErrorMemoryAllocation ? SWIFTKV_ENOMEM : SWIFTKV_ECUDA,
       what + " failed: " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
}

// Makes `device` current for the guard's scope, then restores the caller's device: the library
// never leaves a thread on another device than it found. Since CUDA 12 cudaSetDevice also
// initialises the device's primary context, so no cudaFree(nullptr) is needed, and the guard is
// allowed inside a CUDA graph capture.
class DeviceGuard {
 public:
  explicit DeviceGuard(int32_t device) {
    check_cuda(cudaGetDevice(&prev_), "cudaGetDevice");
    check_cuda(cudaSetDevice(device), "cudaSetDevice(" + std::to_string(device) + ")");
  }
  DeviceGuard(const DeviceGuard &) = delete;
  DeviceGuard &operator=(const DeviceGuard &) = delete;
  ~DeviceGuard() {
    if (cudaSetDevice(prev_) != cudaSuccess) (void)cudaGetLastError();
  }

 private:
  int prev_ = 0;
};

inline void check_device(int32_t device) {
  const uint32_t n = usable_cuda_devices();
  if (device < 0 || static_cast<uint32_t>(device) >= n) {
    fail(SWIFTKV_ENODEV, "CUDA device " + std::to_string(device) +
                             " is not usable; this process "
                             "can use " +
                             std::to_string(n) + " device(s)");
  }
}

}  // namespace swiftkv
