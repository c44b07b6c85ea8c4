// The CUDA executor's twin in builds without CUDA: a device pool cannot exist there, so nothing
// reaches it but a caller's mistake, which is ENODEV.
#include "core/common/error.hpp"
#include "core/transfer/cuda_transfer.hpp"

namespace swiftkv {

std::unique_ptr<DeviceTransfer> DeviceTransfer::create(int32_t device, uint32_t, uint64_t,
                                                       const std::vector<StagedSegment> &,
                                                       const std::vector<uint32_t> &,
                                                       const std::vector<StagedSegment> &,
                                                       const std::vector<uint32_t> &) {
  fail(SWIFTKV_ENODEV, "transfers to CUDA device " + std::to_string(device) +
                           " need a libswiftkv built with CUDA");
}

}  // namespace swiftkv
