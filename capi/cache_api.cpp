// Model registration and the borrower's chunk cache at the ABI: model ids to fingerprints, token
// arrays to chunk keys, and the cache's results into versioned structs.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "capi/borrower.hpp"
#include "capi/capi_guard.hpp"
#include "capi/context_handle.hpp"
#include "capi/elastic_handle.hpp"
#include "capi/model_desc.hpp"
#include "capi/raw_enum.hpp"
#include "capi/versioned.hpp"

namespace swiftkv::capi {

namespace {

constexpr size_t kModelConfigV1Size = offsetof(swiftkv_model_config, reserved0) + sizeof(uint32_t);
constexpr size_t kLookupResultV1Size =
    offsetof(swiftkv_lookup_result, chunks_per_tier) + 3 * sizeof(uint64_t);
constexpr size_t kStatsV1Size = offsetof(swiftkv_stats, demotions_deferred) + sizeof(uint64_t);

Tier read_tier(swiftkv_tier t, const char *arg) {
  const int32_t v = raw_enum_value(t);
  const std::optional<Tier> tier = v >= 0 ? tier_of_code(static_cast<uint32_t>(v)) : std::nullopt;
  if (!tier) {
    fail_invalid(std::string(arg) + " (" + std::to_string(v) + ") is not a tier a chunk can be in");
  }
  return *tier;
}

// The lookup of chunks by key into the caller's result and residency (both checked first).
void lookup_keys(swiftkv_lookup_result *out, uint8_t *residency_out, size_t residency_capacity,
                 swiftkv_ctx *ctx, const RegisteredModel &m, const std::vector<ChunkKey> &keys) {
  std::vector<uint8_t> residency(keys.size());
  const LookupResult r = ctx->cache.lookup(keys, residency.data());
  const uint64_t c = m.geometry.chunk_tokens;
  swiftkv_lookup_result v = SWIFTKV_LOOKUP_RESULT_INIT;
  v.chunks = r.chunks;
  v.dropped_head_tokens = r.dropped_head * c;
  v.loadable_tokens = r.loadable * c;
  v.prefix_tokens = r.prefix * c;
  for (size_t t = 0; t < 3; ++t) v.chunks_per_tier[t] = r.per_tier[t];
  v.remote_chunks = r.per_tier[tier_slot(Tier::remote)];
  write_versioned(out, v, SWIFTKV_LOOKUP_RESULT_VERSION, kLookupResultV1Size, "out",
                  "SWIFTKV_LOOKUP_RESULT_INIT");
  const size_t n = residency.size() < residency_capacity ? residency.size() : residency_capacity;
  if (n != 0) std::memcpy(residency_out, residency.data(), n);
}

// Checks what a lookup writes to, before anything is touched (a bad call changes no activity
// time or counter).
void check_lookup_out(swiftkv_lookup_result *out, uint8_t *residency_out,
                      size_t residency_capacity) {
  require(out, "out");
  if (residency_out == nullptr && residency_capacity != 0) {
    fail_invalid("residency_out is NULL but residency_capacity is " +
                 std::to_string(residency_capacity));
  }
  check_struct_header<swiftkv_lookup_result>(out->size, out->version, SWIFTKV_LOOKUP_RESULT_VERSION,
                                             kLookupResultV1Size, "out",
                                             "SWIFTKV_LOOKUP_RESULT_INIT");
}

// Stores chunks `keys` from kv (checked: exactly one chunk's bytes per key), the first being
// chunk first_position of its sequence. *leading_out: the leading keys cached, also when a
// chunk fails to write (the error is rethrown after it is set).
void store_keys(uint64_t *leading_out, swiftkv_ctx *ctx, const RegisteredModel &m,
                const std::vector<ChunkKey> &keys, const void *kv, size_t kv_bytes,
                uint64_t first_position) {
  if (kv == nullptr && !keys.empty()) fail_invalid("kv is NULL");
  const uint64_t chunk_bytes = m.sizes.full_chunk_bytes;
  if (kv_bytes / chunk_bytes != keys.size() || kv_bytes % chunk_bytes != 0) {
    fail_invalid("kv_bytes (" + std::to_string(kv_bytes) + ") is not " +
                 std::to_string(keys.size()) + " chunks of " + std::to_string(chunk_bytes) +
                 " bytes");
  }
  if (first_position + keys.size() > UINT32_MAX) {
    fail_invalid("first_chunk (" + std::to_string(first_position) + ") and " +
                 std::to_string(keys.size()) + " chunks pass chunk number 2^32 - 1");
  }
  // A chunk that fails to write ends the call; what was stored before it stays, and says so.
  uint64_t leading = 0;
  try {
    ctx->cache.store(m.fingerprint, keys, m.geometry.chunk_tokens, chunk_bytes,
                     static_cast<const std::byte *>(kv), &leading,
                     static_cast<uint32_t>(first_position));
  } catch (...) {
    *leading_out = leading;
    throw;
  }
  *leading_out = leading;
}

// Copies the chunks keys[first..] into kv (a whole number of chunks, checked), as many as it
// holds: how many were copied.
uint64_t retrieve_keys(swiftkv_ctx *ctx, const RegisteredModel &m,
                       const std::vector<ChunkKey> &keys, uint64_t first, void *kv,
                       size_t kv_bytes) {
  const uint64_t chunk_bytes = m.sizes.full_chunk_bytes;
  if (kv_bytes % chunk_bytes != 0) {
    fail_invalid("kv_bytes (" + std::to_string(kv_bytes) + ") is not a whole number of " +
                 std::to_string(chunk_bytes) + "-byte chunks");
  }
  if (kv == nullptr && kv_bytes != 0) fail_invalid("kv is NULL");
  const uint64_t fit = kv_bytes / chunk_bytes;
  const size_t end = static_cast<size_t>(first + fit < keys.size() ? first + fit : keys.size());
  return ctx->cache.retrieve(std::span<const ChunkKey>(keys.data(), end), first, chunk_bytes,
                             static_cast<std::byte *>(kv));
}

void check_tier_mask(uint32_t tier_mask) {
  if (tier_mask == 0 || (tier_mask & ~SWIFTKV_TIERS_ALL) != 0) {
    fail_invalid("tier_mask (" + std::to_string(tier_mask) +
                 ") must be a non-empty set of SWIFTKV_TIER_BIT values");
  }
}

// Moves chunks `keys` to tier t (checked to be configured for the model).
uint64_t move_keys(swiftkv_ctx *ctx, const RegisteredModel &m, const std::vector<ChunkKey> &keys,
                   Tier t) {
  if (!ctx->cache.configured(t, m.fingerprint)) {
    fail_invalid(std::string("tier ") + tier_name(t) + " is not configured for " + m.name +
                 (t == Tier::peer     ? " (it borrows no lent memory of this host)"
                  : t == Tier::remote ? " (it borrows no lent memory of another host)"
                  : t == Tier::host   ? " (the context has no host_budget_bytes)"
                                      : " (the context has no disk_path)"));
  }
  return ctx->cache.move(keys, t);
}

}  // namespace

}  // namespace swiftkv::capi

