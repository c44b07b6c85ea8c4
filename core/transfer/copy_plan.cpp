// Building per-chunk copy plans from a layout's strides, and running them with memcpy or
// non-temporal copies.
#include "core/transfer/copy_plan.hpp"

#include <algorithm>

#include "core/common/nontemporal_copy.hpp"

namespace swiftkv {

std::vector<CopySegment> chunk_copy_plan(const PageLayout &l, std::span<const int32_t> pages,
                                         uint32_t chunk_tokens, uint32_t first_token) {
  std::vector<CopySegment> plan;
  const uint64_t row = uint64_t{l.head_dim} * l.dtype_bytes;  // one head of one token
  // Each page's memory is walked in its own order: where a head's tokens lie next to each other
  // in the page (HND), a page's tokens of one head, then of the next; else (NHD, vLLM's) a
  // token's heads, then the next token's. Either way consecutive segments keep one distance on
  // both sides as long as possible, so that they join into the rows of one item (copy_items.hpp):
  // an HND page of 16 tokens of 256-byte heads gives 4 KiB items where token by token gave 2 KiB.
  // HND's segments are left one head of one token each: a run contiguous on both sides is rare
  // there (K's last row with V's first, in a page that holds the whole chunk), and merged it
  // would break the rows' spacing.
  const bool heads_outer = l.heads > 1 && l.page_tokens > 1 && l.token_stride == l.head_dim;
  // A token's heads side by side in the page (every layout but HND) are one run on both sides:
  // added at once, rather than head by head and merged (the same plan; SGLang's page_first pool
  // seen as one layer of every layer's heads has 64 heads a token, and its 128-page calls spent
  // a millisecond building plans).
  const bool heads_joined = !heads_outer && l.head_stride == int64_t{l.head_dim};
  auto add = [&](uint32_t c, uint32_t t, uint32_t h, uint64_t bytes) {
    const auto page = static_cast<uint32_t>(pages[t / l.page_tokens]);
    const uint64_t at = l.offset(page, c, t % l.page_tokens, h);
    const uint64_t piece = ((uint64_t{c} * chunk_tokens + t) * l.heads + h) * row;
    if (!plan.empty() && !heads_outer) {
      CopySegment &last = plan.back();
      if (last.page_offset + last.bytes == at && last.piece_offset + last.bytes == piece) {
        last.bytes += bytes;
        return;
      }
    }
    plan.push_back(CopySegment{at, piece, bytes});
  };
  for (uint32_t c = 0; c < 2; ++c) {
    if (!heads_outer) {
      for (uint32_t t = first_token; t < chunk_tokens; ++t) {
        if (heads_joined) {
          add(c, t, 0, l.heads * row);
          continue;
        }
        for (uint32_t h = 0; h < l.heads; ++h) add(c, t, h, row);
      }
      continue;
    }
    for (uint32_t page_start = 0; page_start < chunk_tokens; page_start += l.page_tokens) {
      const uint32_t begin = std::max(page_start, first_token);
      const uint32_t end = std::min(page_start + l.page_tokens, chunk_tokens);
      for (uint32_t h = 0; h < l.heads; ++h) {
        for (uint32_t t = begin; t < end; ++t) add(c, t, h, row);
      }
    }
  }
  return plan;
}

void scatter_piece(std::span<const CopySegment> plan, const std::byte *piece, std::byte *layer_base,
                   bool nontemporal) noexcept {
  const NontemporalStores stores = nontemporal ? nontemporal_stores() : NontemporalStores::none;
  for (const CopySegment &s : plan) {
    nontemporal_copy_with(stores, layer_base + s.page_offset, piece + s.piece_offset, s.bytes);
  }
  if (nontemporal) nontemporal_fence();
}

void gather_piece(std::span<const CopySegment> plan, const std::byte *layer_base, std::byte *piece,
                  bool nontemporal) noexcept {
  const NontemporalStores stores = nontemporal ? nontemporal_stores() : NontemporalStores::none;
  for (const CopySegment &s : plan) {
    nontemporal_copy_with(stores, piece + s.piece_offset, layer_base + s.page_offset, s.bytes);
  }
  if (nontemporal) nontemporal_fence();
}

}  // namespace swiftkv
