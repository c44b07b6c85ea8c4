// Eq. 1-5 of SwiftCache §3.2, with the worked example (10 layers, K_master = 100, K = 9 + 8 ->
// 17 stream + 8 regular = 25 blocks against 10) as its test.
#include "core/geometry/capacity_plan.hpp"

#include <algorithm>
#include <string>

#include "core/common/checked_math.hpp"

namespace swiftkv {

CapacityPlan plan_borrower(const ModelGeometry &borrower, const GeometrySizes &sizes,
                           uint64_t borrower_kv_bytes, std::span<const uint64_t> lender_kv_bytes) {
  const uint64_t m_block = sizes.layer_block_bytes;  // Eq. 1
  const uint64_t full_block = sizes.full_block_bytes;
  const uint64_t layers = borrower.num_layers;

  uint64_t sum_k = 0;  // sum of K_i, Eq. 2
  for (size_t i = 0; i < lender_kv_bytes.size(); ++i) {
    sum_k = checked_add(sum_k, lender_kv_bytes[i] / full_block,
                        "sum over lender_kv_bytes[0.." + std::to_string(i) + "] of full blocks");
  }
  const uint64_t k_master = borrower_kv_bytes / m_block;  // Eq. 3

  CapacityPlan p{};
  p.lender_full_blocks = sum_k;
  p.stream_blocks = std::min(sum_k, k_master);                            // Eq. 4
  p.regular_blocks = sum_k < k_master ? (k_master - sum_k) / layers : 0;  // Eq. 5
  // N_LSC + N_RC <= K_master, and K_master * B <= borrower_kv_bytes / (2 H D dtype) fits, but the
  // products are still checked so that the rule has no exception.
  p.max_context_tokens = checked_mul(p.stream_blocks + p.regular_blocks, borrower.block_tokens,
                                     "borrower: max_context_tokens");
  p.baseline_context_tokens =
      checked_mul(k_master / layers, borrower.block_tokens, "borrower: baseline_context_tokens");
  return p;
}

}  // namespace swiftkv
