#include "core/transfer/copy_items.hpp"

#include <algorithm>
#include <cstring>

namespace swiftkv {

void append_copy_items(const uint64_t *segments, size_t n, uint32_t chunk,
                       std::vector<CopyItem> &out) {
  for (size_t s = 0; s < n; ++s) {
    const uint64_t page = segments[3 * s], piece = segments[3 * s + 1], bytes = segments[3 * s + 2];
    for (uint64_t at = 0; at < bytes; at += kItemBytes) {
      const auto len = static_cast<uint32_t>(std::min<uint64_t>(kItemBytes, bytes - at));
      out.push_back(CopyItem{page + at, piece + at, chunk, len});
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
    if (scatter) {
      std::memcpy(page, piece, it.bytes);
    } else {
      std::memcpy(piece, page, it.bytes);
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
    codec::decode_layer_cpu(staging + c.staged_at, shape, c.encoding, it.piece_offset / 2,
                            it.bytes / 2, layer_base + it.page_offset);
  }
}

}  // namespace swiftkv
