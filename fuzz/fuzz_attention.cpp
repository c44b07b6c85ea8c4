// libFuzzer target: attention plans and runs on the host. The input gives a batch (dtype, heads,
// head dim, page size, causal mode, KV splits, scale, soft cap, ragged sub-requests, page
// layout) and at most one fault: a description the library must refuse, a page table that
// contradicts itself, a page id out of range, a zero stride, a workspace too small.
// Oracle: a refused plan leaves the plan struct as it was; a refused run leaves out and lse as
// they were; a run without a fault matches the fp64 reference within the dtype's rounding plus
// the fp32 partial rows' error, which grows with |lse| (docs/attention.md).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "fuzz/fuzz_support.hpp"
#include "tests/support/attention_fixture.h"

namespace {

void check(bool ok, const char *what) { swiftkv::fuzz::check(ok, "fuzz_attention", what); }

enum Fault : uint8_t {
  kNone = 0,
  kDescHeadDim = 6,
  kDescDtype,
  kDescHeads,
  kDescPageTokens,
  kDescChunk,
  kDescScale,
  kDescCap,
  kLastPageZero,
  kLastPageLong,
  kKvDown,
  kQoDown,          // the plan must refuse these
  kSmallWorkspace,  // refused, or planned with fewer pieces
  kPageOut,
  kPageNegative,
  kFewerPages,
  kStrideZero,
  kReserved,  // the run must refuse these
  kFaults
};

bool outputs_match(const att_problem &p) {
  const int64_t hq = p.desc.num_qo_heads, d = p.desc.head_dim;
  std::vector<double> o(static_cast<size_t>(d));
  for (uint32_t r = 0; r < p.n_req; ++r) {
    for (int32_t i = 0; i < p.q_len[r]; ++i) {
      const int64_t t = p.qo_indptr[r] + i;
      for (int64_t h = 0; h < hq; ++h) {
        const double lse = att_reference(&p, r, i, h, o.data());
        const float got_lse = p.lse[t * hq + h];
        if (std::isinf(lse) ? !(std::isinf(got_lse) && got_lse < 0)
                            : std::fabs(got_lse - lse) > 1e-5 * std::fmax(1.0, std::fabs(lse))) {
          std::fprintf(stderr, "fuzz_attention: lse of r%u i%d h%lld: %.9g, reference %.9g\n", r, i,
                       static_cast<long long>(h), got_lse, lse);
          return false;
        }
        for (int64_t e = 0; e < d; ++e) {
          const double got =
              att_load(p.desc.dtype, p.out + static_cast<size_t>(t * p.args.out_token_stride +
                                                                 h * p.args.out_head_stride + e) *
                                                 p.elem);
          // The dtype's rounding, plus the fp32 partial rows of split KV: a partial's lse is
          // rounded to fp32, so a merge weight is off by about |lse| * 2^-24 relative.
          const double partials = 1.2e-7 * (std::isinf(lse) ? 1.0 : std::fmax(1.0, std::fabs(lse)));
          if (std::fabs(got - o[static_cast<size_t>(e)]) >
              att_ulp(p.desc.dtype, o[static_cast<size_t>(e)]) + partials) {
            std::fprintf(stderr,
                         "fuzz_attention: out of r%u i%d h%lld d%lld: %.9g, reference %.9g\n", r, i,
                         static_cast<long long>(h), static_cast<long long>(e), got,
                         o[static_cast<size_t>(e)]);
            return false;
          }
        }
      }
    }
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  swiftkv::fuzz::Reader in{data, size};
  att_problem p;
  std::memset(&p, 0, sizeof p);
  swiftkv_attention_desc desc = SWIFTKV_ATTENTION_DESC_INIT;
  const swiftkv_dtype dtypes[3] = {SWIFTKV_DTYPE_F16, SWIFTKV_DTYPE_BF16, SWIFTKV_DTYPE_F32};
  desc.dtype = dtypes[in.take<uint8_t>(0) % 3];
  const uint32_t dims[3] = {64, 128, 256};
  desc.head_dim = dims[in.take<uint8_t>(0) % 3];
  desc.num_kv_heads = 1 + in.take<uint8_t>(0) % 2;
  desc.num_qo_heads = desc.num_kv_heads * (1 + in.take<uint8_t>(0) % 4);
  desc.page_tokens = 1 + in.take<uint8_t>(15);  // 1..256
  const uint8_t mode = in.take<uint8_t>(1);
  desc.causal = mode & 1;
  const uint32_t chunks[3] = {0, 16, 32};
  desc.kv_chunk_tokens = chunks[(mode >> 1) % 3];
  const float scales[3] = {0.0f, 0.05f, 1.0f}, caps[3] = {0.0f, 30.0f, 5.0f};
  desc.sm_scale = scales[(mode >> 3) % 3];
  desc.logits_soft_cap = caps[(mode >> 5) % 3];
  p.desc = desc;
  p.layout = static_cast<att_layout>(in.take<uint8_t>(0) % ATT_LAYOUTS);
  p.n_req = in.take<uint8_t>(1) % (ATT_MAX_REQ + 1);
  for (uint32_t r = 0; r < p.n_req; ++r) {
    p.q_len[r] = in.take<uint8_t>(1) % 13;
    p.kv_len[r] = in.take<uint8_t>(16) % 161;
  }
  const uint32_t extra_pages = in.take<uint8_t>(0) % 4;
  const auto fault = static_cast<Fault>(in.take<uint8_t>(0) % kFaults);
  const uint8_t which = in.take<uint8_t>(0);
  att_build(&p, 1 + which, extra_pages);
  const int32_t used = p.kv_indptr[p.n_req];

  uint64_t bytes = 0;
  check(swiftkv_attention_workspace_size(&bytes, &p.desc, p.n_req,
                                         static_cast<uint64_t>(p.q_tokens)) == SWIFTKV_OK,
        "workspace_size");
  void *ws = nullptr;
  check(posix_memalign(&ws, 256, bytes == 0 ? 256 : bytes) == 0, "workspace");

  // The plan, with its fault if the fault is the plan's.
  swiftkv_attention_desc d = p.desc;
  std::vector<int32_t> qo(p.qo_indptr, p.qo_indptr + p.n_req + 1);
  std::vector<int32_t> kv(p.kv_indptr, p.kv_indptr + p.n_req + 1);
  std::vector<int32_t> last(p.last_page_len, p.last_page_len + p.n_req);
  const uint32_t r = p.n_req == 0 ? 0 : which % p.n_req;
  bool plan_must_fail = true;
  uint64_t ws_bytes = bytes;
  switch (fault) {
    case kDescHeadDim: d.head_dim = 96; break;
    case kDescDtype: d.dtype = SWIFTKV_DTYPE_FP8_E4M3; break;
    case kDescHeads:  // query heads that are not a multiple of the KV heads
      d.num_kv_heads = 2;
      d.num_qo_heads = 2 * (1 + which % 4) + 1;
      break;
    case kDescPageTokens: d.page_tokens = 257 + which; break;
    case kDescChunk: d.kv_chunk_tokens = 8 + 16 * (which % 4); break;
    case kDescScale: d.sm_scale = which % 2 ? -1.0f : NAN; break;
    case kDescCap: d.logits_soft_cap = which % 2 ? -2.0f : INFINITY; break;
    case kLastPageZero:
    case kLastPageLong:
      plan_must_fail = p.n_req > 0 && kv[r + 1] > kv[r];
      if (plan_must_fail) {
        last[r] = fault == kLastPageZero ? 0 : static_cast<int32_t>(p.desc.page_tokens) + 1;
      }
      break;
    case kKvDown:
    case kQoDown: {
      std::vector<int32_t> &v = fault == kKvDown ? kv : qo;
      plan_must_fail = p.n_req > 0 && v[r + 1] > 0;
      if (plan_must_fail) v[r + 1] = v[r] - 1;
      break;
    }
    case kSmallWorkspace:
      plan_must_fail = false;  // fewer KV pieces, or ENOMEM
      ws_bytes = bytes / (2 + which % 8);
      break;
    default: plan_must_fail = false;
  }
  swiftkv_attention_plan plan = SWIFTKV_ATTENTION_PLAN_INIT;
  std::memset(plan.internal, 0x5e, sizeof plan.internal);
  const swiftkv_attention_plan before = plan;
  const swiftkv_status planned = swiftkv_attention_plan_make(
      &plan, &d, qo.data(), kv.data(), last.data(), p.n_req, ws, ws_bytes, nullptr);
  if (planned != SWIFTKV_OK || plan_must_fail) {
    check(planned != SWIFTKV_OK, "a plan with a fault was made");
    check(planned == SWIFTKV_EINVAL || planned == SWIFTKV_EUNSUPPORTED ||
              (planned == SWIFTKV_ENOMEM && fault == kSmallWorkspace),
          "a refused plan's status");
    check(fault != kNone && fault < kFaults && (fault >= kDescHeadDim),
          "a plan without a fault was refused");
    check(std::memcmp(&plan, &before, sizeof plan) == 0, "a refused plan changed the struct");
    std::free(ws);
    att_free(&p);
    return 0;
  }

  // The run, with its fault if the fault is the run's.
  swiftkv_attention_args a = p.args;
  // A run reads the pages of sub-requests with queries only, and checks the ids it reads.
  auto read = [&](int32_t entry) {
    for (uint32_t q = 0; q < p.n_req; ++q) {
      if (entry >= p.kv_indptr[q] && entry < p.kv_indptr[q + 1]) return p.q_len[q] > 0;
    }
    return false;
  };
  bool run_must_fail = false;
  const int32_t entry = used > 0 ? which % used : 0;
  switch (fault) {
    case kPageOut:
    case kPageNegative:
      if (used == 0) break;
      p.kv_indices[entry] =
          fault == kPageOut ? static_cast<int32_t>(p.num_pages) + which : -1 - which;
      run_must_fail = read(entry);
      break;
    case kFewerPages: {
      int32_t top = 0;
      for (int32_t i = 0; i < used; ++i) top = std::max(top, p.kv_indices[i]);
      a.num_pages = static_cast<uint32_t>(top);
      for (int32_t i = 0; i < used; ++i) run_must_fail |= p.kv_indices[i] == top && read(i);
      run_must_fail |= top == 0 && plan.kv_tokens > 0;  // args->num_pages 0 with KV to read
      break;
    }
    case kStrideZero:  // a run reads no stride of tensors it does not touch (an empty batch)
      if (which % 3 == 2) {
        run_must_fail = p.q_tokens > 0;
        a.q_token_stride = 0;
      } else {
        run_must_fail = plan.kv_tokens > 0;
        (which % 3 == 0 ? a.token_stride : a.head_stride) = 0;
      }
      break;
    case kReserved:
      run_must_fail = true;
      a.reserved0 = 1u + which;
      break;
    default: run_must_fail = false;
  }
  std::memset(p.out, 0xab, p.out_bytes);
  const size_t lse_bytes =
      sizeof(float) * static_cast<size_t>(p.q_tokens * p.desc.num_qo_heads + 1);
  std::memset(p.lse, 0xcd, lse_bytes);
  const std::vector<unsigned char> out_before(p.out, p.out + p.out_bytes);
  const std::vector<unsigned char> lse_before(reinterpret_cast<unsigned char *>(p.lse),
                                              reinterpret_cast<unsigned char *>(p.lse) + lse_bytes);
  const swiftkv_status ran = swiftkv_attention_run(&plan, &a, ws, nullptr);
  if (ran != SWIFTKV_OK || run_must_fail) {
    check(ran == SWIFTKV_EINVAL && run_must_fail, "a run's status");
    check(std::memcmp(p.out, out_before.data(), p.out_bytes) == 0, "a refused run wrote out");
    check(std::memcmp(p.lse, lse_before.data(), lse_bytes) == 0, "a refused run wrote lse");
  } else {
    check(outputs_match(p), "out or lse differs from the fp64 reference");
  }
  std::free(ws);
  att_free(&p);
  return 0;
}
