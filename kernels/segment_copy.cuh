// The gather/scatter kernel of the transfer engine: copies a copy plan's segments between a
// contiguous staging buffer (a chunk's layer pieces, one after another) and an engine's pages.
// Every page layout becomes segments on the host (core/transfer/copy_plan), so one kernel serves
// them all, and any dtype: it moves bytes. The CPU twin is scatter_piece / gather_piece.
#pragma once

#include <cstdint>

namespace swiftkv::kernels {

// The device form of a CopySegment (same fields, same layout).
struct DeviceSegment {
  uint64_t page_offset;   // from the layer's base in the pool
  uint64_t piece_offset;  // in the staging buffer
  uint64_t bytes;
};

// scatter != 0: staging -> pages; else pages -> staging. Blocks take segments in turn; a
// segment moves in 16-byte words when both ends and its length allow, else 4 bytes, else bytes.
__global__ void copy_segments(const DeviceSegment *segments, uint32_t n,
                              const unsigned char *src_base, unsigned char *dst_base,
                              int scatter) {
  for (uint32_t s = blockIdx.x; s < n; s += gridDim.x) {
    const DeviceSegment g = segments[s];
    const unsigned char *from = src_base + (scatter ? g.piece_offset : g.page_offset);
    unsigned char *to = dst_base + (scatter ? g.page_offset : g.piece_offset);
    const uint64_t align = reinterpret_cast<uintptr_t>(from) | reinterpret_cast<uintptr_t>(to) |
                           g.bytes;
    if (align % 16 == 0) {
      const uint4 *f = reinterpret_cast<const uint4 *>(from);
      uint4 *t = reinterpret_cast<uint4 *>(to);
      for (uint64_t i = threadIdx.x; i < g.bytes / 16; i += blockDim.x) t[i] = f[i];
    } else if (align % 4 == 0) {
      const uint32_t *f = reinterpret_cast<const uint32_t *>(from);
      uint32_t *t = reinterpret_cast<uint32_t *>(to);
      for (uint64_t i = threadIdx.x; i < g.bytes / 4; i += blockDim.x) t[i] = f[i];
    } else {
      for (uint64_t i = threadIdx.x; i < g.bytes; i += blockDim.x) to[i] = from[i];
    }
  }
}

}  // namespace swiftkv::kernels
