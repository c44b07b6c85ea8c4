// How the chunk cache stores a chunk under a codec: the encoding word the index keeps
// (ChunkMeta::encoding), what each model asks of compression, and the steps between a chunk's
// stored bytes and its decoded bytes. docs/codecs.md describes the frames and the rules.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "core/codec/chunk_codec.hpp"
#include "core/index/chunk_index.hpp"

namespace swiftkv {

// Adaptive mode (AdaptCache §2, docs/codecs.md "The adaptive policy"): the cache chooses each
// chunk's encoding as it enters host memory or the disk, by utility
//   freq x (alpha x quality - stored bytes / bandwidth(tier)) - price(tier) x stored bytes
// among the chunk as it is and the methods below; a full tier's price is what its last victims
// lost per byte, so chunks are compressed further as the fast tiers fill. A method's time to
// decode counts beside its bytes' time on the link.
struct AdaptiveMethod {
  codec::CodecParams params;    // never raw: the chunk as it is is always an option
  double quality = -1;          // the engine's, in [0, 1]; negative: the built-in profile's
  double decode_bandwidth = 0;  // the engine's, decoded bytes per second; 0: measured here
  // Measured on the first chunk of the model the cache sees: stored bytes / decoded bytes, the
  // built-in quality (1 - relative RMS error) and the decoder's speed on this CPU (the fastest
  // of three decodes). The method is not chosen before (ratio 0).
  double ratio = 0;
  double measured_quality = -1;
  double measured_decode_bandwidth = 0;
  double effective_quality() const noexcept { return quality >= 0 ? quality : measured_quality; }
  double effective_decode_bandwidth() const noexcept {
    return decode_bandwidth > 0 ? decode_bandwidth : measured_decode_bandwidth;
  }
};
struct AdaptivePolicy {
  bool enabled = false;
  double alpha = 1.0;       // seconds of load time that one reuse's full quality is worth
  double horizon_s = 60.0;  // a chunk idle this long counts half as likely to be reused
  // Bytes per second to the GPU from host memory and disk, and the decoded bytes per second a
  // recompute makes (a dropped chunk's cost).
  double host_bandwidth = 25e9;
  double disk_bandwidth = 3e9;
  double recompute_bandwidth = 1.5e9;
  std::vector<AdaptiveMethod> methods;
  bool measured = false;  // ratio and built-in qualities filled in
};
inline constexpr size_t kMaxAdaptiveMethods = 8;

// What a registered model asks of compression.
struct ModelCompression {
  codec::ChunkShape shape;  // the model's chunk (layers, chunk tokens, heads, dim, dtype)
  // Fixed mode: the encoding of the model's exact chunks placed in each tier (none: as they
  // come). Never for the peer tier, whose lent memory holds decoded chunks only.
  std::array<std::optional<codec::CodecParams>, kTierCount> fixed{};
  // Whether loads and retrieves may return a lossy chunk (decoded); otherwise it ends the cached
  // run as a miss would.
  bool accept_lossy = false;
  AdaptivePolicy adaptive;  // exclusive with fixed codecs
};

// The methods adaptive mode uses when the engine names none: zstd over byte planes (in builds
// with libzstd), and for a model that accepts lossy chunks KIVI 8-bit and 4-bit (group 32) and
// FP8; each only where the shape takes it.
std::vector<AdaptiveMethod> default_adaptive_methods(const codec::ChunkShape &shape,
                                                     bool accept_lossy);

// EINVAL for a fixed codec on the peer tier or parameters the shape does not take; in adaptive
// mode, for fixed codecs beside it, a raw, repeated or (for a model that wants exact bytes) lossy
// method, more than kMaxAdaptiveMethods, a quality above 1, or a bandwidth, horizon or alpha that
// is not finite and positive (alpha: >= 0). EUNSUPPORTED for zstd in a build without it.
void check_compression(const ModelCompression &c);

// The encoding word of chunks encoded under `p` (lossy: the chunk was already approximate).
uint32_t encoding_of(const codec::CodecParams &p, bool lossy) noexcept;
// The parameters an encoding word names (its zstd level is not kept: 1).
codec::CodecParams params_of(uint32_t encoding) noexcept;

// An encoded chunk's stored bytes checked against its index entry: EINTERNAL when they are not
// meta.stored() long; EIO when its model's shape is not meta.bytes or the frame is malformed, of
// another shape or of another encoding than the entry's (a record that is not this chunk).
codec::FrameInfo check_stored_frame(std::span<const std::byte> stored, const ChunkMeta &meta,
                                    const codec::ChunkShape &shape);

// A chunk's decoded bytes from its stored ones: `stored` (meta.stored() bytes) decoded into
// dst (meta.bytes). EIO when the frame is not a valid encoding of the shape.
void decode_stored(std::span<const std::byte> stored, const ChunkMeta &meta,
                   const codec::ChunkShape &shape, std::byte *dst);

// A chunk's bytes under another encoding, with the meta that describes them.
struct Encoded {
  ChunkMeta meta;
  std::vector<std::byte> bytes;
};
// `decoded` (meta.bytes of them) encoded under `to` (raw: the bytes as they are); the result
// is lossy when the chunk was or `to` is.
Encoded encode_chunk(std::span<const std::byte> decoded, const ChunkMeta &meta,
                     const codec::ChunkShape &shape, const codec::CodecParams &to);

// Whether a chunk stored as `meta` is already what `to` would make of it (the same codec and
// parameters; the zstd level is not compared).
bool same_encoding(const ChunkMeta &meta, const codec::CodecParams &to) noexcept;

}  // namespace swiftkv