using swiftkv::ChunkKey;
using swiftkv::Tier;
using swiftkv::capi::borrower;
using swiftkv::capi::keys_of;
using swiftkv::capi::keys_of_names;
using swiftkv::capi::require;

extern "C" {

SWIFTKV_API swiftkv_status swiftkv_model_register(uint32_t *model_out, swiftkv_ctx *ctx,
                                                  const swiftkv_model_config *config) {
  try {
    require(model_out, "model_out");
    require(ctx, "ctx");
    const swiftkv_model_config defaults = SWIFTKV_MODEL_CONFIG_INIT;
    const swiftkv_model_config c = swiftkv::capi::read_versioned(
        config, defaults, SWIFTKV_MODEL_CONFIG_VERSION, swiftkv::capi::kModelConfigV1Size, "config",
        "SWIFTKV_MODEL_CONFIG_INIT");
    if (c.reserved0 != 0) swiftkv::fail_invalid("config->reserved0 is not 0");
    require(c.desc, "config->desc");
    const swiftkv::capi::CheckedModel m = swiftkv::capi::read_model_desc(c.desc, "config->desc");
    if (c.desc->name == nullptr || c.desc->name[0] == '\0') {
      swiftkv::fail_invalid("config->desc->name is required: it keys the model's chunks");
    }
    const int32_t role = swiftkv::capi::raw_enum_value(c.role);
    if (role != SWIFTKV_ROLE_LENDER && role != SWIFTKV_ROLE_BORROWER) {
      swiftkv::fail_invalid("config->role (" + std::to_string(role) + ") is not a swiftkv_role");
    }
    swiftkv::capi::RegisteredModel r{
        c.desc->name, m.geometry, m.sizes,
        swiftkv::model_fingerprint(c.desc->name, m.geometry, m.identity),
        static_cast<swiftkv_role>(role)};
    std::unique_lock lock(ctx->models_mu);
    for (const auto &[id, other] : ctx->models) {
      if (other.fingerprint == r.fingerprint) {
        swiftkv::fail(SWIFTKV_EBUSY, "model '" + r.name +
                                         "' with this geometry and identity is "
                                         "registered already as model " +
                                         std::to_string(id));
      }
    }
    if (ctx->next_model == SWIFTKV_MODEL_ALL) {
      swiftkv::fail(SWIFTKV_ENOMEM, "the context has used every model id");
    }
    const uint32_t id = ctx->next_model++;
    const bool cache = r.role == SWIFTKV_ROLE_BORROWER;
    const uint64_t chunk_bytes = r.sizes.full_chunk_bytes;
    const swiftkv::ModelCompression compression = swiftkv::capi::default_compression(r);
    const ChunkKey fingerprint = r.fingerprint;
    ctx->models.emplace(id, std::move(r));
    lock.unlock();
    if (cache) {
      ctx->cache.reserve_for(chunk_bytes);
      ctx->cache.set_compression(fingerprint, compression);
    }
    *model_out = id;
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

SWIFTKV_API swiftkv_status swiftkv_model_unregister(swiftkv_ctx *ctx, uint32_t model) {
  try {
    require(ctx, "ctx");
    if (ctx->cache.in_event_callback()) {
      // The chunks it gives back may be the ones this thread is moving.
      swiftkv::fail(SWIFTKV_ESTATE, "called from the context's chunk event callback");
    }
    swiftkv::capi::RegisteredModel m;
    {
      std::unique_lock lock(ctx->models_mu);
      const auto it = ctx->models.find(model);
      if (it == ctx->models.end()) {
        swiftkv::fail(SWIFTKV_ENOTFOUND, "model " + std::to_string(model) + " is not registered");
      }
      {
        std::lock_guard io(ctx->io_mu);
        for (const auto &[id, p] : ctx->pools) {
          if (p.model == model) {
            swiftkv::fail(SWIFTKV_EBUSY, "model " + std::to_string(model) + " still has pool " +
                                             std::to_string(id) + "; destroy it first");
          }
        }
      }
      m = std::move(it->second);
      ctx->models.erase(it);
    }
    if (m.role == SWIFTKV_ROLE_BORROWER) ctx->cache.give_back(m.fingerprint);
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

SWIFTKV_API swiftkv_status swiftkv_lookup(swiftkv_lookup_result *out, uint8_t *residency_out,
                                          size_t residency_capacity, swiftkv_ctx *ctx,
                                          uint32_t model, const uint32_t *tokens, size_t n_tokens) {
  try {
    require(ctx, "ctx");
    swiftkv::capi::check_lookup_out(out, residency_out, residency_capacity);
    const swiftkv::capi::RegisteredModel m = borrower(ctx, model);
    swiftkv::capi::lookup_keys(out, residency_out, residency_capacity, ctx, m,
                               keys_of(m, tokens, n_tokens, false));
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

SWIFTKV_API swiftkv_status swiftkv_store(uint64_t *cached_tokens_out, swiftkv_ctx *ctx,
                                         uint32_t model, const uint32_t *tokens, size_t n_tokens,
                                         const void *kv, size_t kv_bytes) {
  try {
    require(cached_tokens_out, "cached_tokens_out");
    require(ctx, "ctx");
    const swiftkv::capi::RegisteredModel m = borrower(ctx, model);
    const std::vector<ChunkKey> keys = keys_of(m, tokens, n_tokens, true);
    uint64_t leading = 0;
    try {
      swiftkv::capi::store_keys(&leading, ctx, m, keys, kv, kv_bytes, 0);
    } catch (const swiftkv::Error &e) {
      // The leading tokens cached are written for any failure after the arguments were checked.
      if (e.status() != SWIFTKV_EINVAL) *cached_tokens_out = leading * m.geometry.chunk_tokens;
      throw;
    } catch (...) {
      *cached_tokens_out = leading * m.geometry.chunk_tokens;
      throw;
    }
    *cached_tokens_out = leading * m.geometry.chunk_tokens;
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

SWIFTKV_API swiftkv_status swiftkv_retrieve(uint64_t *loaded_tokens_out, swiftkv_ctx *ctx,
                                            uint32_t model, const uint32_t *tokens, size_t n_tokens,
                                            uint64_t start_token, void *kv, size_t kv_bytes) {
  try {
    require(loaded_tokens_out, "loaded_tokens_out");
    require(ctx, "ctx");
    const swiftkv::capi::RegisteredModel m = borrower(ctx, model);
    const std::vector<ChunkKey> keys = keys_of(m, tokens, n_tokens, false);
    const uint64_t c = m.geometry.chunk_tokens;
    if (start_token % c != 0 || start_token / c > keys.size()) {
      swiftkv::fail_invalid("start_token (" + std::to_string(start_token) +
                            ") is not a chunk boundary within the " + std::to_string(keys.size()) +
                            " full chunks of tokens");
    }
    *loaded_tokens_out =
        swiftkv::capi::retrieve_keys(ctx, m, keys, start_token / c, kv, kv_bytes) * c;
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

SWIFTKV_API swiftkv_status swiftkv_lookup_named(swiftkv_lookup_result *out, uint8_t *residency_out,
                                                size_t residency_capacity, swiftkv_ctx *ctx,
                                                uint32_t model, const void *names,
                                                size_t names_bytes, uint32_t name_bytes) {
  try {
    require(ctx, "ctx");
    swiftkv::capi::check_lookup_out(out, residency_out, residency_capacity);
    const swiftkv::capi::RegisteredModel m = borrower(ctx, model);
    swiftkv::capi::lookup_keys(out, residency_out, residency_capacity, ctx, m,
                               keys_of_names(m, names, names_bytes, name_bytes));
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

SWIFTKV_API swiftkv_status swiftkv_store_named(uint64_t *cached_chunks_out, swiftkv_ctx *ctx,
                                               uint32_t model, const void *names,
                                               size_t names_bytes, uint32_t name_bytes,
                                               uint64_t first_chunk, const void *kv,
                                               size_t kv_bytes) {
  try {
    require(cached_chunks_out, "cached_chunks_out");
    require(ctx, "ctx");
    const swiftkv::capi::RegisteredModel m = borrower(ctx, model);
    const std::vector<ChunkKey> keys = keys_of_names(m, names, names_bytes, name_bytes);
    uint64_t leading = 0;
    try {
      swiftkv::capi::store_keys(&leading, ctx, m, keys, kv, kv_bytes, first_chunk);
    } catch (const swiftkv::Error &e) {
      if (e.status() != SWIFTKV_EINVAL) *cached_chunks_out = leading;
      throw;
    } catch (...) {
      *cached_chunks_out = leading;
      throw;
    }
    *cached_chunks_out = leading;
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

SWIFTKV_API swiftkv_status swiftkv_retrieve_named(uint64_t *loaded_chunks_out, swiftkv_ctx *ctx,
                                                  uint32_t model, const void *names,
                                                  size_t names_bytes, uint32_t name_bytes, void *kv,
                                                  size_t kv_bytes) {
  try {
    require(loaded_chunks_out, "loaded_chunks_out");
    require(ctx, "ctx");
    const swiftkv::capi::RegisteredModel m = borrower(ctx, model);
    const std::vector<ChunkKey> keys = keys_of_names(m, names, names_bytes, name_bytes);
    *loaded_chunks_out = swiftkv::capi::retrieve_keys(ctx, m, keys, 0, kv, kv_bytes);
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

SWIFTKV_API swiftkv_status swiftkv_pin_named(swiftkv_ctx *ctx, uint32_t model, const void *names,
                                             size_t names_bytes, uint32_t name_bytes) {
  try {
    require(ctx, "ctx");
    const swiftkv::capi::RegisteredModel m = borrower(ctx, model);
    ctx->cache.pin(keys_of_names(m, names, names_bytes, name_bytes));
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

SWIFTKV_API swiftkv_status swiftkv_unpin_named(swiftkv_ctx *ctx, uint32_t model, const void *names,
                                               size_t names_bytes, uint32_t name_bytes) {
  try {
    require(ctx, "ctx");
    const swiftkv::capi::RegisteredModel m = borrower(ctx, model);
    ctx->cache.unpin(keys_of_names(m, names, names_bytes, name_bytes));
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

SWIFTKV_API swiftkv_status swiftkv_clear_named(uint64_t *cleared_chunks_out, swiftkv_ctx *ctx,
                                               uint32_t model, uint32_t tier_mask,
                                               const void *names, size_t names_bytes,
                                               uint32_t name_bytes) {
  try {
    require(cleared_chunks_out, "cleared_chunks_out");
    require(ctx, "ctx");
    swiftkv::capi::check_tier_mask(tier_mask);
    const swiftkv::capi::RegisteredModel m = borrower(ctx, model);
    const std::vector<ChunkKey> keys = keys_of_names(m, names, names_bytes, name_bytes);
    *cleared_chunks_out =
        ctx->cache.clear(m.fingerprint, tier_mask, std::span<const ChunkKey>(keys));
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

SWIFTKV_API swiftkv_status swiftkv_chunk_keys_named(uint64_t *keys_out, size_t keys_capacity,
                                                    const swiftkv_ctx *ctx, uint32_t model,
                                                    const void *names, size_t names_bytes,
                                                    uint32_t name_bytes) {
  try {
    require(ctx, "ctx");
    if (keys_out == nullptr && keys_capacity != 0) {
      swiftkv::fail_invalid("keys_out is NULL but keys_capacity is " +
                            std::to_string(keys_capacity));
    }
    const swiftkv::capi::RegisteredModel m = borrower(ctx, model);
    const std::vector<ChunkKey> keys = keys_of_names(m, names, names_bytes, name_bytes);
    const size_t n = std::min(keys.size(), keys_capacity / 2);
    for (size_t i = 0; i < n; ++i) {
      keys_out[2 * i] = keys[i].lo;
      keys_out[2 * i + 1] = keys[i].hi;
    }
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

SWIFTKV_API swiftkv_status swiftkv_move_named(uint64_t *chunks_there_out, swiftkv_ctx *ctx,
                                              uint32_t model, const void *names, size_t names_bytes,
                                              uint32_t name_bytes, swiftkv_tier to) {
  try {
    require(chunks_there_out, "chunks_there_out");
    require(ctx, "ctx");
    const Tier t = swiftkv::capi::read_tier(to, "to");
    const swiftkv::capi::RegisteredModel m = borrower(ctx, model);
    *chunks_there_out =
        swiftkv::capi::move_keys(ctx, m, keys_of_names(m, names, names_bytes, name_bytes), t);
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

SWIFTKV_API swiftkv_status swiftkv_borrow(uint64_t *lease_id_out, swiftkv_ctx *ctx, uint32_t model,
                                          swiftkv_elastic *lender, uint64_t max_units) {
  try {
    require(lease_id_out, "lease_id_out");
    require(ctx, "ctx");
    require(lender, "lender");
    if (max_units == 0) swiftkv::fail_invalid("max_units is 0");
    const swiftkv::capi::RegisteredModel m = borrower(ctx, model);
    *lease_id_out =
        ctx->cache.borrow(m.fingerprint, m.sizes, swiftkv::local_lender(lender->region), max_units);
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

SWIFTKV_API swiftkv_status swiftkv_pin(swiftkv_ctx *ctx, uint32_t model, const uint32_t *tokens,
                                       size_t n_tokens) {
  try {
    require(ctx, "ctx");
    const swiftkv::capi::RegisteredModel m = borrower(ctx, model);
    ctx->cache.pin(keys_of(m, tokens, n_tokens, true));
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

SWIFTKV_API swiftkv_status swiftkv_unpin(swiftkv_ctx *ctx, uint32_t model, const uint32_t *tokens,
                                         size_t n_tokens) {
  try {
    require(ctx, "ctx");
    const swiftkv::capi::RegisteredModel m = borrower(ctx, model);
    ctx->cache.unpin(keys_of(m, tokens, n_tokens, true));
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

SWIFTKV_API swiftkv_status swiftkv_clear(uint64_t *cleared_chunks_out, swiftkv_ctx *ctx,
                                         uint32_t model, uint32_t tier_mask, const uint32_t *tokens,
                                         size_t n_tokens) {
  try {
    require(cleared_chunks_out, "cleared_chunks_out");
    require(ctx, "ctx");
    swiftkv::capi::check_tier_mask(tier_mask);
    uint64_t n = 0;
    if (model == SWIFTKV_MODEL_ALL) {
      if (tokens != nullptr || n_tokens != 0) {
        swiftkv::fail_invalid("tokens name chunks of one model; SWIFTKV_MODEL_ALL takes none");
      }
      n = ctx->cache.clear(std::nullopt, tier_mask, std::nullopt);
    } else {
      const swiftkv::capi::RegisteredModel m = borrower(ctx, model);
      if (tokens == nullptr && n_tokens == 0) {
        n = ctx->cache.clear(m.fingerprint, tier_mask, std::nullopt);
      } else {
        const std::vector<ChunkKey> keys = keys_of(m, tokens, n_tokens, true);
        n = ctx->cache.clear(m.fingerprint, tier_mask, std::span<const ChunkKey>(keys));
      }
    }
    *cleared_chunks_out = n;
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

SWIFTKV_API swiftkv_status swiftkv_move(uint64_t *chunks_there_out, swiftkv_ctx *ctx,
                                        uint32_t model, const uint32_t *tokens, size_t n_tokens,
                                        swiftkv_tier to) {
  try {
    require(chunks_there_out, "chunks_there_out");
    require(ctx, "ctx");
    const Tier t = swiftkv::capi::read_tier(to, "to");
    const swiftkv::capi::RegisteredModel m = borrower(ctx, model);
    *chunks_there_out = swiftkv::capi::move_keys(ctx, m, keys_of(m, tokens, n_tokens, true), t);
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

SWIFTKV_API swiftkv_status swiftkv_stats_get(swiftkv_stats *out, const swiftkv_ctx *ctx) {
  try {
    require(ctx, "ctx");
    const swiftkv::CacheStats s = ctx->cache.stats();
    swiftkv_stats v = SWIFTKV_STATS_INIT;
    for (size_t t = 0; t < 3; ++t) {
      v.chunks[t] = s.chunks[t];
      v.bytes[t] = s.bytes[t];
      v.capacity_bytes[t] = s.capacity_bytes[t];
      v.hits[t] = s.hits[t];
    }
    const size_t remote = swiftkv::tier_slot(Tier::remote);
    v.remote_chunks = s.chunks[remote];
    v.remote_bytes = s.bytes[remote];
    v.remote_capacity_bytes = s.capacity_bytes[remote];
    v.remote_hits = s.hits[remote];
    v.misses = s.misses;
    v.stores = s.stores;
    v.stores_rejected = s.stores_rejected;
    v.evictions = s.evictions;
    v.demotions = s.demotions;
    v.promotions = s.promotions;
    v.load_failures = s.load_failures;
    v.revocations = s.revocations;
    v.corrupt_files_removed = s.corrupt_files_removed;
    v.demotions_deferred = s.demotions_deferred;
    v.disk_files_skipped = s.disk_files_skipped;
    v.disk_records_mismatched = s.disk_records_mismatched;
    v.disk_segments_cleaned = s.disk_segments_cleaned;
    v.disk_bytes_relocated = s.disk_bytes_relocated;
    v.disk_bytes_allocated = s.disk_bytes_allocated;
    v.disk_full_refusals = s.disk_full_refusals;
    v.index_bytes = ctx->cache.index_bytes();
    v.index_capacity_chunks = ctx->cache.index_capacity();
    {
      std::lock_guard lock(ctx->io_mu);
      v.requests_open = ctx->requests.size();
    }
    swiftkv::capi::write_versioned(out, v, SWIFTKV_STATS_VERSION, swiftkv::capi::kStatsV1Size,
                                   "out", "SWIFTKV_STATS_INIT");
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

SWIFTKV_API swiftkv_status swiftkv_set_chunk_event_callback(swiftkv_ctx *ctx,
                                                            swiftkv_chunk_event_fn fn,
                                                            void *user_data) {
  try {
    require(ctx, "ctx");
    if (fn == nullptr) {
      ctx->cache.set_event_callback(nullptr);
      return SWIFTKV_OK;
    }
    ctx->cache.set_event_callback([ctx, fn, user_data](const swiftkv::ChunkEvent &e) {
      swiftkv_chunk_event ev{};
      ev.model = SWIFTKV_MODEL_ALL;
      {
        std::shared_lock lock(ctx->models_mu);
        for (const auto &[id, m] : ctx->models) {
          if (m.fingerprint == e.model) ev.model = id;
        }
      }
      ev.from = static_cast<swiftkv_tier>(swiftkv::tier_code(e.from));
      ev.to = e.to ? static_cast<swiftkv_tier>(swiftkv::tier_code(*e.to)) : SWIFTKV_TIER_DROPPED;
      ev.reason = static_cast<swiftkv_chunk_event_reason>(e.reason);
      ev.key_lo = e.key.lo;
      ev.key_hi = e.key.hi;
      fn(&ev, user_data);
    });
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

}  // extern "C"
