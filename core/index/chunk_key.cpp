// Chunk keys and model fingerprints over libxxhash's XXH3-128. The encoding of what is hashed is
// fixed here: keys are stored on disk and must not change between releases.
#include "core/index/chunk_key.hpp"

#include <xxhash.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "core/common/error.hpp"

namespace swiftkv {

namespace {

static_assert(sizeof(uint32_t) == 4);
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "chunk keys hash token ids as little-endian words");

// Frees an XXH3 state on every path.
struct StateDeleter {
  void operator()(XXH3_state_t *s) const noexcept { XXH3_freeState(s); }
};

ChunkKey from_xxh(XXH128_hash_t h) { return ChunkKey{h.low64, h.high64}; }

}  // namespace

ChunkKey model_fingerprint(std::string_view name, const ModelGeometry &g,
                           std::string_view identity) {
  // A tag and a format number first, so a later encoding can never collide with this one.
  static constexpr char kTag[] = "swiftkv-model-fingerprint-v1";
  const std::array<uint32_t, 7> fields = {static_cast<uint32_t>(name.size()),
                                          g.num_layers,
                                          g.num_kv_heads,
                                          g.head_dim,
                                          g.block_tokens,
                                          g.chunk_tokens,
                                          static_cast<uint32_t>(g.dtype)};
  std::unique_ptr<XXH3_state_t, StateDeleter> s(XXH3_createState());
  if (!s) fail(SWIFTKV_ENOMEM, "cannot allocate an XXH3 state");
  XXH3_128bits_reset(s.get());
  XXH3_128bits_update(s.get(), kTag, sizeof kTag - 1);
  XXH3_128bits_update(s.get(), fields.data(), sizeof fields);
  XXH3_128bits_update(s.get(), name.data(), name.size());
  if (!identity.empty()) {
    // After the name, whose length is hashed above: its length, then its bytes.
    const uint32_t n = static_cast<uint32_t>(identity.size());
    XXH3_128bits_update(s.get(), &n, sizeof n);
    XXH3_128bits_update(s.get(), identity.data(), identity.size());
  }
  return from_xxh(XXH3_128bits_digest(s.get()));
}

void chunk_keys(ChunkKey *out, const ChunkKey &fingerprint, const uint32_t *tokens, size_t n_tokens,
                uint32_t chunk_tokens) {
  const size_t chunks = n_tokens / chunk_tokens;
  if (chunks == 0) return;
  // One buffer holds (fingerprint, previous key, tokens) so each key is one one-shot XXH3 call:
  // the streaming API costs more per chunk than the hash of 1 KiB itself.
  const size_t token_bytes = size_t{chunk_tokens} * sizeof(uint32_t);
  const size_t prefix = 4 * sizeof(uint64_t);
  thread_local std::string buf;
  buf.resize(prefix + token_bytes);
  char *b = buf.data();
  const uint64_t head[4] = {fingerprint.lo, fingerprint.hi, 0, 0};
  std::memcpy(b, head, sizeof head);
  for (size_t c = 0; c < chunks; ++c) {
    std::memcpy(b + prefix, tokens + c * chunk_tokens, token_bytes);
    const ChunkKey k = from_xxh(XXH3_128bits(b, prefix + token_bytes));
    out[c] = k;
    const uint64_t prev[2] = {k.lo, k.hi};
    std::memcpy(b + 2 * sizeof(uint64_t), prev, sizeof prev);
  }
}

void named_chunk_keys(ChunkKey *out, const ChunkKey &fingerprint, const std::byte *names, size_t n,
                      size_t name_bytes) {
  static constexpr char kTag[] = "swiftkv-named-chunk-v1";
  static constexpr size_t kTagBytes = sizeof kTag - 1;
  if (name_bytes == 0 || name_bytes > kMaxChunkNameBytes) {
    fail_invalid("a chunk name has " + std::to_string(name_bytes) + " bytes; 1 to " +
                 std::to_string(kMaxChunkNameBytes) + " are allowed");
  }
  // (tag, fingerprint, name length, name) in one buffer: one one-shot XXH3 call per key.
  std::array<char, kTagBytes + 2 * sizeof(uint64_t) + sizeof(uint32_t) + kMaxChunkNameBytes> b{};
  std::memcpy(b.data(), kTag, kTagBytes);
  const uint64_t fp[2] = {fingerprint.lo, fingerprint.hi};
  std::memcpy(b.data() + kTagBytes, fp, sizeof fp);
  const auto len = static_cast<uint32_t>(name_bytes);
  std::memcpy(b.data() + kTagBytes + sizeof fp, &len, sizeof len);
  const size_t head = kTagBytes + sizeof fp + sizeof len;
  for (size_t i = 0; i < n; ++i) {
    std::memcpy(b.data() + head, names + i * name_bytes, name_bytes);
    out[i] = from_xxh(XXH3_128bits(b.data(), head + name_bytes));
  }
}

std::string to_hex(const ChunkKey &k) {
  char s[33];
  std::snprintf(s, sizeof s, "%016llx%016llx", static_cast<unsigned long long>(k.hi),
                static_cast<unsigned long long>(k.lo));
  return s;
}

}  // namespace swiftkv
