// Context and device entry points: the versioned config is read with defaults, validated
// against the machine by swiftkv::Context, and only then is a handle returned.
#include <cstddef>
#include <memory>
#include <string>

#include "capi/capi_guard.hpp"
#include "capi/context_handle.hpp"
#include "capi/versioned.hpp"
#include "core/context/context.hpp"
#include "core/memory/device_query.hpp"


namespace {

constexpr size_t kCtxConfigV1Size =
    offsetof(swiftkv_ctx_config, disk_budget_bytes) + sizeof(uint64_t);

swiftkv::ContextConfig read_config(const swiftkv_ctx_config *config) {
  const swiftkv_ctx_config defaults = SWIFTKV_CTX_CONFIG_INIT;
  const swiftkv_ctx_config c =
      config == nullptr
          ? defaults
          : swiftkv::capi::read_versioned(config, defaults, SWIFTKV_CTX_CONFIG_VERSION,
                                          kCtxConfigV1Size, "config", "SWIFTKV_CTX_CONFIG_INIT");
  if (c.reserved0 != 0) swiftkv::fail_invalid("config->reserved0 is not 0");
  swiftkv::ContextConfig out;
  out.device_mask = c.device_mask;
  out.host_budget_bytes = c.host_budget_bytes;
  out.host_numa_node = c.host_numa_node;
  if (c.disk_path != nullptr) out.disk_path = std::string(c.disk_path);
  out.disk_budget_bytes = c.disk_budget_bytes;
  return out;
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
    auto ctx = std::make_unique<swiftkv_ctx>(read_config(config));
    *out = ctx.release();
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

SWIFTKV_API void swiftkv_ctx_destroy(swiftkv_ctx *ctx) {
  // Destruction of an immutable context cannot fail; the unique_ptr ends it.
  std::unique_ptr<swiftkv_ctx> owned(ctx);
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
