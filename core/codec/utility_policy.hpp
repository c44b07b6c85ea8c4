// AdaptCache's placement policy (§2): for each chunk, which tier holds it and under which
// encoding, by marginal utility. A pure decision over numbers: the cache will feed it the
// chunks a tier must make room among, and apply what it returns.
//
//   utility(chunk, option, tier) = freq x (alpha x quality(option) - bytes(option) /
//   bandwidth(tier)
//                                          - decode_s(option))
//   utility(chunk, dropped)      = freq x (alpha - recompute_s)   (a recompute has full quality)
//
// Every chunk starts in the fastest tier under its best option. While a tier holds more than its
// capacity, the chunk whose cheapest action loses the least utility per byte it frees in that
// tier takes it: compress further (another option with fewer bytes, same tier), move down (to the
// next tier, under that tier's best option), or be dropped. Greedy, as AdaptCache's is (the exact
// problem is a multiple-choice knapsack, NP-hard); each step costs O(log n).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/codec/chunk_codec.hpp"

namespace swiftkv::codec {

// One way to store a chunk: its size and the quality of what it serves (1: exact).
struct EncodingOption {
  CodecParams params;
  double bytes = 0;
  double quality = 1;
  double decode_s = 0;  // seconds to decode it, on top of its bytes' time on the link
};

struct ChunkChoice {
  double freq = 0;                      // expected reuses (from the chunk's own history)
  double recompute_s = 0;               // seconds to recompute it when it is dropped
  std::vector<EncodingOption> options;  // at least one; usually raw first
};

struct TierCapacity {
  double capacity_bytes = 0;
  double bandwidth = 1;  // bytes per second from this tier to the GPU
};

struct Placement {
  int tier = -1;    // index into the tiers; -1: dropped
  int option = -1;  // index into the chunk's options; -1 when dropped
};

struct PolicyResult {
  std::vector<Placement> placements;  // one per chunk, in order
  std::vector<double> used_bytes;     // per tier, never above its capacity
  double utility = 0;                 // the sum over chunks
};

double utility(const ChunkChoice &c, const EncodingOption &o, const TierCapacity &t, double alpha);
double dropped_utility(const ChunkChoice &c, double alpha);

// EINVAL for no tiers, a chunk without options, a size or bandwidth that is not positive and
// finite, a quality outside [0, 1], or a negative frequency or recompute time.
PolicyResult place_chunks(std::span<const ChunkChoice> chunks, std::span<const TierCapacity> tiers,
                          double alpha);

// The online form of the policy, for a cache that cannot see every chunk at once: the option a
// chunk takes as it enters a tier, given the tier's price of a byte (the utility per byte that
// the tier's last victims lost to make room; 0 while it has room):
//   argmax_o  utility(c, o, t) - price x bytes(o)
// the Lagrangian form of place_chunks' greedy (an option is taken when what it loses per byte it
// saves is below what the tier's bytes are worth at the margin). Ties go to the smaller option.
// Same checks as place_chunks (EINVAL), and a price that is not finite and >= 0.
int entry_choice(const ChunkChoice &c, const TierCapacity &t, double alpha, double price);

// The built-in quality of an encoding of a chunk when the engine supplied no profile: 1 minus the
// relative RMS error of what it decodes to (clamped at 0); 1 for a lossless codec.
double reconstruction_quality(const ChunkShape &shape, const CodecParams &params,
                              std::span<const std::byte> raw);

}  // namespace swiftkv::codec
