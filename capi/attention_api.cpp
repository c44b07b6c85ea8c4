// Paged attention at the ABI: descriptions checked into shapes, plans written into the caller's
// workspace with a check word, and runs dispatched to the CPU twin or the CUDA kernels.
#include <algorithm>
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
#include "core/attention/flashinfer_map.hpp"
#include "core/common/checked_math.hpp"
#include "core/common/error.hpp"

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

// What a run needs from its plan, as the plan struct carries it:
//   internal[0]  the magic's low half | FlashInfer's partial rows
//   internal[1]  device | dtype            internal[2]  num_qo_heads | num_kv_heads
//   internal[3]  head_dim | page_tokens
//   internal[4]  the plan word (AttentionPlanWord: causal, tile rows, FlashInfer's refusal,
//                query tile, split and blocks per KV head)
//   internal[5]  sm_scale | soft cap       internal[6]  the workspace's address
//   internal[7]  work items | merges       internal[8]  merge offset | FlashInfer's offset / 256
//   internal[9]  partial_o offset          internal[10] partial_lse offset
//   internal[11] the check word
struct PlanView {
  AttentionShape shape;
  uint32_t tile_rows;
  uintptr_t workspace;
  uint32_t n_work, n_merge;
  uint64_t work_offset, merge_offset, partial_o_offset, partial_lse_offset;
  uint64_t check;
  uint64_t q_tokens, kv_tokens;
  uint32_t n_requests;
  FlashInferRefusal fi_refusal;
  uint32_t fi_cta_tile_q, fi_ctas;
  bool fi_split;
  uint64_t fi_offset, fi_partial_rows;
};

