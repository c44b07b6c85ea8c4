/* Compiled twice, as C11 and as C++17, with -Wall -Wextra -pedantic -Werror: the public header
 * must build cleanly in both, and its struct layouts (ABI for every binding) must not move.
 * Runs without CMocka so that nothing but the header and the library is involved. */
#include <stddef.h>
#include <stdio.h>

#include "swiftkv/swiftkv.h"

#ifdef __cplusplus
#define STATIC_CHECK(cond, msg) static_assert(cond, msg)
#else
#define STATIC_CHECK(cond, msg) _Static_assert(cond, msg)
#endif

/* LP64 layouts, pinned: a change here is an ABI break and needs a new soname. */
STATIC_CHECK(sizeof(swiftkv_model_desc) == 56, "swiftkv_model_desc size");
STATIC_CHECK(offsetof(swiftkv_model_desc, name) == 8, "swiftkv_model_desc.name");
STATIC_CHECK(offsetof(swiftkv_model_desc, num_layers) == 16, "swiftkv_model_desc.num_layers");
STATIC_CHECK(offsetof(swiftkv_model_desc, chunk_tokens) == 32, "swiftkv_model_desc.chunk_tokens");
STATIC_CHECK(offsetof(swiftkv_model_desc, dtype) == 36, "swiftkv_model_desc.dtype");
STATIC_CHECK(offsetof(swiftkv_model_desc, device) == 40, "swiftkv_model_desc.device");
STATIC_CHECK(offsetof(swiftkv_model_desc, identity) == 48, "swiftkv_model_desc.identity");
STATIC_CHECK(sizeof(swiftkv_capacity_plan) == 48, "swiftkv_capacity_plan size");
STATIC_CHECK(offsetof(swiftkv_capacity_plan, stream_blocks) == 8, "plan.stream_blocks");
STATIC_CHECK(offsetof(swiftkv_capacity_plan, lender_full_blocks) == 40, "plan.lender_full_blocks");
STATIC_CHECK(sizeof(swiftkv_ctx_config) == 176, "swiftkv_ctx_config size");
STATIC_CHECK(offsetof(swiftkv_ctx_config, tier_order) == 168, "config.tier_order (v9)");
STATIC_CHECK(offsetof(swiftkv_ctx_config, reserved3) == 172, "config.reserved3");
STATIC_CHECK(offsetof(swiftkv_ctx_config, coord_ucx_transports) == 152,
             "config.coord_ucx_transports (v8)");
STATIC_CHECK(offsetof(swiftkv_ctx_config, coord_remote_path) == 160, "config.coord_remote_path");
STATIC_CHECK(offsetof(swiftkv_ctx_config, coord_rma_timeout_ms) == 164,
             "config.coord_rma_timeout_ms");
STATIC_CHECK(offsetof(swiftkv_ctx_config, write_back_on_close) == 144,
             "config.write_back_on_close (v7)");
STATIC_CHECK(offsetof(swiftkv_ctx_config, reserved2) == 148, "config.reserved2");
STATIC_CHECK(offsetof(swiftkv_ctx_config, max_open_requests) == 136,
             "config.max_open_requests (v6)");
STATIC_CHECK(offsetof(swiftkv_ctx_config, reserved1) == 140, "config.reserved1");
STATIC_CHECK(offsetof(swiftkv_ctx_config, disk_segment_bytes) == 120,
             "config.disk_segment_bytes (v5)");
STATIC_CHECK(offsetof(swiftkv_ctx_config, disk_sync_ms) == 128, "config.disk_sync_ms");
STATIC_CHECK(offsetof(swiftkv_ctx_config, transfer_threads) == 132, "config.transfer_threads");
STATIC_CHECK(offsetof(swiftkv_ctx_config, coord_endpoint) == 104, "config.coord_endpoint (v4)");
STATIC_CHECK(offsetof(swiftkv_ctx_config, coord_heartbeat_ms) == 112, "config.coord_heartbeat_ms");
STATIC_CHECK(offsetof(swiftkv_ctx_config, coord_timeout_ms) == 116, "config.coord_timeout_ms");
STATIC_CHECK(sizeof(swiftkv_coord_stats) == 176, "swiftkv_coord_stats size");
STATIC_CHECK(offsetof(swiftkv_coord_stats, remote_sessions) == 120,
             "coord_stats.remote_sessions (v2)");
