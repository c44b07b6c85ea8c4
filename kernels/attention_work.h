// The work list of multi-token paged attention: what the host plan writes into the workspace
// and what both runs (CUDA kernels and the CPU twin) read. Plain structs, no CUDA header.
#pragma once

#include <cstdint>

namespace swiftkv {

// One unit of a run: the packed rows [row_begin, row_begin + tile_rows) of one sub-request and
// one KV head, over the keys [kv_begin, kv_end). A packed row is (query token i, head j of the
// KV head's group): row = i * group + j, so a decode step with GQA still fills a tile.
struct AttentionWorkItem {
  int32_t q_begin;     // the sub-request's first query token in q and out
  int32_t q_len;       // its query tokens
  int32_t kv_len;      // its keys (all pieces)
  int32_t page_begin;  // its first entry in kv_indices
  int32_t kv_head;
  int32_t row_begin;  // first packed row of this tile
  int32_t kv_begin;   // this piece's keys
  int32_t kv_end;
  int32_t partial;  // -1: write out and lse; else the piece's first row in the partials
  int32_t reserved[3];
};
static_assert(sizeof(AttentionWorkItem) == 48);

// The merge of one (sub-request, KV head) whose keys were split into `pieces`: row r of piece p
// is partial row partial_base + p * rows + r, with rows = q_len * group.
struct AttentionMergeItem {
  int32_t q_begin;
  int32_t q_len;
  int32_t kv_head;
  int32_t pieces;
  int32_t partial_base;
  int32_t reserved[3];
};
static_assert(sizeof(AttentionMergeItem) == 32);

// The fixed parameters of a run, passed by value to the kernels and the CPU twin.
struct AttentionParams {
  const void *q;
  int64_t q_token_stride;
  int64_t q_head_stride;
  const void *k;
  const void *v;
  int64_t page_stride;
  int64_t token_stride;
  int64_t head_stride;
  const int32_t *kv_indices;
  int32_t num_pages;
  int32_t num_qo_heads;
  int32_t group;  // query heads per KV head
  int32_t page_tokens;
  int32_t causal;
  int32_t tile_rows;  // packed rows per work item (the plan's)
  int32_t head_dim;
  float sm_scale;
  float soft_cap;  // 0: none
  void *out;
  int64_t out_token_stride;
  int64_t out_head_stride;
  float *lse;  // may be null
  const AttentionWorkItem *work;
  int32_t n_work;
  int32_t n_merge;
  const AttentionMergeItem *merge;
  float *partial_o;    // [partial rows, head_dim]
  float *partial_lse;  // [partial rows]
};

}  // namespace swiftkv
