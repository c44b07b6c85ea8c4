// The gather/scatter kernel of the transfer engine: moves a request's copy items (its chunks'
// copy plans cut into pieces of at most kItemBytes, core/transfer/copy_items.hpp) between each
// chunk's layer piece and an engine's pages. Every page layout becomes segments on the host
// (core/transfer/copy_plan), so one kernel serves them all, and any dtype: it moves bytes.
//
// A warp per group of items (kGroupItems), so a launch has work for every SM whatever the
// segment sizes. A large item is moved by the whole warp, each lane issuing all its 16-byte loads
// (up to 8) before its first store; small ones (HND pages give 256-byte segments) a group at a
// time, a half-warp per item, so that a lane still has several loads in flight. A chunk's piece is
// read from (or written to) its own memory when that memory is on a device (ChunkSource::direct,
// peer or IPC-mapped), else from the staging buffer the copy engine filled. The CPU twin is
// copy_items_cpu. Items of encoded chunks are decode_items' (below).
#pragma once

#include <cstdint>

#include "core/transfer/copy_items.hpp"

namespace swiftkv::kernels {

constexpr int kCopyThreads = 256;
constexpr int kCopyWarps = kCopyThreads / 32;
constexpr uint32_t kWordsPerLane = kItemBytes / 16 / 32;  // 8
static_assert(kItemBytes % (16 * 32) == 0, "an item is whole 16-byte words for every lane");

// Items of at most this many 16-byte words, 16-byte aligned, are small: HND pages give 256-byte
// (16-word) items, whose copy by a whole warp left half its lanes idle with one load each in
// flight. Small items are moved kGroupItems at a time per warp instead: each half-warp takes
// every other item of the group, a lane one word of each, so a lane has kGroupItems / 2 loads in
// flight before its first store. Larger or unaligned items are moved by the whole warp.
constexpr uint32_t kSmallWords = 16;
constexpr uint32_t kGroupItems = 8;

// Where item `it` copies from and to for this launch.
__device__ inline void item_ends(const CopyItem &it, const ChunkSource *__restrict__ chunks,
                                 uint64_t layer_offset, unsigned char *staging,
                                 unsigned char *pages, int scatter, const unsigned char **from,
                                 unsigned char **to) {
  const ChunkSource c = chunks[it.chunk];
  unsigned char *piece = (c.direct != 0 ? reinterpret_cast<unsigned char *>(c.direct) + layer_offset
                                        : staging + c.staged_at) +
                         it.piece_offset;
  unsigned char *page = pages + it.page_offset;
  *from = scatter ? piece : page;
  *to = scatter ? page : piece;
}

__device__ inline bool is_small(const unsigned char *from, const unsigned char *to,
                                uint32_t bytes) {
  const uint64_t align =
      reinterpret_cast<uintptr_t>(from) | reinterpret_cast<uintptr_t>(to) | bytes;
  return align % 16 == 0 && bytes <= 16 * kSmallWords;
}

// scatter != 0: pieces -> pages; else pages -> pieces. Layer `layer`'s piece of a direct chunk
// is layer * piece_bytes past its address. A warp takes a group of kGroupItems items at a time.
__global__ void __launch_bounds__(kCopyThreads)
    copy_items(const CopyItem *__restrict__ items, uint32_t n,
               const ChunkSource *__restrict__ chunks, uint64_t layer_offset,
               unsigned char *staging, unsigned char *pages, int scatter) {
  const uint32_t lane = threadIdx.x % 32;
  const uint32_t warps = gridDim.x * kCopyWarps;
  const uint32_t groups = (n + kGroupItems - 1) / kGroupItems;
  for (uint32_t g = blockIdx.x * kCopyWarps + threadIdx.x / 32; g < groups; g += warps) {
    const uint32_t first = g * kGroupItems;
    const uint32_t last = first + kGroupItems < n ? first + kGroupItems : n;
    // The group's small items: half-warp h takes items first + h, first + h + 2, ...; lane
    // (lane % 16) moves word lane % 16 of each.
    const uint32_t word = lane % 16;
    uint4 r[kGroupItems / 2];
    const uint4 *src[kGroupItems / 2];
    uint4 *dst[kGroupItems / 2];
#pragma unroll
    for (uint32_t k = 0; k < kGroupItems / 2; ++k) {
      src[k] = nullptr;
      dst[k] = nullptr;
      const uint32_t i = first + lane / 16 + 2 * k;
      if (i >= last) continue;
      const CopyItem it = items[i];
      if (chunks[it.chunk].encoding != 0) continue;  // decode_items' work
      const unsigned char *from = nullptr;
      unsigned char *to = nullptr;
      item_ends(it, chunks, layer_offset, staging, pages, scatter, &from, &to);
      if (!is_small(from, to, it.bytes) || word >= it.bytes / 16) continue;
      src[k] = reinterpret_cast<const uint4 *>(from) + word;
      dst[k] = reinterpret_cast<uint4 *>(to) + word;
    }
#pragma unroll
    for (uint32_t k = 0; k < kGroupItems / 2; ++k) {
      if (src[k] != nullptr) r[k] = *src[k];
    }
#pragma unroll
    for (uint32_t k = 0; k < kGroupItems / 2; ++k) {
      if (dst[k] != nullptr) *dst[k] = r[k];
    }
    // The rest, one item at a time by the whole warp.
    for (uint32_t i = first; i < last; ++i) {
      const CopyItem it = items[i];
      if (chunks[it.chunk].encoding != 0) continue;
      const unsigned char *from = nullptr;
      unsigned char *to = nullptr;
      item_ends(it, chunks, layer_offset, staging, pages, scatter, &from, &to);
      if (is_small(from, to, it.bytes)) continue;
      const uint64_t align =
          reinterpret_cast<uintptr_t>(from) | reinterpret_cast<uintptr_t>(to) | it.bytes;
      if (align % 16 == 0) {
        const uint4 *f = reinterpret_cast<const uint4 *>(from);
        uint4 *t = reinterpret_cast<uint4 *>(to);
        const uint32_t words = it.bytes / 16;
        uint4 w[kWordsPerLane];
#pragma unroll
        for (uint32_t k = 0; k < kWordsPerLane; ++k) {
          const uint32_t j = lane + 32 * k;
          if (j < words) w[k] = f[j];
        }
#pragma unroll
        for (uint32_t k = 0; k < kWordsPerLane; ++k) {
          const uint32_t j = lane + 32 * k;
          if (j < words) t[j] = w[k];
        }
      } else if (align % 4 == 0) {
        const uint32_t *f = reinterpret_cast<const uint32_t *>(from);
        uint32_t *t = reinterpret_cast<uint32_t *>(to);
        for (uint32_t j = lane; j < it.bytes / 4; j += 32) t[j] = f[j];
      } else {
        for (uint32_t j = lane; j < it.bytes; j += 32) to[j] = from[j];
      }
    }
  }
}

// The load of encoded (kivi, fp8) chunks: each item's elements decoded from the chunk's layer
// payload in staging (copied in compressed) and written to the pages, so the decoded bytes never
// exist anywhere else. One warp per item as above; each lane makes eight elements (one 16-byte
// store) at a time where the item and the head dim allow, else one. The CPU twin is
// decode_items_cpu; both call codec::decode_layer_8 / decode_layer_element.
__global__ void __launch_bounds__(kCopyThreads)
    decode_items(const CopyItem *__restrict__ items, uint32_t n,
                 const ChunkSource *__restrict__ chunks, const unsigned char *__restrict__ staging,
                 unsigned char *pages, codec::LayerShape shape) {
  const uint32_t lane = threadIdx.x % 32;
  const uint32_t warps = gridDim.x * kCopyWarps;
  for (uint32_t w = blockIdx.x * kCopyWarps + threadIdx.x / 32; w < n; w += warps) {
    const CopyItem it = items[w];
    const ChunkSource c = chunks[it.chunk];
    if (c.encoding == 0) continue;  // copy_items' work
    const unsigned char *payload = staging + c.staged_at;
    unsigned char *page = pages + it.page_offset;
    const uint64_t first = it.piece_offset / 2;
    const uint32_t count = it.bytes / 2;
    if (shape.dim % 8 == 0 && first % 8 == 0 && count % 8 == 0 &&
        reinterpret_cast<uintptr_t>(page) % 16 == 0) {
      for (uint32_t k = lane; k < count / 8; k += 32) {
        uint16_t v[8];
        codec::decode_layer_8(payload, shape, c.encoding, first + 8 * uint64_t{k}, v);
        uint4 word;
        word.x = uint32_t{v[0]} | (uint32_t{v[1]} << 16);
        word.y = uint32_t{v[2]} | (uint32_t{v[3]} << 16);
        word.z = uint32_t{v[4]} | (uint32_t{v[5]} << 16);
        word.w = uint32_t{v[6]} | (uint32_t{v[7]} << 16);
        reinterpret_cast<uint4 *>(page)[k] = word;
      }
    } else {
      for (uint32_t k = lane; k < count; k += 32) {
        const uint16_t v = codec::decode_layer_element(payload, shape, c.encoding, first + k);
        page[2 * k] = static_cast<unsigned char>(v & 0xffu);
        page[2 * k + 1] = static_cast<unsigned char>(v >> 8);
      }
    }
  }
}

}  // namespace swiftkv::kernels
