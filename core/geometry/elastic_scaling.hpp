// Algorithm 1 of SwiftCache (§3.4-3.5): how many blocks a lender grows by for a request
// (ScaleUp) or may release after a quiet window (ScaleDown), always in whole MEUs.
#pragma once

#include <cstdint>

namespace swiftkv {

struct ScaleStep {
  uint64_t owned_blocks;  // N_i: blocks the lender owns now
  uint32_t block_tokens;  // B_i
  uint64_t meu_lender;    // MEU_i
  uint64_t meu_borrower;  // MEU_m
};

struct ScaleDelta {
  uint64_t lender_blocks;    // k * MEU_i
  uint64_t borrower_blocks;  // k * MEU_m
};

// Lines 10-19: grow when ceil(request_tokens / B_i) exceeds N_i, by whole MEUs rounded up.
ScaleDelta scale_up(const ScaleStep &s, uint64_t request_tokens);

// Lines 21-31: shrink by the whole MEUs between N_i and ceil(max_tokens_in_window / B_i).
ScaleDelta scale_down(const ScaleStep &s, uint64_t max_tokens_in_window);

}  // namespace swiftkv
