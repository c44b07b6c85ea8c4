// The library's own CUDA attention kernels' source (kernels/attention_fa2.cuh and the merge in
// kernels/attention_merge.cuh) run in the CPU emulation of the CUDA execution model
// (tests/emu/cuda_emu.hpp) against the CPU twin, over the plans a device gets (split for a
// device's parallelism): f16 and bf16,
// head dims 64/128/256, both tiles, GQA, page sizes, every layout, causal or not, soft cap,
// explicit and automatic KV splits with the merge kernel. The tolerance is the GPU test's
// (tests/gpu/test_gpu_attention.cpp), and every output starts as NaN, so a row the kernel never
// writes fails. Each case runs under two thread orders. This does not replace the run on a
// device (timing, the memory model, the real instructions); it checks what the source says.
#include <cmath>
#include <csetjmp>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "attention_fixture.h"
#include "core/attention/attention_cpu.hpp"
#include "core/attention/attention_plan.hpp"
#include "emu_kernels.hpp"

extern "C" {
#include <cmocka.h>
}

namespace {

using swiftkv::AttentionParams;

// What a H100 reports to the plan (132 SMs, two work items each): the splits a device sees.
constexpr uint32_t kDeviceParallelism = 264;

struct Planned {
  swiftkv::AttentionShape shape;
  swiftkv::AttentionPlan plan;
  void *workspace = nullptr;
  AttentionParams params{};
  bool vectorised = false;
  ~Planned() { std::free(workspace); }
};

bool aligned16(const void *p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The plan and parameters swiftkv_attention_run would give the kernels (capi/attention_api.cpp).
void plan_problem(const att_problem &p, Planned &out) {
  out.shape = swiftkv::check_attention_shape(p.desc, static_cast<int32_t>(p.desc.dtype));
  const uint64_t bound =
      swiftkv::attention_workspace_bound(out.shape, p.n_req, uint64_t(p.q_tokens));
  out.plan = swiftkv::plan_attention(
      out.shape, swiftkv::AttentionBatch{p.qo_indptr, p.kv_indptr, p.last_page_len, p.n_req}, bound,
      kDeviceParallelism);
  out.workspace = std::aligned_alloc(256, (out.plan.bytes + 255) / 256 * 256);
  std::memset(out.workspace, 0, out.plan.bytes);
  swiftkv::serialize_attention_plan(out.plan, 1, out.workspace, out.plan.partial_o_offset);
  auto *ws = static_cast<unsigned char *>(out.workspace);
  const swiftkv_attention_args &a = p.args;
  AttentionParams &q = out.params;
  q.q = a.q;
  q.q_token_stride = a.q_token_stride;
  q.q_head_stride = a.q_head_stride;
  q.k = a.k_base;
  q.v = a.v_base;
  q.page_stride = a.page_stride;
  q.token_stride = a.token_stride;
  q.head_stride = a.head_stride;
  q.kv_indices = a.kv_indices;
  q.num_pages = static_cast<int32_t>(a.num_pages);
  q.num_qo_heads = static_cast<int32_t>(out.shape.num_qo_heads);
  q.group = static_cast<int32_t>(out.shape.group());
  q.page_tokens = static_cast<int32_t>(out.shape.page_tokens);
  q.causal = out.shape.causal ? 1 : 0;
  q.tile_rows = static_cast<int32_t>(out.plan.tile_rows);
  q.head_dim = static_cast<int32_t>(out.shape.head_dim);
  q.sm_scale = out.shape.sm_scale;
  q.soft_cap = out.shape.soft_cap;
  q.out = a.out;
  q.out_token_stride = a.out_token_stride;
  q.out_head_stride = a.out_head_stride;
  q.lse = a.lse;
  q.work = reinterpret_cast<const swiftkv::AttentionWorkItem *>(ws + out.plan.work_offset);
  q.n_work = static_cast<int32_t>(out.plan.work.size());
  q.merge = reinterpret_cast<const swiftkv::AttentionMergeItem *>(ws + out.plan.merge_offset);
  q.n_merge = static_cast<int32_t>(out.plan.merge.size());
  q.partial_o = reinterpret_cast<float *>(ws + out.plan.partial_o_offset);
  q.partial_lse = reinterpret_cast<float *>(ws + out.plan.partial_lse_offset);
  out.vectorised = aligned16(a.q) && aligned16(a.k_base) && aligned16(a.v_base) &&
                   a.q_token_stride % 8 == 0 && a.q_head_stride % 8 == 0 &&
                   a.page_stride % 8 == 0 && a.token_stride % 8 == 0 && a.head_stride % 8 == 0;
}

struct Seen {
  uint32_t cases = 0, fa2 = 0, split = 0, tile16 = 0, tile64 = 0;
};

// The twin once, then each kernel under two thread orders, against it.
void compare_case(att_problem &p, const char *name, Seen &seen) {
  Planned pl;
  plan_problem(p, pl);
  swiftkv::check_attention_pages(pl.params);
  swiftkv::run_attention_cpu(pl.shape, pl.params);
  const size_t lse_n = size_t(p.q_tokens) * p.desc.num_qo_heads;
  const std::vector<unsigned char> want_out(p.out, p.out + p.out_bytes);
  const std::vector<float> want_lse(p.lse, p.lse + lse_n);
  ++seen.cases;
  seen.split += pl.plan.split_requests > 0;
  seen.tile16 += pl.plan.tile_rows == 16;
  seen.tile64 += pl.plan.tile_rows == 64;
  if (!pl.vectorised) return;  // the launcher refuses such a run on a device
  ++seen.fa2;
  // Lockstep warps with copies landing at their wait, then greedy warps with copies landing when
  // issued.
  for (int order = 0; order < 2; ++order) {
    const kernel_emulation::Schedule schedule{uint64_t(1000 * order + 7), order == 1, order == 1};
    std::memset(p.out, 0xff, p.out_bytes);
    std::memset(p.lse, 0xff, lse_n * sizeof(float));
    const uint64_t blocks =
        kernel_emulation::run_attention(p.desc.dtype == SWIFTKV_DTYPE_BF16, int(p.desc.head_dim),
                                        &pl.params, sizeof pl.params, schedule);
    assert_int_equal(blocks, pl.plan.work.size() + pl.plan.merge.size());
    char what[96];
    std::snprintf(what, sizeof what, "%s (fa2, order %d)", name, order);
    const int bad = att_mismatches(&p, p.out, p.lse, want_out.data(), want_lse.data(), what);
    if (bad != 0) fail_msg("%s: %d elements outside the tolerance", what, bad);
  }
}

// The GPU test's sweep, smaller batches (the emulation runs every thread of every block). Under
// ASan, whose stack switches cost a system call and a shadow clear each, the first third.
#if defined(__SANITIZE_ADDRESS__)
constexpr int kSweepCases = 8;
#else
constexpr int kSweepCases = 24;
#endif

void kernels_match_the_cpu_twin(void **) {
  uint64_t s = 77;
  Seen seen;
  for (int c = 0; c < kSweepCases; ++c) {
    att_problem p;
    att_sweep_case(&p, c, &s, 150, 70, 100);
    char name[64];
    std::snprintf(name, sizeof name, "case %d", c);
    compare_case(p, name, seen);
    att_free(&p);
  }
  // The sweep reached what it is for.
  std::printf("cases %u, fa2 %u, split %u, tile16 %u, tile64 %u\n", seen.cases, seen.fa2,
              seen.split, seen.tile16, seen.tile64);
  assert_int_equal(seen.cases, kSweepCases);
  assert_true(seen.fa2 == kSweepCases && seen.split >= 2 && seen.tile16 >= 1 &&
              seen.tile64 >= kSweepCases / 3);
}

// A decode step (tile 16, four warps splitting each KV tile inside fa2's block) too small to fill
// a device with one long KV: the plan splits it and the merge kernel joins the pieces.
void decode_with_automatic_splits(void **) {
  Seen seen;
  for (swiftkv_dtype t : {SWIFTKV_DTYPE_F16, SWIFTKV_DTYPE_BF16}) {
    att_problem p;
    att_start(&p, 16, 4, 128, 16, ATT_NHD);
    p.desc.dtype = t;
    p.n_req = 2;
    p.q_len[0] = 1;
    p.kv_len[0] = 2100;
    p.q_len[1] = 1;
    p.kv_len[1] = 700;
    att_build(&p, 9, 0);
    compare_case(p, t == SWIFTKV_DTYPE_F16 ? "decode f16" : "decode bf16", seen);
    att_free(&p);
  }
  assert_int_equal(seen.split, 2);
  assert_int_equal(seen.tile16, 2);
}

// A prefill tile of 64 rows with head dim 256 (fa2's 32-key tiles, Q read through ldmatrix at
// every step) and a causal mask that ends inside a KV tile.
void wide_heads_prefill(void **) {
  Seen seen;
  att_problem p;
  att_start(&p, 4, 2, 256, 16, ATT_HND);
  p.desc.dtype = SWIFTKV_DTYPE_BF16;
  p.n_req = 1;
  p.q_len[0] = 70;
  p.kv_len[0] = 101;
  att_build(&p, 31, 2);
  compare_case(p, "head dim 256", seen);
  att_free(&p);
  assert_int_equal(seen.tile64, 1);
}

}  // namespace

int main() {
  const CMUnitTest tests[] = {
      cmocka_unit_test(kernels_match_the_cpu_twin),
      cmocka_unit_test(decode_with_automatic_splits),
      cmocka_unit_test(wide_heads_prefill),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
