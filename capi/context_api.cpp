// Context and device entry points: the versioned config is read with defaults, validated
// against the machine by swiftkv::Context, and only then is a handle returned.
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "capi/capi_guard.hpp"
#include "capi/context_handle.hpp"
#include "capi/raw_enum.hpp"
#include "capi/versioned.hpp"
#include "core/common/log.hpp"
#include "core/context/context.hpp"
#include "core/memory/device_query.hpp"

namespace {

constexpr size_t kCtxConfigV1Size =
    offsetof(swiftkv_ctx_config, disk_budget_bytes) + sizeof(uint64_t);
constexpr size_t kCtxConfigV9Size = offsetof(swiftkv_ctx_config, reserved3) + sizeof(uint32_t);
static_assert(kCtxConfigV9Size == sizeof(swiftkv_ctx_config));
constexpr uint32_t kMaxOpenRequestsLimit = uint32_t{1} << 20;

struct ReadConfig {
  swiftkv::ContextConfig context;
  swiftkv::CacheOptions cache;
  swiftkv::coord::CoordOptions coord;
  swiftkv_clock_fn clock = nullptr;  // as given, for swiftkv_ctx_get_config
  void *clock_user_data = nullptr;
  uint32_t transfer_threads = 0;  // 0: the default for this machine
  uint32_t max_open_requests = 0;
  bool write_back_on_close = true;
};

// The checks of fields that stand alone (reserved words, flags, counts).
void check_config_fields(const swiftkv_ctx_config &c) {
  if (c.reserved0 != 0) swiftkv::fail_invalid("config->reserved0 is not 0");
  if (c.reserved1 != 0) swiftkv::fail_invalid("config->reserved1 is not 0");
  if (c.reserved2 != 0) swiftkv::fail_invalid("config->reserved2 is not 0");
  if (c.reserved3 != 0) swiftkv::fail_invalid("config->reserved3 is not 0");
  if (c.write_back_on_close > 1) {
    swiftkv::fail_invalid("config->write_back_on_close (" + std::to_string(c.write_back_on_close) +
                          ") is not 0 or 1");
  }
  if (c.max_open_requests == 0 || c.max_open_requests > kMaxOpenRequestsLimit) {
    swiftkv::fail_invalid("config->max_open_requests (" + std::to_string(c.max_open_requests) +
                          ") is not in 1.." + std::to_string(kMaxOpenRequestsLimit));
  }
  if (c.transfer_threads > 64) {
    swiftkv::fail_invalid("config->transfer_threads (" + std::to_string(c.transfer_threads) +
                          ") is above 64");
  }
}

swiftkv::ContextConfig context_config(const swiftkv_ctx_config &c) {
  swiftkv::ContextConfig out;
  out.device_mask = c.device_mask;
  out.host_budget_bytes = c.host_budget_bytes;
  out.host_numa_node = c.host_numa_node;
  if (c.disk_path != nullptr) out.disk_path = std::string(c.disk_path);
  out.disk_budget_bytes = c.disk_budget_bytes;
  out.disk_segment_bytes = c.disk_segment_bytes;
  out.disk_sync_ns = uint64_t{c.disk_sync_ms} * 1'000'000;
  return out;
}

// The cache's options: eviction, demotion, the recompute cost, maintenance and the clock.
swiftkv::CacheOptions cache_options(const swiftkv_ctx_config &c) {
  swiftkv::CacheOptions o;
  const int32_t policy = swiftkv::capi::raw_enum_value(c.eviction_policy);
  if (policy != SWIFTKV_EVICT_LRU && policy != SWIFTKV_EVICT_RETENTION) {
    swiftkv::fail_invalid("config->eviction_policy (" + std::to_string(policy) +
                          ") is not a swiftkv_eviction_policy");
  }
  o.policy = static_cast<swiftkv::EvictionPolicy>(policy);
  if (c.demote_free_percent > 100) {
    swiftkv::fail_invalid("config->demote_free_percent (" + std::to_string(c.demote_free_percent) +
                          ") is above 100");
  }
  o.demote_free_percent = c.demote_free_percent;
  o.cost.token_cost = c.recompute_token_cost;
  o.cost.attention_cost = c.recompute_attention_cost;
  if (c.attention_cost_entries > 63) {
    swiftkv::fail_invalid("config->attention_cost_entries (" +
                          std::to_string(c.attention_cost_entries) + ") is above 63");
  }
  if (c.attention_cost_entries != 0 && c.attention_cost_table == nullptr) {
    swiftkv::fail_invalid("config->attention_cost_table is NULL but attention_cost_entries is " +
                          std::to_string(c.attention_cost_entries));
  }
  if (c.attention_cost_entries != 0) {
    o.cost.attention_table.assign(c.attention_cost_table,
                                  c.attention_cost_table + c.attention_cost_entries);
  }
  swiftkv::check_recompute_cost(o.cost, "config->recompute cost:");
  if (c.maintenance_interval_ms == 0) {
    swiftkv::fail_invalid("config->maintenance_interval_ms is 0; leases need renewing");
  }
  o.maintenance_interval_ms = c.maintenance_interval_ms;
  const int32_t order = swiftkv::capi::raw_enum_value(c.tier_order);
  if (order == SWIFTKV_TIER_ORDER_HOST_FIRST) {
    o.chain = {swiftkv::Tier::peer, swiftkv::Tier::host, swiftkv::Tier::remote,
               swiftkv::Tier::disk};
  } else if (order != SWIFTKV_TIER_ORDER_REMOTE_FIRST) {
    swiftkv::fail_invalid("config->tier_order (" + std::to_string(order) +
                          ") is not a swiftkv_tier_order");
  }
  if (c.clock != nullptr) {
    const swiftkv_clock_fn fn = c.clock;
    void *user = c.clock_user_data;
    o.clock = [fn, user] { return fn(user); };
  }
  return o;
}

swiftkv::coord::CoordOptions coord_options(const swiftkv_ctx_config &c) {
  swiftkv::coord::CoordOptions o;
  if (c.coord_endpoint != nullptr) o.endpoint = std::string(c.coord_endpoint);
  if (c.coord_heartbeat_ms == 0) swiftkv::fail_invalid("config->coord_heartbeat_ms is 0");
  if (c.coord_timeout_ms == 0) swiftkv::fail_invalid("config->coord_timeout_ms is 0");
  o.heartbeat_ns = uint64_t{c.coord_heartbeat_ms} * 1'000'000;
  o.timeout_ns = uint64_t{c.coord_timeout_ms} * 1'000'000;
  const int32_t path = swiftkv::capi::raw_enum_value(c.coord_remote_path);
  if (path < SWIFTKV_REMOTE_PATH_AUTO || path > SWIFTKV_REMOTE_PATH_LOCAL) {
    swiftkv::fail_invalid("config->coord_remote_path (" + std::to_string(path) +
                          ") is not a swiftkv_remote_path");
  }
  o.path = static_cast<swiftkv::coord::RemotePath>(path);
  if (c.coord_ucx_transports != nullptr) {
    const size_t n = ::strnlen(c.coord_ucx_transports, 1025);
    if (n > 1024) swiftkv::fail_invalid("config->coord_ucx_transports is over 1024 bytes");
    o.ucx_transports = std::string(c.coord_ucx_transports, n);
  }
  if (c.coord_rma_timeout_ms == 0) swiftkv::fail_invalid("config->coord_rma_timeout_ms is 0");
  o.rma_timeout_ns = uint64_t{c.coord_rma_timeout_ms} * 1'000'000;
  if (const char *e = std::getenv("SWIFTKV_COORD_HEARTBEAT"); e != nullptr && *e != '\0') {
    if (std::strcmp(e, "message") == 0) {
      o.beat_page = false;
    } else if (std::strcmp(e, "narrow-page") == 0) {
      o.beat_page_bytes = swiftkv::coord::kBeatPageBytes;  // as before wide pages
    } else if (std::strcmp(e, "page") != 0) {
      swiftkv::fail_invalid(std::string("SWIFTKV_COORD_HEARTBEAT is '") + e +
                            "': it says how a borrower on its lender's host heartbeats, page, "
                            "narrow-page or message (unset: page)");
    }
  }
  return o;
}

ReadConfig read_config(const swiftkv_ctx_config *config) {
  const swiftkv_ctx_config defaults = SWIFTKV_CTX_CONFIG_INIT;
  const swiftkv_ctx_config c =
      config == nullptr
          ? defaults
          : swiftkv::capi::read_versioned(config, defaults, SWIFTKV_CTX_CONFIG_VERSION,
                                          kCtxConfigV1Size, "config", "SWIFTKV_CTX_CONFIG_INIT");
  check_config_fields(c);
  ReadConfig r;
  r.context = context_config(c);
  r.transfer_threads = c.transfer_threads;
  r.max_open_requests = c.max_open_requests;
  r.write_back_on_close = c.write_back_on_close != 0;
  r.cache = cache_options(c);
  r.clock = c.clock;
  r.clock_user_data = c.clock != nullptr ? c.clock_user_data : nullptr;
  r.coord = coord_options(c);
  return r;
}

}  // namespace