PlanView read_plan(const swiftkv_attention_plan *plan) {
  require(plan, "plan");
  check_struct_header<swiftkv_attention_plan>(plan->size, plan->version,
                                              SWIFTKV_ATTENTION_PLAN_VERSION, kPlanV1Size, "plan",
                                              "SWIFTKV_ATTENTION_PLAN_INIT");
  const uint64_t *in = plan->internal;
  if (lo32(in[0]) != lo32(kAttentionWorkspaceMagic) || in[11] != check_word(*plan)) {
    fail_invalid("plan was not made by swiftkv_attention_plan_make, or was changed since");
  }
  PlanView v{};
  v.shape.device = static_cast<int32_t>(lo32(in[1]));
  v.shape.dtype = static_cast<swiftkv_dtype>(hi32(in[1]));
  v.shape.num_qo_heads = lo32(in[2]);
  v.shape.num_kv_heads = hi32(in[2]);
  v.shape.head_dim = lo32(in[3]);
  v.shape.page_tokens = hi32(in[3]);
  const AttentionPlanWord word = decode_plan_word(in[4]);
  v.shape.causal = word.causal;
  v.tile_rows = word.tile_rows;
  v.fi_refusal = word.refusal;
  v.fi_cta_tile_q = word.cta_tile_q;
  v.fi_split = word.split;
  v.fi_ctas = word.ctas;
  v.fi_partial_rows = hi32(in[0]);
  v.shape.sm_scale = bits_float(lo32(in[5]));
  v.shape.soft_cap = bits_float(hi32(in[5]));
  v.workspace = static_cast<uintptr_t>(in[6]);
  v.n_work = lo32(in[7]);
  v.n_merge = hi32(in[7]);
  v.work_offset = kAttentionWorkOffset;
  v.merge_offset = lo32(in[8]);
  v.fi_offset = uint64_t{hi32(in[8])} * kAttentionAlign;
  v.partial_o_offset = in[9];
  v.partial_lse_offset = in[10];
  v.check = in[11];
  v.q_tokens = plan->q_tokens;
  v.kv_tokens = plan->kv_tokens;
  v.n_requests = plan->n_requests;
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
    const AttentionBatch batch{qo_indptr, kv_indptr, kv_last_page_len, n_requests};
    AttentionPlan plan = plan_attention(s, batch, workspace_bytes, parallelism);

    // FlashInfer's schedule and arrays go after the library's own plan (which the fa2 kernel
    // runs), when the workspace has room for both.
    FlashInferSchedule sched;
    FlashInferRefusal fi = FlashInferRefusal::host;
    if (!host) {
      fi = flashinfer_built()
               ? flashinfer_schedule(s, batch, std::min(parallelism, kFlashInferMaxCtas), &sched)
               : FlashInferRefusal::not_built;
    }
    FlashInferLayout layout;
    uint64_t fi_offset = 0;
    if (fi == FlashInferRefusal::none) {
      layout = flashinfer_layout(s, n_requests, plan.q_tokens, sched.ctas(), sched.split,
                                 sched.partial_rows);
      if (plan.bytes + layout.bytes > workspace_bytes && layout.bytes < workspace_bytes) {
        // The library's plan splits less to leave FlashInfer its room.
        try {
          plan = plan_attention(s, batch, workspace_bytes - layout.bytes, parallelism);
        } catch (const Error &e) {
          if (e.status() != SWIFTKV_ENOMEM) throw;
        }
      }
      fi_offset = plan.bytes;
      if (fi_offset + layout.bytes > workspace_bytes) fi = FlashInferRefusal::workspace;
    }
    if (plan.merge_offset > UINT32_MAX || fi_offset / kAttentionAlign > UINT32_MAX) {
      fail_invalid("the batch's work list passes the plan's 4 GiB of offsets");
    }
    if (fi != FlashInferRefusal::none) sched = FlashInferSchedule{};

    swiftkv_attention_plan p = SWIFTKV_ATTENTION_PLAN_INIT;
    p.n_requests = n_requests;
    p.work_items = static_cast<uint32_t>(plan.work.size());
    p.q_tokens = plan.q_tokens;
    p.kv_tokens = plan.kv_tokens;
    p.split_requests = plan.split_requests;
    p.max_kv_pieces = plan.max_pieces;
    p.workspace_bytes = fi == FlashInferRefusal::none ? fi_offset + layout.bytes : plan.bytes;
    p.internal[0] = pack(lo32(kAttentionWorkspaceMagic), static_cast<uint32_t>(sched.partial_rows));
    p.internal[1] = pack(static_cast<uint32_t>(s.device), static_cast<uint32_t>(s.dtype));
    p.internal[2] = pack(s.num_qo_heads, s.num_kv_heads);
    p.internal[3] = pack(s.head_dim, s.page_tokens);
    AttentionPlanWord word;
    word.causal = s.causal;
    word.tile_rows = plan.tile_rows;
    word.refusal = fi;
    word.cta_tile_q = fi == FlashInferRefusal::none ? sched.cta_tile_q : 16;
    word.split = sched.split;
    word.ctas = sched.ctas();
    p.internal[4] = encode_plan_word(word);
    p.internal[5] = pack(float_bits(s.sm_scale), float_bits(s.soft_cap));
    p.internal[6] = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(workspace));
    p.internal[7] =
        pack(static_cast<uint32_t>(plan.work.size()), static_cast<uint32_t>(plan.merge.size()));
    p.internal[8] = pack(static_cast<uint32_t>(plan.merge_offset),
                         static_cast<uint32_t>(fi_offset / kAttentionAlign));
    p.internal[9] = plan.partial_o_offset;
    p.internal[10] = plan.partial_lse_offset;
    p.internal[11] = check_word(p);

    // Header, work list and merges; the partial rows are the run's scratch. Then FlashInfer's
    // arrays (its partials are scratch too).
    if (host) {
      serialize_attention_plan(plan, p.internal[11], workspace, plan.partial_o_offset);
    } else {
      std::vector<unsigned char> staged(plan.partial_o_offset);
      serialize_attention_plan(plan, p.internal[11], staged.data(), staged.size());
      attention_copy_plan(s.device, workspace, staged.data(), staged.size(), stream);
      if (fi == FlashInferRefusal::none) {
        staged.assign(layout.int_bytes, 0);
        serialize_flashinfer_plan(sched, batch, layout, staged.data());
        attention_copy_plan(s.device, static_cast<unsigned char *>(workspace) + fi_offset,
                            staged.data(), staged.size(), stream);
      }
    }
    write_versioned(out, p, SWIFTKV_ATTENTION_PLAN_VERSION, kPlanV1Size, "out",
                    "SWIFTKV_ATTENTION_PLAN_INIT");
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

}  // extern "C"

