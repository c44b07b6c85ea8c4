// The planning entry points (SwiftCache Eq. 1-9 and Algorithm 1): pure functions that validate,
// compute into locals, and write the caller's outputs only when everything succeeded.
#include <cstddef>
#include <cstring>
#include <span>
#include <string>

#include "capi/capi_guard.hpp"
#include "capi/model_desc.hpp"
#include "capi/raw_enum.hpp"
#include "capi/versioned.hpp"
#include "core/geometry/capacity_plan.hpp"
#include "core/geometry/elastic_scaling.hpp"

namespace swiftkv::capi {

namespace {

constexpr size_t kModelDescV1Size = offsetof(swiftkv_model_desc, device) + sizeof(int32_t);
// An identity is a revision, an adapter name, a salt: short. The bound keeps a pointer to
// something that is not a string from being read far.
constexpr size_t kMaxIdentityBytes = 4096;
constexpr size_t kCapacityPlanV1Size =
    offsetof(swiftkv_capacity_plan, lender_full_blocks) + sizeof(uint64_t);

// Both Algorithm 1 entry points end here: outputs checked, then written together.
swiftkv_status store_delta(const ScaleDelta &d, uint64_t *lender_delta_out,
                           uint64_t *borrower_delta_out) {
  require(lender_delta_out, "lender_delta_out");
  require(borrower_delta_out, "borrower_delta_out");
  *lender_delta_out = d.lender_blocks;
  *borrower_delta_out = d.borrower_blocks;
  return SWIFTKV_OK;
}

}  // namespace

CheckedModel read_model_desc(const swiftkv_model_desc *desc, const char *arg) {
  const swiftkv_model_desc defaults = SWIFTKV_MODEL_DESC_INIT;
  const swiftkv_model_desc d = read_versioned(desc, defaults, SWIFTKV_MODEL_DESC_VERSION,
                                              kModelDescV1Size, arg, "SWIFTKV_MODEL_DESC_INIT");
  ModelGeometry g;
  g.num_layers = d.num_layers;
  g.num_kv_heads = d.num_kv_heads;
  g.head_dim = d.head_dim;
  g.block_tokens = d.block_tokens;
  g.chunk_tokens = d.chunk_tokens;
  const int32_t raw_dtype = raw_enum_value(d.dtype);
  if (swiftkv::dtype_size(raw_dtype) == 0) {
    fail_invalid(std::string(arg) + "->dtype (" + std::to_string(raw_dtype) +
                 ") is not a swiftkv_dtype");
  }
  g.dtype = static_cast<swiftkv_dtype>(raw_dtype);
  g.device = d.device;
  std::string identity;
  if (d.identity != nullptr) {
    const size_t n = strnlen(d.identity, kMaxIdentityBytes + 1);
    if (n > kMaxIdentityBytes) {
      fail_invalid(std::string(arg) + "->identity is longer than " +
                   std::to_string(kMaxIdentityBytes) + " bytes");
    }
    identity.assign(d.identity, n);
  }
  return CheckedModel{g, geometry_sizes(g, arg), std::move(identity)};
}

}  // namespace swiftkv::capi

using swiftkv::capi::read_model_desc;

