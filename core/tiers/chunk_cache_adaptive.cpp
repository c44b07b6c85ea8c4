// The chunk cache's adaptive compression (AdaptCache §2 in its online form): which encoding a
// chunk takes as it enters host memory or the disk, the reuse estimate it is weighed by, the
// built-in profile of each method, and the price of a byte that a full tier's victims set.
// docs/codecs.md "The adaptive policy" states the rule and its bounds.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "core/codec/utility_policy.hpp"
#include "core/common/error.hpp"
#include "core/tiers/chunk_cache.hpp"

namespace swiftkv {

namespace {

double bandwidth_of(const AdaptivePolicy &a, Tier t) {
  return t == Tier::disk ? a.disk_bandwidth : a.host_bandwidth;
}

// The quality of what a chunk stored as `meta` serves: 1 when exact, else its method's (1 when
// it was made by a codec the policy does not list: a fixed codec of before, or compress).
double quality_of(const ChunkMeta &meta, const AdaptivePolicy &a) {
  if (!meta.lossy()) return 1.0;
  for (const AdaptiveMethod &m : a.methods) {
    if (same_encoding(meta, m.params) && m.effective_quality() >= 0) return m.effective_quality();
  }
  return 1.0;
}

// What one reuse of a chunk stored as `meta` in tier t is worth: alpha x its quality, less the
// time its bytes take on the link and its decoder takes (a codec the policy does not list
// decodes at no modelled cost).
double value_of(const ChunkMeta &meta, Tier t, const AdaptivePolicy &a) {
  double decode_s = 0;
  if (meta.encoded()) {
    for (const AdaptiveMethod &m : a.methods) {
      if (same_encoding(meta, m.params) && m.effective_decode_bandwidth() > 0) {
        decode_s = static_cast<double>(meta.bytes) / m.effective_decode_bandwidth();
      }
    }
  }
  return a.alpha * quality_of(meta, a) - static_cast<double>(meta.stored()) / bandwidth_of(a, t) -
         decode_s;
}

}  // namespace

double ChunkCache::reuse_of(const ChunkKey &key, double horizon_s) const {
  // A chunk being stored is not resident yet: no need for the eviction order's lock.
  if (!index_.contains(key)) return 1.0;
  const std::optional<ChunkIndex::Activity> a = index_.activity(key);
  if (!a) return 1.0;
  const uint64_t t = now();
  const double idle_s = t > a->last_active ? static_cast<double>(t - a->last_active) * 1e-9 : 0.0;
  return (1.0 + a->hits) * horizon_s / (horizon_s + idle_s);
}

std::optional<codec::CodecParams> ChunkCache::adaptive_choice(const ChunkKey &key,
                                                              const ChunkMeta &meta, Tier t,
                                                              const ModelCompression &mc) const {
  if (lent(t) || meta.lossy()) return std::nullopt;
  const AdaptivePolicy &a = mc.adaptive;
  codec::ChunkChoice c;
  c.freq = reuse_of(key, a.horizon_s);
  std::vector<codec::CodecParams> params;
  c.options.push_back({codec::CodecParams{}, static_cast<double>(meta.bytes), 1.0});
  params.push_back(codec::CodecParams{});
  for (const AdaptiveMethod &m : a.methods) {
    if (m.ratio <= 0 || m.effective_quality() < 0 || m.effective_decode_bandwidth() <= 0) {
      continue;  // not measured yet
    }
    const double decoded = static_cast<double>(meta.bytes);
    c.options.push_back({m.params, m.ratio * decoded, m.effective_quality(),
                         decoded / m.effective_decode_bandwidth()});
    params.push_back(m.params);
  }
  if (c.options.size() == 1 && !meta.encoded()) return std::nullopt;
  const codec::TierCapacity tier{0, bandwidth_of(a, t)};
  const double price = store_of(t)->free_bytes(meta.model) < meta.bytes
                           ? price_[tier_slot(t)].load(std::memory_order_relaxed)
                           : 0.0;
  const codec::CodecParams &to = params[codec::entry_choice(c, tier, a.alpha, price)];
  if (same_encoding(meta, to)) return std::nullopt;
  if (to.codec == codec::Codec::raw && !meta.encoded()) return std::nullopt;
  return to;
}

void ChunkCache::measure_methods(const ChunkKey &model, const std::byte *decoded) {
  codec::ChunkShape shape;
  std::vector<AdaptiveMethod> methods;
  {
    std::shared_lock lock(comp_mu_);
    const auto it = compression_.find(model);
    if (it == compression_.end() || !it->second.adaptive.enabled || it->second.adaptive.measured) {
      return;
    }
    shape = it->second.shape;
    methods = it->second.adaptive.methods;
  }
  // The first layer stands for the chunk: a frame's payload grows with the layers, its header
  // does not.
  codec::ChunkShape one = shape;
  one.layers = 1;
  const std::span<const std::byte> raw(decoded, one.bytes());
  std::vector<std::byte> back(one.bytes());
  for (AdaptiveMethod &m : methods) {
    const std::vector<std::byte> frame = codec::encode(one, m.params, raw);
    const double payload = static_cast<double>(frame.size() - codec::kFrameHeaderBytes);
    m.ratio =
        (payload * shape.layers + codec::kFrameHeaderBytes) / static_cast<double>(shape.bytes());
    m.measured_quality = codec::reconstruction_quality(one, m.params, raw);
    double best_s = 0;
    for (int i = 0; i < 3; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      codec::decode(frame, one, back);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (i == 0 || s < best_s) best_s = s;
    }
    // A decode too short for the clock counts as a nanosecond.
    m.measured_decode_bandwidth = static_cast<double>(one.bytes()) / std::max(best_s, 1e-9);
  }
  std::unique_lock lock(comp_mu_);
  const auto it = compression_.find(model);
  if (it == compression_.end() || !it->second.adaptive.enabled || it->second.adaptive.measured) {
    return;
  }
  AdaptivePolicy &a = it->second.adaptive;
  if (a.methods.size() != methods.size()) return;  // replaced meanwhile: measured next time
  for (size_t i = 0; i < methods.size(); ++i) {
    if (encoding_of(methods[i].params, false) != encoding_of(a.methods[i].params, false)) return;
  }
  for (size_t i = 0; i < methods.size(); ++i) {
    a.methods[i].ratio = methods[i].ratio;
    a.methods[i].measured_quality = methods[i].measured_quality;
    a.methods[i].measured_decode_bandwidth = methods[i].measured_decode_bandwidth;
  }
  a.measured = true;
}

void ChunkCache::measure_from(const ChunkUse &use) {
  if (!needs_measure(use.meta.model)) return;
  std::vector<std::byte> decoded(use.meta.bytes);
  try {
    read_slot(use.where, use.meta, decoded.data());
  } catch (const Error &) {
    return;  // unreadable here: whoever moves it next finds it so and handles it
  }
  // A lossy chunk's bytes are not the model's: its errors would count twice.
  if (!use.meta.lossy()) measure_methods(use.meta.model, decoded.data());
}

void ChunkCache::carry_measurements(const AdaptivePolicy &from, AdaptivePolicy &to) {
  bool all = !to.methods.empty();
  for (AdaptiveMethod &m : to.methods) {
    for (const AdaptiveMethod &o : from.methods) {
      if (o.ratio > 0 && encoding_of(o.params, false) == encoding_of(m.params, false)) {
        m.ratio = o.ratio;
        m.measured_quality = o.measured_quality;
        m.measured_decode_bandwidth = o.measured_decode_bandwidth;
      }
    }
    all = all && m.ratio > 0;
  }
  to.measured = all;
}

bool ChunkCache::needs_measure(const ChunkKey &model) const {
  if (adaptive_models_.load(std::memory_order_relaxed) == 0) return false;
  std::shared_lock lock(comp_mu_);
  const auto it = compression_.find(model);
  return it != compression_.end() && it->second.adaptive.enabled && !it->second.adaptive.measured;
}

ChunkCache::RoomAction ChunkCache::room_action(const ChunkMeta &meta, Tier t) const {
  RoomAction best;
  if (lent(t)) return best;  // lent memory holds decoded chunks: they move down
  const std::optional<Tier> lower = lower_tier(t, meta.model);
  std::shared_lock lock(comp_mu_);
  const auto it = compression_.find(meta.model);
  if (it == compression_.end() || !it->second.adaptive.enabled) return best;
  const AdaptivePolicy &a = it->second.adaptive;
  // Each action's loss of one reuse's value per byte it frees here (the chunk's expected reuses
  // scale every action alike, so they do not change which is least). Moving down is valued as
  // the chunk as it is in the lower tier.
  const double here = value_of(meta, t, a);
  const double stored = static_cast<double>(meta.stored());
  double least = std::numeric_limits<double>::infinity();
  if (lower) least = (here - value_of(meta, *lower, a)) / stored;
  const double dropped = a.alpha - static_cast<double>(meta.bytes) / a.recompute_bandwidth;
  if ((here - dropped) / stored < least) {
    least = (here - dropped) / stored;
    best.kind = RoomAction::Kind::drop;
  }
  if (meta.lossy()) return best;  // never encoded a second time
  for (const AdaptiveMethod &m : a.methods) {
    if (m.ratio <= 0 || m.effective_quality() < 0 || m.effective_decode_bandwidth() <= 0) {
      continue;  // not measured yet
    }
    ChunkMeta smaller = meta;
    smaller.encoding = encoding_of(m.params, false);
    smaller.stored_bytes =
        static_cast<uint64_t>(std::ceil(m.ratio * static_cast<double>(meta.bytes)));
    if (smaller.stored() >= meta.stored() || same_encoding(meta, m.params)) continue;
    const double loss =
        (here - value_of(smaller, t, a)) / static_cast<double>(meta.stored() - smaller.stored());
    if (loss < least) {
      least = loss;
      best.kind = RoomAction::Kind::compress;
      best.to = m.params;
    }
  }
  return best;
}

void ChunkCache::note_victim(Tier t, const ChunkMeta &before, double reuse,
                             const std::optional<std::pair<Tier, ChunkMeta>> &after) {
  if (lent(t)) return;  // lent memory holds decoded chunks: no price to set
  double per_byte = 0;
  {
    std::shared_lock lock(comp_mu_);
    const auto it = compression_.find(before.model);
    if (it == compression_.end() || !it->second.adaptive.enabled) return;
    const AdaptivePolicy &a = it->second.adaptive;
    const double u = reuse * value_of(before, t, a);
    const double u_after =
        after ? reuse * value_of(after->second, after->first, a)
              : reuse * (a.alpha - static_cast<double>(before.bytes) / a.recompute_bandwidth);
    // Re-encoded in place, it freed only the bytes it no longer takes.
    const uint64_t kept = after && after->first == t ? after->second.stored() : 0;
    const uint64_t freed = before.stored() > kept ? before.stored() - kept : 1;
    per_byte = std::max(0.0, u - u_after) / static_cast<double>(freed);
  }
  std::atomic<double> &p = price_[tier_slot(t)];
  p.store(0.875 * p.load(std::memory_order_relaxed) + 0.125 * per_byte, std::memory_order_relaxed);
}

}  // namespace swiftkv
