// The gather/scatter kernel of the transfer engine: moves a request's copy items (its chunks'
// copy plans cut into pieces of at most kItemBytes, core/transfer/copy_items.hpp) between each
// chunk's layer piece and an engine's pages. Every page layout becomes segments on the host
// (core/transfer/copy_plan), so one kernel serves them all, and any dtype: it moves bytes.
//
// One warp per item, so a launch has work for every SM whatever the segment sizes: HND pages
// give 256-byte segments, which one block per segment left 16 of 256 threads to copy. Each lane
// issues all its 16-byte loads (up to 8) before its first store, so 8 loads per lane are in flight
// instead of one. A chunk's piece is read from (or written to) its own memory when that memory is
// on a device (ChunkSource::direct, peer or IPC-mapped), else from the staging buffer the copy
// engine filled. The CPU twin is copy_items_cpu.
#pragma once

#include <cstdint>

#include "core/transfer/copy_items.hpp"

namespace swiftkv::kernels {

constexpr int kCopyThreads = 256;
constexpr int kCopyWarps = kCopyThreads / 32;
constexpr uint32_t kWordsPerLane = kItemBytes / 16 / 32;  // 8
static_assert(kItemBytes % (16 * 32) == 0, "an item is whole 16-byte words for every lane");

// scatter != 0: pieces -> pages; else pages -> pieces. Layer `layer`'s piece of a direct chunk
// is layer * piece_bytes past its address.
__global__ void __launch_bounds__(kCopyThreads)
    copy_items(const CopyItem *__restrict__ items, uint32_t n,
               const ChunkSource *__restrict__ chunks, uint64_t layer_offset,
               unsigned char *staging, unsigned char *pages, int scatter) {
  const uint32_t lane = threadIdx.x % 32;
  const uint32_t warps = gridDim.x * kCopyWarps;
  for (uint32_t w = blockIdx.x * kCopyWarps + threadIdx.x / 32; w < n; w += warps) {
    const CopyItem it = items[w];
    const ChunkSource c = chunks[it.chunk];
    unsigned char *piece =
        (c.direct != 0 ? reinterpret_cast<unsigned char *>(c.direct) + layer_offset
                       : staging + c.staged_at) +
        it.piece_offset;
    unsigned char *page = pages + it.page_offset;
    const unsigned char *from = scatter ? piece : page;
    unsigned char *to = scatter ? page : piece;
    const uint64_t align =
        reinterpret_cast<uintptr_t>(from) | reinterpret_cast<uintptr_t>(to) | it.bytes;
    if (align % 16 == 0) {
      const uint4 *f = reinterpret_cast<const uint4 *>(from);
      uint4 *t = reinterpret_cast<uint4 *>(to);
      const uint32_t words = it.bytes / 16;
      uint4 r[kWordsPerLane];
#pragma unroll
      for (uint32_t k = 0; k < kWordsPerLane; ++k) {
        const uint32_t i = lane + 32 * k;
        if (i < words) r[k] = f[i];
      }
#pragma unroll
      for (uint32_t k = 0; k < kWordsPerLane; ++k) {
        const uint32_t i = lane + 32 * k;
        if (i < words) t[i] = r[k];
      }
    } else if (align % 4 == 0) {
      const uint32_t *f = reinterpret_cast<const uint32_t *>(from);
      uint32_t *t = reinterpret_cast<uint32_t *>(to);
      for (uint32_t i = lane; i < it.bytes / 4; i += 32) t[i] = f[i];
    } else {
      for (uint32_t i = lane; i < it.bytes; i += 32) to[i] = from[i];
    }
  }
}

}  // namespace swiftkv::kernels
