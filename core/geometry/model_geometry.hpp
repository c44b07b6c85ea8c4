// A model's KV geometry and every size derived from it (SwiftCache Eq. 1, 6-9). Pure functions
// over plain structs: no memory backend, no state, safe from any thread.
#pragma once

#include "core/common/defaults.hpp"

#include <cstdint>
#include <string_view>

#include "swiftkv/swiftkv.h"

namespace swiftkv {

struct ModelGeometry {
  uint32_t num_layers = 0;
  uint32_t num_kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t block_tokens = defaults::kModel.block_tokens;
  uint32_t chunk_tokens = defaults::kModel.chunk_tokens;
  swiftkv_dtype dtype = SWIFTKV_DTYPE_F16;
  int32_t device = SWIFTKV_DEVICE_HOST;
};

// Sizes of a validated geometry. All fit in 64 bits: that is part of being valid.
struct GeometrySizes {
  uint64_t dtype_bytes;
  uint64_t bytes_per_token;    // 2 * L * H * D * dtype: K and V of one token, all layers
  uint64_t layer_block_bytes;  // M_block (Eq. 1): K and V of one layer of one block
  uint64_t full_block_bytes;   // L * M_block
  uint64_t block_elems;        // BE (Eq. 6-7): L * B * H * D
  uint64_t layer_chunk_bytes;  // K and V of one layer of one chunk: one contiguous copy
  uint64_t full_chunk_bytes;   // all layers of one chunk
};

// Bytes of one element, 0 for a value that is not a swiftkv_dtype. Takes the raw integer: a C
// caller may store any int in a dtype field, and C++ must not hold it in the enum unchecked.
uint32_t dtype_size(int32_t dtype) noexcept;

// Checks every rule of a valid geometry and returns its sizes; throws Error(SWIFTKV_EINVAL) with
// a message that starts with `arg` (the caller's name for the descriptor) otherwise.
GeometrySizes geometry_sizes(const ModelGeometry &g, std::string_view arg);

// Minimum elastic unit (Eq. 6-9) in blocks of each side. The LCM is over per-block bytes, which
// is Eq. 8 times the dtype size when both sides share a dtype (so the MEUs are exactly Eq. 9) and
// keeps both sides byte-aligned when they do not.
struct Meu {
  uint64_t borrower_blocks;
  uint64_t lender_blocks;
};
Meu minimum_elastic_unit(const GeometrySizes &borrower, const GeometrySizes &lender);

// The lending unit: the MEU with the borrower's block replaced by its chunk (DESIGN "Layouts"),
// so that lent memory holds whole borrower chunks and whole lender blocks. The lender gives
// `lender_blocks` blocks exactly when the borrower gains `borrower_chunks` chunks.
struct LendUnit {
  uint64_t borrower_chunks;
  uint64_t lender_blocks;
};
LendUnit lend_unit(const GeometrySizes &borrower, const GeometrySizes &lender);

}  // namespace swiftkv
