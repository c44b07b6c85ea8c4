// The no-CUDA stand-in of the CUDA backend for builds without CUDA: there is no device to allocate
// on, which is SWIFTKV_ENODEV for every caller, as DESIGN.md asks of GPU-only calls.
#include "core/common/error.hpp"
#include "core/memory/cuda_region.hpp"
#include "core/memory/region_registry.hpp"

namespace swiftkv {

std::shared_ptr<MemoryRegion> create_cuda_region(const CudaRegionOptions &o) {
  fail(SWIFTKV_ENODEV, "device memory on CUDA device " + std::to_string(o.device) +
                           " needs a libswiftkv built with CUDA");
}

bool cuda_vmm_supported(int32_t) { return false; }

uint64_t cuda_vmm_granule(int32_t device) {
  fail(SWIFTKV_ENODEV,
       "CUDA device " + std::to_string(device) + " needs a libswiftkv built with CUDA");
}

std::unique_ptr<AliasedLayers> create_aliased_layers(int32_t device, uint32_t, uint64_t, uint64_t) {
  fail(SWIFTKV_ENODEV,
       "a pool on CUDA device " + std::to_string(device) + " needs a libswiftkv built with CUDA");
}

std::shared_ptr<RegionMapping> open_cuda_region(const RegionExport &, int32_t) {
  fail(SWIFTKV_ENODEV, "opening CUDA device memory needs a libswiftkv built with CUDA");
}

}  // namespace swiftkv