extern "C" {

SWIFTKV_API uint32_t swiftkv_dtype_size(swiftkv_dtype dtype) {
  return swiftkv::dtype_size(swiftkv::capi::raw_enum_value(dtype));
}

SWIFTKV_API swiftkv_status swiftkv_geometry_bytes_per_token(const swiftkv_model_desc *m,
                                                            uint64_t *out) {
  try {
    swiftkv::capi::require(out, "out");
    const auto model = read_model_desc(m, "m");
    *out = model.sizes.bytes_per_token;
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

SWIFTKV_API swiftkv_status swiftkv_geometry_meu(const swiftkv_model_desc *borrower,
                                                const swiftkv_model_desc *lender,
                                                uint64_t *borrower_blocks_out,
                                                uint64_t *lender_blocks_out) {
  try {
    swiftkv::capi::require(borrower_blocks_out, "borrower_blocks_out");
    swiftkv::capi::require(lender_blocks_out, "lender_blocks_out");
    const auto b = read_model_desc(borrower, "borrower");
    const auto l = read_model_desc(lender, "lender");
    const swiftkv::Meu meu = swiftkv::minimum_elastic_unit(b.sizes, l.sizes);
    *borrower_blocks_out = meu.borrower_blocks;
    *lender_blocks_out = meu.lender_blocks;
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

SWIFTKV_API swiftkv_status swiftkv_geometry_lend_unit(uint64_t *borrower_chunks_out,
                                                      uint64_t *lender_blocks_out,
                                                      const swiftkv_model_desc *borrower,
                                                      const swiftkv_model_desc *lender) {
  try {
    swiftkv::capi::require(borrower_chunks_out, "borrower_chunks_out");
    swiftkv::capi::require(lender_blocks_out, "lender_blocks_out");
    const auto b = read_model_desc(borrower, "borrower");
    const auto l = read_model_desc(lender, "lender");
    const swiftkv::LendUnit u = swiftkv::lend_unit(b.sizes, l.sizes);
    *borrower_chunks_out = u.borrower_chunks;
    *lender_blocks_out = u.lender_blocks;
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

SWIFTKV_API swiftkv_status swiftkv_plan_borrower(const swiftkv_model_desc *borrower,
                                                 uint64_t borrower_kv_bytes,
                                                 const uint64_t *lender_kv_bytes, size_t n_lenders,
                                                 swiftkv_capacity_plan *out) {
  try {
    if (lender_kv_bytes == nullptr && n_lenders != 0) {
      swiftkv::fail_invalid("lender_kv_bytes is NULL but n_lenders is " +
                            std::to_string(n_lenders));
    }
    swiftkv::capi::require(out, "out");
    const auto b = read_model_desc(borrower, "borrower");
    const swiftkv::CapacityPlan p = swiftkv::plan_borrower(
        b.geometry, b.sizes, borrower_kv_bytes,
        std::span<const uint64_t>(lender_kv_bytes, lender_kv_bytes ? n_lenders : 0));
    swiftkv_capacity_plan result = SWIFTKV_CAPACITY_PLAN_INIT;
    result.stream_blocks = p.stream_blocks;
    result.regular_blocks = p.regular_blocks;
    result.max_context_tokens = p.max_context_tokens;
    result.baseline_context_tokens = p.baseline_context_tokens;
    result.lender_full_blocks = p.lender_full_blocks;
    swiftkv::capi::write_versioned(out, result, SWIFTKV_CAPACITY_PLAN_VERSION,
                                   swiftkv::capi::kCapacityPlanV1Size, "out",
                                   "SWIFTKV_CAPACITY_PLAN_INIT");
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

SWIFTKV_API swiftkv_status swiftkv_plan_scale_up(uint64_t owned_blocks, uint32_t block_tokens,
                                                 uint64_t meu_lender, uint64_t meu_borrower,
                                                 uint64_t request_tokens,
                                                 uint64_t *lender_delta_out,
                                                 uint64_t *borrower_delta_out) {
  try {
    const swiftkv::ScaleStep step{owned_blocks, block_tokens, meu_lender, meu_borrower};
    return swiftkv::capi::store_delta(swiftkv::scale_up(step, request_tokens), lender_delta_out,
                                      borrower_delta_out);
  }
  SWIFTKV_CATCH_ALL
}

SWIFTKV_API swiftkv_status swiftkv_plan_scale_down(uint64_t owned_blocks, uint32_t block_tokens,
                                                   uint64_t meu_lender, uint64_t meu_borrower,
                                                   uint64_t max_tokens_in_window,
                                                   uint64_t *lender_delta_out,
                                                   uint64_t *borrower_delta_out) {
  try {
    const swiftkv::ScaleStep step{owned_blocks, block_tokens, meu_lender, meu_borrower};
    return swiftkv::capi::store_delta(swiftkv::scale_down(step, max_tokens_in_window),
                                      lender_delta_out, borrower_delta_out);
  }
  SWIFTKV_CATCH_ALL
}

}  // extern "C"
