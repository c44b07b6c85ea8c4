#include "core/transfer/copy_items.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/common/error.hpp"

namespace swiftkv {

CopyKernel copy_kernel_choice() {
  const char *e = std::getenv("SWIFTKV_COPY_KERNEL");
  if (e == nullptr || *e == '\0' || std::strcmp(e, "spread") == 0) return CopyKernel::spread;
  if (std::strcmp(e, "ahead") == 0) return CopyKernel::ahead;
  fail_invalid(std::string("SWIFTKV_COPY_KERNEL is '") + e +
               "': it names how the gather/scatter kernel is launched, spread or ahead (unset: "
               "spread)");
}

void append_copy_items(const uint64_t *segments, size_t n, uint32_t chunk,
                       std::vector<CopyItem> &out) {
  const size_t first = out.size();  // this chunk's items start here
  for (size_t s = 0; s < n; ++s) {
    const uint64_t page = segments[3 * s], piece = segments[3 * s + 1], bytes = segments[3 * s + 2];
    if (bytes <= kItemBytes && out.size() > first) {
      CopyItem &last = out.back();
      if (last.bytes == bytes && (last.rows + uint64_t{1}) * bytes <= kItemBytes) {
        if (last.rows == 1) {
          // A second row: the distances from the first set the strides.
          if (page > last.page_offset && piece > last.piece_offset &&
              page - last.page_offset >= bytes && piece - last.piece_offset >= bytes &&
              page - last.page_offset <= UINT32_MAX && piece - last.piece_offset <= UINT32_MAX) {
            last.page_stride = static_cast<uint32_t>(page - last.page_offset);
            last.piece_stride = static_cast<uint32_t>(piece - last.piece_offset);
            last.rows = 2;
            continue;
          }
        } else if (page == last.page_offset + uint64_t{last.rows} * last.page_stride &&
                   piece == last.piece_offset + uint64_t{last.rows} * last.piece_stride) {
          ++last.rows;
          continue;
        }
      }
    }
    for (uint64_t at = 0; at < bytes; at += kItemBytes) {
      const auto len = static_cast<uint16_t>(std::min<uint64_t>(kItemBytes, bytes - at));
      out.push_back(CopyItem{page + at, piece + at, chunk, len, 1, 0, 0});
    }
  }
}

void copy_items_cpu(const CopyItem *items, size_t n, const ChunkSource *chunks, uint32_t layer,
                    uint64_t piece_bytes, std::byte *staging, std::byte *layer_base,
                    bool scatter) noexcept {
  for (size_t i = 0; i < n; ++i) {
    const CopyItem &it = items[i];
    const ChunkSource &c = chunks[it.chunk];
    if (c.encoding != 0) continue;
    std::byte *piece = c.direct != 0
                           ? reinterpret_cast<std::byte *>(c.direct) + uint64_t{layer} * piece_bytes
                           : staging + c.staged_at;
    piece += it.piece_offset;
    std::byte *page = layer_base + it.page_offset;
    for (uint32_t r = 0; r < it.rows; ++r) {
      std::byte *pg = page + uint64_t{r} * it.page_stride;
      std::byte *pc = piece + uint64_t{r} * it.piece_stride;
      if (scatter) {
        std::memcpy(pg, pc, it.bytes);
      } else {
        std::memcpy(pc, pg, it.bytes);
      }
    }
  }
}

void decode_items_cpu(const CopyItem *items, size_t n, const ChunkSource *chunks,
                      const codec::LayerShape &shape, const std::byte *staging,
                      std::byte *layer_base) noexcept {
  for (size_t i = 0; i < n; ++i) {
    const CopyItem &it = items[i];
    const ChunkSource &c = chunks[it.chunk];
    if (c.encoding == 0) continue;
    for (uint32_t r = 0; r < it.rows; ++r) {
      codec::decode_layer_cpu(staging + c.staged_at, shape, c.encoding,
                              (it.piece_offset + uint64_t{r} * it.piece_stride) / 2, it.bytes / 2,
                              layer_base + it.page_offset + uint64_t{r} * it.page_stride);
    }
  }
}

}  // namespace swiftkv
