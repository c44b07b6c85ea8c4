// Compression at the ABI: codec parameters in and out of their versioned structs, a model's
// compression config, the controller's compress, per-chunk info and the codec counts.
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "capi/borrower.hpp"
#include "capi/capi_guard.hpp"
#include "capi/context_handle.hpp"
#include "capi/raw_enum.hpp"
#include "capi/versioned.hpp"
#include "core/tiers/chunk_encoding.hpp"

namespace swiftkv::capi {

namespace {

constexpr size_t kCodecParamsV1Size = sizeof(swiftkv_codec_params);
constexpr size_t kCompressionConfigV1Size = sizeof(swiftkv_compression_config);
constexpr size_t kCodecStatsV1Size = sizeof(swiftkv_codec_stats);

codec::CodecParams read_codec(const swiftkv_codec_params &p, const std::string &arg) {
  check_struct_header<swiftkv_codec_params>(p.size, p.version, SWIFTKV_CODEC_PARAMS_VERSION,
                                            kCodecParamsV1Size, arg.c_str(),
                                            "SWIFTKV_CODEC_PARAMS_INIT");
  if (p.reserved0 != 0) fail_invalid(arg + ".reserved0 is not 0");
  const int32_t c = raw_enum_value(p.codec);
  if (c < SWIFTKV_CODEC_RAW || c > SWIFTKV_CODEC_FP8) {
    fail_invalid(arg + ".codec (" + std::to_string(c) + ") is not a swiftkv_codec");
  }
  if (p.byte_planes > 1) fail_invalid(arg + ".byte_planes is not 0 or 1");
  if (c != SWIFTKV_CODEC_KIVI && (p.bits != 0 || p.group != 0)) {
    fail_invalid(arg + ": bits and group are kivi's; they must be 0 for another codec");
  }
  if (c != SWIFTKV_CODEC_ZSTD && p.byte_planes != 0) {
    fail_invalid(arg + ": byte_planes is zstd's; it must be 0 for another codec");
  }
  codec::CodecParams r;
  r.codec = static_cast<codec::Codec>(c);
  r.bits = p.bits;
  r.group = p.group;
  r.byte_planes = p.byte_planes != 0;
  r.zstd_level = p.zstd_level;
  return r;
}

AdaptivePolicy read_adaptive(const swiftkv_compression_config &c) {
  if (c.n_methods > SWIFTKV_MAX_COMPRESSION_METHODS) {
    fail_invalid("config->n_methods (" + std::to_string(c.n_methods) + ") is above " +
                 std::to_string(SWIFTKV_MAX_COMPRESSION_METHODS));
  }
  AdaptivePolicy a;
  a.enabled = true;
  a.alpha = c.alpha;
  a.horizon_s = c.reuse_horizon_s;
  // GB/s to bytes per second; what is not finite and positive stays so for the cache's check.
  a.host_bandwidth = c.host_gbps * 1e9;
  a.disk_bandwidth = c.disk_gbps * 1e9;
  a.recompute_bandwidth = c.recompute_gbps * 1e9;
  for (uint32_t i = 0; i < c.n_methods; ++i) {
    const std::string arg = "config->methods[" + std::to_string(i) + "]";
    AdaptiveMethod m;
    m.params = read_codec(c.methods[i].params, arg + ".params");
    m.quality = c.methods[i].quality;
    m.decode_bandwidth = c.methods[i].decode_gbps * 1e9;
    a.methods.push_back(m);
  }
  return a;
}

codec::ChunkShape shape_of(const RegisteredModel &m) {
  codec::ChunkShape s;
  s.layers = m.geometry.num_layers;
  s.tokens = m.geometry.chunk_tokens;
  s.heads = m.geometry.num_kv_heads;
  s.dim = m.geometry.head_dim;
  s.dtype = m.geometry.dtype;
  return s;
}

}  // namespace

ModelCompression default_compression(const RegisteredModel &m) {
  ModelCompression c;
  c.shape = shape_of(m);
  return c;
}

void check_info_out(const swiftkv_chunk_info *info_out, size_t info_capacity) {
  if (info_out == nullptr && info_capacity != 0) {
    fail_invalid("info_out is NULL but info_capacity is " + std::to_string(info_capacity));
  }
}

// Where and how each chunk of `keys` is cached, into info_out (checked), recording no activity.
void chunk_info(swiftkv_chunk_info *info_out, size_t info_capacity, size_t *chunks_out,
                const swiftkv_ctx *ctx, const std::vector<ChunkKey> &keys) {
  const size_t n = keys.size() < info_capacity ? keys.size() : info_capacity;
  for (size_t i = 0; i < n; ++i) {
    swiftkv_chunk_info v{};
    v.tier = SWIFTKV_TIER_DROPPED;
    if (const std::optional<ChunkView> cv = ctx->cache.view(keys[i])) {
      const codec::CodecParams p = params_of(cv->meta.encoding);
      v.tier = tier_code(cv->where.tier);
      v.codec = static_cast<uint8_t>(p.codec);
      v.bits = static_cast<uint8_t>(p.bits);
      v.group = static_cast<uint16_t>(p.group);
      v.byte_planes = p.byte_planes ? 1 : 0;
      v.lossy = cv->meta.lossy() ? 1 : 0;
      v.stored_bytes = cv->meta.stored();
    }
    info_out[i] = v;
  }
  *chunks_out = keys.size();
}

}  // namespace swiftkv::capi

