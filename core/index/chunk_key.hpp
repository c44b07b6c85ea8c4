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

// The longest name a caller may give a chunk (named chunks, below), in bytes.
inline constexpr size_t kMaxChunkNameBytes = 64;

// The keys of chunks named by the caller (an engine's own block or page keys): out[i] for the
// name at names + i * name_bytes, 0 < name_bytes <= kMaxChunkNameBytes. A key is XXH3-128 over
// a tag of its own, the model's fingerprint and the name's bytes: the model's identity is in it
// (another model's chunk of the same name has another key), and it never equals a token-named
// key (which hashes no tag). The name must already say everything before the chunk too (a
// chained hash), as the engines' keys do: the library chains nothing over names.
void named_chunk_keys(ChunkKey *out, const ChunkKey &fingerprint, const std::byte *names, size_t n,
                      size_t name_bytes);

// 32 lowercase hex digits, hi word first: how keys appear in file names and messages.
std::string to_hex(const ChunkKey &k);

}  // namespace swiftkv
