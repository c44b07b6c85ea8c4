// The CUDA memory backend: device memory another process on the node can map. Two implementations:
// cuda_region.cu (CUDA builds) and cuda_region_nocuda.cpp (without CUDA: every call is ENODEV).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/memory/memory_region.hpp"

namespace swiftkv {

enum class CudaAllocation : int32_t {
  automatic = 0,  // VMM when the device and driver support POSIX-fd shareable VMM, else malloc
  vmm = 1,        // cuMemCreate/cuMemMap granules; EUNSUPPORTED where VMM is unavailable
  malloc = 2,     // one cudaMalloc exported with cudaIpcGetMemHandle; fixed for the region's life
};

struct CudaRegionOptions {
  int32_t device = 0;
  uint64_t size = 0;  // bytes; rounded up to the VMM granule
  CudaAllocation allocation = CudaAllocation::automatic;
};

// Reserves the region's addresses; commits nothing under VMM (commit() maps granules), all of
// it under malloc. Throws Error: ENODEV, EUNSUPPORTED, ENOMEM, ECUDA.
std::shared_ptr<MemoryRegion> create_cuda_region(const CudaRegionOptions &o);

// True when `device` can back regions with POSIX-fd shareable VMM memory.
bool cuda_vmm_supported(int32_t device);

// The VMM allocation granule of `device` (EUNSUPPORTED without VMM).
uint64_t cuda_vmm_granule(int32_t device);

// Device memory for a library-made pool (the layer stream cache on a GPU): one address range per
// layer of regular_bytes + stream_bytes (each a whole number of granules). The first
// regular_bytes of a layer are its own memory; the last stream_bytes are one physical allocation
// mapped into every layer at the same offset, so a write through one layer's range shows in all.
class AliasedLayers {
 public:
  virtual ~AliasedLayers() = default;
  virtual std::byte *layer(uint32_t l) const noexcept = 0;
};
// Throws Error: ENODEV, EUNSUPPORTED (no VMM), ENOMEM, ECUDA, EINVAL (sizes not in granules).
std::unique_ptr<AliasedLayers> create_aliased_layers(int32_t device, uint32_t layers,
                                                     uint64_t regular_bytes, uint64_t stream_bytes);

}  // namespace swiftkv