using swiftkv::ChunkKey;
using swiftkv::capi::borrower;
using swiftkv::capi::keys_of;
using swiftkv::capi::require;

extern "C" {

SWIFTKV_API swiftkv_status swiftkv_compression_set(swiftkv_ctx *ctx, uint32_t model,
                                                   const swiftkv_compression_config *config) {
  try {
    require(ctx, "ctx");
    require(config, "config");
    const swiftkv_compression_config defaults = SWIFTKV_COMPRESSION_CONFIG_INIT;
    const swiftkv_compression_config c = swiftkv::capi::read_versioned(
        config, defaults, SWIFTKV_COMPRESSION_CONFIG_VERSION,
        swiftkv::capi::kCompressionConfigV1Size, "config", "SWIFTKV_COMPRESSION_CONFIG_INIT");
    if (c.reserved0 != 0) swiftkv::fail_invalid("config->reserved0 is not 0");
    if (c.accept_lossy > 1) swiftkv::fail_invalid("config->accept_lossy is not 0 or 1");
    if (c.adaptive > 1) swiftkv::fail_invalid("config->adaptive is not 0 or 1");
    const swiftkv::capi::RegisteredModel m = borrower(ctx, model);
    swiftkv::ModelCompression mc = swiftkv::capi::default_compression(m);
    mc.accept_lossy = c.accept_lossy != 0;
    const swiftkv::codec::CodecParams host = swiftkv::capi::read_codec(c.host, "config->host");
    const swiftkv::codec::CodecParams disk = swiftkv::capi::read_codec(c.disk, "config->disk");
    // Raw in the config is "as they come", not "decode whatever arrives".
    if (host.codec != swiftkv::codec::Codec::raw) mc.fixed[1] = host;
    if (disk.codec != swiftkv::codec::Codec::raw) mc.fixed[2] = disk;
    if (c.adaptive != 0) mc.adaptive = swiftkv::capi::read_adaptive(c);
    ctx->cache.set_compression(m.fingerprint, mc);
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

SWIFTKV_API swiftkv_status swiftkv_compress(uint64_t *chunks_out, swiftkv_ctx *ctx, uint32_t model,
                                            const uint32_t *tokens, size_t n_tokens,
                                            const swiftkv_codec_params *params) {
  try {
    require(chunks_out, "chunks_out");
    require(ctx, "ctx");
    std::optional<swiftkv::codec::CodecParams> to;  // none: the adaptive policy chooses
    if (params != nullptr) to = swiftkv::capi::read_codec(*params, "params");
    const swiftkv::capi::RegisteredModel m = borrower(ctx, model);
    const std::vector<ChunkKey> keys = keys_of(m, tokens, n_tokens, true);
    *chunks_out = ctx->cache.compress(m.fingerprint, keys, to);
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

SWIFTKV_API swiftkv_status swiftkv_chunk_info_get(swiftkv_chunk_info *info_out,
                                                  size_t info_capacity, size_t *chunks_out,
                                                  const swiftkv_ctx *ctx, uint32_t model,
                                                  const uint32_t *tokens, size_t n_tokens) {
  try {
    require(chunks_out, "chunks_out");
    require(ctx, "ctx");
    swiftkv::capi::check_info_out(info_out, info_capacity);
    const swiftkv::capi::RegisteredModel m = borrower(ctx, model);
    swiftkv::capi::chunk_info(info_out, info_capacity, chunks_out, ctx,
                              keys_of(m, tokens, n_tokens, false));
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

SWIFTKV_API swiftkv_status swiftkv_chunk_info_get_named(swiftkv_chunk_info *info_out,
                                                        size_t info_capacity, size_t *chunks_out,
                                                        const swiftkv_ctx *ctx, uint32_t model,
                                                        const void *names, size_t names_bytes,
                                                        uint32_t name_bytes) {
  try {
    require(chunks_out, "chunks_out");
    require(ctx, "ctx");
    swiftkv::capi::check_info_out(info_out, info_capacity);
    const swiftkv::capi::RegisteredModel m = borrower(ctx, model);
    swiftkv::capi::chunk_info(info_out, info_capacity, chunks_out, ctx,
                              swiftkv::capi::keys_of_names(m, names, names_bytes, name_bytes));
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

SWIFTKV_API swiftkv_status swiftkv_codec_stats_get(swiftkv_codec_stats *out,
                                                   const swiftkv_ctx *ctx) {
  try {
    require(ctx, "ctx");
    const swiftkv::CacheStats s = ctx->cache.stats();
    swiftkv_codec_stats v = SWIFTKV_CODEC_STATS_INIT;
    for (size_t c = 0; c < 4; ++c) {
      for (size_t t = 0; t < 3; ++t) {
        v.chunks[c][t] = s.codecs.chunks[c][t];
        v.raw_bytes[c][t] = s.codecs.raw_bytes[c][t];
        v.stored_bytes[c][t] = s.codecs.stored_bytes[c][t];
      }
    }
    v.encodes = s.encodes;
    v.decodes = s.decodes;
    v.lossy_refused = s.lossy_refused;
    swiftkv::capi::write_versioned(out, v, SWIFTKV_CODEC_STATS_VERSION,
                                   swiftkv::capi::kCodecStatsV1Size, "out",
                                   "SWIFTKV_CODEC_STATS_INIT");
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

}  // extern "C"
