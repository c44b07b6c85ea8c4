// How an engine's per-layer KV tensors are laid out in pages, described by explicit strides, and
// the checks that reject a description that contradicts the model or the memory it names.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "core/geometry/model_geometry.hpp"

namespace swiftkv {

// Element (page p, k_or_v c, token t, head h, dim d) of layer l lives at
//   layer_base[l] + (p*page_stride + c*kv_stride + t*token_stride + h*head_stride + d) * dtype
// bytes. The dim stride is 1. Strides are in elements, as a tensor library reports them. Pages
// [stream_first, stream_first + stream_pages) are stream pages: one memory shared by all layers.
// This one description covers vLLM's [2, pages, B, H, D], FlashInfer's NHD [pages, 2, B, H, D]
// and HND [pages, 2, H, B, D], and cross-layer pages [pages, L, 2, B, H, D].
struct PageLayout {
  std::vector<std::byte *> layer_base;  // one per layer
  int32_t device = SWIFTKV_DEVICE_HOST;
  uint64_t layer_span_bytes = 0;  // bytes addressable from each base
  uint32_t num_pages = 0;
  uint32_t page_tokens = 0;  // the model's block_tokens
  uint32_t heads = 0, head_dim = 0;
  uint32_t dtype_bytes = 0;
  uint32_t stream_first = 0, stream_pages = 0;
  int64_t page_stride = 0, kv_stride = 0, token_stride = 0, head_stride = 0;

  bool is_stream(uint32_t page) const noexcept {
    return page >= stream_first && page - stream_first < stream_pages;
  }
  // Byte offset of (page, c, token, head, dim 0) from a layer's base.
  uint64_t offset(uint32_t page, uint32_t c, uint32_t token, uint32_t head) const noexcept {
    return static_cast<uint64_t>(page * page_stride + c * kv_stride + token * token_stride +
                                 head * head_stride) *
           dtype_bytes;
  }
};

// Checks a layout against the model (layers, tokens per page, heads, head dim, dtype) and
// itself: strides positive, no two elements of a layer at one address, every element inside
// layer_span_bytes, bases aligned to the dtype and distinct. Throws Error(EINVAL) naming the
// field, with `arg` as the caller's name for the descriptor.
void check_page_layout(const PageLayout &layout, const ModelGeometry &g, std::string_view arg);

// The layout a library-made pool uses: FlashInfer's NHD, [pages, 2, B, H, D] per layer.
PageLayout nhd_layout(const ModelGeometry &g, uint32_t num_pages);

}  // namespace swiftkv
