// The gather/scatter kernel of the transfer engine: moves a request's copy items (its chunks'
// copy plans cut or joined into items of at most kItemBytes, core/transfer/copy_items.hpp)
// between each chunk's layer piece and an engine's pages. Every page layout becomes segments on
// the host (core/transfer/copy_plan), so one kernel serves them all, and any dtype: it moves
// bytes.
//
// A warp per item, so a launch has work for every SM whatever the segment sizes. An item is rows
// of equal length at fixed distances (one row for most layouts; HND pages give 256-byte segments,
// joined on the host into rows of up to kItemBytes), and the warp moves it as 16-byte words, each
// lane issuing all its loads (up to 8) before its first store, wherever the rows start and end.
// A chunk's piece is read from (or written to) its own memory when that memory is on a device
// (ChunkSource::direct, peer or IPC-mapped), else from the staging buffer the copy engine filled.
// The CPU twin is copy_items_cpu. Items of encoded chunks are decode_items' (below).
#pragma once

#include <cstdint>

#include "core/transfer/copy_items.hpp"

namespace swiftkv::kernels {

// kCopyThreads and kCopyWarps: core/transfer/copy_items.hpp (the launches size grids by them).
constexpr uint32_t kWordsPerLane = kItemBytes / 16 / 32;  // 8
static_assert(kItemBytes % (16 * 32) == 0, "an item is whole 16-byte words for every lane");

// Where item `it` copies from and to for this launch, and the distance between its rows on
// each side.
__device__ inline void item_ends(const CopyItem &it, const ChunkSource &c, uint64_t layer_offset,
                                 unsigned char *staging, unsigned char *pages, int scatter,
                                 const unsigned char **from, unsigned char **to,
                                 uint32_t *from_stride, uint32_t *to_stride) {
  unsigned char *piece = (c.direct != 0 ? reinterpret_cast<unsigned char *>(c.direct) + layer_offset
                                        : staging + c.staged_at) +
                         it.piece_offset;
  unsigned char *page = pages + it.page_offset;
  *from = scatter ? piece : page;
  *to = scatter ? page : piece;
  *from_stride = scatter ? it.piece_stride : it.page_stride;
  *to_stride = scatter ? it.page_stride : it.piece_stride;
}

// Word `col` of row `row`, advanced by the 32 words of a warp step: q whole rows and r words
// (32 = q * row_words + r, r < row_words).
__device__ inline void next_word(uint32_t &row, uint32_t &col, uint32_t q, uint32_t r,
                                 uint32_t row_words) {
  col += r;
  row += q;
  if (col >= row_words) {
    col -= row_words;
    ++row;
  }
}

// Moves one item with the 32 lanes of a warp. scatter != 0: piece -> pages; else pages -> piece.
__device__ inline void copy_item(const CopyItem &it, const ChunkSource &c, uint32_t lane,
                                 uint64_t layer_offset, unsigned char *staging,
                                 unsigned char *pages, int scatter) {
  const unsigned char *from = nullptr;
  unsigned char *to = nullptr;
  uint32_t from_stride = 0, to_stride = 0;
  item_ends(it, c, layer_offset, staging, pages, scatter, &from, &to, &from_stride, &to_stride);
  const uint32_t rows = it.rows, bytes = it.bytes;
  const uint64_t align = reinterpret_cast<uintptr_t>(from) | reinterpret_cast<uintptr_t>(to) |
                         bytes | (rows > 1 ? (from_stride | to_stride) : 0u);
  if (align % 16 == 0) {
    // The item's words, row by row: lane takes words lane, lane + 32, ... (at most 8).
    const uint32_t row_words = bytes / 16, words = rows * row_words;
    uint32_t row = 0, col = lane, q = 0, r = 32;  // one row: the lane's words are its columns
    if ((row_words & (row_words - 1)) == 0) {
      // Rows of a power of two words (HND rows of head dims 64, 128, 256): shifts and masks.
      const uint32_t shift = static_cast<uint32_t>(__ffs(static_cast<int>(row_words)) - 1);
      const uint32_t mask = row_words - 1;
      row = lane >> shift;
      col = lane & mask;
      q = 32 >> shift;
      r = 32 & mask;
    } else if (rows > 1 && row_words < 32) {
      // Other rows shorter than a warp step (HND rows of head dims 80 and 96: 10 and 12 words):
      // lane / row_words and 32 / row_words as (x * m) >> 16 with m = ceil(2^16 / row_words), not
      // two integer divisions of about 20 instructions each. m comes from a float reciprocal
      // within 2 ulp: 2^16 times it is within 0.006 of 2^16 / row_words, which is at least 1/31
      // from a whole number (row_words has an odd factor), so it rounds up to m. Then for x <= 32
      // x * m / 2^16 exceeds x / row_words by under 32 / 2^16, less than the 1/31 that any
      // quotient that is not whole lacks of the next: the shift truncates to x / row_words.
      // Longer rows keep the one-row walk: q = 0, r = 32.
      const uint32_t m =
          static_cast<uint32_t>(ceilf(65536.0f * __fdividef(1.0f, static_cast<float>(row_words))));
      row = (lane * m) >> 16;
      col = lane - row * row_words;
      q = m >> 11;
      r = 32 - q * row_words;
    }
    const uint32_t first_row = row, first_col = col;
    uint4 v[kWordsPerLane];
#pragma unroll
    for (uint32_t k = 0; k < kWordsPerLane; ++k) {
      if (lane + 32 * k < words) {
        v[k] = *reinterpret_cast<const uint4 *>(from + uint64_t{row} * from_stride + 16 * col);
      }
      next_word(row, col, q, r, row_words);
    }
    row = first_row;
    col = first_col;
#pragma unroll
    for (uint32_t k = 0; k < kWordsPerLane; ++k) {
      if (lane + 32 * k < words) {
        *reinterpret_cast<uint4 *>(to + uint64_t{row} * to_stride + 16 * col) = v[k];
      }
      next_word(row, col, q, r, row_words);
    }
  } else {
    for (uint32_t row = 0; row < rows; ++row) {
      const unsigned char *f = from + uint64_t{row} * from_stride;
      unsigned char *t = to + uint64_t{row} * to_stride;
      const uint64_t a = reinterpret_cast<uintptr_t>(f) | reinterpret_cast<uintptr_t>(t) | bytes;
      if (a % 4 == 0) {
        for (uint32_t j = lane; j < bytes / 4; j += 32) {
          reinterpret_cast<uint32_t *>(t)[j] = reinterpret_cast<const uint32_t *>(f)[j];
        }
      } else {
        for (uint32_t j = lane; j < bytes; j += 32) t[j] = f[j];
      }
    }
  }
}

// scatter != 0: pieces -> pages; else pages -> pieces. Layer `layer`'s piece of a direct chunk
// is layer * piece_bytes past its address. A warp takes an item at a time, the grid spread over
// the items (a warp each, up to 8 blocks an SM).
__global__ void __launch_bounds__(kCopyThreads)
    copy_items(const CopyItem *__restrict__ items, uint32_t n,
               const ChunkSource *__restrict__ chunks, uint64_t layer_offset,
               unsigned char *staging, unsigned char *pages, int scatter) {
  const uint32_t lane = threadIdx.x % 32;
  const uint32_t warps = gridDim.x * kCopyWarps;
  for (uint32_t w = blockIdx.x * kCopyWarps + threadIdx.x / 32; w < n; w += warps) {
    const CopyItem it = items[w];
    const ChunkSource c = chunks[it.chunk];
    if (c.encoding != 0) continue;  // decode_items' work
    copy_item(it, c, lane, layer_offset, staging, pages, scatter);
  }
}

// The same work for a grid of only the blocks an SM holds at once (kAheadBlocks each, so at most
// 64 registers a thread), every warp going through its share of the items in turn: while a warp
// moves one item, the next one's entry is already on its way, so reading it overlaps the move
// instead of coming between two items. Launched where CopyKernel::ahead is chosen
// (copy_items.hpp).
constexpr int kAheadBlocks = 3;
__global__ void __launch_bounds__(kCopyThreads, kAheadBlocks)
    copy_items_ahead(const CopyItem *__restrict__ items, uint32_t n,
                     const ChunkSource *__restrict__ chunks, uint64_t layer_offset,
                     unsigned char *staging, unsigned char *pages, int scatter) {
  const uint32_t lane = threadIdx.x % 32;
  const uint32_t warps = gridDim.x * kCopyWarps;
  uint32_t w = blockIdx.x * kCopyWarps + threadIdx.x / 32;
  if (w >= n) return;
  CopyItem it = items[w];
  for (; w < n; w += warps) {
    const ChunkSource c = chunks[it.chunk];
    CopyItem next = it;
    if (w + warps < n) next = items[w + warps];
    if (c.encoding == 0) copy_item(it, c, lane, layer_offset, staging, pages, scatter);
    it = next;
  }
}

// The load of encoded (kivi, fp8) chunks: each item's elements decoded from the chunk's layer
// payload in staging (copied in compressed) and written to the pages, so the decoded bytes never
// exist anywhere else. One warp per item as above, row by row (rows shorter than 32 groups of
// eight several at a time in the spread launch); each lane makes eight elements (one 16-byte
// store) at a time where the row and the head dim allow, else one. Eight at a time, a lane first
// reads what kGroups such groups need (the codes and scale words, codec::Fetched8), then decodes
// and stores them: kGroups groups' reads in flight at once. The CPU twin is
// decode_items_cpu; both go through codec::decode_layer_8's parts / decode_layer_element.
//
// Groups [begin, end) of a row, lanes taking groups begin + lane, + 32, ...: kAligned where every
// word read is at a multiple of its size (codec::layer_words_aligned, the payload 16-byte
// aligned), so each is one load; kBf16 the element type; kCodecBits, where not 0, the encoding's
// codec and kivi's bits (its low 16 bits; kivi's group stays a parameter), so that kivi's codes
// are taken by constant shifts; kKv whether the groups are K's (0) or V's (1), or either (-1,
// found per group). All are known per item or per part of a row, so the inner loop has no branch
// on them.
template <uint32_t kGroups, bool kAligned, bool kBf16, uint32_t kCodecBits, int kKv>
__device__ inline void decode_groups(const unsigned char *__restrict__ payload,
                                     const codec::LayerShape &shape, uint32_t chunk_encoding,
                                     uint64_t first, uint32_t begin, uint32_t end,
                                     unsigned char *page, uint32_t lane) {
  const uint32_t encoding =
      kCodecBits != 0 ? (chunk_encoding & ~uint32_t{0xffff}) | kCodecBits : chunk_encoding;
  // Two iterations at a time in the spread launch, so the compiler may issue the second group's
  // reads before the first group's store (it does for value groups and fp8's V records on sm_90;
  // a key group's eight pairs leave it no registers for that). The ahead launch has its own.
#pragma unroll(kGroups == 1 ? 2 : 1)
  for (uint32_t k0 = begin + lane; k0 < end; k0 += 32 * kGroups) {
    codec::Fetched8 f[kGroups];
#pragma unroll
    for (uint32_t u = 0; u < kGroups; ++u) {
      const uint32_t k = k0 + 32 * u;
      if (k < end) {
        codec::fetch_layer_8<kAligned, kKv>(payload, shape, encoding, first + 8 * uint64_t{k},
                                            f[u]);
      }
    }
#pragma unroll
    for (uint32_t u = 0; u < kGroups; ++u) {
      const uint32_t k = k0 + 32 * u;
      if (k < end) {
        uint16_t v[8];
        codec::decode_fetched_8_as<kBf16>(f[u], encoding, v);
        uint4 word;
        word.x = uint32_t{v[0]} | (uint32_t{v[1]} << 16);
        word.y = uint32_t{v[2]} | (uint32_t{v[3]} << 16);
        word.z = uint32_t{v[4]} | (uint32_t{v[5]} << 16);
        word.w = uint32_t{v[6]} | (uint32_t{v[7]} << 16);
        reinterpret_cast<uint4 *>(page)[k] = word;
      }
    }
  }
}

// A row's `groups` groups of eight from element `first`: in the `spread` launch its K groups,
// then its V groups, each through a loop made for them (a row crosses from K to V where a page's
// K and V blocks follow each other as the chunk's do; the boundary, the tensor's element count, is
// a multiple of 8 as dim is). The `ahead` launch keeps one loop for both, as two spilled on sm_90.
template <uint32_t kGroups, bool kAligned, bool kBf16, uint32_t kCodecBits = 0>
__device__ inline void decode_row_groups(const unsigned char *__restrict__ payload,
                                         const codec::LayerShape &shape, uint32_t encoding,
                                         uint64_t first, uint32_t groups, unsigned char *page,
                                         uint32_t lane) {
  if constexpr (kGroups > 1) {
    decode_groups<kGroups, kAligned, kBf16, kCodecBits, -1>(payload, shape, encoding, first, 0,
                                                            groups, page, lane);
  } else {
    const uint32_t n = shape.tokens * shape.heads * shape.dim;   // under 2^31 on a device
    const uint64_t before_v = first >= n ? 0 : (n - first) / 8;  // groups before V's first
    const uint32_t keys = before_v < groups ? static_cast<uint32_t>(before_v) : groups;
    decode_groups<1, kAligned, kBf16, kCodecBits, 0>(payload, shape, encoding, first, 0, keys, page,
                                                     lane);
    decode_groups<1, kAligned, kBf16, kCodecBits, 1>(payload, shape, encoding, first, keys, groups,
                                                     page, lane);
  }
}

// Row `row` of an item: its page bytes, its first element in the layer and its element count;
// and whether it decodes by groups of eight (a head dim of 8's multiples, the first element and
// the count multiples of 8, the page 16-byte aligned). Else element by element:
struct DecodeRow {
  unsigned char *page;
  uint64_t first;
  uint32_t count;
};
__device__ inline DecodeRow decode_row_at(const CopyItem &it, unsigned char *pages, uint32_t row) {
  return {pages + it.page_offset + uint64_t{row} * it.page_stride,
          (it.piece_offset + uint64_t{row} * it.piece_stride) / 2, uint32_t{it.bytes} / 2};
}
__device__ inline bool row_takes_groups(const codec::LayerShape &shape, const DecodeRow &r) {
  return shape.dim % 8 == 0 && r.first % 8 == 0 && r.count % 8 == 0 &&
         reinterpret_cast<uintptr_t>(r.page) % 16 == 0;
}
__device__ inline void decode_row_elements(const unsigned char *__restrict__ payload,
                                           const codec::LayerShape &shape, uint32_t encoding,
                                           const DecodeRow &r, uint32_t lane) {
  for (uint32_t k = lane; k < r.count; k += 32) {
    const uint16_t v = codec::decode_layer_element(payload, shape, encoding, r.first + k);
    r.page[2 * k] = static_cast<unsigned char>(v & 0xffu);
    r.page[2 * k + 1] = static_cast<unsigned char>(v >> 8);
  }
}

// Where an item's rows are at most 16 groups of eight and all take groups (an HND page's head
// of one token: 16 at head dim 128, 10 at 80, 12 at 96), its rows go 32 / groups at a time, each
// by its share of the lanes: the warp's first row `row`, its `step`, and `lane` made the group's
// in its row. Where the groups do not divide 32, the lanes past the last whole row (2 at 10
// groups, 8 at 12) keep a lane past their row's groups, so they decode nothing (an idle-lane
// test of its own lengthened the spread launch's loops on sm_90 by up to 9 instructions). Every
// row then takes groups, its first element and its page staying multiples of 8 and 16. Else
// row 0, step 1 and the lane unchanged.
__device__ inline void span_short_rows(const CopyItem &it, unsigned char *pages,
                                       const codec::LayerShape &shape, uint32_t &row,
                                       uint32_t &step, uint32_t &lane) {
  const uint32_t row_groups = it.bytes / 16;
  if (it.rows > 1 && it.bytes % 16 == 0 && row_groups != 0 && row_groups <= 16 &&
      it.page_stride % 16 == 0 && it.piece_stride % 16 == 0 &&
      row_takes_groups(shape, decode_row_at(it, pages, 0))) {
    row = lane / row_groups;
    step = 32 / row_groups;
    lane -= min(row, step - 1) * row_groups;
  }
}

// An item's rows, all decoded by the loops the template arguments make (the `spread` launch
// chooses them once per item, so that what each one's loops keep from row to row is its own).
// Short rows several at a time (span_short_rows), so that every lane has a group.
template <bool kAligned, bool kBf16, uint32_t kCodecBits = 0>
__device__ inline void decode_item_rows(const CopyItem &it,
                                        const unsigned char *__restrict__ payload,
                                        unsigned char *pages, const codec::LayerShape &shape,
                                        uint32_t encoding, uint32_t lane) {
  uint32_t row = 0, step = 1;
  span_short_rows(it, pages, shape, row, step, lane);
  for (; row < it.rows; row += step) {
    const DecodeRow r = decode_row_at(it, pages, row);
    if (row_takes_groups(shape, r)) {
      decode_row_groups<1, kAligned, kBf16, kCodecBits>(payload, shape, encoding, r.first,
                                                        r.count / 8, r.page, lane);
    } else {
      decode_row_elements(payload, shape, encoding, r, lane);  // with step 1 only
    }
  }
}

// The `spread` launch's item whose words are aligned: its loops made for each codec and kivi bit
// count (fp8, kivi 8, 4, 2).
template <bool kBf16>
__device__ inline void decode_item_aligned(const CopyItem &it,
                                           const unsigned char *__restrict__ payload,
                                           unsigned char *pages, const codec::LayerShape &shape,
                                           uint32_t encoding, uint32_t lane) {
  constexpr uint32_t kKivi8 = codec::kLayerKivi | (8u << 8), kKivi4 = codec::kLayerKivi | (4u << 8),
                     kKivi2 = codec::kLayerKivi | (2u << 8);
  switch (encoding & 0xffffu) {
    case codec::kLayerFp8:
      return decode_item_rows<true, kBf16, codec::kLayerFp8>(it, payload, pages, shape, encoding,
                                                             lane);
    case kKivi8:
      return decode_item_rows<true, kBf16, kKivi8>(it, payload, pages, shape, encoding, lane);
    case kKivi4:
      return decode_item_rows<true, kBf16, kKivi4>(it, payload, pages, shape, encoding, lane);
    case kKivi2:
      return decode_item_rows<true, kBf16, kKivi2>(it, payload, pages, shape, encoding, lane);
    default:  // no encoder writes another; decoded as the encoding says all the same
      return decode_item_rows<true, kBf16>(it, payload, pages, shape, encoding, lane);
  }
}

// The `ahead` launch's item: one loop for every codec, chosen per row by alignment and element
// type (its three groups' reads fill sm_90's 80 registers; loops made per codec, or chosen per
// item, spilled there), short rows several at a time as in the spread launch.
template <uint32_t kGroups>
__device__ inline void decode_item_ahead(const CopyItem &it,
                                         const unsigned char *__restrict__ payload, bool aligned,
                                         unsigned char *pages, const codec::LayerShape &shape,
                                         uint32_t encoding, uint32_t lane) {
  uint32_t row = 0, step = 1;
  span_short_rows(it, pages, shape, row, step, lane);
  for (; row < it.rows; row += step) {
    const DecodeRow r = decode_row_at(it, pages, row);
    const uint32_t groups = r.count / 8;
    if (!row_takes_groups(shape, r)) {
      decode_row_elements(payload, shape, encoding, r, lane);  // with step 1 only
    } else if (aligned && shape.bf16 != 0) {
      decode_row_groups<kGroups, true, true>(payload, shape, encoding, r.first, groups, r.page,
                                             lane);
    } else if (aligned) {
      decode_row_groups<kGroups, true, false>(payload, shape, encoding, r.first, groups, r.page,
                                              lane);
    } else if (shape.bf16 != 0) {
      decode_row_groups<kGroups, false, true>(payload, shape, encoding, r.first, groups, r.page,
                                              lane);
    } else {
      decode_row_groups<kGroups, false, false>(payload, shape, encoding, r.first, groups, r.page,
                                               lane);
    }
  }
}

// Inlined into its kernel outright: left to itself, sm_80's compiler kept the spread launch's
// as a function of its own, which spilled.
template <uint32_t kGroups>
__device__ __forceinline__ void decode_warp_items(const CopyItem *__restrict__ items, uint32_t n,
                                                  const ChunkSource *__restrict__ chunks,
                                                  const unsigned char *__restrict__ staging,
                                                  unsigned char *pages,
                                                  const codec::LayerShape &shape) {
  const uint32_t lane = threadIdx.x % 32;
  const uint32_t warps = gridDim.x * kCopyWarps;
  for (uint32_t w = blockIdx.x * kCopyWarps + threadIdx.x / 32; w < n; w += warps) {
    const CopyItem it = items[w];
    const ChunkSource c = chunks[it.chunk];
    if (c.encoding == 0) continue;  // copy_items' work
    const unsigned char *payload = staging + c.staged_at;
    const bool aligned = reinterpret_cast<uintptr_t>(payload) % 16 == 0 &&
                         codec::layer_words_aligned(shape, c.encoding);
    if constexpr (kGroups > 1) {
      decode_item_ahead<kGroups>(it, payload, aligned, pages, shape, c.encoding, lane);
    } else if (aligned && shape.bf16 != 0) {
      decode_item_aligned<true>(it, payload, pages, shape, c.encoding, lane);
    } else if (aligned) {
      decode_item_aligned<false>(it, payload, pages, shape, c.encoding, lane);
    } else if (shape.bf16 != 0) {
      decode_item_rows<false, true>(it, payload, pages, shape, c.encoding, lane);
    } else {
      decode_item_rows<false, false>(it, payload, pages, shape, c.encoding, lane);
    }
  }
}

// One group of eight elements at a time (the launch `spread`: 64 registers, 4 blocks an SM; said
// outright, as sm_80's compiler otherwise picks 48 registers and spills), and three (`ahead`: 80
// registers, 3 blocks an SM on sm_90, so 72 groups' reads in flight an SM against spread's 32, or
// 64 for value groups (decode_groups); sm_80's and sm_89's compilers need more registers for it,
// so 2 blocks there).
constexpr int kDecodeSpreadBlocks = 4;
constexpr uint32_t kDecodeGroupsAhead = 3;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
constexpr int kDecodeAheadBlocks = 2;
#else
constexpr int kDecodeAheadBlocks = 3;
#endif
__global__ void __launch_bounds__(kCopyThreads, kDecodeSpreadBlocks)
    decode_items(const CopyItem *__restrict__ items, uint32_t n,
                 const ChunkSource *__restrict__ chunks, const unsigned char *__restrict__ staging,
                 unsigned char *pages, codec::LayerShape shape) {
  decode_warp_items<1>(items, n, chunks, staging, pages, shape);
}
__global__ void __launch_bounds__(kCopyThreads, kDecodeAheadBlocks)
    decode_items_ahead(const CopyItem *__restrict__ items, uint32_t n,
                       const ChunkSource *__restrict__ chunks,
                       const unsigned char *__restrict__ staging, unsigned char *pages,
                       codec::LayerShape shape) {
  decode_warp_items<kDecodeGroupsAhead>(items, n, chunks, staging, pages, shape);
}

}  // namespace swiftkv::kernels