STATIC_CHECK(offsetof(swiftkv_coord_stats, rma_bytes_written) == 168,
             "coord_stats.rma_bytes_written");
STATIC_CHECK(offsetof(swiftkv_coord_stats, messages_dropped) == 48, "coord_stats.messages_dropped");
STATIC_CHECK(offsetof(swiftkv_coord_stats, lenders_lost) == 112, "coord_stats.lenders_lost");
STATIC_CHECK(offsetof(swiftkv_ctx_config, clock) == 88, "config.clock (v3)");
STATIC_CHECK(offsetof(swiftkv_ctx_config, clock_user_data) == 96, "config.clock_user_data");
STATIC_CHECK(offsetof(swiftkv_ctx_config, eviction_policy) == 48, "config.eviction_policy (v2)");
STATIC_CHECK(offsetof(swiftkv_ctx_config, recompute_token_cost) == 56,
             "config.recompute_token_cost");
STATIC_CHECK(offsetof(swiftkv_ctx_config, attention_cost_table) == 72,
             "config.attention_cost_table");
STATIC_CHECK(offsetof(swiftkv_ctx_config, maintenance_interval_ms) == 84,
             "config.maintenance_interval_ms");
STATIC_CHECK(offsetof(swiftkv_ctx_config, host_numa_node) == 24, "config.host_numa_node");
STATIC_CHECK(offsetof(swiftkv_ctx_config, disk_path) == 32, "config.disk_path");
STATIC_CHECK(offsetof(swiftkv_ctx_config, disk_budget_bytes) == 40, "config.disk_budget_bytes");
STATIC_CHECK(sizeof(swiftkv_status) == 4 && sizeof(swiftkv_dtype) == 4, "enum size");
STATIC_CHECK(sizeof(swiftkv_memory_kind) == 4 && sizeof(swiftkv_cuda_alloc) == 4, "enum size");
STATIC_CHECK(sizeof(swiftkv_remote_path) == 4, "enum size");
STATIC_CHECK(sizeof(swiftkv_elastic_config) == 96, "swiftkv_elastic_config size");
STATIC_CHECK(offsetof(swiftkv_elastic_config, host_granule_bytes) == 88,
             "elastic_config.host_granule_bytes (v3)");
STATIC_CHECK(offsetof(swiftkv_elastic_config, reclaim_deadline_ms) == 80,
             "elastic_config.reclaim_deadline_ms");
STATIC_CHECK(offsetof(swiftkv_elastic_config, borrower) == 16, "elastic_config.borrower");
STATIC_CHECK(offsetof(swiftkv_elastic_config, lease_ms) == 48, "elastic_config.lease_ms");
STATIC_CHECK(offsetof(swiftkv_elastic_config, cuda_alloc) == 56, "elastic_config.cuda_alloc");
STATIC_CHECK(offsetof(swiftkv_elastic_config, clock) == 64, "elastic_config.clock");
STATIC_CHECK(sizeof(swiftkv_layer_view) == 72, "swiftkv_layer_view size");
STATIC_CHECK(offsetof(swiftkv_layer_view, num_pages) == 56, "layer_view.num_pages");
STATIC_CHECK(offsetof(swiftkv_layer_view, device) == 64, "layer_view.device");
STATIC_CHECK(sizeof(swiftkv_lease) == 96, "swiftkv_lease size");
STATIC_CHECK(offsetof(swiftkv_lease, data) == 56, "lease.data");
STATIC_CHECK(offsetof(swiftkv_lease, reclaim_requested) == 88, "lease.reclaim_requested");
STATIC_CHECK(sizeof(swiftkv_elastic_stats) == 144, "swiftkv_elastic_stats size");
STATIC_CHECK(offsetof(swiftkv_elastic_stats, reclaims_requested) == 128,
             "stats.reclaims_requested");
