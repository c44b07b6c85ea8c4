// Building per-chunk copy plans from a layout's strides, and running them with memcpy.
#include "core/transfer/copy_plan.hpp"

#include <cstring>

namespace swiftkv {

std::vector<CopySegment> chunk_copy_plan(const PageLayout &l, std::span<const int32_t> pages,
                                         uint32_t chunk_tokens, uint32_t first_token) {
  std::vector<CopySegment> plan;
  const uint64_t row = uint64_t{l.head_dim} * l.dtype_bytes;  // one head of one token
  uint64_t piece = 0;
  for (uint32_t c = 0; c < 2; ++c) {
    for (uint32_t t = 0; t < chunk_tokens; ++t) {
      if (t < first_token) {
        piece += row * l.heads;
        continue;
      }
      const auto page = static_cast<uint32_t>(pages[t / l.page_tokens]);
      for (uint32_t h = 0; h < l.heads; ++h, piece += row) {
        const uint64_t at = l.offset(page, c, t % l.page_tokens, h);
        if (!plan.empty()) {
          CopySegment &last = plan.back();
          if (last.page_offset + last.bytes == at && last.piece_offset + last.bytes == piece) {
            last.bytes += row;
            continue;
          }
        }
        plan.push_back(CopySegment{at, piece, row});
      }
    }
  }
  return plan;
}

void scatter_piece(std::span<const CopySegment> plan, const std::byte *piece,
                   std::byte *layer_base) noexcept {
  for (const CopySegment &s : plan) {
    std::memcpy(layer_base + s.page_offset, piece + s.piece_offset, s.bytes);
  }
}

void gather_piece(std::span<const CopySegment> plan, const std::byte *layer_base,
                  std::byte *piece) noexcept {
  for (const CopySegment &s : plan) {
    std::memcpy(piece + s.piece_offset, layer_base + s.page_offset, s.bytes);
  }
}

}  // namespace swiftkv
