// The coordinator's entry points: offering a region, borrowing from another process, and the
// coordinator's counters.
#include <cstddef>
#include <cstring>
#include <string>

#include "capi/borrower.hpp"
#include "capi/capi_guard.hpp"
#include "capi/context_handle.hpp"
#include "capi/elastic_handle.hpp"
#include "capi/versioned.hpp"
#include "core/tiers/lender_link.hpp"

namespace {

constexpr size_t kCoordStatsV1Size = offsetof(swiftkv_coord_stats, lenders_lost) + sizeof(uint64_t);

// A C string argument of 1 to max bytes.
std::string string_arg(const char *s, const char *name, size_t max) {
  swiftkv::capi::require(s, name);
  const size_t n = ::strnlen(s, max + 1);
  if (n == 0 || n > max) {
    swiftkv::fail_invalid(std::string(name) + " must be 1 to " + std::to_string(max) + " bytes");
  }
  return std::string(s, n);
}

}  // namespace

using swiftkv::capi::require;

extern "C" {

SWIFTKV_API swiftkv_status swiftkv_elastic_offer(swiftkv_elastic *e, const char *name) {
  try {
    require(e, "e");
    e->coord->offer(string_arg(name, "name", 255), e->region);
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

SWIFTKV_API swiftkv_status swiftkv_borrow_remote(uint64_t *lease_id_out, swiftkv_ctx *ctx,
                                                 uint32_t model, const char *endpoint,
                                                 const char *lender_name, uint64_t max_units) {
  try {
    require(lease_id_out, "lease_id_out");
    require(ctx, "ctx");
    const std::string ep = string_arg(endpoint, "endpoint", 1024);
    const std::string name = string_arg(lender_name, "lender_name", 255);
    if (max_units == 0) swiftkv::fail_invalid("max_units is 0");
    const swiftkv::capi::RegisteredModel m = swiftkv::capi::borrower(ctx, model);
    swiftkv::ChunkCache *cache = &ctx->cache;
    auto link = ctx->coord.connect(ep, name, m.geometry, [cache] { cache->wake(); });
    *lease_id_out = ctx->cache.borrow(m.fingerprint, m.sizes, std::move(link), max_units);
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

SWIFTKV_API swiftkv_status swiftkv_coord_stats_get(swiftkv_coord_stats *out,
                                                   const swiftkv_ctx *ctx) {
  try {
    require(ctx, "ctx");
    const swiftkv::coord::CoordStats s = ctx->coord.stats();
    swiftkv_coord_stats v = SWIFTKV_COORD_STATS_INIT;
    v.offered_regions = s.offered_regions;
    v.sessions_served = s.sessions_served;
    v.lenders_connected = s.lenders_connected;
    v.messages_sent = s.messages_sent;
    v.messages_received = s.messages_received;
    v.messages_dropped = s.messages_dropped;
    v.heartbeats_sent = s.heartbeats_sent;
    v.heartbeats_answered = s.heartbeats_answered;
    v.reclaims_sent = s.reclaims_sent;
    v.reclaims_acked = s.reclaims_acked;
    v.reclaim_ns_total = s.reclaim_ns_total;
    v.reclaim_ns_max = s.reclaim_ns_max;
    v.leases_lost = s.leases_lost;
    v.lenders_lost = s.lenders_lost;
    v.remote_sessions = s.remote_sessions;
    v.remote_lenders = s.remote_lenders;
    v.grants_refused = s.grants_refused;
    v.rma_batches = s.rma_batches;
    v.rma_batches_failed = s.rma_batches_failed;
    v.rma_bytes_read = s.rma_bytes_read;
    v.rma_bytes_written = s.rma_bytes_written;
    swiftkv::capi::write_versioned(out, v, SWIFTKV_COORD_STATS_VERSION, kCoordStatsV1Size, "out",
                                   "SWIFTKV_COORD_STATS_INIT");
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

}  // extern "C"