STATIC_CHECK(offsetof(swiftkv_elastic_stats, memory_kind) == 136, "stats.memory_kind");
STATIC_CHECK(sizeof(swiftkv_model_config) == 24, "swiftkv_model_config size");
STATIC_CHECK(offsetof(swiftkv_model_config, role) == 16, "model_config.role");
STATIC_CHECK(sizeof(swiftkv_lookup_result) == 72, "swiftkv_lookup_result size");
STATIC_CHECK(offsetof(swiftkv_lookup_result, remote_chunks) == 64, "lookup.remote_chunks (v2)");
STATIC_CHECK(offsetof(swiftkv_lookup_result, loadable_tokens) == 32, "lookup.loadable_tokens");
STATIC_CHECK(offsetof(swiftkv_lookup_result, chunks_per_tier) == 40, "lookup.chunks_per_tier");
STATIC_CHECK(sizeof(swiftkv_stats) == 288, "swiftkv_stats size");
STATIC_CHECK(offsetof(swiftkv_stats, disk_full_refusals) == 280, "stats.disk_full_refusals (v5)");
STATIC_CHECK(offsetof(swiftkv_stats, remote_chunks) == 248, "stats.remote_chunks (v4)");
STATIC_CHECK(offsetof(swiftkv_stats, remote_hits) == 272, "stats.remote_hits");
STATIC_CHECK(offsetof(swiftkv_stats, index_bytes) == 224, "stats.index_bytes (v3)");
STATIC_CHECK(offsetof(swiftkv_stats, index_capacity_chunks) == 232, "stats.index_capacity_chunks");
STATIC_CHECK(offsetof(swiftkv_stats, requests_open) == 240, "stats.requests_open");
STATIC_CHECK(offsetof(swiftkv_stats, disk_files_skipped) == 184, "stats.disk_files_skipped (v2)");
STATIC_CHECK(offsetof(swiftkv_stats, disk_bytes_allocated) == 216, "stats.disk_bytes_allocated");
STATIC_CHECK(offsetof(swiftkv_stats, hits) == 80, "stats.hits");
STATIC_CHECK(offsetof(swiftkv_stats, misses) == 104, "stats.misses");
STATIC_CHECK(offsetof(swiftkv_stats, demotions_deferred) == 176, "stats.demotions_deferred");
STATIC_CHECK(sizeof(swiftkv_chunk_event) == 32, "swiftkv_chunk_event size");
STATIC_CHECK(offsetof(swiftkv_chunk_event, key_lo) == 16, "chunk_event.key_lo");
STATIC_CHECK(sizeof(swiftkv_pool_desc) == 72, "swiftkv_pool_desc size");
STATIC_CHECK(offsetof(swiftkv_pool_desc, layer_base) == 24, "pool_desc.layer_base");
STATIC_CHECK(offsetof(swiftkv_pool_desc, page_stride) == 40, "pool_desc.page_stride");
STATIC_CHECK(offsetof(swiftkv_pool_desc, head_stride) == 64, "pool_desc.head_stride");
STATIC_CHECK(sizeof(swiftkv_request_desc) == 88, "swiftkv_request_desc size");
STATIC_CHECK(offsetof(swiftkv_request_desc, names) == 64, "request_desc.names (v3)");
STATIC_CHECK(offsetof(swiftkv_request_desc, names_bytes) == 72, "request_desc.names_bytes");
STATIC_CHECK(offsetof(swiftkv_request_desc, name_bytes) == 80, "request_desc.name_bytes");
STATIC_CHECK(offsetof(swiftkv_request_desc, shape) == 56, "request_desc.shape (v2)");
STATIC_CHECK(offsetof(swiftkv_request_desc, reserved1) == 60, "request_desc.reserved1");
STATIC_CHECK(offsetof(swiftkv_request_desc, tokens) == 16, "request_desc.tokens");
STATIC_CHECK(offsetof(swiftkv_request_desc, load_from_tokens) == 48,
             "request_desc.load_from_tokens");
STATIC_CHECK(sizeof(swiftkv_request_info) == 64, "swiftkv_request_info size");
STATIC_CHECK(offsetof(swiftkv_request_info, saved_tokens) == 40, "request_info.saved_tokens");
STATIC_CHECK(offsetof(swiftkv_request_info, stream_ordered) == 56, "request_info.stream_ordered");
STATIC_CHECK(sizeof(swiftkv_attention_desc) == 48, "swiftkv_attention_desc size");
STATIC_CHECK(offsetof(swiftkv_attention_desc, kv_chunk_tokens) == 36,
             "attention_desc.kv_chunk_tokens");
