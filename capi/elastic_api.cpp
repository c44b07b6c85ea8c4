// The elastic region entry points: read and check the versioned config, pick the memory
// backend from the lender's device, and hand out leases and views as versioned structs.
#include <unistd.h>

#include <cstddef>
#include <memory>
#include <string>

#include "capi/capi_guard.hpp"
#include "capi/context_handle.hpp"
#include "capi/elastic_handle.hpp"
#include "capi/model_desc.hpp"
#include "capi/raw_enum.hpp"
#include "capi/versioned.hpp"
#include "core/common/checked_math.hpp"
#include "core/context/context.hpp"
#include "core/elastic/elastic_region.hpp"
#include "core/memory/cuda_region.hpp"
#include "core/memory/host_region.hpp"

namespace swiftkv::capi {

namespace {

constexpr size_t kElasticConfigV1Size =
    offsetof(swiftkv_elastic_config, clock_user_data) + sizeof(void *);
constexpr size_t kLayerViewV1Size = offsetof(swiftkv_layer_view, reserved0) + sizeof(uint32_t);
constexpr size_t kLeaseV1Size = offsetof(swiftkv_lease, reserved0) + sizeof(uint32_t);
constexpr size_t kElasticStatsV1Size = offsetof(swiftkv_elastic_stats, device) + sizeof(int32_t);

struct ReadConfig {
  ElasticConfig core;
  CudaAllocation cuda_alloc;
  uint64_t host_granule_bytes = 0;
};

ReadConfig read_config(const swiftkv_elastic_config *config) {
  const swiftkv_elastic_config defaults = SWIFTKV_ELASTIC_CONFIG_INIT;
  const swiftkv_elastic_config c =
      read_versioned(config, defaults, SWIFTKV_ELASTIC_CONFIG_VERSION, kElasticConfigV1Size,
                     "config", "SWIFTKV_ELASTIC_CONFIG_INIT");
  if (c.lender == nullptr) fail_invalid("config->lender is NULL");
  ReadConfig r;
  r.core.lender = read_model_desc(c.lender, "config->lender").geometry;
  if (c.borrower != nullptr)
    r.core.borrower = read_model_desc(c.borrower, "config->borrower").geometry;
  r.core.capacity_blocks = c.capacity_blocks;
  r.core.owned_blocks = c.owned_blocks;
  if (c.window_ms > UINT64_MAX / 1'000'000 || c.lease_ms > UINT64_MAX / 1'000'000 ||
      c.reclaim_deadline_ms > UINT64_MAX / 1'000'000) {
    fail_invalid(
        "config->window_ms, lease_ms or reclaim_deadline_ms does not fit in 64-bit "
        "nanoseconds");
  }
  r.core.window_ns = c.window_ms * 1'000'000;
  r.core.lease_ns = c.lease_ms * 1'000'000;
  r.core.reclaim_deadline_ns = c.reclaim_deadline_ms * 1'000'000;
  if ((c.flags & ~SWIFTKV_ELASTIC_KEEP_COMMITTED) != 0) {
    fail_invalid("config->flags has unknown bits " +
                 std::to_string(c.flags & ~SWIFTKV_ELASTIC_KEEP_COMMITTED));
  }
  r.core.keep_committed = (c.flags & SWIFTKV_ELASTIC_KEEP_COMMITTED) != 0;
  if (c.clock != nullptr) {
    const swiftkv_clock_fn fn = c.clock;
    void *user = c.clock_user_data;
    r.core.clock = [fn, user] { return fn(user); };
  }
  const int32_t alloc = raw_enum_value(c.cuda_alloc);
  if (alloc < SWIFTKV_CUDA_ALLOC_AUTO || alloc > SWIFTKV_CUDA_ALLOC_MALLOC) {
    fail_invalid("config->cuda_alloc (" + std::to_string(alloc) + ") is not a swiftkv_cuda_alloc");
  }
  r.cuda_alloc = static_cast<CudaAllocation>(alloc);
  if (c.host_granule_bytes != 0 && r.core.lender.device != SWIFTKV_DEVICE_HOST) {
    fail_invalid("config->host_granule_bytes is " + std::to_string(c.host_granule_bytes) +
                 " for a region on CUDA device " + std::to_string(r.core.lender.device) +
                 " (host regions only; device memory has its own granules)");
  }
  const auto page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  if (c.host_granule_bytes % page != 0) {
    fail_invalid("config->host_granule_bytes (" + std::to_string(c.host_granule_bytes) +
                 ") is not a multiple of the page size (" + std::to_string(page) + ")");
  }
  r.host_granule_bytes = c.host_granule_bytes;
  return r;
}

swiftkv_lease to_c(const ElasticRegion &r, const Lease &l) {
  swiftkv_lease out = SWIFTKV_LEASE_INIT;
  out.id = l.id;
  out.first_block = l.first_unit * r.unit_blocks();
  out.blocks = l.units * r.unit_blocks();
  out.chunks = l.units * r.unit_chunks();
  out.offset = r.lease_offset(l);
  out.bytes = l.units * r.unit_bytes();
  out.data = r.memory().data() + out.offset;
  out.chunk_stride = r.borrower_sizes()->full_chunk_bytes;
  out.layer_stride = r.borrower_sizes()->layer_chunk_bytes;
  out.expires_ns = l.expires_ns;
  out.reclaim_requested = l.reclaim_requested ? 1 : 0;
  return out;
}

void write_lease(swiftkv_lease *out, const swiftkv_lease &v) {
  write_versioned(out, v, SWIFTKV_LEASE_VERSION, kLeaseV1Size, "out", "SWIFTKV_LEASE_INIT");
}

// Checks an output struct before a call changes state, so a bad `out` changes nothing.
template <class T>
void check_out(const T *out, uint32_t version, size_t first_size, const char *init) {
  require(out, "out");
  check_struct_header<T>(out->size, out->version, version, first_size, "out", init);
}

swiftkv_status resize_result(const ElasticDelta &d, uint64_t *lender_blocks_out,
                             uint64_t *borrower_chunks_out) {
  *lender_blocks_out = d.lender_blocks;
  *borrower_chunks_out = d.borrower_chunks;
  return d.waiting ? SWIFTKV_IN_PROGRESS : SWIFTKV_OK;
}

}  // namespace

}  // namespace swiftkv::capi

