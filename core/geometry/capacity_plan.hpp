// The borrower's capacity plan (SwiftCache §3.2, Eq. 1-5): how many single-layer blocks of its
// own KV memory form the layer stream cache and how many full blocks the regular cache.
#pragma once

#include <cstdint>
#include <span>

#include "core/geometry/model_geometry.hpp"

namespace swiftkv {

struct CapacityPlan {
  uint64_t stream_blocks;            // N_LSC (Eq. 4)
  uint64_t regular_blocks;           // N_RC (Eq. 5)
  uint64_t max_context_tokens;       // (N_LSC + N_RC) * B
  uint64_t baseline_context_tokens;  // floor(K_master / L) * B
  uint64_t lender_full_blocks;       // sum of K_i (Eq. 2)
};

CapacityPlan plan_borrower(const ModelGeometry &borrower, const GeometrySizes &sizes,
                           uint64_t borrower_kv_bytes, std::span<const uint64_t> lender_kv_bytes);

}  // namespace swiftkv
