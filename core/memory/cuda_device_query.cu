// The CUDA twin of the device query: asks the runtime how many devices this process sees.
// The runtime is linked statically, so a machine without a driver loads the library and gets 0.
#include <cuda_runtime_api.h>

#include <string>

#include "core/common/error.hpp"
#include "core/memory/device_query.hpp"

namespace swiftkv {

uint32_t usable_cuda_devices() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  switch (err) {
    case cudaSuccess: return count > 0 ? static_cast<uint32_t>(count) : 0;
    // No driver, only the toolkit's stub driver, or no device (CUDA_VISIBLE_DEVICES may hide
    // them all): each means "no usable device", which is not an error here.
    case cudaErrorInsufficientDriver:
    case cudaErrorStubLibrary:
    case cudaErrorNoDevice:
      (void)cudaGetLastError();  // reset the runtime's last error so later checks start clean
      return 0;
    default:
      (void)cudaGetLastError();
      fail(SWIFTKV_ECUDA, std::string("cudaGetDeviceCount failed: ") + cudaGetErrorName(err) +
                              ": " + cudaGetErrorString(err));
  }
}

bool built_with_cuda() noexcept { return true; }

}  // namespace swiftkv
