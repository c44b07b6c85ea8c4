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

// What a registered model asks of compression.
struct ModelCompression {
  codec::ChunkShape shape;  // the model's chunk (layers, chunk tokens, heads, dim, dtype)
  // Fixed mode: the encoding of the model's exact chunks placed in each tier (none: as they
  // come). Never for the peer tier, whose lent memory holds decoded chunks only.
  std::array<std::optional<codec::CodecParams>, kTierCount> fixed{};
  // Whether loads and retrieves may return a lossy chunk (decoded); otherwise it ends the cached
  // run as a miss would.
  bool accept_lossy = false;
};

// EINVAL for a fixed codec on the peer tier or parameters the shape does not take;
// EUNSUPPORTED for zstd in a build without it.
void check_compression(const ModelCompression &c);

// The encoding word of chunks encoded under `p` (lossy: the chunk was already approximate).
uint32_t encoding_of(const codec::CodecParams &p, bool lossy) noexcept;
// The parameters an encoding word names (its zstd level is not kept: 1).
codec::CodecParams params_of(uint32_t encoding) noexcept;

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
