// Paged attention at the ABI: descriptions checked into shapes, plans written into the caller's
// workspace with a check word, and runs dispatched to the CPU twin or the CUDA kernels.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <xxhash.h>

#include "capi/capi_guard.hpp"
#include "capi/raw_enum.hpp"
#include "capi/versioned.hpp"
#include "core/attention/attention_cpu.hpp"
#include "core/attention/attention_plan.hpp"
#include "core/attention/cuda_attention.hpp"
#include "core/common/checked_math.hpp"

namespace swiftkv::capi {

namespace {

constexpr size_t kDescV1Size = offsetof(swiftkv_attention_desc, logits_soft_cap) + sizeof(float);
constexpr size_t kPlanV1Size = offsetof(swiftkv_attention_plan, internal) + 12 * sizeof(uint64_t);
constexpr size_t kArgsV1Size = offsetof(swiftkv_attention_args, lse) + sizeof(float *);

AttentionShape read_desc(const swiftkv_attention_desc *desc) {
  const swiftkv_attention_desc defaults = SWIFTKV_ATTENTION_DESC_INIT;
  const swiftkv_attention_desc d =
      read_versioned(desc, defaults, SWIFTKV_ATTENTION_DESC_VERSION, kDescV1Size, "desc",
                     "SWIFTKV_ATTENTION_DESC_INIT");
  return check_attention_shape(d, raw_enum_value(d.dtype));
}

uint64_t pack(uint32_t lo, uint32_t hi) { return uint64_t{lo} | (uint64_t{hi} << 32); }
uint32_t lo32(uint64_t v) { return static_cast<uint32_t>(v); }
uint32_t hi32(uint64_t v) { return static_cast<uint32_t>(v >> 32); }
uint32_t float_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}
float bits_float(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}

// The check word over everything a run trusts (the fields from n_requests up to the check word
// itself, a struct without padding): a plan struct that was not made by
// swiftkv_attention_plan_make, or was changed since, fails it.
uint64_t check_word(const swiftkv_attention_plan &p) {
  constexpr size_t first = offsetof(swiftkv_attention_plan, n_requests);
  constexpr size_t end = offsetof(swiftkv_attention_plan, internal) + 11 * sizeof(uint64_t);
  return XXH3_64bits(reinterpret_cast<const unsigned char *>(&p) + first, end - first);
}

// What a run needs from its plan, as the plan struct carries it.
struct PlanView {
  AttentionShape shape;
  uint32_t tile_rows;
  uintptr_t workspace;
  uint32_t n_work, n_merge;
  uint64_t work_offset, merge_offset, partial_o_offset, partial_lse_offset;
  uint64_t check;
  uint64_t q_tokens, kv_tokens;
};

PlanView read_plan(const swiftkv_attention_plan *plan) {
  require(plan, "plan");
  check_struct_header<swiftkv_attention_plan>(plan->size, plan->version,
                                              SWIFTKV_ATTENTION_PLAN_VERSION, kPlanV1Size, "plan",
                                              "SWIFTKV_ATTENTION_PLAN_INIT");
  const uint64_t *in = plan->internal;
  if (in[0] != kAttentionWorkspaceMagic || in[11] != check_word(*plan)) {
    fail_invalid("plan was not made by swiftkv_attention_plan_make, or was changed since");
  }
  PlanView v{};
  v.shape.device = static_cast<int32_t>(lo32(in[1]));
  v.shape.dtype = static_cast<swiftkv_dtype>(hi32(in[1]));
  v.shape.num_qo_heads = lo32(in[2]);
  v.shape.num_kv_heads = hi32(in[2]);
  v.shape.head_dim = lo32(in[3]);
  v.shape.page_tokens = hi32(in[3]);
  v.shape.causal = lo32(in[4]) != 0;
  v.tile_rows = hi32(in[4]);
  v.shape.sm_scale = bits_float(lo32(in[5]));
  v.shape.soft_cap = bits_float(hi32(in[5]));
  v.workspace = static_cast<uintptr_t>(in[6]);
  v.n_work = lo32(in[7]);
  v.n_merge = hi32(in[7]);
  v.work_offset = kAttentionWorkOffset;
  v.merge_offset = in[8];
  v.partial_o_offset = in[9];
  v.partial_lse_offset = in[10];
  v.check = in[11];
  v.q_tokens = plan->q_tokens;
  v.kv_tokens = plan->kv_tokens;
  return v;
}

// The last element a strided tensor reaches must be addressable in 64 bits.
void check_reach(uint64_t n0, int64_t s0, uint64_t n1, int64_t s1, uint64_t n2, int64_t s2,
                 uint32_t dim, const char *what) {
  uint64_t reach = dim;
  if (n0 > 0)
    reach = checked_add(reach, checked_mul(n0 - 1, static_cast<uint64_t>(s0), what), what);
  if (n1 > 0)
    reach = checked_add(reach, checked_mul(n1 - 1, static_cast<uint64_t>(s1), what), what);
  if (n2 > 0)
    reach = checked_add(reach, checked_mul(n2 - 1, static_cast<uint64_t>(s2), what), what);
  if (reach > static_cast<uint64_t>(INT64_MAX))
    fail_invalid(std::string(what) + " reaches past 2^63 elements");
}

void require_stride(int64_t v, const char *name) {
  if (v < 1)
    fail_invalid(std::string("args->") + name + " is " + std::to_string(v) +
                 "; strides must be >= 1");
}

bool aligned16(const void *p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

}  // namespace swiftkv::capi

using namespace swiftkv;
using namespace swiftkv::capi;

extern "C" {

swiftkv_status swiftkv_attention_workspace_size(uint64_t *bytes_out,
                                                const swiftkv_attention_desc *desc,
                                                uint32_t max_requests, uint64_t max_q_tokens) {
  try {
    require(bytes_out, "bytes_out");
    const AttentionShape s = read_desc(desc);
    *bytes_out = attention_workspace_bound(s, max_requests, max_q_tokens);
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

swiftkv_status swiftkv_attention_plan_make(swiftkv_attention_plan *out,
                                           const swiftkv_attention_desc *desc,
                                           const int32_t *qo_indptr, const int32_t *kv_indptr,
                                           const int32_t *kv_last_page_len, uint32_t n_requests,
                                           void *workspace, uint64_t workspace_bytes,
                                           void *stream) {
  try {
    require(out, "out");
    check_struct_header<swiftkv_attention_plan>(out->size, out->version,
                                                SWIFTKV_ATTENTION_PLAN_VERSION, kPlanV1Size, "out",
                                                "SWIFTKV_ATTENTION_PLAN_INIT");
    const AttentionShape s = read_desc(desc);
    require(workspace, "workspace");
    if (reinterpret_cast<uintptr_t>(workspace) % kAttentionAlign != 0) {
      fail_invalid("workspace is not 256-byte aligned");
    }
    const bool host = s.device == SWIFTKV_DEVICE_HOST;
    if (host && stream != nullptr)
      fail_invalid("stream is not NULL, and a host plan takes no stream");
    const uint32_t parallelism = host ? 1 : attention_device_parallelism(s.device);
    const AttentionPlan plan =
        plan_attention(s, AttentionBatch{qo_indptr, kv_indptr, kv_last_page_len, n_requests},
                       workspace_bytes, parallelism);

    swiftkv_attention_plan p = SWIFTKV_ATTENTION_PLAN_INIT;
    p.n_requests = n_requests;
    p.work_items = static_cast<uint32_t>(plan.work.size());
    p.q_tokens = plan.q_tokens;
    p.kv_tokens = plan.kv_tokens;
    p.split_requests = plan.split_requests;
    p.max_kv_pieces = plan.max_pieces;
    p.workspace_bytes = plan.bytes;
    p.internal[0] = kAttentionWorkspaceMagic;
    p.internal[1] = pack(static_cast<uint32_t>(s.device), static_cast<uint32_t>(s.dtype));
    p.internal[2] = pack(s.num_qo_heads, s.num_kv_heads);
    p.internal[3] = pack(s.head_dim, s.page_tokens);
    p.internal[4] = pack(s.causal ? 1u : 0u, plan.tile_rows);
    p.internal[5] = pack(float_bits(s.sm_scale), float_bits(s.soft_cap));
    p.internal[6] = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(workspace));
    p.internal[7] =
        pack(static_cast<uint32_t>(plan.work.size()), static_cast<uint32_t>(plan.merge.size()));
    p.internal[8] = plan.merge_offset;
    p.internal[9] = plan.partial_o_offset;
    p.internal[10] = plan.partial_lse_offset;
    p.internal[11] = check_word(p);

    // Header, work list and merges; the partial rows are the run's scratch.
    if (host) {
      serialize_attention_plan(plan, p.internal[11], workspace, plan.partial_o_offset);
    } else {
      std::vector<unsigned char> staged(plan.partial_o_offset);
      serialize_attention_plan(plan, p.internal[11], staged.data(), staged.size());
      attention_copy_plan(s.device, workspace, staged.data(), staged.size(), stream);
    }
    write_versioned(out, p, SWIFTKV_ATTENTION_PLAN_VERSION, kPlanV1Size, "out",
                    "SWIFTKV_ATTENTION_PLAN_INIT");
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

namespace {

// Every pointer, stride and count of a run's arguments against the plan's shape: EINVAL before
// anything is read.
void check_run_args(const PlanView &v, const swiftkv_attention_args &a, const void *workspace,
                    const void *stream) {
  require(workspace, "workspace");
  if (reinterpret_cast<uintptr_t>(workspace) != v.workspace) {
    fail_invalid("workspace is not the one the plan was made in");
  }
  if (a.reserved0 != 0) fail_invalid("args->reserved0 is not 0");
  const AttentionShape &s = v.shape;
  if (v.q_tokens > 0) {
    require(a.q, "args->q");
    require(a.out, "args->out");
    require_stride(a.q_token_stride, "q_token_stride");
    require_stride(a.q_head_stride, "q_head_stride");
    require_stride(a.out_token_stride, "out_token_stride");
    require_stride(a.out_head_stride, "out_head_stride");
    check_reach(v.q_tokens, a.q_token_stride, s.num_qo_heads, a.q_head_stride, 0, 0, s.head_dim,
                "q");
    check_reach(v.q_tokens, a.out_token_stride, s.num_qo_heads, a.out_head_stride, 0, 0, s.head_dim,
                "out");
  }
  if (v.kv_tokens > 0) {
    require(a.k_base, "args->k_base");
    require(a.v_base, "args->v_base");
    require(a.kv_indices, "args->kv_indices");
    require_stride(a.page_stride, "page_stride");
    require_stride(a.token_stride, "token_stride");
    require_stride(a.head_stride, "head_stride");
    if (a.num_pages == 0 || a.num_pages > static_cast<uint32_t>(INT32_MAX)) {
      fail_invalid("args->num_pages is " + std::to_string(a.num_pages) +
                   "; it must be 1..2^31 - 1");
    }
    check_reach(a.num_pages, a.page_stride, s.page_tokens, a.token_stride, s.num_kv_heads,
                a.head_stride, s.head_dim, "k and v");
  }
  if (s.device == SWIFTKV_DEVICE_HOST && stream != nullptr) {
    fail_invalid("stream is not NULL, and a host run takes no stream");
  }
}

// What the kernel and its CPU twin take: the arguments, the shape, and the plan's lists in the
// workspace.
AttentionParams run_params(const PlanView &v, const swiftkv_attention_args &a, void *workspace) {
  const AttentionShape &s = v.shape;
  auto *ws = static_cast<unsigned char *>(workspace);
  AttentionParams p{};
  p.q = a.q;
  p.q_token_stride = a.q_token_stride;
  p.q_head_stride = a.q_head_stride;
  p.k = a.k_base;
  p.v = a.v_base;
  p.page_stride = a.page_stride;
  p.token_stride = a.token_stride;
  p.head_stride = a.head_stride;
  p.kv_indices = a.kv_indices;
  p.num_pages = static_cast<int32_t>(a.num_pages);
  p.num_qo_heads = static_cast<int32_t>(s.num_qo_heads);
  p.group = static_cast<int32_t>(s.group());
  p.page_tokens = static_cast<int32_t>(s.page_tokens);
  p.causal = s.causal ? 1 : 0;
  p.tile_rows = static_cast<int32_t>(v.tile_rows);
  p.head_dim = static_cast<int32_t>(s.head_dim);
  p.sm_scale = s.sm_scale;
  p.soft_cap = s.soft_cap;
  p.out = a.out;
  p.out_token_stride = a.out_token_stride;
  p.out_head_stride = a.out_head_stride;
  p.lse = a.lse;
  p.work = reinterpret_cast<const AttentionWorkItem *>(ws + v.work_offset);
  p.n_work = static_cast<int32_t>(v.n_work);
  p.merge = reinterpret_cast<const AttentionMergeItem *>(ws + v.merge_offset);
  p.n_merge = static_cast<int32_t>(v.n_merge);
  p.partial_o = reinterpret_cast<float *>(ws + v.partial_o_offset);
  p.partial_lse = reinterpret_cast<float *>(ws + v.partial_lse_offset);
  return p;
}

// The host run: the workspace must still hold this plan, and every page index is checked.
void run_on_host(const PlanView &v, const AttentionParams &p, const void *workspace) {
  AttentionWorkspaceHeader h;
  std::memcpy(&h, workspace, sizeof h);
  if (h.magic != kAttentionWorkspaceMagic || h.check != v.check) {
    fail_invalid("the workspace no longer holds this plan (planned into again, or overwritten)");
  }
  check_attention_pages(p);
  run_attention_cpu(v.shape, p);
}

}  // namespace

swiftkv_status swiftkv_attention_run(const swiftkv_attention_plan *plan,
                                     const swiftkv_attention_args *args, void *workspace,
                                     void *stream) {
  try {
    const PlanView v = read_plan(plan);
    const swiftkv_attention_args defaults = SWIFTKV_ATTENTION_ARGS_INIT;
    const swiftkv_attention_args a =
        read_versioned(args, defaults, SWIFTKV_ATTENTION_ARGS_VERSION, kArgsV1Size, "args",
                       "SWIFTKV_ATTENTION_ARGS_INIT");
    check_run_args(v, a, workspace, stream);
    const AttentionParams p = run_params(v, a, workspace);
    if (v.shape.device == SWIFTKV_DEVICE_HOST) {
      run_on_host(v, p, workspace);
    } else {
      // 16-byte loads need 16-byte aligned bases and strides of whole 16-byte pieces.
      const bool vectorised = aligned16(a.q) && aligned16(a.k_base) && aligned16(a.v_base) &&
                              a.q_token_stride % 8 == 0 && a.q_head_stride % 8 == 0 &&
                              a.page_stride % 8 == 0 && a.token_stride % 8 == 0 &&
                              a.head_stride % 8 == 0;
      attention_run_cuda(v.shape, p, vectorised, stream);
    }
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

}  // extern "C"
