// Which chunks a full tier gives up first: LRU, or Pensieve's retention value (cost of
// recomputing a chunk over the time since its conversation was last active). Pure functions
// over plain structs; the tiers call them with a snapshot of their candidates.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
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

// One chunk a tier may give up.
struct EvictionCandidate {
  uint64_t last_active_ns = 0;  // the last lookup or store that touched the chunk
  uint64_t end_tokens = 0;      // l: tokens up to and including this chunk in its sequence
  uint32_t tokens = 0;          // s: tokens in the chunk
  uint64_t bytes = 0;           // bytes it frees
};

// Indices of `c` in the order the policy gives them up (first evicted first). LRU: oldest
// last_active first. Retention: ascending chunk_cost(s, l) / T with T = now - last_active
// (at least 1 ns), so idle conversations go first and, within one, leading chunks first. Ties
// keep the candidates' order.
std::vector<size_t> eviction_order(std::span<const EvictionCandidate> c, EvictionPolicy policy,
                                   const RecomputeCost &cost, uint64_t now_ns);

// The shortest prefix of eviction_order whose bytes reach `bytes_needed` (all of them when they
// do not).
std::vector<size_t> select_victims(std::span<const EvictionCandidate> c, EvictionPolicy policy,
                                   const RecomputeCost &cost, uint64_t now_ns,
                                   uint64_t bytes_needed);

}  // namespace swiftkv
