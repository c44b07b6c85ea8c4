// Checking an attention description and planning a batch: the partition into work items is a
// pure function of the lengths, shared by the CUDA kernels and the CPU twin.
#include "core/attention/attention_plan.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "core/common/checked_math.hpp"
#include "core/common/error.hpp"

namespace swiftkv {

namespace {

uint64_t align_up(uint64_t v) { return round_up(v, kAttentionAlign); }

constexpr uint64_t kInt32Max = static_cast<uint64_t>(std::numeric_limits<int32_t>::max());

struct SubRequest {
  int32_t q_begin;
  int32_t q_len;
  int32_t kv_len;
  int32_t page_begin;
  uint64_t rows;  // q_len * group
};

std::string at(const char *array, uint32_t i) {
  return std::string(array) + "[" + std::to_string(i) + "]";
}

std::vector<SubRequest> read_batch(const AttentionShape &s, const AttentionBatch &b) {
  if (b.qo_indptr == nullptr) fail_invalid("qo_indptr is NULL");
  if (b.kv_indptr == nullptr) fail_invalid("kv_indptr is NULL");
  if (b.kv_last_page_len == nullptr && b.n_requests > 0) fail_invalid("kv_last_page_len is NULL");
  if (b.qo_indptr[0] != 0)
    fail_invalid("qo_indptr[0] is " + std::to_string(b.qo_indptr[0]) + ", not 0");
  if (b.kv_indptr[0] != 0)
    fail_invalid("kv_indptr[0] is " + std::to_string(b.kv_indptr[0]) + ", not 0");
  std::vector<SubRequest> out;
  out.reserve(b.n_requests);
  for (uint32_t r = 0; r < b.n_requests; ++r) {
    const int32_t q0 = b.qo_indptr[r], q1 = b.qo_indptr[r + 1];
    const int32_t p0 = b.kv_indptr[r], p1 = b.kv_indptr[r + 1];
    if (q1 < q0) {
      fail_invalid(at("qo_indptr", r + 1) + " is " + std::to_string(q1) + ", below " +
                   at("qo_indptr", r) + " (" + std::to_string(q0) + ")");
    }
    if (p1 < p0) {
      fail_invalid(at("kv_indptr", r + 1) + " is " + std::to_string(p1) + ", below " +
                   at("kv_indptr", r) + " (" + std::to_string(p0) + ")");
    }
    const int32_t last = b.kv_last_page_len[r];
    const int64_t pages = p1 - p0;
    if (pages > 0 && (last < 1 || static_cast<uint32_t>(last) > s.page_tokens)) {
      fail_invalid(at("kv_last_page_len", r) + " is " + std::to_string(last) +
                   "; a sub-request with pages needs 1.." + std::to_string(s.page_tokens));
    }
    if (pages == 0 && last != 0) {
      fail_invalid(at("kv_last_page_len", r) + " is " + std::to_string(last) +
                   " for a sub-request with no pages; it must be 0");
    }
    const uint64_t kv_len =
        pages == 0 ? 0
                   : static_cast<uint64_t>(pages - 1) * s.page_tokens + static_cast<uint64_t>(last);
    if (kv_len > kInt32Max) {
      fail_invalid("sub-request " + std::to_string(r) + " has " + std::to_string(kv_len) +
                   " keys; at most 2^31 - 1 are supported");
    }
    const uint64_t rows = static_cast<uint64_t>(q1 - q0) * s.group();
    out.push_back({q0, q1 - q0, static_cast<int32_t>(kv_len), p0, rows});
  }
  const uint64_t q_tokens = static_cast<uint64_t>(b.qo_indptr[b.n_requests]);
  if (checked_mul(q_tokens, s.num_qo_heads, "query rows (tokens x heads)") > kInt32Max) {
    fail_invalid("the batch has " + std::to_string(q_tokens) + " query tokens of " +
                 std::to_string(s.num_qo_heads) + " heads; at most 2^31 - 1 rows are supported");
  }
  return out;
}

// The split of one layout: pieces per sub-request for a KV piece length (0: no split).
struct Split {
  std::vector<uint32_t> pieces;
  uint64_t items = 0;
  uint64_t partial_rows = 0;
  uint64_t merges = 0;
};

Split split_for(const AttentionShape &s, const std::vector<SubRequest> &subs, uint32_t tile,
                uint64_t piece) {
  Split out;
  out.pieces.resize(subs.size(), 1);
  for (size_t r = 0; r < subs.size(); ++r) {
    const SubRequest &q = subs[r];
    if (q.rows == 0) {
      out.pieces[r] = 0;
      continue;
    }
    const uint64_t tiles = ceil_div(q.rows, tile);
    uint64_t pieces = 1;
    if (piece > 0 && static_cast<uint64_t>(q.kv_len) > piece) {
      pieces = ceil_div(static_cast<uint64_t>(q.kv_len), piece);
    }
    out.pieces[r] = static_cast<uint32_t>(pieces);
    out.items += tiles * s.num_kv_heads * pieces;
    if (pieces > 1) {
      out.partial_rows += q.rows * s.num_kv_heads * pieces;
      out.merges += s.num_kv_heads;
    }
  }
  return out;
}

struct Offsets {
  uint64_t work, merge, partial_o, partial_lse, bytes;
};

Offsets offsets_for(const AttentionShape &s, uint64_t items, uint64_t merges, uint64_t rows) {
  Offsets o{};
  o.work = kAttentionWorkOffset;
  o.merge = align_up(
      checked_add(o.work, checked_mul(items, sizeof(AttentionWorkItem), "work list"), "workspace"));
  o.partial_o = align_up(checked_add(
      o.merge, checked_mul(merges, sizeof(AttentionMergeItem), "merge list"), "workspace"));
  o.partial_lse = align_up(checked_add(
      o.partial_o,
      checked_mul(checked_mul(rows, s.head_dim, "partial rows"), sizeof(float), "partials"),
      "workspace"));
  o.bytes = align_up(
      checked_add(o.partial_lse, checked_mul(rows, sizeof(float), "partials"), "workspace"));
  return o;
}

}  // namespace

AttentionShape check_attention_shape(const swiftkv_attention_desc &d, int32_t raw_dtype) {
  AttentionShape s;
  if (d.device < SWIFTKV_DEVICE_HOST) {
    fail_invalid("desc->device is " + std::to_string(d.device) +
                 "; use SWIFTKV_DEVICE_HOST or a CUDA device ordinal");
  }
  s.device = d.device;
  const int32_t dtype = raw_dtype;
  if (dtype == SWIFTKV_DTYPE_F32) {
    if (d.device != SWIFTKV_DEVICE_HOST) {
      fail(SWIFTKV_EUNSUPPORTED,
           "desc->dtype F32 runs on the host only; use F16 or BF16 on a device");
    }
  } else if (dtype != SWIFTKV_DTYPE_F16 && dtype != SWIFTKV_DTYPE_BF16) {
    fail(SWIFTKV_EUNSUPPORTED,
         "desc->dtype " + std::to_string(dtype) +
             " is not supported by attention: use F16 or BF16 (or F32 on the host)");
  }
  s.dtype = static_cast<swiftkv_dtype>(dtype);
  if (d.num_kv_heads == 0) fail_invalid("desc->num_kv_heads is 0");
  if (d.num_qo_heads == 0 || d.num_qo_heads % d.num_kv_heads != 0) {
    fail_invalid("desc->num_qo_heads is " + std::to_string(d.num_qo_heads) +
                 "; it must be a non-zero multiple of num_kv_heads (" +
                 std::to_string(d.num_kv_heads) + ")");
  }
  if (d.num_qo_heads > 65535) fail_invalid("desc->num_qo_heads is above 65535");
  s.num_qo_heads = d.num_qo_heads;
  s.num_kv_heads = d.num_kv_heads;
  if (d.head_dim != 64 && d.head_dim != 128 && d.head_dim != 256) {
    fail(SWIFTKV_EUNSUPPORTED, "desc->head_dim is " + std::to_string(d.head_dim) +
                                   "; attention supports 64, 128 and 256");
  }
  s.head_dim = d.head_dim;
  if (d.page_tokens < 1 || d.page_tokens > 256) {
    fail_invalid("desc->page_tokens is " + std::to_string(d.page_tokens) + "; it must be 1..256");
  }
  s.page_tokens = d.page_tokens;
  if (d.causal > 1) fail_invalid("desc->causal is " + std::to_string(d.causal) + "; use 0 or 1");
  s.causal = d.causal == 1;
  if (d.kv_chunk_tokens % 16 != 0) {
    fail_invalid("desc->kv_chunk_tokens is " + std::to_string(d.kv_chunk_tokens) +
                 "; it must be 0 or a multiple of 16");
  }
  s.kv_chunk_tokens = d.kv_chunk_tokens;
  if (!(std::isfinite(d.sm_scale) && d.sm_scale >= 0.0f)) {
    fail_invalid("desc->sm_scale must be a finite value >= 0 (0: 1/sqrt(head_dim))");
  }
  s.sm_scale = d.sm_scale > 0.0f
                   ? d.sm_scale
                   : static_cast<float>(1.0 / std::sqrt(static_cast<double>(d.head_dim)));
  if (!(std::isfinite(d.logits_soft_cap) && d.logits_soft_cap >= 0.0f)) {
    fail_invalid("desc->logits_soft_cap must be a finite value >= 0 (0: none)");
  }
  s.soft_cap = d.logits_soft_cap;
  return s;
}

namespace {

// How the batch's KV is cut: desc->kv_chunk_tokens when set; otherwise, when the batch gives
// fewer work items than `parallelism`, the longest KV in enough pieces to reach it, no finer
// than the minimum, and coarser again while the workspace has no room for the partials.
// *piece_len is 0 when nothing is cut.
Split choose_split(const AttentionShape &s, const std::vector<SubRequest> &subs, uint32_t tile_rows,
                   uint64_t max_kv, uint64_t workspace_bytes, uint32_t parallelism,
                   uint64_t *piece_len) {
  *piece_len = 0;
  if (s.kv_chunk_tokens > 0) {
    *piece_len = s.kv_chunk_tokens;
    return split_for(s, subs, tile_rows, s.kv_chunk_tokens);
  }
  Split split = split_for(s, subs, tile_rows, 0);
  if (split.items == 0 || split.items >= parallelism || max_kv <= kAttentionMinPiece) return split;
  const uint64_t want = ceil_div(parallelism, split.items);
  uint64_t piece =
      std::max<uint64_t>(kAttentionMinPiece, ceil_div(ceil_div(max_kv, want), 64) * 64);
  for (; piece < max_kv; piece *= 2) {
    Split candidate = split_for(s, subs, tile_rows, piece);
    if (offsets_for(s, candidate.items, candidate.merges, candidate.partial_rows).bytes <=
        workspace_bytes) {
      *piece_len = piece;
      return candidate;
    }
  }
  return split;
}

// The work items (and merges of split sub-requests) of one sub-request: per KV head, per piece
// of piece_len keys (the last shorter), per tile of rows.
void add_work(const AttentionShape &s, const SubRequest &q, uint32_t pieces, uint64_t piece_len,
              int32_t *partial_next, AttentionPlan &plan) {
  const uint64_t len = pieces == 1 ? static_cast<uint64_t>(q.kv_len) : piece_len;
  const int32_t rows = static_cast<int32_t>(q.rows);
  for (uint32_t h = 0; h < s.num_kv_heads; ++h) {
    const int32_t base = pieces > 1 ? *partial_next : -1;
    if (pieces > 1) {
      plan.merge.push_back({q.q_begin,
                            q.q_len,
                            static_cast<int32_t>(h),
                            static_cast<int32_t>(pieces),
                            base,
                            {0, 0, 0}});
      *partial_next += rows * static_cast<int32_t>(pieces);
    }
    for (uint32_t p = 0; p < pieces; ++p) {
      const auto kb =
          static_cast<int32_t>(std::min<uint64_t>(p * len, static_cast<uint64_t>(q.kv_len)));
      const auto ke =
          static_cast<int32_t>(std::min<uint64_t>((p + 1) * len, static_cast<uint64_t>(q.kv_len)));
      for (int32_t row = 0; row < rows; row += static_cast<int32_t>(plan.tile_rows)) {
        plan.work.push_back({q.q_begin,
                             q.q_len,
                             q.kv_len,
                             q.page_begin,
                             static_cast<int32_t>(h),
                             row,
                             pieces == 1 ? 0 : kb,
                             pieces == 1 ? q.kv_len : ke,
                             pieces > 1 ? base + static_cast<int32_t>(p) * rows : -1,
                             {0, 0, 0}});
      }
    }
  }
  if (pieces > 1) ++plan.split_requests;
  plan.max_pieces = std::max(plan.max_pieces, pieces);
}

}  // namespace

AttentionPlan plan_attention(const AttentionShape &s, const AttentionBatch &b,
                             uint64_t workspace_bytes, uint32_t parallelism) {
  const std::vector<SubRequest> subs = read_batch(s, b);
  AttentionPlan plan;
  uint64_t max_rows = 0, max_kv = 0;
  for (const SubRequest &q : subs) {
    max_rows = std::max(max_rows, q.rows);
    max_kv = std::max<uint64_t>(max_kv, static_cast<uint64_t>(q.kv_len));
    plan.kv_tokens += static_cast<uint64_t>(q.kv_len);
  }
  plan.q_tokens = static_cast<uint64_t>(b.qo_indptr[b.n_requests]);
  plan.kv_entries = static_cast<uint64_t>(b.kv_indptr[b.n_requests]);
  plan.tile_rows = max_rows <= kAttentionSmallTile ? kAttentionSmallTile : kAttentionLargeTile;

  uint64_t piece_len = 0;
  const Split split =
      choose_split(s, subs, plan.tile_rows, max_kv, workspace_bytes, parallelism, &piece_len);
  if (split.items > kInt32Max || split.partial_rows > kInt32Max) {
    fail_invalid("the batch needs more than 2^31 - 1 work items or partial rows");
  }
  const Offsets o = offsets_for(s, split.items, split.merges, split.partial_rows);
  if (o.bytes > workspace_bytes) {
    fail(SWIFTKV_ENOMEM, "the plan needs " + std::to_string(o.bytes) +
                             " workspace bytes and workspace_bytes is " +
                             std::to_string(workspace_bytes));
  }
  int32_t partial_next = 0;
  plan.work.reserve(split.items);
  for (size_t r = 0; r < subs.size(); ++r) {
    if (split.pieces[r] != 0) add_work(s, subs[r], split.pieces[r], piece_len, &partial_next, plan);
  }
  plan.partial_rows = static_cast<uint64_t>(partial_next);
  plan.work_offset = o.work;
  plan.merge_offset = o.merge;
  plan.partial_o_offset = o.partial_o;
  plan.partial_lse_offset = o.partial_lse;
  plan.bytes = o.bytes;
  return plan;
}

uint64_t attention_workspace_bound(const AttentionShape &s, uint32_t max_requests,
                                   uint64_t max_q_tokens) {
  // Unsplit: at most one partly filled tile per sub-request beyond the full ones.
  const uint64_t rows = checked_mul(max_q_tokens, s.group(), "query rows");
  const uint64_t items = checked_mul(checked_add(rows / kAttentionSmallTile, max_requests, "tiles"),
                                     s.num_kv_heads, "work items");
  // Splits: each partial row of a piece adds at most one item (a tile holds >= 1 row).
  const uint64_t split_items = kAttentionSplitRows;
  const uint64_t merges = checked_mul(max_requests, s.num_kv_heads, "merges");
  return offsets_for(s, checked_add(items, split_items, "work items"), merges, kAttentionSplitRows)
      .bytes;
}

void serialize_attention_plan(const AttentionPlan &plan, uint64_t check, void *dst,
                              uint64_t header_and_lists_bytes) {
  auto *bytes = static_cast<unsigned char *>(dst);
  std::memset(bytes, 0, header_and_lists_bytes);
  AttentionWorkspaceHeader h{kAttentionWorkspaceMagic, check, {0, 0}};
  std::memcpy(bytes, &h, sizeof h);
  if (!plan.work.empty()) {
    std::memcpy(bytes + plan.work_offset, plan.work.data(),
                plan.work.size() * sizeof(AttentionWorkItem));
  }
  if (!plan.merge.empty()) {
    std::memcpy(bytes + plan.merge_offset, plan.merge.data(),
                plan.merge.size() * sizeof(AttentionMergeItem));
  }
}

}  // namespace swiftkv
