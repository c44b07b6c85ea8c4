// Validation of model geometry and the sizes derived from it (Eq. 1, 6-9).
// Every product goes through checked_mul so that no caller input can wrap a size.
#include "core/geometry/model_geometry.hpp"

#include <numeric>
#include <string>

#include "core/common/checked_math.hpp"
#include "core/common/error.hpp"

namespace swiftkv {

uint32_t dtype_size(int32_t dtype) noexcept {
  switch (dtype) {
    case SWIFTKV_DTYPE_F16:
    case SWIFTKV_DTYPE_BF16: return 2;
    case SWIFTKV_DTYPE_F32: return 4;
    case SWIFTKV_DTYPE_FP8_E4M3:
    case SWIFTKV_DTYPE_FP8_E5M2:
    case SWIFTKV_DTYPE_I8: return 1;
  }
  return 0;
}

namespace {

void require_nonzero(uint32_t v, std::string_view arg, const char *field) {
  if (v == 0) fail_invalid(std::string(arg) + "->" + field + " is 0; it must be at least 1");
}

}  // namespace

GeometrySizes geometry_sizes(const ModelGeometry &g, std::string_view arg) {
  const std::string a(arg);
  require_nonzero(g.num_layers, arg, "num_layers");
  require_nonzero(g.num_kv_heads, arg, "num_kv_heads");
  require_nonzero(g.head_dim, arg, "head_dim");
  require_nonzero(g.block_tokens, arg, "block_tokens");
  require_nonzero(g.chunk_tokens, arg, "chunk_tokens");
  if (g.chunk_tokens % g.block_tokens != 0) {
    fail_invalid(a + "->chunk_tokens (" + std::to_string(g.chunk_tokens) +
                 ") is not a multiple of block_tokens (" + std::to_string(g.block_tokens) + ")");
  }
  GeometrySizes s{};
  s.dtype_bytes = dtype_size(g.dtype);
  if (s.dtype_bytes == 0) fail_invalid(a + "->dtype is not a swiftkv_dtype");
  if (g.device < SWIFTKV_DEVICE_HOST) {
    fail_invalid(a + "->device (" + std::to_string(g.device) +
                 ") is neither a device ordinal nor SWIFTKV_DEVICE_HOST");
  }
  // The largest size is the full chunk; once it fits, every smaller product fits too, but each
  // is still computed checked so the message names the first quantity that overflows.
  const std::string per = a + ": ";
  const uint64_t head_elems =
      checked_mul(g.num_kv_heads, g.head_dim, per + "num_kv_heads * head_dim");
  const uint64_t kv_token_layer =
      checked_mul(2 * s.dtype_bytes, head_elems, per + "bytes of one token in one layer");
  s.bytes_per_token = checked_mul(kv_token_layer, g.num_layers, per + "bytes per token");
  s.layer_block_bytes =
      checked_mul(kv_token_layer, g.block_tokens, per + "bytes of one layer block");
  s.full_block_bytes =
      checked_mul(s.layer_block_bytes, g.num_layers, per + "bytes of one full block");
  s.block_elems =
      checked_mul(checked_mul(head_elems, g.block_tokens, per + "elements of one block"),
                  g.num_layers, per + "elements of one block");
  s.layer_chunk_bytes =
      checked_mul(kv_token_layer, g.chunk_tokens, per + "bytes of one layer chunk");
  s.full_chunk_bytes =
      checked_mul(s.layer_chunk_bytes, g.num_layers, per + "bytes of one full chunk");
  return s;
}

Meu minimum_elastic_unit(const GeometrySizes &borrower, const GeometrySizes &lender) {
  // Per-block bytes are 2 * BE (Eq. 6-7) * dtype bytes; the common factor 2 cancels in Eq. 9.
  const uint64_t bm = borrower.full_block_bytes;
  const uint64_t bl = lender.full_block_bytes;
  const uint64_t g = std::gcd(bm, bl);
  // lcm = bm / g * bl; Eq. 9 divides it by each side again, so the MEUs are bl/g and bm/g and
  // never overflow even when the lcm itself would not fit in 64 bits.
  return Meu{bl / g, bm / g};
}

LendUnit lend_unit(const GeometrySizes &borrower, const GeometrySizes &lender) {
  const uint64_t bc = borrower.full_chunk_bytes;
  const uint64_t bl = lender.full_block_bytes;
  const uint64_t g = std::gcd(bc, bl);
  return LendUnit{bl / g, bc / g};
}

}  // namespace swiftkv
