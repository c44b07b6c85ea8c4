#include "core/tiers/chunk_encoding.hpp"

#include <bit>
#include <cstring>
#include <string>

#include "core/common/error.hpp"

namespace swiftkv {

void check_compression(const ModelCompression &c) {
  if (c.fixed[static_cast<size_t>(Tier::peer)]) {
    fail_invalid("the peer tier holds decoded chunks only: it takes no codec");
  }
  for (const std::optional<codec::CodecParams> &p : c.fixed) {
    if (p) codec::check_params(c.shape, *p);
  }
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

void decode_stored(std::span<const std::byte> stored, const ChunkMeta &meta,
                   const codec::ChunkShape &shape, std::byte *dst) {
  if (stored.size() != meta.stored()) {
    fail(SWIFTKV_EINTERNAL, "a stored chunk of " + std::to_string(stored.size()) +
                                " bytes; its meta says " + std::to_string(meta.stored()));
  }
  if (!meta.encoded()) {
    std::memcpy(dst, stored.data(), stored.size());
    return;
  }
  if (shape.bytes() != meta.bytes) {
    fail(SWIFTKV_EIO,
         "a chunk of " + std::to_string(meta.bytes) + " decoded bytes is not of its model's shape");
  }
  const codec::FrameInfo fi = codec::read_frame_header(stored, shape);
  // The frame must be what the index says it is: a record that says otherwise is not this chunk.
  if (!same_encoding(meta, fi.params)) {
    fail(SWIFTKV_EIO, "a chunk frame of another encoding than its index entry");
  }
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