STATIC_CHECK(offsetof(swiftkv_attention_desc, logits_soft_cap) == 44,
             "attention_desc.logits_soft_cap");
STATIC_CHECK(sizeof(swiftkv_attention_plan) == 144, "swiftkv_attention_plan size");
STATIC_CHECK(offsetof(swiftkv_attention_plan, workspace_bytes) == 40,
             "attention_plan.workspace_bytes");
STATIC_CHECK(offsetof(swiftkv_attention_plan, internal) == 48, "attention_plan.internal");
STATIC_CHECK(sizeof(swiftkv_attention_args) == 120, "swiftkv_attention_args size");
STATIC_CHECK(offsetof(swiftkv_attention_args, k_base) == 32, "attention_args.k_base");
STATIC_CHECK(offsetof(swiftkv_attention_args, num_pages) == 72, "attention_args.num_pages");
STATIC_CHECK(offsetof(swiftkv_attention_args, kv_indices) == 80, "attention_args.kv_indices");
STATIC_CHECK(offsetof(swiftkv_attention_args, lse) == 112, "attention_args.lse");
STATIC_CHECK(sizeof(swiftkv_tier) == 4 && sizeof(swiftkv_role) == 4, "enum size");

static int failures = 0;
#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                              \
    }                                                                          \
  } while (0)