using namespace swiftkv::capi;

extern "C" {

SWIFTKV_API swiftkv_status swiftkv_elastic_create(swiftkv_elastic **out, swiftkv_ctx *ctx,
                                                  const swiftkv_elastic_config *config) {
  try {
    require(out, "out");
    require(ctx, "ctx");
    ReadConfig c = read_config(config);
    uint64_t bytes = swiftkv::ElasticRegion::required_bytes(c.core);
    if (c.host_granule_bytes != 0) {  // the region is whole granules: the budget counts them all
      bytes = swiftkv::checked_mul(swiftkv::ceil_div(bytes, c.host_granule_bytes),
                                   c.host_granule_bytes, "the region's bytes in granules");
    }
    auto e = std::make_unique<swiftkv_elastic>();
    e->ctx = &ctx->core;
    e->coord = &ctx->coord;
    std::shared_ptr<swiftkv::MemoryRegion> memory;
    const int32_t device = c.core.lender.device;
    if (device == SWIFTKV_DEVICE_HOST) {
      swiftkv::HostRegionOptions o;
      o.size = bytes;
      o.numa_node = e->ctx->host_numa_node();
      o.page_lock = e->ctx->device_count() > 0;
      o.name = "swiftkv-elastic";
      o.granule = c.host_granule_bytes;
      const std::string what =
          "an elastic region of " + std::to_string(c.core.capacity_blocks) + " blocks";
      try {
        e->ctx->reserve_host(bytes, what);
      } catch (const swiftkv::Error &err) {
        // The host tier's empty slabs (made ahead, or emptied) are its to remake: the region
        // takes their budget. Chunks held in the tier stay; the second refusal stands.
        if (err.status() != SWIFTKV_ENOMEM || ctx->cache.give_back_host_budget() == 0) throw;
        e->ctx->reserve_host(bytes, what);
      }
      e->host_reserved = bytes;
      memory = swiftkv::create_host_region(o);
    } else {
      if (!e->ctx->uses_device(device)) {
        swiftkv::fail(SWIFTKV_ENODEV, "config->lender->device is " + std::to_string(device) +
                                          ", which is not in the context's device_mask");
      }
      memory = swiftkv::create_cuda_region({device, bytes, c.cuda_alloc});
    }
    e->region = std::make_shared<swiftkv::ElasticRegion>(c.core, std::move(memory));
    *out = e.release();
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

SWIFTKV_API void swiftkv_elastic_destroy(swiftkv_elastic *e) {
  // In a fork: the region's memory is shared with the parent and its grants are the parent's.
  if (e != nullptr && swiftkv::capi::destroy_refused_in_fork(e->owner, __func__, "e")) return;
  std::unique_ptr<swiftkv_elastic> owned(e);
}

SWIFTKV_API swiftkv_status swiftkv_elastic_layer_view(swiftkv_layer_view *out,
                                                      const swiftkv_elastic *e, uint32_t layer) {
  try {
    require(e, "e");
    const swiftkv::ElasticRegion &r = *e->region;
    if (layer >= r.lender().num_layers) {
      swiftkv::fail_invalid("layer " + std::to_string(layer) + " is not below the lender's " +
                            std::to_string(r.lender().num_layers) + " layers");
    }
    const swiftkv::LayerView lv =
        swiftkv::block_major_layer_view(r.lender(), r.lender_sizes(), layer);
    swiftkv_layer_view v = SWIFTKV_LAYER_VIEW_INIT;
    v.base = r.memory().data() + lv.layer_offset;
    v.page_stride = lv.page_stride;
    v.k_offset = lv.k_offset;
    v.v_offset = lv.v_offset;
    v.token_stride = lv.token_stride;
    v.head_stride = lv.head_stride;
    v.num_pages = r.capacity_blocks();
    v.device = r.memory().device();
    write_versioned(out, v, SWIFTKV_LAYER_VIEW_VERSION, kLayerViewV1Size, "out",
                    "SWIFTKV_LAYER_VIEW_INIT");
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

SWIFTKV_API swiftkv_status swiftkv_elastic_scale_for_request(uint64_t *lender_blocks_out,
                                                             uint64_t *borrower_chunks_out,
                                                             swiftkv_elastic *e,
                                                             uint64_t request_tokens) {
  try {
    require(lender_blocks_out, "lender_blocks_out");
    require(borrower_chunks_out, "borrower_chunks_out");
    require(e, "e");
    return resize_result(e->region->scale_for_request(request_tokens), lender_blocks_out,
                         borrower_chunks_out);
  }
  SWIFTKV_CATCH_ALL
}

SWIFTKV_API swiftkv_status swiftkv_elastic_tick(uint64_t *lender_blocks_out,
                                                uint64_t *borrower_chunks_out, swiftkv_elastic *e,
                                                uint64_t in_use_blocks) {
  try {
    require(lender_blocks_out, "lender_blocks_out");
    require(borrower_chunks_out, "borrower_chunks_out");
    require(e, "e");
    return resize_result(e->region->tick(in_use_blocks), lender_blocks_out, borrower_chunks_out);
  }
  SWIFTKV_CATCH_ALL
}

SWIFTKV_API swiftkv_status swiftkv_elastic_resize(uint64_t *lender_blocks_out,
                                                  uint64_t *borrower_chunks_out, swiftkv_elastic *e,
                                                  uint64_t owned_blocks) {
  try {
    require(lender_blocks_out, "lender_blocks_out");
    require(borrower_chunks_out, "borrower_chunks_out");
    require(e, "e");
    return resize_result(e->region->resize(owned_blocks), lender_blocks_out, borrower_chunks_out);
  }
  SWIFTKV_CATCH_ALL
}

SWIFTKV_API swiftkv_status swiftkv_elastic_lend(swiftkv_lease *out, swiftkv_elastic *e,
                                                uint64_t max_units) {
  try {
    check_out(out, SWIFTKV_LEASE_VERSION, kLeaseV1Size, "SWIFTKV_LEASE_INIT");
    require(e, "e");
    const swiftkv::Lease l = e->region->lend(max_units);
    write_lease(out, to_c(*e->region, l));
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

SWIFTKV_API swiftkv_status swiftkv_elastic_lease_get(swiftkv_lease *out, const swiftkv_elastic *e,
                                                     uint64_t lease_id) {
  try {
    check_out(out, SWIFTKV_LEASE_VERSION, kLeaseV1Size, "SWIFTKV_LEASE_INIT");
    require(e, "e");
    write_lease(out, to_c(*e->region, e->region->lease(lease_id)));
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

SWIFTKV_API swiftkv_status swiftkv_elastic_renew(swiftkv_elastic *e, uint64_t lease_id) {
  try {
    require(e, "e");
    e->region->renew(lease_id);
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

SWIFTKV_API swiftkv_status swiftkv_elastic_release(swiftkv_elastic *e, uint64_t lease_id) {
  try {
    require(e, "e");
    e->region->release(lease_id);
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

SWIFTKV_API swiftkv_status swiftkv_elastic_reclaim(swiftkv_elastic *e, uint64_t lease_id) {
  try {
    require(e, "e");
    e->region->reclaim(lease_id == SWIFTKV_LEASE_ALL ? swiftkv::ElasticRegion::kAllLeases
                                                     : lease_id);
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

SWIFTKV_API swiftkv_status swiftkv_elastic_wait_reclaims(swiftkv_elastic *e, uint64_t timeout_ms) {
  try {
    require(e, "e");
    const uint64_t ns = timeout_ms > UINT64_MAX / 1'000'000 ? UINT64_MAX : timeout_ms * 1'000'000;
    if (!e->region->wait_reclaims(ns)) {
      swiftkv::fail(SWIFTKV_ETIMEDOUT,
                    "leases still asked back after " + std::to_string(timeout_ms) +
                        " ms: " + std::to_string(e->region->pending_reclaims().size()) +
                        " not released by their borrowers");
    }
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

SWIFTKV_API swiftkv_status swiftkv_elastic_pending_reclaims(uint64_t *ids_out, size_t ids_capacity,
                                                            size_t *count_out,
                                                            const swiftkv_elastic *e) {
  try {
    if (ids_out == nullptr && ids_capacity != 0) {
      swiftkv::fail_invalid("ids_out is NULL but ids_capacity is " + std::to_string(ids_capacity));
    }
    require(count_out, "count_out");
    require(e, "e");
    const std::vector<uint64_t> ids = e->region->pending_reclaims();
    for (size_t i = 0; i < ids.size() && i < ids_capacity; ++i) ids_out[i] = ids[i];
    *count_out = ids.size();
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

SWIFTKV_API swiftkv_status swiftkv_elastic_stats_get(swiftkv_elastic_stats *out,
                                                     const swiftkv_elastic *e) {
  try {
    require(e, "e");
    const swiftkv::ElasticStats s = e->region->stats();
    swiftkv_elastic_stats v = SWIFTKV_ELASTIC_STATS_INIT;
    v.capacity_blocks = s.capacity_blocks;
    v.owned_blocks = s.owned_blocks;
    v.ready_blocks = s.ready_blocks;
    v.reclaiming_blocks = s.reclaiming_blocks;
    v.lent_blocks = s.lent_blocks;
    v.free_blocks = s.free_blocks;
    v.unit_lender_blocks = s.unit_lender_blocks;
    v.unit_borrower_chunks = s.unit_borrower_chunks;
    v.leases = s.leases;
    v.region_bytes = s.region_bytes;
    v.committed_bytes = s.committed_bytes;
    v.scale_ups = s.scale_ups;
    v.scale_downs = s.scale_downs;
    v.leases_granted = s.leases_granted;
    v.leases_expired = s.leases_expired;
    v.reclaims_requested = s.reclaims_requested;
    v.memory_kind = static_cast<swiftkv_memory_kind>(e->region->memory().kind());
    v.device = e->region->memory().device();
    write_versioned(out, v, SWIFTKV_ELASTIC_STATS_VERSION, kElasticStatsV1Size, "out",
                    "SWIFTKV_ELASTIC_STATS_INIT");
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

}  // extern "C"
