#include "core/tiers/chunk_encoding.hpp"

#include <bit>
#include <cmath>
#include <cstring>
#include <string>

#include "core/common/error.hpp"

namespace swiftkv {

namespace {

bool positive(double v) { return std::isfinite(v) && v > 0; }

void check_adaptive(const ModelCompression &c) {
  const AdaptivePolicy &a = c.adaptive;
  for (const std::optional<codec::CodecParams> &p : c.fixed) {
    if (p) fail_invalid("adaptive mode chooses the codecs: it takes no fixed codec beside it");
  }
  if (!std::isfinite(a.alpha) || a.alpha < 0) fail_invalid("alpha must be finite and >= 0");
  if (!positive(a.horizon_s)) fail_invalid("the reuse horizon must be finite and > 0");
  if (!positive(a.host_bandwidth) || !positive(a.disk_bandwidth) ||
      !positive(a.recompute_bandwidth)) {
    fail_invalid("the host, disk and recompute bandwidths must be finite and > 0");
  }
  if (a.methods.size() > kMaxAdaptiveMethods) {
    fail_invalid("at most " + std::to_string(kMaxAdaptiveMethods) + " methods, not " +
                 std::to_string(a.methods.size()));
  }
  for (size_t i = 0; i < a.methods.size(); ++i) {
    const AdaptiveMethod &m = a.methods[i];
    const std::string who = "method " + std::to_string(i);
    if (m.params.codec == codec::Codec::raw) {
      fail_invalid(who + " is raw: the chunk as it is is always an option");
    }
    codec::check_params(c.shape, m.params);
    if (!codec::lossless(m.params.codec) && !c.accept_lossy) {
      fail_invalid(who + " is lossy, and the model accepts exact bytes only");
    }
    if (std::isnan(m.quality) || m.quality > 1) {
      fail_invalid(who + ": a quality is in [0, 1] (negative: measured)");
    }
    if (!std::isfinite(m.decode_bandwidth) || m.decode_bandwidth < 0) {
      fail_invalid(who + ": a decode bandwidth is finite and > 0 (0: measured)");
    }
    for (size_t j = 0; j < i; ++j) {
      if (encoding_of(a.methods[j].params, false) == encoding_of(m.params, false)) {
        fail_invalid(who + " repeats method " + std::to_string(j));
      }
    }
  }
}

}  // namespace

void check_compression(const ModelCompression &c) {
  for (const Tier t : {Tier::peer, Tier::remote}) {
    if (c.fixed[tier_slot(t)]) {
      fail_invalid(std::string("the ") + tier_name(t) +
                   " tier holds decoded chunks only: it takes no codec");
    }
  }
  for (const Tier t : {Tier::host, Tier::disk}) {
    const std::optional<codec::CodecParams> &p = c.fixed[tier_slot(t)];
    if (!p) continue;
    codec::check_params(c.shape, *p);
    if (!codec::lossless(p->codec) && !c.accept_lossy) {
      fail_invalid(std::string("the ") + tier_name(t) + " codec " + codec::codec_name(p->codec) +
                   " is lossy, and the model accepts exact bytes only: its chunks could never "
                   "load (set accept_lossy)");
    }
  }
  if (c.adaptive.enabled) check_adaptive(c);
}

std::vector<AdaptiveMethod> default_adaptive_methods(const codec::ChunkShape &shape,
                                                     bool accept_lossy) {
  std::vector<codec::CodecParams> want;
  if (codec::zstd_available()) want.push_back({codec::Codec::zstd, 0, 0, true, 1});
  if (accept_lossy) {
    want.push_back({codec::Codec::kivi, 8, 32});
    want.push_back({codec::Codec::fp8});
    want.push_back({codec::Codec::kivi, 4, 32});
  }
  std::vector<AdaptiveMethod> m;
  for (const codec::CodecParams &p : want) {
    try {
      codec::check_params(shape, p);
    } catch (const Error &) {
      continue;  // a shape this method does not take (an element type, a group size)
    }
    m.push_back(AdaptiveMethod{p});
  }
  return m;
}

uint32_t encoding_of(const codec::CodecParams &p, bool lossy) noexcept {
  uint32_t e = static_cast<uint32_t>(p.codec) & kEncodingCodecMask;
  if (p.codec == codec::Codec::kivi) {
    e |= (p.bits & 0xff) << 8;
    e |= static_cast<uint32_t>(std::countr_zero(p.group) & 0xff) << 16;
  }
  if (p.codec == codec::Codec::zstd && p.byte_planes) e |= uint32_t{1} << 24;
  if (lossy || !codec::lossless(p.codec)) e |= kEncodingLossy;
  return e;
}

codec::CodecParams params_of(uint32_t encoding) noexcept {
  codec::CodecParams p;
  p.codec = static_cast<codec::Codec>(encoding & kEncodingCodecMask);
  if (p.codec == codec::Codec::kivi) {
    p.bits = (encoding >> 8) & 0xff;
    p.group = uint32_t{1} << ((encoding >> 16) & 0x1f);
  }
  p.byte_planes = p.codec == codec::Codec::zstd && ((encoding >> 24) & 1) != 0;
  return p;
}

bool same_encoding(const ChunkMeta &meta, const codec::CodecParams &to) noexcept {
  return (meta.encoding & ~kEncodingLossy) == (encoding_of(to, false) & ~kEncodingLossy);
}

namespace {

void check_stored_size(std::span<const std::byte> stored, const ChunkMeta &meta) {
  if (stored.size() != meta.stored()) {
    fail(SWIFTKV_EINTERNAL, "a stored chunk of " + std::to_string(stored.size()) +
                                " bytes; its meta says " + std::to_string(meta.stored()));
  }
}

}  // namespace

codec::FrameInfo check_stored_frame(std::span<const std::byte> stored, const ChunkMeta &meta,
                                    const codec::ChunkShape &shape) {
  check_stored_size(stored, meta);
  if (shape.bytes() != meta.bytes) {
    fail(SWIFTKV_EIO,
         "a chunk of " + std::to_string(meta.bytes) + " decoded bytes is not of its model's shape");
  }
  const codec::FrameInfo fi = codec::read_frame_header(stored, shape);
  // The frame must be what the index says it is: a record that says otherwise is not this chunk.
  if (!same_encoding(meta, fi.params)) {
    fail(SWIFTKV_EIO, "a chunk frame of another encoding than its index entry");
  }
  return fi;
}

void decode_stored(std::span<const std::byte> stored, const ChunkMeta &meta,
                   const codec::ChunkShape &shape, std::byte *dst) {
  if (!meta.encoded()) {
    check_stored_size(stored, meta);
    std::memcpy(dst, stored.data(), stored.size());
    return;
  }
  check_stored_frame(stored, meta, shape);
  codec::decode(stored, shape, std::span<std::byte>(dst, meta.bytes));
}

Encoded encode_chunk(std::span<const std::byte> decoded, const ChunkMeta &meta,
                     const codec::ChunkShape &shape, const codec::CodecParams &to) {
  Encoded r;
  r.meta = meta;
  const bool lossy = meta.lossy() || !codec::lossless(to.codec);
  if (to.codec == codec::Codec::raw) {
    r.bytes.assign(decoded.begin(), decoded.end());
    r.meta.stored_bytes = 0;
    r.meta.encoding = lossy ? kEncodingLossy : 0;
    return r;
  }
  r.bytes = codec::encode(shape, to, decoded);
  r.meta.stored_bytes = r.bytes.size();
  r.meta.encoding = encoding_of(to, lossy);
  return r;
}

}  // namespace swiftkv
