// The work items of the gather/scatter kernel: a request's copy plans cut into pieces of at most
// kItemBytes, one warp each, so that every kernel launch has work for every SM whatever the page
// layout (256-token pages give a few large segments, cut; HND pages many 256-byte ones, joined
// into rows of one item where they are evenly spaced). Built once per request on the host, the
// same for every layer. copy_items_cpu is the kernel's CPU twin: the kernel must move exactly the
// bytes it moves. C++17, so that nvcc compiles it too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/codec/layer_decode.hpp"

namespace swiftkv {

constexpr uint32_t kItemBytes = 4096;

// `rows` runs of `bytes` each (rows * bytes at most kItemBytes): run r at page_offset + r *
// page_stride from a layer's base in the pool and at piece_offset + r * piece_stride in chunk
// `chunk`'s piece of that layer. With one row the strides are 0. Runs never overlap (each stride
// is at least `bytes`). 32 bytes, the kernel reads it whole.
struct CopyItem {
  uint64_t page_offset;
  uint64_t piece_offset;
  uint32_t chunk;
  uint16_t bytes;
  uint16_t rows;
  uint32_t page_stride;
  uint32_t piece_stride;
};
static_assert(sizeof(CopyItem) == 32, "the kernel's layout");
static_assert(kItemBytes <= UINT16_MAX, "an item's bytes fit its field");

// Where chunk i's layer piece is for the kernel: `direct` != 0 is the address of its layer-0
// piece in memory the pool's device reads and writes in place (its own or a peer's, through a
// mapping; layer l's piece is l * piece_bytes further), so no copy to staging; 0 means the piece
// goes through the staging buffer, at `staged_at`. `encoding` != 0 (the index's encoding of a
// kivi or fp8 chunk, core/codec/layer_decode.hpp): the staging buffer holds the layer's
// compressed payload, which the decode kernel (not the copy kernel) turns into the piece.
struct ChunkSource {
  uint64_t direct;
  uint64_t staged_at;
  uint32_t encoding;
  uint32_t reserved;
};
static_assert(sizeof(ChunkSource) == 24, "the kernel's layout");

// How the gather/scatter kernel (kernels/segment_copy.cuh) is launched. `spread`: a warp per item
// over a grid of up to 8 blocks an SM, each warp reading its item's entry before moving it.
// `ahead`: only the blocks the SMs hold at once, each warp going through its share of the items
// with the next item's entry read while it moves one. The library launches the one
// SWIFTKV_COPY_KERNEL names (spread, the default, or ahead), read when a device pool's lanes are
// made; `bench_transfer --kernels` measures both.
enum class CopyKernel { spread, ahead };
// SWIFTKV_COPY_KERNEL's choice: spread when unset or empty; EINVAL for another value.
CopyKernel copy_kernel_choice();

// Appends the items of one chunk's plan (segments as {page_offset, piece_offset, bytes}, the
// fields of CopySegment, `n` of them): a segment longer than kItemBytes is cut at kItemBytes from
// its start, so a 16-byte aligned segment gives 16-byte aligned items. Shorter segments of one
// size that follow each other at the same distance on both sides (an HND page's tokens of one
// head, as chunk_copy_plan orders them) become the rows of one item, up to kItemBytes, for the
// copy kernel and the decode kernel alike (whose spread launch decodes rows of fewer than 32
// groups several at a time).
void append_copy_items(const uint64_t *segments, size_t n, uint32_t chunk,
                       std::vector<CopyItem> &out);

// The kernel on the CPU: for each of the `n` items, the chunk's piece of layer `layer` (direct,
// or staging + staged_at) to the pages at `layer_base` when scatter, else back. Items of encoded
// chunks are left to decode_items_cpu.
void copy_items_cpu(const CopyItem *items, size_t n, const ChunkSource *chunks, uint32_t layer,
                    uint64_t piece_bytes, std::byte *staging, std::byte *layer_base,
                    bool scatter) noexcept;

// The decode kernel on the CPU: for each of the `n` items of an encoded chunk, its elements
// decoded from the layer's payload at staging + staged_at into the pages at `layer_base`
// (chunks of `shape`: tokens, heads, dim, element type). Other items are left as they are.
void decode_items_cpu(const CopyItem *items, size_t n, const ChunkSource *chunks,
                      const codec::LayerShape &shape, const std::byte *staging,
                      std::byte *layer_base) noexcept;

namespace kernels {
// The block of the gather/scatter and decode kernels (kernels/segment_copy.cuh): 8 warps, one
// item (or a group of rows) a warp; the launches size their grids by it.
constexpr int kCopyThreads = 256;
constexpr int kCopyWarps = kCopyThreads / 32;
}  // namespace kernels

}  // namespace swiftkv
