// Which chunks a full tier gives up first: LRU, or Pensieve's retention value (cost of
// recomputing a chunk over the time since its conversation was last active). The cost model is
// a pure function over a plain struct; EvictionOrder keeps the order the policies define.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace swiftkv {

enum class EvictionPolicy : uint8_t { lru = 0, retention = 1 };

// The cost of recomputing a chunk of s tokens that ends a context at position l (tokens before
// and including the chunk): s * (token_cost + attention(l_mid)), where l_mid = l - s / 2 is the
// chunk's middle and attention(x) is the per-token cost of attending over x tokens. Attention is
// attention_cost * x / 1024 when there is no table; with a table, entry i is the per-token cost
// at 2^i tokens, interpolated linearly between powers of two and extended in proportion to x
// beyond the last entry. Units are arbitrary but the same for both terms.
struct RecomputeCost {
  double token_cost = 1.0;      // the position-independent part (MLP, projections) per token
  double attention_cost = 1.0;  // per token, per 1024 tokens of context (no table)
  std::vector<double> attention_table;  // optional profile, entry i at 2^i tokens

  double attention(double context_tokens) const noexcept;
  double chunk_cost(uint64_t s, uint64_t l) const noexcept;
};

// Checks a cost model: costs finite and >= 0, table entries finite, >= 0 and non-decreasing.
// Throws Error(EINVAL) naming `arg`.
void check_recompute_cost(const RecomputeCost &c, const char *arg);

}  // namespace swiftkv
