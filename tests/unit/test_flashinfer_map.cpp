// The host-side mapping of an attention run onto FlashInfer's batch-prefill kernel: for each page
// layout the API documents (vLLM's, FlashInfer's NHD and HND, cross-layer pages, the library's
// own pools), the strides handed to FlashInfer's paged_kv_t are the hand-computed ones; a run
// FlashInfer cannot take (its 32-bit strides, 16-byte vectors, dense output, dtypes, head dims)
// is refused with the rule it breaks named, so it goes to the fa2 kernel instead.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/attention/attention_plan.hpp"
#include "core/attention/flashinfer_map.hpp"

// After the core headers: CMocka defines a macro named fail.
extern "C" {
#include <setjmp.h>
#include <stdarg.h>

#include <cmocka.h>
}

namespace {

using swiftkv::AttentionShape;
using swiftkv::FlashInferTensors;

constexpr int64_t kPages = 64, kTokens = 16, kHeads = 8, kDim = 128, kQoHeads = 32;

// The mapping reads no memory, only addresses: K at a 256-byte aligned address, the rest beside.
constexpr uintptr_t kBase = uintptr_t{1} << 30;

const void *at(uintptr_t bytes) { return reinterpret_cast<const void *>(kBase + bytes); }

AttentionShape shape() {
  AttentionShape s;
  s.device = 0;
  s.dtype = SWIFTKV_DTYPE_BF16;
  s.num_qo_heads = kQoHeads;
  s.num_kv_heads = kHeads;
  s.head_dim = kDim;
  s.page_tokens = kTokens;
  return s;
}

// q and out dense; K and V from the given bases with the given strides.
swiftkv_attention_args args(int64_t page, int64_t token, int64_t head, int64_t v_offset) {
  swiftkv_attention_args a = SWIFTKV_ATTENTION_ARGS_INIT;
  a.q = at(0);
  a.q_token_stride = kQoHeads * kDim;
  a.q_head_stride = kDim;
  a.k_base = at(0);
  a.v_base = at(static_cast<uintptr_t>(v_offset) * 2);
  a.page_stride = page;
  a.token_stride = token;
  a.head_stride = head;
  a.num_pages = kPages;
  a.out = const_cast<void *>(at(1024));
  a.out_token_stride = kQoHeads * kDim;
  a.out_head_stride = kDim;
  return a;
}

void expect(const swiftkv_attention_args &a, uint32_t page, uint32_t token, uint32_t head) {
  std::string why;
  const auto t = swiftkv::flashinfer_tensors(shape(), a, &why);
  if (!t) fail_msg("refused: %s", why.c_str());
  assert_int_equal(t->page_stride, page);
  assert_int_equal(t->token_stride, token);
  assert_int_equal(t->head_stride, head);
  assert_int_equal(t->q_token_stride, kQoHeads * kDim);
  assert_int_equal(t->q_head_stride, kDim);
}

void refused(const AttentionShape &s, const swiftkv_attention_args &a, const char *needle) {
  std::string why;
  const auto t = swiftkv::flashinfer_tensors(s, a, &why);
  assert_false(t.has_value());
  if (why.find(needle) == std::string::npos) {
    fail_msg("the reason '%s' does not name '%s'", why.c_str(), needle);
  }
}

void every_documented_layout_maps(void **) {
  // vLLM: [2, pages, B, H, D], V a whole K tensor further.
  expect(args(kTokens * kHeads * kDim, kHeads * kDim, kDim, kPages * kTokens * kHeads * kDim),
         16 * 8 * 128, 8 * 128, 128);
  // FlashInfer NHD: [pages, 2, B, H, D], V one page half further.
  expect(args(2 * kTokens * kHeads * kDim, kHeads * kDim, kDim, kTokens * kHeads * kDim),
         2 * 16 * 8 * 128, 8 * 128, 128);
  // FlashInfer HND: [pages, 2, H, B, D]: tokens of one head are adjacent.
  expect(args(2 * kHeads * kTokens * kDim, kDim, kTokens * kDim, kHeads * kTokens * kDim),
         2 * 8 * 16 * 128, 128, 16 * 128);
  // Cross-layer pages [pages, L = 32, 2, B, H, D], a layer's K as the base.
  expect(args(32 * 2 * kTokens * kHeads * kDim, kHeads * kDim, kDim, kTokens * kHeads * kDim),
         32 * 2 * 16 * 8 * 128, 8 * 128, 128);
  // The library's pool (swiftkv_pool_get): NHD pages with the K/V halves kv_stride apart and
  // stream pages beyond; a page stride of 2 B H D rounded to a memory page is still a multiple
  // of 8 elements.
  expect(args(2 * kTokens * kHeads * kDim + 2048, kHeads * kDim, kDim, kTokens * kHeads * kDim),
         2 * 16 * 8 * 128 + 2048, 8 * 128, 128);
}

void what_flashinfer_cannot_take_is_refused(void **) {
  const swiftkv_attention_args good = args(2 * kTokens * kHeads * kDim, kHeads * kDim, kDim, 0);
  AttentionShape s = shape();
  s.dtype = SWIFTKV_DTYPE_F32;
  refused(s, good, "dtype");
  s = shape();
  s.head_dim = 96;
  refused(s, good, "head_dim 96");
  swiftkv_attention_args a = good;
  a.page_stride = int64_t{1} << 33;  // a cross-layer pool of very many layers
  refused(shape(), a, "page_stride 8589934592 does not fit");
  a = good;
  a.token_stride = kHeads * kDim + 4;  // padded rows not a whole vector
  refused(shape(), a, "token_stride 1028 is not a multiple of 8");
  a = good;
  a.q_head_stride = kDim + 1;
  refused(shape(), a, "q_head_stride");
  a = good;
  a.k_base = at(2);
  refused(shape(), a, "k_base is not 16-byte aligned");
  a = good;
  a.v_base = at(8);
  refused(shape(), a, "v_base");
  a = good;
  a.out = const_cast<void *>(at(4));
  refused(shape(), a, "out is not 16-byte aligned");
  a = good;
  a.out_token_stride = 2 * kQoHeads * kDim;  // out rows interleaved with something else
  refused(shape(), a, "out is not dense");
  a = good;
  a.out_head_stride = 2 * kDim;
  a.out_token_stride = kQoHeads * 2 * kDim;
  refused(shape(), a, "out is not dense");
  // f16 maps as bf16 does.
  s = shape();
  s.dtype = SWIFTKV_DTYPE_F16;
  assert_true(swiftkv::flashinfer_tensors(s, good, nullptr).has_value());
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(every_documented_layout_maps),
      cmocka_unit_test(what_flashinfer_cannot_take_is_refused),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