// The run's helpers, C++ (one returns a C++ struct), between the two exported groups.
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

// FlashInfer's launch: the arguments, and the arrays and partials in the workspace.
FlashInferLaunch flashinfer_launch(const PlanView &v, const swiftkv_attention_args &a,
                                   const FlashInferTensors &t, void *workspace) {
  const FlashInferLayout l = flashinfer_layout(v.shape, v.n_requests, v.q_tokens, v.fi_ctas,
                                               v.fi_split, v.fi_partial_rows);
  auto *base = static_cast<unsigned char *>(workspace) + v.fi_offset;
  auto ints = [&](uint64_t offset) { return reinterpret_cast<int32_t *>(base + offset); };
  FlashInferLaunch f;
  f.q = a.q;
  f.k = a.k_base;
  f.v = a.v_base;
  f.out = a.out;
  f.lse = a.lse;
  f.q_token_stride = t.q_token_stride;
  f.q_head_stride = t.q_head_stride;
  f.page_stride = t.page_stride;
  f.token_stride = t.token_stride;
  f.head_stride = t.head_stride;
  f.kv_indices = const_cast<int32_t *>(a.kv_indices);
  f.qo_indptr = ints(l.qo_indptr);
  f.kv_indptr = ints(l.kv_indptr);
  f.last_page_len = ints(l.last_page_len);
  f.request_indices = ints(l.request_indices);
  f.qo_tile_indices = ints(l.qo_tile_indices);
  f.kv_tile_indices = ints(l.kv_tile_indices);
  f.o_indptr = ints(l.o_indptr);
  f.merge_indptr = ints(l.merge_indptr);
  f.kv_chunk_size = ints(l.kv_chunk_size);
  if (v.fi_split) {
    f.tmp_v = base + l.tmp_v;
    f.tmp_s = reinterpret_cast<float *>(base + l.tmp_s);
  }
  f.n_requests = v.n_requests;
  f.q_tokens = static_cast<uint32_t>(v.q_tokens);
  f.ctas = v.fi_ctas;
  f.cta_tile_q = v.fi_cta_tile_q;
  return f;
}

// A device run: FlashInfer's kernel where the plan and the tensors allow it (and
// SWIFTKV_ATTENTION_KERNEL does not ask for fa2), else the fa2 kernel.
void run_on_device(const PlanView &v, const swiftkv_attention_args &a, const AttentionParams &p,
                   void *workspace, void *stream) {
  const AttentionKernelChoice choice = attention_kernel_choice();
  if (choice != AttentionKernelChoice::fa2) {
    std::string why;
    if (v.fi_refusal != FlashInferRefusal::none) {
      why = flashinfer_refusal_text(v.fi_refusal);
    } else if (const auto t = flashinfer_tensors(v.shape, a, v.q_tokens, &why)) {
      attention_run_flashinfer(v.shape, flashinfer_launch(v, a, *t, workspace), stream);
      return;
    }
    if (choice == AttentionKernelChoice::flashinfer) {
      fail(SWIFTKV_EUNSUPPORTED,
           "SWIFTKV_ATTENTION_KERNEL=flashinfer, and FlashInfer's kernel cannot run this: " + why);
    }
  }
  // The fa2 kernel's 16-byte loads need 16-byte aligned bases and strides of whole pieces.
  const bool vectorised = aligned16(a.q) && aligned16(a.k_base) && aligned16(a.v_base) &&
                          a.q_token_stride % 8 == 0 && a.q_head_stride % 8 == 0 &&
                          a.page_stride % 8 == 0 && a.token_stride % 8 == 0 &&
                          a.head_stride % 8 == 0;
  if (!vectorised) {
    fail_invalid(
        "on a device, q, k_base and v_base must be 16-byte aligned and the q and K/V strides "
        "multiples of 8 elements (the kernels load 16 bytes at a time)");
  }
  attention_run_cuda(v.shape, p, stream);
}

}  // namespace

extern "C" {

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
      run_on_device(v, a, p, workspace, stream);
    }
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

}  // extern "C"
