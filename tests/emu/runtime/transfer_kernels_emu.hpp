// What core/transfer/cuda_transfer.cu, built with SWIFTKV_TRANSFER_EMULATION against the
// emulated runtime (cuda_runtime_api.h here), launches instead of the kernels: the same kernels'
// source run in the CPU emulation of the execution model (tests/emu/emu_kernels.hpp), each
// launch as one piece of its stream's work, one launch at a time.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/codec/layer_decode.hpp"
#include "core/transfer/copy_items.hpp"

namespace swiftkv {

namespace kernels {
// Named where cuda_transfer.cu asks the runtime for the kernel's occupancy; never run.
inline void copy_items_ahead() {}
}  // namespace kernels

namespace transfer_emulation {

void launch_copy(bool ahead, unsigned grid, const CopyItem *items, uint32_t n,
                 const ChunkSource *chunks, uint64_t layer_offset, unsigned char *staging,
                 unsigned char *pages, bool scatter, cudaStream_t s);
void launch_decode(bool ahead, unsigned grid, const CopyItem *items, uint32_t n,
                   const ChunkSource *chunks, const unsigned char *staging, unsigned char *pages,
                   const codec::LayerShape &shape, cudaStream_t s);

}  // namespace transfer_emulation
}  // namespace swiftkv
