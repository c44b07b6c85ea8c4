// The recompute cost model of the retention policy.
#include "core/policy/eviction_policy.hpp"

#include <cmath>
#include <string>

#include "core/common/error.hpp"

namespace swiftkv {

double RecomputeCost::attention(double x) const noexcept {
  if (attention_table.empty()) return attention_cost * x / 1024.0;
  if (x <= 1.0) return attention_table[0];
  const size_t last = attention_table.size() - 1;
  const double lg = std::log2(x);
  if (lg >= static_cast<double>(last)) {
    // Past the profile attention keeps growing with the context: scale the last entry.
    return attention_table[last] * x / std::ldexp(1.0, static_cast<int>(last));
  }
  const auto i = static_cast<size_t>(lg);
  const double lo = std::ldexp(1.0, static_cast<int>(i));
  const double t = (x - lo) / lo;  // the next power of two is 2 * lo
  return attention_table[i] + t * (attention_table[i + 1] - attention_table[i]);
}

double RecomputeCost::chunk_cost(uint64_t s, uint64_t l) const noexcept {
  const double mid = static_cast<double>(l) - static_cast<double>(s) / 2.0;
  return static_cast<double>(s) * (token_cost + attention(mid < 0 ? 0 : mid));
}

void check_recompute_cost(const RecomputeCost &c, const char *arg) {
  const std::string a(arg);
  if (!std::isfinite(c.token_cost) || c.token_cost < 0) {
    fail_invalid(a + " token cost must be finite and >= 0");
  }
  if (!std::isfinite(c.attention_cost) || c.attention_cost < 0) {
    fail_invalid(a + " attention cost must be finite and >= 0");
  }
  if (c.attention_table.size() > 63) fail_invalid(a + " table has more than 63 entries");
  for (size_t i = 0; i < c.attention_table.size(); ++i) {
    const double v = c.attention_table[i];
    if (!std::isfinite(v) || v < 0) {
      fail_invalid(a + " table entry " + std::to_string(i) + " must be finite and >= 0");
    }
    if (i > 0 && v < c.attention_table[i - 1]) {
      fail_invalid(a + " table entry " + std::to_string(i) +
                   " is below the one before it; attention cost cannot fall with context");
    }
  }
}

}  // namespace swiftkv
