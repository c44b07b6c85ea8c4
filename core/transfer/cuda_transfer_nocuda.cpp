// The no-CUDA stand-in of the CUDA executor: a device pool cannot exist there, so nothing
// reaches it but a caller's mistake, which is ENODEV.
#include <string>

#include "core/common/error.hpp"
#include "core/transfer/cuda_transfer.hpp"

namespace swiftkv {

class DeviceLanes {};

namespace {

[[noreturn]] void no_cuda(const std::string &device) {
  fail(SWIFTKV_ENODEV, "transfers to " + device + " need a libswiftkv built with CUDA");
}

}  // namespace

std::shared_ptr<DeviceLanes> make_device_lanes(int32_t device) {
  no_cuda("CUDA device " + std::to_string(device));
}

bool reads_in_place(DeviceLanes &, int32_t) { return false; }

PinnedBuffer::~PinnedBuffer() = default;

PinnedBuffer take_pinned(const std::shared_ptr<DeviceLanes> &, uint64_t) {
  no_cuda("a CUDA device");
}

void refuse_capture(void *, const char *) {}

void launch_copy_items(int32_t device, const CopyItem *, uint32_t, const ChunkSource *, uint64_t,
                       std::byte *, std::byte *, bool, void *, CopyKernel) {
  no_cuda("CUDA device " + std::to_string(device));
}

void launch_decode_items(int32_t device, const CopyItem *, uint32_t, const ChunkSource *,
                         const std::byte *, std::byte *, const codec::LayerShape &, void *,
                         CopyKernel) {
  no_cuda("CUDA device " + std::to_string(device));
}

std::unique_ptr<DeviceTransfer> DeviceTransfer::create(const std::shared_ptr<DeviceLanes> &,
                                                       uint32_t, uint64_t, DeviceSide, DeviceSide) {
  no_cuda("a CUDA device");
}

}  // namespace swiftkv
