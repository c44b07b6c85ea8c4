// Chunk keys: the 128-bit XXH3 hash that names a chunk of one model's KV. A key is chained over
// the model's fingerprint, the previous chunk's key and the chunk's own token ids, so equal keys
// mean equal prefixes of the same model.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/geometry/model_geometry.hpp"

namespace swiftkv {

struct ChunkKey {
  uint64_t lo = 0;
  uint64_t hi = 0;
  friend bool operator==(const ChunkKey &, const ChunkKey &) = default;
};

struct ChunkKeyHash {
  // The key is already a uniform hash; its low word is a good bucket index.
  size_t operator()(const ChunkKey &k) const noexcept { return static_cast<size_t>(k.lo); }
};

// The fingerprint of a model: XXH3-128 over its name, every field that shapes its KV bytes
// (layers, heads, head_dim, block and chunk tokens, dtype) and its identity (weights revision,
// adapter, tenant, salt). The device is left out: the same model on another GPU has the same
// bytes. An empty identity hashes exactly as before identities existed, so disk tiers written
// then keep their keys.
ChunkKey model_fingerprint(std::string_view name, const ModelGeometry &g,
                           std::string_view identity = {});

// The keys of the leading full chunks of `tokens`: out[i] for chunk i, i < n_tokens /
// chunk_tokens. Token ids are hashed as little-endian 32-bit words.
void chunk_keys(ChunkKey *out, const ChunkKey &fingerprint, const uint32_t *tokens, size_t n_tokens,
                uint32_t chunk_tokens);

// 32 lowercase hex digits, hi word first: how keys appear in file names and messages.
std::string to_hex(const ChunkKey &k);

}  // namespace swiftkv
