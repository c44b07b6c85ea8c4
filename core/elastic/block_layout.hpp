// Address arithmetic of block-major KV memory: the lender's blocks (n_blocks, L, 2, B, H, D)
// and the borrower's chunks in lent memory (n_chunks, L, 2, C, H, D). Pure functions; every
// offset is in bytes from the start of the region.
#pragma once

#include <cstdint>

#include "core/geometry/model_geometry.hpp"

namespace swiftkv {

// How an engine addresses one layer of a block-major region as an ordinary paged cache: page p
// of layer l starts at layer_offset + p * page_stride; within a page, K (then V) is (B, H, D).
struct LayerView {
  uint64_t layer_offset;  // block 0, layer l, K, token 0, head 0
  uint64_t page_stride;   // one full block: L * M_block
  uint64_t k_offset;      // 0: K comes first in a layer block
  uint64_t v_offset;      // B * H * D * dtype: V follows K
  uint64_t token_stride;  // H * D * dtype
  uint64_t head_stride;   // D * dtype
};

inline uint64_t kv_half_bytes(const ModelGeometry &g, const GeometrySizes &s, uint64_t tokens) {
  return tokens * g.num_kv_heads * g.head_dim * s.dtype_bytes;
}

inline LayerView block_major_layer_view(const ModelGeometry &g, const GeometrySizes &s,
                                        uint32_t layer) {
  return LayerView{layer * s.layer_block_bytes,
                   s.full_block_bytes,
                   0,
                   kv_half_bytes(g, s, g.block_tokens),
                   kv_half_bytes(g, s, 1),
                   uint64_t{g.head_dim} * s.dtype_bytes};
}

// The byte of element (block, layer, kv, token, head, 0) in the lender's layout; kv 0 is K.
inline uint64_t block_major_offset(const ModelGeometry &g, const GeometrySizes &s, uint64_t block,
                                   uint32_t layer, uint32_t kv, uint32_t token, uint32_t head) {
  const LayerView v = block_major_layer_view(g, s, layer);
  return v.layer_offset + block * v.page_stride + (kv ? v.v_offset : v.k_offset) +
         token * v.token_stride + head * v.head_stride;
}

// The start of one layer of one borrower chunk: K and V of the layer, C tokens each, one
// contiguous piece of layer_chunk_bytes. `base` is where the chunk storage starts (a lease).
inline uint64_t chunk_layer_offset(const GeometrySizes &s, uint64_t base, uint64_t chunk,
                                   uint32_t layer) {
  return base + chunk * s.full_chunk_bytes + layer * s.layer_chunk_bytes;
}

}  // namespace swiftkv