int main(void) {
  /* The init macros give the documented defaults in either language. */
  swiftkv_model_desc m = SWIFTKV_MODEL_DESC_INIT;
  CHECK(m.size == sizeof m && m.version == SWIFTKV_MODEL_DESC_VERSION);
  CHECK(m.block_tokens == 16 && m.chunk_tokens == 256);
  CHECK(m.dtype == SWIFTKV_DTYPE_F16 && m.device == SWIFTKV_DEVICE_HOST && m.name == NULL);
  swiftkv_ctx_config c = SWIFTKV_CTX_CONFIG_INIT;
  CHECK(c.size == sizeof c && c.version == SWIFTKV_CTX_CONFIG_VERSION);
  CHECK(c.device_mask == 0 && c.host_numa_node == SWIFTKV_NUMA_NODE_AUTO);
  CHECK(c.disk_path == NULL && c.disk_budget_bytes == 0);
  swiftkv_capacity_plan p = SWIFTKV_CAPACITY_PLAN_INIT;
  CHECK(p.size == sizeof p && p.version == SWIFTKV_CAPACITY_PLAN_VERSION);
  swiftkv_elastic_config ec = SWIFTKV_ELASTIC_CONFIG_INIT;
  CHECK(ec.size == sizeof ec && ec.version == SWIFTKV_ELASTIC_CONFIG_VERSION);
  CHECK(ec.window_ms == 60000 && ec.lease_ms == 10000 && ec.cuda_alloc == SWIFTKV_CUDA_ALLOC_AUTO);
  CHECK(ec.lender == NULL && ec.borrower == NULL && ec.clock == NULL && ec.flags == 0);
  CHECK(ec.version == 3 && ec.reclaim_deadline_ms == 30000 && ec.host_granule_bytes == 0);
  swiftkv_layer_view lv = SWIFTKV_LAYER_VIEW_INIT;
  CHECK(lv.size == sizeof lv && lv.version == SWIFTKV_LAYER_VIEW_VERSION && lv.base == NULL);
  swiftkv_ctx_config cc = SWIFTKV_CTX_CONFIG_INIT;
  CHECK(cc.version == 9 && cc.eviction_policy == SWIFTKV_EVICT_RETENTION);
  CHECK(cc.tier_order == SWIFTKV_TIER_ORDER_REMOTE_FIRST && cc.reserved3 == 0);
  CHECK(cc.coord_ucx_transports == NULL && cc.coord_remote_path == SWIFTKV_REMOTE_PATH_AUTO);
  CHECK(cc.coord_rma_timeout_ms == 2000);
  CHECK(cc.write_back_on_close == 1 && cc.reserved2 == 0);
  CHECK(cc.max_open_requests == 4096 && cc.reserved1 == 0);
  CHECK(cc.disk_segment_bytes == 0 && cc.disk_sync_ms == 1000 && cc.transfer_threads == 0);
  CHECK(cc.coord_endpoint == NULL && cc.coord_heartbeat_ms == 100 && cc.coord_timeout_ms == 5000);
  swiftkv_coord_stats cs = SWIFTKV_COORD_STATS_INIT;
  CHECK(cs.size == sizeof cs && cs.version == SWIFTKV_COORD_STATS_VERSION && cs.lenders_lost == 0);
  CHECK(cs.version == 2 && cs.remote_sessions == 0 && cs.rma_bytes_written == 0);
  CHECK(cc.demote_free_percent == 25 && cc.recompute_token_cost == 1.0);
  CHECK(cc.attention_cost_table == NULL && cc.maintenance_interval_ms == 10 && cc.clock == NULL);
  swiftkv_model_config mc = SWIFTKV_MODEL_CONFIG_INIT;
  CHECK(mc.size == sizeof mc && mc.role == SWIFTKV_ROLE_BORROWER && mc.desc == NULL);
  swiftkv_lookup_result lr = SWIFTKV_LOOKUP_RESULT_INIT;
  CHECK(lr.size == sizeof lr && lr.chunks_per_tier[2] == 0);
  CHECK(lr.version == 2 && lr.remote_chunks == 0);
  swiftkv_stats st = SWIFTKV_STATS_INIT;
  CHECK(st.size == sizeof st && st.version == 5 && st.demotions_deferred == 0);
  CHECK(st.remote_chunks == 0 && st.remote_bytes == 0 && st.remote_capacity_bytes == 0);
  CHECK(st.remote_hits == 0 && st.disk_full_refusals == 0);
  CHECK(SWIFTKV_TIER_REMOTE == 4 && SWIFTKV_TIERS_ALL == 0x17u);
  CHECK(st.index_bytes == 0 && st.index_capacity_chunks == 0 && st.requests_open == 0);
  CHECK(st.disk_files_skipped == 0 && st.disk_bytes_allocated == 0);
  swiftkv_lease ls = SWIFTKV_LEASE_INIT;
  CHECK(ls.size == sizeof ls && ls.version == SWIFTKV_LEASE_VERSION && ls.data == NULL);
  swiftkv_attention_desc ad = SWIFTKV_ATTENTION_DESC_INIT;
  CHECK(ad.size == sizeof ad && ad.version == SWIFTKV_ATTENTION_DESC_VERSION);
  CHECK(ad.device == SWIFTKV_DEVICE_HOST && ad.dtype == SWIFTKV_DTYPE_F16 && ad.page_tokens == 16);
  CHECK(ad.causal == 1 && ad.kv_chunk_tokens == 0 && ad.sm_scale == 0.0f &&
        ad.logits_soft_cap == 0.0f);
  swiftkv_attention_plan ap = SWIFTKV_ATTENTION_PLAN_INIT;
  CHECK(ap.size == sizeof ap && ap.version == SWIFTKV_ATTENTION_PLAN_VERSION &&
        ap.internal[11] == 0);
  swiftkv_attention_args aa = SWIFTKV_ATTENTION_ARGS_INIT;
  CHECK(aa.size == sizeof aa && aa.version == SWIFTKV_ATTENTION_ARGS_VERSION && aa.lse == NULL);
  swiftkv_elastic_stats es = SWIFTKV_ELASTIC_STATS_INIT;
  CHECK(es.size == sizeof es && es.version == SWIFTKV_ELASTIC_STATS_VERSION);

  /* And the library linked with it answers. */
  m.num_layers = 36;
  m.num_kv_heads = 8;
  m.head_dim = 128;
  uint64_t bpt = 0;
  CHECK(swiftkv_geometry_bytes_per_token(&m, &bpt) == SWIFTKV_OK && bpt == 147456);
  CHECK(swiftkv_version() == SWIFTKV_VERSION_NUMBER);
  if (failures == 0)
    printf("header_check (%s): all checks passed\n",
#ifdef __cplusplus
           "C++"
#else
           "C"
#endif
    );
  return failures == 0 ? 0 : 1;
}
