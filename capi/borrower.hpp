// Registered borrowers as the cache and connector calls need them: the id checked and the
// model copied out under the table's lock, and token arrays turned into chunk keys.
#pragma once

#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include "capi/context_handle.hpp"
#include "core/common/error.hpp"

namespace swiftkv::capi {

// A registered borrower; call with ctx->models_mu held.
inline RegisteredModel borrower_locked(const swiftkv_ctx *ctx, uint32_t model) {
  const auto it = ctx->models.find(model);
  if (it == ctx->models.end()) {
    fail(SWIFTKV_ENOTFOUND, "model " + std::to_string(model) + " is not registered");
  }
  if (it->second.role != SWIFTKV_ROLE_BORROWER) {
    fail(SWIFTKV_ESTATE, "model " + std::to_string(model) + " (" + it->second.name +
                             ") is a lender; only borrowers have a chunk cache");
  }
  return it->second;
}

// What a model asks of compression when it registers: nothing (its chunk shape only).
ModelCompression default_compression(const RegisteredModel &m);

inline RegisteredModel borrower(const swiftkv_ctx *ctx, uint32_t model) {
  std::shared_lock lock(ctx->models_mu);
  return borrower_locked(ctx, model);
}

// The keys of the full chunks of tokens. With `whole`, tokens must be whole chunks.
inline std::vector<ChunkKey> keys_of(const RegisteredModel &m, const uint32_t *tokens,
                                     size_t n_tokens, bool whole) {
  if (tokens == nullptr && n_tokens != 0) fail_invalid("tokens is NULL");
  const uint32_t c = m.geometry.chunk_tokens;
  if (whole && n_tokens % c != 0) {
    fail_invalid("n_tokens (" + std::to_string(n_tokens) + ") is not a multiple of " + m.name +
                 "'s chunk_tokens (" + std::to_string(c) + ")");
  }
  std::vector<ChunkKey> keys(n_tokens / c);
  chunk_keys(keys.data(), m.fingerprint, tokens, n_tokens, c);
  return keys;
}

// The keys of chunks named by the caller: names_bytes / name_bytes names of name_bytes bytes.
inline std::vector<ChunkKey> keys_of_names(const RegisteredModel &m, const void *names,
                                           size_t names_bytes, uint32_t name_bytes) {
  if (name_bytes == 0 || name_bytes > kMaxChunkNameBytes) {
    fail_invalid("name_bytes (" + std::to_string(name_bytes) + ") must be 1 to " +
                 std::to_string(kMaxChunkNameBytes));
  }
  if (names == nullptr && names_bytes != 0) fail_invalid("names is NULL");
  if (names_bytes % name_bytes != 0) {
    fail_invalid("names_bytes (" + std::to_string(names_bytes) + ") is not a whole number of " +
                 std::to_string(name_bytes) + "-byte names");
  }
  std::vector<ChunkKey> keys(names_bytes / name_bytes);
  named_chunk_keys(keys.data(), m.fingerprint, static_cast<const std::byte *>(names), keys.size(),
                   name_bytes);
  return keys;
}

}  // namespace swiftkv::capi
