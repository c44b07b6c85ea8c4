// The host half of multi-token paged attention: the checked shape of a run and the plan that
// partitions a batch into work items (query tiles x KV heads x KV pieces) and merges.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/attention_work.h"
#include "swiftkv/swiftkv.h"

namespace swiftkv {

// A checked swiftkv_attention_desc.
struct AttentionShape {
  int32_t device = SWIFTKV_DEVICE_HOST;
  swiftkv_dtype dtype = SWIFTKV_DTYPE_F16;
  uint32_t num_qo_heads = 0;
  uint32_t num_kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t page_tokens = 0;
  bool causal = true;
  uint32_t kv_chunk_tokens = 0;  // 0: automatic
  float sm_scale = 0;            // resolved: > 0
  float soft_cap = 0;

  uint32_t group() const { return num_qo_heads / num_kv_heads; }
};

// Checks every field (the message names it) and resolves the default scale. `raw_dtype` is
// d.dtype as stored, read without trusting it to be an enumerator.
AttentionShape check_attention_shape(const swiftkv_attention_desc &d, int32_t raw_dtype);

// The largest packed rows one work item covers: a tile of 16 rows for decode-like batches, 64
// otherwise. The kernels are instantiated for exactly these.
inline constexpr uint32_t kAttentionSmallTile = 16;
inline constexpr uint32_t kAttentionLargeTile = 64;
// Automatic splitting never cuts KV finer than this: a piece must amortise its merge.
inline constexpr uint32_t kAttentionMinPiece = 256;
// Partial rows the workspace bound leaves for splits, beyond what the batch needs unsplit.
inline constexpr uint64_t kAttentionSplitRows = 32768;
inline constexpr uint64_t kAttentionAlign = 256;

// The host arrays of one batch.
struct AttentionBatch {
  const int32_t *qo_indptr = nullptr;
  const int32_t *kv_indptr = nullptr;
  const int32_t *kv_last_page_len = nullptr;
  uint32_t n_requests = 0;
};

// A plan: the work list, and where each part lies in the workspace.
struct AttentionPlan {
  uint32_t tile_rows = 0;
  std::vector<AttentionWorkItem> work;
  std::vector<AttentionMergeItem> merge;
  uint64_t partial_rows = 0;
  uint64_t q_tokens = 0;
  uint64_t kv_tokens = 0;
  uint64_t kv_entries = 0;  // kv_indptr[n]: how many page ids a run reads
  uint32_t split_requests = 0;
  uint32_t max_pieces = 0;
  // Byte offsets in the workspace; the work list starts after the header.
  uint64_t work_offset = 0;
  uint64_t merge_offset = 0;
  uint64_t partial_o_offset = 0;
  uint64_t partial_lse_offset = 0;
  uint64_t bytes = 0;
};

// The header at the start of a planned workspace: a run on the host checks it against the plan
// it is given (a device run cannot read it, and trusts the plan's check word).
struct AttentionWorkspaceHeader {
  uint64_t magic;
  uint64_t check;
  uint64_t reserved[2];
};
inline constexpr uint64_t kAttentionWorkspaceMagic = 0x31414b56'54464957ull;  // "WIFTVKA1"
// The work list starts right after the header, on the workspace's alignment.
inline constexpr uint64_t kAttentionWorkOffset =
    (sizeof(AttentionWorkspaceHeader) + kAttentionAlign - 1) / kAttentionAlign * kAttentionAlign;

// Builds the plan of a batch. `parallelism` is how many work items keep the device busy (the
// plan splits KV only to reach it); `workspace_bytes` bounds the split. EINVAL names a bad
// array entry; ENOMEM says how many bytes the plan needs when even the unsplit one does not fit
// (or an explicit kv_chunk_tokens's does not).
AttentionPlan plan_attention(const AttentionShape &shape, const AttentionBatch &batch,
                             uint64_t workspace_bytes, uint32_t parallelism);

// The workspace bytes any batch within the bounds needs, with kAttentionSplitRows of room to
// split.
uint64_t attention_workspace_bound(const AttentionShape &shape, uint32_t max_requests,
                                   uint64_t max_q_tokens);

// Writes the header, work list and merges into `dst` (host memory, plan.bytes long, zeroing
// the gaps; the partial rows are left as they are).
void serialize_attention_plan(const AttentionPlan &plan, uint64_t check, void *dst,
                              uint64_t header_and_lists_bytes);

}  // namespace swiftkv
