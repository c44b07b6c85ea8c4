// The project's CUDA kernels launched in the CPU emulation (cuda_emu.hpp), with the same
// template dispatch as their launchers (core/attention/cuda_attention.cu,
// core/transfer/cuda_transfer.cu), for the tests that compare them with the CPU twins.
//
// The emulated kernels are compiled inside an unnamed namespace (emu_kernels.cpp), so that
// nothing of theirs meets the library's own symbols of the same names (the CUDA objects' host
// stubs, the host side's inline functions) at link time. So this interface passes the kernels'
// plain parameter structs (kernels/attention_work.h, core/transfer/copy_items.hpp,
// core/codec/layer_decode.hpp) as bytes, with their sizes checked on both sides.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kernel_emulation {

// How threads interleave (cuda_emu.hpp takes it as it is): the seed of the order fibers run in,
// warps released one at a time (greedy) or together, cp.async landing when issued or at its wait.
struct Schedule {
  uint64_t seed = 1;
  bool greedy_warps = false;
  bool copies_land_at_issue = false;
};

// The fa2 kernel's work items, then the merges, of `params` (a swiftkv::AttentionParams,
// params_size bytes, 16-byte aligned tensors), as attention_run_cuda launches them; `schedule`
// says how threads interleave. Returns the blocks launched.
uint64_t run_attention(bool bf16, int head_dim, const void *params, size_t params_size,
                       const Schedule &schedule);

// copy_items and decode_items (copy_items_ahead and decode_items_ahead when `ahead`) over `grid`
// blocks of the transfer engine's block size. items: swiftkv::CopyItem[n], chunks:
// swiftkv::ChunkSource[], shape: a swiftkv::codec::LayerShape.
void run_copy_items(unsigned grid, const void *items, uint32_t n, const void *chunks,
                    uint64_t layer_offset, unsigned char *staging, unsigned char *pages,
                    bool scatter, bool ahead, const Schedule &schedule);
void run_decode_items(unsigned grid, const void *items, uint32_t n, const void *chunks,
                      const unsigned char *staging, unsigned char *pages, const void *shape,
                      size_t shape_size, bool ahead, const Schedule &schedule);

// The sizes the emulated kernels were compiled with, for the callers' checks.
size_t copy_item_size();
size_t chunk_source_size();

}  // namespace kernel_emulation