using swiftkv::capi::require;

extern "C" {

SWIFTKV_API swiftkv_status swiftkv_device_count(uint32_t *out) {
  try {
    require(out, "out");
    *out = swiftkv::usable_cuda_devices();
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

SWIFTKV_API swiftkv_status swiftkv_ctx_create(swiftkv_ctx **out, const swiftkv_ctx_config *config) {
  try {
    require(out, "out");
    ReadConfig c = read_config(config);
    auto ctx = std::make_unique<swiftkv_ctx>(std::move(c.context), std::move(c.cache),
                                             std::move(c.coord), c.transfer_threads);
    ctx->clock = c.clock;
    ctx->clock_user_data = c.clock_user_data;
    ctx->max_open_requests = c.max_open_requests;
    ctx->write_back_on_close = c.write_back_on_close ? 1 : 0;
    *out = ctx.release();
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

SWIFTKV_API void swiftkv_ctx_destroy(swiftkv_ctx *ctx) {
  // In a fork of the process that made it, everything the context holds is the parent's too:
  // its host slabs and lent memory are shared mappings, its disk lock an open file the parent
  // holds, its threads the parent's. Nothing is released or written; the child's copies go with
  // its exit or exec.
  if (ctx != nullptr && swiftkv::capi::destroy_refused_in_fork(ctx->owner, __func__, "ctx")) return;
  if (ctx != nullptr && ctx->cache.in_event_callback()) {
    // The context would wait for the very thread that is running its callback. It stays; the
    // refusal is the thread's last error, and a line on stderr.
    static constexpr char kWhy[] =
        "called from the context's chunk event callback; the context "
        "was not destroyed";
    swiftkv::capi::set_error(__func__, SWIFTKV_ESTATE, kWhy);
    swiftkv::log_warn(std::string("swiftkv_ctx_destroy: ") + kWhy);
    return;
  }
  std::unique_ptr<swiftkv_ctx> owned(ctx);
  if (ctx != nullptr && ctx->write_back_on_close && ctx->cache.disk() != nullptr) {
    // Open requests end first: their saves land (or are given back) before the write-back.
    ctx->finish_requests();
    try {
      const uint64_t n = ctx->cache.write_back(SWIFTKV_TIER_BIT(SWIFTKV_TIER_HOST) |
                                               SWIFTKV_TIER_BIT(SWIFTKV_TIER_PEER) |
                                               SWIFTKV_TIER_BIT(SWIFTKV_TIER_REMOTE));
      if (n != 0)
        swiftkv::log_info("swiftkv_ctx_destroy: wrote " + std::to_string(n) +
                          " chunks back to disk");
    } catch (const std::exception &e) {
      // A context always ends; what could not be written is lost, and said so.
      swiftkv::log_warn(std::string("swiftkv_ctx_destroy: write-back to disk failed: ") + e.what());
    }
  }
}

SWIFTKV_API swiftkv_status swiftkv_ctx_get_config(swiftkv_ctx_config *out, const swiftkv_ctx *ctx) {
  try {
    require(ctx, "ctx");
    const swiftkv::ContextConfig &c = ctx->core.config();
    swiftkv_ctx_config v = SWIFTKV_CTX_CONFIG_INIT;
    v.device_mask = c.device_mask;
    v.host_budget_bytes = c.host_budget_bytes;
    v.host_numa_node = c.host_numa_node;
    v.disk_path = c.disk_path ? c.disk_path->c_str() : nullptr;
    v.disk_budget_bytes = c.disk_budget_bytes;
    v.disk_segment_bytes =
        ctx->cache.disk() ? ctx->cache.disk()->segment_bytes() : c.disk_segment_bytes;
    v.disk_sync_ms = static_cast<uint32_t>(c.disk_sync_ns / 1'000'000);
    const swiftkv::CacheOptions &o = ctx->cache.options();
    v.eviction_policy = static_cast<swiftkv_eviction_policy>(o.policy);
    v.demote_free_percent = o.demote_free_percent;
    v.recompute_token_cost = o.cost.token_cost;
    v.recompute_attention_cost = o.cost.attention_cost;
    v.attention_cost_table = ctx->attention_table.empty() ? nullptr : ctx->attention_table.data();
    v.attention_cost_entries = static_cast<uint32_t>(ctx->attention_table.size());
    v.maintenance_interval_ms = static_cast<uint32_t>(o.maintenance_interval_ms);
    v.tier_order = o.chain[1] == swiftkv::Tier::host ? SWIFTKV_TIER_ORDER_HOST_FIRST
                                                     : SWIFTKV_TIER_ORDER_REMOTE_FIRST;
    v.clock = ctx->clock;
    v.clock_user_data = ctx->clock_user_data;
    const swiftkv::coord::CoordOptions &co = ctx->coord.options();
    v.coord_endpoint = co.endpoint ? co.endpoint->c_str() : nullptr;
    v.coord_heartbeat_ms = static_cast<uint32_t>(co.heartbeat_ns / 1'000'000);
    v.coord_timeout_ms = static_cast<uint32_t>(co.timeout_ns / 1'000'000);
    v.coord_ucx_transports = co.ucx_transports.empty() ? nullptr : co.ucx_transports.c_str();
    v.coord_remote_path = static_cast<swiftkv_remote_path>(co.path);
    v.coord_rma_timeout_ms = static_cast<uint32_t>(co.rma_timeout_ns / 1'000'000);
    v.transfer_threads = ctx->executor.threads();
    v.max_open_requests = ctx->max_open_requests;
    v.write_back_on_close = ctx->write_back_on_close ? 1 : 0;
    swiftkv::capi::write_versioned(out, v, SWIFTKV_CTX_CONFIG_VERSION, kCtxConfigV1Size, "out",
                                   "SWIFTKV_CTX_CONFIG_INIT");
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

SWIFTKV_API swiftkv_status swiftkv_ctx_device_count(uint32_t *out, const swiftkv_ctx *ctx) {
  try {
    require(out, "out");
    require(ctx, "ctx");
    *out = ctx->core.device_count();
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

}  // extern "C"
