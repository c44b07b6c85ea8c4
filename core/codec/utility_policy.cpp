#include "core/codec/utility_policy.hpp"

#include <cmath>
#include <cstring>
#include <limits>
#include <queue>
#include <string>

#include "core/common/error.hpp"

namespace swiftkv::codec {

namespace {

bool positive(double v) { return std::isfinite(v) && v > 0; }

void check_inputs(std::span<const ChunkChoice> chunks, std::span<const TierCapacity> tiers,
                  double alpha) {
  if (tiers.empty()) fail_invalid("the policy needs at least one tier");
  if (!std::isfinite(alpha) || alpha < 0) fail_invalid("alpha must be finite and >= 0");
  for (size_t t = 0; t < tiers.size(); ++t) {
    if (!positive(tiers[t].bandwidth) || !std::isfinite(tiers[t].capacity_bytes) ||
        tiers[t].capacity_bytes < 0) {
      fail_invalid("tier " + std::to_string(t) + " needs a positive bandwidth and a capacity >= 0");
    }
  }
  for (size_t i = 0; i < chunks.size(); ++i) {
    const ChunkChoice &c = chunks[i];
    const std::string who = "chunk " + std::to_string(i);
    if (c.options.empty()) fail_invalid(who + " has no encoding options");
    if (!std::isfinite(c.freq) || c.freq < 0 || !std::isfinite(c.recompute_s) ||
        c.recompute_s < 0) {
      fail_invalid(who + " needs a frequency and a recompute time >= 0");
    }
    for (const EncodingOption &o : c.options) {
      if (!positive(o.bytes) || !(o.quality >= 0 && o.quality <= 1) || !std::isfinite(o.decode_s) ||
          o.decode_s < 0) {
        fail_invalid(who + " has an option with bytes <= 0, a quality outside [0, 1] or a decode" +
                     " time that is not finite and >= 0");
      }
    }
  }
}

// The option with the highest utility in tier t (the smallest on a tie).
int best_option(const ChunkChoice &c, const TierCapacity &t, double alpha) {
  int best = 0;
  for (int o = 1; o < static_cast<int>(c.options.size()); ++o) {
    const double u = utility(c, c.options[o], t, alpha);
    const double ub = utility(c, c.options[best], t, alpha);
    if (u > ub || (u == ub && c.options[o].bytes < c.options[best].bytes)) best = o;
  }
  return best;
}

// What a chunk in tier t under option o would do next to free room there.
struct Action {
  double per_byte = std::numeric_limits<double>::infinity();  // utility lost per byte freed
  int kind = 0;                                               // 0 compress, 1 move down, 2 drop
  int option = -1;  // compress / move down: the option it ends under
};

Action cheapest_action(const ChunkChoice &c, int t, int o, std::span<const TierCapacity> tiers,
                       double alpha) {
  const double now = utility(c, c.options[o], tiers[t], alpha);
  const double bytes = c.options[o].bytes;
  Action best;
  auto consider = [&](double after, double freed, int kind, int option) {
    const double per_byte = (now - after) / freed;
    if (per_byte < best.per_byte) best = Action{per_byte, kind, option};
  };
  for (int p = 0; p < static_cast<int>(c.options.size()); ++p) {
    if (c.options[p].bytes < bytes) {
      consider(utility(c, c.options[p], tiers[t], alpha), bytes - c.options[p].bytes, 0, p);
    }
  }
  if (t + 1 < static_cast<int>(tiers.size())) {
    const int p = best_option(c, tiers[t + 1], alpha);
    consider(utility(c, c.options[p], tiers[t + 1], alpha), bytes, 1, p);
  }
  consider(dropped_utility(c, alpha), bytes, 2, -1);
  return best;
}

}  // namespace

double utility(const ChunkChoice &c, const EncodingOption &o, const TierCapacity &t, double alpha) {
  return c.freq * (alpha * o.quality - o.bytes / t.bandwidth - o.decode_s);
}

double dropped_utility(const ChunkChoice &c, double alpha) {
  return c.freq * (alpha - c.recompute_s);
}

PolicyResult place_chunks(std::span<const ChunkChoice> chunks, std::span<const TierCapacity> tiers,
                          double alpha) {
  check_inputs(chunks, tiers, alpha);
  PolicyResult r;
  r.placements.resize(chunks.size());
  r.used_bytes.assign(tiers.size(), 0.0);
  // Every chunk in the fastest tier under its best option there.
  for (size_t i = 0; i < chunks.size(); ++i) {
    const int o = best_option(chunks[i], tiers[0], alpha);
    r.placements[i] = Placement{0, o};
    r.used_bytes[0] += chunks[i].options[o].bytes;
  }
  // Tier by tier, fastest first: a chunk moved down joins the next tier's queue.
  struct Item {
    double per_byte;
    size_t chunk;
    bool operator>(const Item &b) const {
      return per_byte > b.per_byte || (per_byte == b.per_byte && chunk > b.chunk);
    }
  };
  std::vector<size_t> members;
  for (size_t i = 0; i < chunks.size(); ++i) members.push_back(i);
  for (int t = 0; t < static_cast<int>(tiers.size()); ++t) {
    std::priority_queue<Item, std::vector<Item>, std::greater<>> queue;
    for (size_t i : members) {
      const Placement &p = r.placements[i];
      queue.push({cheapest_action(chunks[i], t, p.option, tiers, alpha).per_byte, i});
    }
    std::vector<size_t> moved;
    while (r.used_bytes[t] > tiers[t].capacity_bytes && !queue.empty()) {
      const size_t i = queue.top().chunk;
      queue.pop();
      Placement &p = r.placements[i];
      const ChunkChoice &c = chunks[i];
      const Action a = cheapest_action(c, t, p.option, tiers, alpha);
      r.used_bytes[t] -= c.options[p.option].bytes;
      if (a.kind == 0) {  // compressed further: it stays, and may act again
        p.option = a.option;
        r.used_bytes[t] += c.options[p.option].bytes;
        queue.push({cheapest_action(c, t, p.option, tiers, alpha).per_byte, i});
      } else if (a.kind == 1) {
        p = Placement{t + 1, a.option};
        r.used_bytes[t + 1] += c.options[a.option].bytes;
        moved.push_back(i);
      } else {
        p = Placement{};
      }
    }
    members = std::move(moved);
  }
  for (size_t i = 0; i < chunks.size(); ++i) {
    const Placement &p = r.placements[i];
    r.utility += p.tier < 0 ? dropped_utility(chunks[i], alpha)
                            : utility(chunks[i], chunks[i].options[p.option], tiers[p.tier], alpha);
  }
  return r;
}

int entry_choice(const ChunkChoice &c, const TierCapacity &t, double alpha, double price) {
  check_inputs(std::span<const ChunkChoice>(&c, 1), std::span<const TierCapacity>(&t, 1), alpha);
  if (!std::isfinite(price) || price < 0) fail_invalid("a tier's price must be finite and >= 0");
  int best = 0;
  double best_value = utility(c, c.options[0], t, alpha) - price * c.options[0].bytes;
  for (int o = 1; o < static_cast<int>(c.options.size()); ++o) {
    const double v = utility(c, c.options[o], t, alpha) - price * c.options[o].bytes;
    if (v > best_value || (v == best_value && c.options[o].bytes < c.options[best].bytes)) {
      best = o;
      best_value = v;
    }
  }
  return best;
}

double reconstruction_quality(const ChunkShape &s, const CodecParams &p,
                              std::span<const std::byte> raw) {
  if (lossless(p.codec)) return 1.0;
  const std::vector<std::byte> frame = encode(s, p, raw);
  std::vector<std::byte> back(raw.size());
  decode(frame, s, back);
  double err = 0, ref = 0;
  for (uint64_t i = 0; i < s.elements(); ++i) {
    uint16_t a, b;
    std::memcpy(&a, &raw[i * 2], 2);
    std::memcpy(&b, &back[i * 2], 2);
    const double x = element_to_float(a, s.dtype), y = element_to_float(b, s.dtype);
    err += (x - y) * (x - y);
    ref += x * x;
  }
  if (ref == 0) return err == 0 ? 1.0 : 0.0;
  return std::max(0.0, 1.0 - std::sqrt(err / ref));
}

}  // namespace swiftkv::codec
