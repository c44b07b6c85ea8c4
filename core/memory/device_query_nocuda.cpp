// The no-CUDA stand-in of the device query, for builds without CUDA: there is never a usable
// device.
#include "core/memory/device_query.hpp"

namespace swiftkv {

uint32_t usable_cuda_devices() { return 0; }

bool built_with_cuda() noexcept { return false; }

}  // namespace swiftkv
