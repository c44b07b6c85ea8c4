// Algorithm 1 (ScaleUp / ScaleDown) with its inputs validated and its products checked.
// The line numbers in comments are the paper's.
#include "core/geometry/elastic_scaling.hpp"

#include <string>

#include "core/common/checked_math.hpp"
#include "core/common/error.hpp"

namespace swiftkv {

namespace {

void validate(const ScaleStep &s) {
  if (s.block_tokens == 0) fail_invalid("block_tokens is 0; it must be at least 1");
  if (s.meu_lender == 0) fail_invalid("meu_lender is 0; it must be at least 1");
  if (s.meu_borrower == 0) fail_invalid("meu_borrower is 0; it must be at least 1");
}

ScaleDelta in_meus(const ScaleStep &s, uint64_t k, const char *what) {
  const std::string w(what);
  return ScaleDelta{checked_mul(k, s.meu_lender, w + ": lender delta (k * meu_lender)"),
                    checked_mul(k, s.meu_borrower, w + ": borrower delta (k * meu_borrower)")};
}

}  // namespace

ScaleDelta scale_up(const ScaleStep &s, uint64_t request_tokens) {
  validate(s);
  const uint64_t need = ceil_div(request_tokens, s.block_tokens);  // line 11
  if (need <= s.owned_blocks) return ScaleDelta{0, 0};             // lines 12-13
  const uint64_t diff = need - s.owned_blocks;                     // line 15
  const uint64_t k = ceil_div(diff, s.meu_lender);                 // line 16
  return in_meus(s, k, "scale up");                                // line 17
}

ScaleDelta scale_down(const ScaleStep &s, uint64_t max_tokens_in_window) {
  validate(s);
  const uint64_t max_need = ceil_div(max_tokens_in_window, s.block_tokens);  // line 23
  if (max_need >= s.owned_blocks) return ScaleDelta{0, 0};                   // lines 24-25
  const uint64_t diff = s.owned_blocks - max_need;                           // line 27
  const uint64_t k = diff / s.meu_lender;                                    // line 28
  return in_meus(s, k, "scale down");                                        // line 29
}

}  // namespace swiftkv
