// The host-side mapping of an attention run onto FlashInfer's batch-prefill kernel: for each page
// layout the API documents (vLLM's, FlashInfer's NHD and HND, cross-layer pages, the library's
// own pools), the strides handed to FlashInfer's paged_kv_t are the hand-computed ones; a run
// FlashInfer cannot take (its 32-bit strides, 16-byte vectors, dense output, dtypes, head dims)
// is refused with the rule it breaks named, so it goes to the fa2 kernel instead. The schedule
// (which query tile and KV chunk each block computes, where partial rows go and how they merge),
// the arrays the plan writes into the workspace and where, for decode, automatic and forced
// splits and prefill tiles, against hand-computed ones; the batches it refuses; and the
// workspace bound against the layouts of random batches.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

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
  const auto t = swiftkv::flashinfer_tensors(shape(), a, 64, &why);
  if (!t) fail_msg("refused: %s", why.c_str());
  assert_int_equal(t->page_stride, page);
  assert_int_equal(t->token_stride, token);
  assert_int_equal(t->head_stride, head);
  assert_int_equal(t->q_token_stride, kQoHeads * kDim);
  assert_int_equal(t->q_head_stride, kDim);
}

void refused(const AttentionShape &s, const swiftkv_attention_args &a, const char *needle) {
  std::string why;
  const auto t = swiftkv::flashinfer_tensors(s, a, 64, &why);
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
  assert_true(swiftkv::flashinfer_tensors(s, good, 64, nullptr).has_value());
  // The kernel's q and out offsets are 32-bit signed products.
  assert_true(swiftkv::flashinfer_tensors(shape(), good,
                                          ((int64_t{1} << 31) - 1) / (kQoHeads * kDim), nullptr)
                  .has_value());
  std::string why;
  assert_false(swiftkv::flashinfer_tensors(shape(), good,
                                           ((int64_t{1} << 31) - 1) / (kQoHeads * kDim) + 1, &why)
                   .has_value());
  assert_true(why.find("32-bit offsets") != std::string::npos);
}

// A batch as plan_attention takes it: query and page counts per sub-request, last page fills.
struct Batch {
  std::vector<int32_t> qo{0}, kv{0}, last;
  void add(int32_t q_len, int32_t pages, int32_t last_len) {
    qo.push_back(qo.back() + q_len);
    kv.push_back(kv.back() + pages);
    last.push_back(last_len);
  }
  swiftkv::AttentionBatch view() const {
    return {qo.data(), kv.data(), last.data(), static_cast<uint32_t>(last.size())};
  }
};

using Ints = std::vector<int32_t>;

swiftkv::FlashInferSchedule schedule_of(const AttentionShape &s, const Batch &b) {
  swiftkv::FlashInferSchedule sc;
  const auto r = swiftkv::flashinfer_schedule(s, b.view(), 264, &sc);
  if (r != swiftkv::FlashInferRefusal::none) {
    fail_msg("refused: %s", swiftkv::flashinfer_refusal_text(r));
  }
  return sc;
}

void same(const Ints &got, const Ints &want, const char *what) {
  if (got != want) {
    std::string g, w;
    for (int32_t v : got) g += std::to_string(v) + " ";
    for (int32_t v : want) w += std::to_string(v) + " ";
    fail_msg("%s: [%s] where [%s] was expected", what, g.c_str(), w.c_str());
  }
}

// Decode, 32 query heads over 8 KV heads: 4 packed rows a request, a 16-row tile each, and KV too
// short to split (fewer pages than the 8 of the shortest chunk, 128 tokens).
void decode_is_one_block_per_request(void **) {
  Batch b;
  b.add(1, 4, 16);
  b.add(1, 1, 5);
  b.add(1, 2, 1);
  const auto sc = schedule_of(shape(), b);
  assert_int_equal(sc.cta_tile_q, 16);
  assert_false(sc.split);
  assert_int_equal(sc.chunk_tokens, 4 * 16);
  same(sc.request_indices, {0, 1, 2}, "request_indices");
  same(sc.qo_tile_indices, {0, 0, 0}, "qo_tile_indices");
  same(sc.kv_tile_indices, {0, 0, 0}, "kv_tile_indices");
  same(sc.o_indptr, {0, 1, 2, 3}, "o_indptr");
  same(sc.merge_indptr, {0, 1, 2, 3}, "merge_indptr");
  assert_int_equal(sc.partial_rows, 0);
}

// One decode over 100 pages cannot fill 264 blocks (33 per KV head): its KV splits into the
// shortest chunks allowed, 8 pages, 13 of them, merged into one row.
void a_lone_long_decode_splits(void **) {
  Batch b;
  b.add(1, 100, 7);
  const auto sc = schedule_of(shape(), b);
  assert_int_equal(sc.cta_tile_q, 16);
  assert_true(sc.split);
  assert_int_equal(sc.chunk_tokens, 128);
  same(sc.request_indices, Ints(13, 0), "request_indices");
  same(sc.qo_tile_indices, Ints(13, 0), "qo_tile_indices");
  same(sc.kv_tile_indices, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, "kv_tile_indices");
  same(sc.o_indptr, {0, 13}, "o_indptr");
  same(sc.merge_indptr, {0, 13}, "merge_indptr");
  assert_int_equal(sc.partial_rows, 13);
  // 40 such requests fill the device unsplit (40 blocks > 33).
  Batch many;
  for (int i = 0; i < 40; ++i) many.add(1, 100, 7);
  assert_false(schedule_of(shape(), many).split);
}

// kv_chunk_tokens = 32 forces 2-page chunks. A sub-request with no query makes no block and no
// partial row; one with no pages hands the kernel last_page_len 0 whatever the caller passed.
void forced_chunks_and_the_arrays_in_the_workspace(void **) {
  AttentionShape s = shape();
  s.kv_chunk_tokens = 32;
  Batch b;
  b.add(3, 5, 10);  // 74 keys: chunks of 2, 2 and 1 pages
  b.add(0, 0, 9);   // nothing to compute
  b.add(1, 2, 16);  // 32 keys: one chunk
  const auto sc = schedule_of(s, b);
  assert_int_equal(sc.cta_tile_q, 16);  // (12 + 0 + 4) / 3 = 5 packed rows on average
  assert_true(sc.split);
  assert_int_equal(sc.chunk_tokens, 32);
  same(sc.request_indices, {0, 0, 0, 2}, "request_indices");
  same(sc.qo_tile_indices, {0, 0, 0, 0}, "qo_tile_indices");
  same(sc.kv_tile_indices, {0, 1, 2, 0}, "kv_tile_indices");
  same(sc.o_indptr, {0, 9, 9, 10}, "o_indptr");
  same(sc.merge_indptr, {0, 3, 6, 9, 10}, "merge_indptr");
  assert_int_equal(sc.partial_rows, 10);

  // Where each array lies: 16-byte aligned int32 arrays, then the partials on 256 bytes.
  const auto l = swiftkv::flashinfer_layout(s, 3, 4, sc.ctas(), true, sc.partial_rows);
  assert_int_equal(l.qo_indptr, 0);
  assert_int_equal(l.kv_indptr, 16);
  assert_int_equal(l.last_page_len, 32);
  assert_int_equal(l.request_indices, 48);
  assert_int_equal(l.qo_tile_indices, 64);
  assert_int_equal(l.kv_tile_indices, 80);
  assert_int_equal(l.o_indptr, 96);
  assert_int_equal(l.merge_indptr, 112);
  assert_int_equal(l.kv_chunk_size, 144);
  assert_int_equal(l.int_bytes, 148);
  assert_int_equal(l.tmp_s, 256);
  assert_int_equal(l.tmp_v, 256 + 1280);                // 10 rows x 32 heads x 4 bytes
  assert_int_equal(l.bytes, 1536 + 10 * 32 * 128 * 2);  // partial outputs in the dtype

  std::vector<unsigned char> ws(l.int_bytes, 0xab);
  swiftkv::serialize_flashinfer_plan(sc, b.view(), l, ws.data());
  auto read = [&](uint64_t offset, size_t n) {
    Ints v(n);
    std::memcpy(v.data(), ws.data() + offset, n * sizeof(int32_t));
    return v;
  };
  same(read(l.qo_indptr, 4), {0, 3, 3, 4}, "qo_indptr in the workspace");
  same(read(l.kv_indptr, 4), {0, 5, 5, 7}, "kv_indptr in the workspace");
  same(read(l.last_page_len, 3), {10, 0, 16}, "last_page_len in the workspace");
  same(read(l.request_indices, 4), {0, 0, 0, 2}, "request_indices in the workspace");
  same(read(l.qo_tile_indices, 4), {0, 0, 0, 0}, "qo_tile_indices in the workspace");
  same(read(l.kv_tile_indices, 4), {0, 1, 2, 0}, "kv_tile_indices in the workspace");
  same(read(l.o_indptr, 4), {0, 9, 9, 10}, "o_indptr in the workspace");
  same(read(l.merge_indptr, 5), {0, 3, 6, 9, 10}, "merge_indptr in the workspace");
  same(read(l.kv_chunk_size, 1), {32}, "kv_chunk_size in the workspace");
  for (uint64_t gap : {uint64_t{44}, uint64_t{132}}) {  // padding is zeroed
    assert_int_equal(read(gap, 1)[0], 0);
  }
}

// Prefill: 100 tokens x 4 = 400 packed rows a request, tiles of 128 (64 at head dim 256), tiles
// ordered query tile first then KV chunk, two 8-page chunks of 10 pages each.
void prefill_tiles_and_chunks(void **) {
  Batch b;
  b.add(100, 10, 16);
  b.add(100, 10, 4);
  const auto sc = schedule_of(shape(), b);
  assert_int_equal(sc.cta_tile_q, 128);
  assert_true(sc.split);  // 8 blocks unsplit, fewer than 33
  assert_int_equal(sc.chunk_tokens, 128);
  same(sc.request_indices, {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1}, "request_indices");
  same(sc.qo_tile_indices, {0, 0, 1, 1, 2, 2, 3, 3, 0, 0, 1, 1, 2, 2, 3, 3}, "qo_tile_indices");
  same(sc.kv_tile_indices, {0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1}, "kv_tile_indices");
  same(sc.o_indptr, {0, 200, 400}, "o_indptr");
  assert_int_equal(sc.merge_indptr.size(), 201);
  for (size_t i = 0; i < sc.merge_indptr.size(); ++i) {
    assert_int_equal(sc.merge_indptr[i], 2 * i);
  }
  AttentionShape wide = shape();
  wide.head_dim = 256;
  assert_int_equal(schedule_of(wide, b).cta_tile_q, 64);
  assert_int_equal(swiftkv::flashinfer_cta_tile_q(16, 128), 16);
  assert_int_equal(swiftkv::flashinfer_cta_tile_q(17, 128), 64);
  assert_int_equal(swiftkv::flashinfer_cta_tile_q(64, 128), 64);
  assert_int_equal(swiftkv::flashinfer_cta_tile_q(65, 128), 128);
}

swiftkv::FlashInferRefusal refusal(const AttentionShape &s, const Batch &b) {
  swiftkv::FlashInferSchedule sc;
  return swiftkv::flashinfer_schedule(s, b.view(), 264, &sc);
}

// What the FlashInfer kernels built cannot compute goes to fa2, each for its reason.
void batches_flashinfer_does_not_take(void **) {
  using swiftkv::FlashInferRefusal;
  Batch decode;
  decode.add(1, 3, 4);
  AttentionShape s = shape();
  s.soft_cap = 30;
  assert_int_equal(refusal(s, decode), FlashInferRefusal::soft_cap);
  s = shape();
  s.dtype = SWIFTKV_DTYPE_F32;
  assert_int_equal(refusal(s, decode), FlashInferRefusal::dtype);
  s = shape();
  s.device = SWIFTKV_DEVICE_HOST;
  assert_int_equal(refusal(s, decode), FlashInferRefusal::host);
  // Not causal: one query token a sub-request is the same either way, more is not built.
  s = shape();
  s.causal = false;
  assert_int_equal(refusal(s, decode), FlashInferRefusal::none);
  Batch two;
  two.add(2, 3, 4);
  assert_int_equal(refusal(s, two), FlashInferRefusal::not_causal);
  // Causal queries that see no key: more queries than keys, or no keys.
  Batch unseen;
  unseen.add(40, 2, 4);  // 20 keys
  assert_int_equal(refusal(shape(), unseen), FlashInferRefusal::unseen_queries);
  Batch empty;
  empty.add(1, 0, 0);
  assert_int_equal(refusal(shape(), empty), FlashInferRefusal::unseen_queries);
  s = shape();
  s.causal = false;
  assert_int_equal(refusal(s, empty), FlashInferRefusal::unseen_queries);
  Batch none;
  none.add(0, 3, 4);
  assert_int_equal(refusal(shape(), none), FlashInferRefusal::no_queries);
  s = shape();
  s.kv_chunk_tokens = 24;  // not whole 16-token pages
  assert_int_equal(refusal(s, decode), FlashInferRefusal::forced_split);
  for (uint32_t r = 0; r <= swiftkv::kFlashInferRefusalMax; ++r) {
    assert_true(std::strlen(swiftkv::flashinfer_refusal_text(static_cast<FlashInferRefusal>(r))) >
                3);
  }
}

// The plan word survives its round trip for every value a plan writes, and a word no plan writes
// decodes as a refusal, so a run takes the fa2 kernel rather than a schedule it cannot trust.
void the_plan_word_round_trips(void **) {
  for (bool causal : {false, true}) {
    for (uint32_t tile : {16u, 64u}) {
      for (uint32_t r = 0; r <= swiftkv::kFlashInferRefusalMax; ++r) {
        for (uint32_t cta : {16u, 64u, 128u}) {
          for (bool split : {false, true}) {
            for (uint32_t ctas : {0u, 1u, 33u, 0xffffffffu}) {
              swiftkv::AttentionPlanWord w;
              w.causal = causal;
              w.tile_rows = tile;
              w.refusal = static_cast<swiftkv::FlashInferRefusal>(r);
              w.cta_tile_q = cta;
              w.split = split;
              w.ctas = ctas;
              const auto back = swiftkv::decode_plan_word(swiftkv::encode_plan_word(w));
              assert_int_equal(back.causal, causal);
              assert_int_equal(back.tile_rows, tile);
              assert_int_equal(back.refusal, w.refusal);
              assert_int_equal(back.cta_tile_q, cta);
              assert_int_equal(back.split, split);
              assert_int_equal(back.ctas, ctas);
            }
          }
        }
      }
    }
  }
  swiftkv::AttentionPlanWord w;
  w.tile_rows = 64;
  const uint64_t good = swiftkv::encode_plan_word(w);
  assert_int_equal(swiftkv::decode_plan_word(good).refusal, swiftkv::FlashInferRefusal::none);
  assert_int_equal(swiftkv::decode_plan_word(good | (uint64_t{3} << 17)).refusal,
                   swiftkv::FlashInferRefusal::too_large);
  assert_int_equal(swiftkv::decode_plan_word(good | (uint64_t{200} << 9)).refusal,
                   swiftkv::FlashInferRefusal::too_large);
}

// The schedule run on the CPU as FlashInfer's kernel reads it (prefill.cuh, FA2 template, the
// pinned release): block b of KV head h computes packed rows [tile * cta, (tile + 1) * cta) of
// request request_indices[b] (row p is query p / group, head h * group + p % group) over keys
// [chunk * kv_chunk_size, (chunk + 1) * kv_chunk_size) of its KV when split (all of it when not),
// causal to the end of the KV, and writes row o_indptr[r] + query (of out) or, split, partial
// row o_indptr[r] + query * chunks + chunk with chunks = ceil(max(kv_len, 1) / kv_chunk_size);
// the merge then joins the partial rows merge_indptr[t] .. merge_indptr[t + 1] of each query
// token t. Every output written exactly once and equal to a direct softmax shows the schedule
// covers every row and key once and addresses what the kernel addresses.
struct Interpreted {
  std::vector<double> out;  // [q_tokens, heads, dim]
  std::vector<int> writes;  // per (token, head): how many times out was written (unsplit)
};

void interpret_and_compare(const AttentionShape &s, const Batch &b,
                           const swiftkv::FlashInferSchedule &sc, std::mt19937_64 &rng) {
  const uint32_t n = static_cast<uint32_t>(b.last.size());
  const uint32_t group = s.group(), heads = s.num_qo_heads, dim = 4;
  const uint64_t q_tokens = static_cast<uint64_t>(b.qo.back());
  std::vector<int64_t> kv_len(n), kv_off(n);
  int64_t kv_total = 0;
  for (uint32_t r = 0; r < n; ++r) {
    const int64_t pages = b.kv[r + 1] - b.kv[r];
    kv_len[r] = pages == 0 ? 0 : (pages - 1) * s.page_tokens + b.last[r];
    kv_off[r] = kv_total;
    kv_total += kv_len[r];
  }
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> q(q_tokens * heads * dim), k(kv_total * s.num_kv_heads * dim),
      v(kv_total * s.num_kv_heads * dim);
  for (double &x : q) x = u(rng);
  for (double &x : k) x = u(rng);
  for (double &x : v) x = u(rng);
  auto q_at = [&](uint64_t t, uint32_t h) { return &q[(t * heads + h) * dim]; };
  auto kv_at = [&](std::vector<double> &m, uint32_t r, int64_t j, uint32_t h) {
    return &m[((kv_off[r] + j) * s.num_kv_heads + h) * dim];
  };
  // Attention of one query over keys [lo, hi) of request r: (o, log2-sum-exp) as the kernel's
  // base-2 softmax gives them; no key: o = 0, lse = -inf.
  auto attend = [&](uint32_t r, int64_t qi, uint32_t head, int64_t lo, int64_t hi,
                    std::vector<double> &o) -> double {
    const int64_t q_len = b.qo[r + 1] - b.qo[r];
    const int64_t last_seen = kv_len[r] - q_len + qi;
    const uint32_t kvh = head / group;
    double m = -INFINITY, d = 0;
    o.assign(dim, 0.0);
    std::vector<double> logits;
    for (int64_t j = lo; j < std::min(hi, last_seen + 1); ++j) {
      double dot = 0;
      for (uint32_t e = 0; e < dim; ++e)
        dot += q_at(b.qo[r] + qi, head)[e] * kv_at(k, r, j, kvh)[e];
      logits.push_back(dot * 0.5 * M_LOG2E);
      m = std::max(m, logits.back());
    }
    if (logits.empty()) return -HUGE_VAL;
    for (size_t i = 0; i < logits.size(); ++i) {
      const double w = std::exp2(logits[i] - m);
      d += w;
      for (uint32_t e = 0; e < dim; ++e) o[e] += w * kv_at(v, r, lo + int64_t(i), kvh)[e];
    }
    for (double &x : o) x /= d;
    return m + std::log2(d);
  };
  std::vector<double> out(q_tokens * heads * dim, NAN);
  std::vector<int> writes(q_tokens * heads, 0);
  const uint64_t partial_rows = sc.split ? sc.partial_rows : 0;
  std::vector<double> tmp_o(partial_rows * heads * dim, NAN), tmp_s(partial_rows * heads, NAN);
  std::vector<int> tmp_writes(partial_rows * heads, 0);
  std::vector<double> o;
  for (uint32_t blk = 0; blk < sc.ctas(); ++blk) {
    const uint32_t r = static_cast<uint32_t>(sc.request_indices[blk]);
    const int64_t tile = sc.qo_tile_indices[blk], chunk = sc.kv_tile_indices[blk];
    const int64_t q_len = b.qo[r + 1] - b.qo[r];
    const int64_t chunks =
        sc.split ? (std::max<int64_t>(kv_len[r], 1) + sc.chunk_tokens - 1) / sc.chunk_tokens : 1;
    const int64_t lo = sc.split ? std::min<int64_t>(chunk * sc.chunk_tokens, kv_len[r]) : 0;
    const int64_t hi =
        sc.split ? std::min<int64_t>((chunk + 1) * sc.chunk_tokens, kv_len[r]) : kv_len[r];
    for (uint32_t kvh = 0; kvh < s.num_kv_heads; ++kvh) {
      for (int64_t p = tile * sc.cta_tile_q;
           p < std::min<int64_t>((tile + 1) * sc.cta_tile_q, q_len * group); ++p) {
        const int64_t qi = p / group;
        const uint32_t head = kvh * group + static_cast<uint32_t>(p % group);
        const double lse = attend(r, qi, head, lo, hi, o);
        if (sc.split) {
          const int64_t row = sc.o_indptr[r] + qi * chunks + chunk;
          assert_true(row >= 0 && static_cast<uint64_t>(row) < partial_rows);
          ++tmp_writes[row * heads + head];
          tmp_s[row * heads + head] = lse;
          std::copy(o.begin(), o.end(), &tmp_o[(row * heads + head) * dim]);
        } else {
          const int64_t row = sc.o_indptr[r] + qi;
          assert_true(row >= 0 && static_cast<uint64_t>(row) < q_tokens);
          ++writes[row * heads + head];
          std::copy(o.begin(), o.end(), &out[(row * heads + head) * dim]);
        }
      }
    }
  }
  if (sc.split) {
    for (int w : tmp_writes) assert_int_equal(w, 1);
    for (uint64_t t = 0; t < q_tokens; ++t) {
      for (uint32_t h = 0; h < heads; ++h) {
        double m = -INFINITY;
        for (int32_t row = sc.merge_indptr[t]; row < sc.merge_indptr[t + 1]; ++row) {
          m = std::max(m, tmp_s[row * heads + h]);
        }
        double d = 0;
        std::vector<double> acc(dim, 0.0);
        for (int32_t row = sc.merge_indptr[t]; row < sc.merge_indptr[t + 1]; ++row) {
          const double w = std::exp2(tmp_s[row * heads + h] - m);
          d += w;
          for (uint32_t e = 0; e < dim; ++e) acc[e] += w * tmp_o[(row * heads + h) * dim + e];
        }
        ++writes[t * heads + h];
        for (uint32_t e = 0; e < dim; ++e) out[(t * heads + h) * dim + e] = acc[e] / d;
      }
    }
  }
  for (int w : writes) assert_int_equal(w, 1);
  // Against a direct softmax of each query over every key it sees.
  for (uint32_t r = 0; r < n; ++r) {
    for (int64_t qi = 0; qi < b.qo[r + 1] - b.qo[r]; ++qi) {
      for (uint32_t h = 0; h < heads; ++h) {
        attend(r, qi, h, 0, kv_len[r], o);
        for (uint32_t e = 0; e < dim; ++e) {
          const double got = out[((b.qo[r] + qi) * heads + h) * dim + e];
          if (!(std::fabs(got - o[e]) <= 1e-12)) {
            fail_msg("request %u query %lld head %u: %.17g where %.17g", r,
                     static_cast<long long>(qi), h, got, o[e]);
          }
        }
      }
    }
  }
}

// Random batches (decode, prefill, ragged, forced and automatic splits) through the interpreter.
void the_schedule_computes_attention_as_the_kernel_reads_it(void **) {
  std::mt19937_64 rng(7);
  int split = 0, unsplit = 0;
  for (int trial = 0; trial < 160; ++trial) {
    AttentionShape s = shape();
    s.num_kv_heads = 1u << (rng() % 2);
    s.num_qo_heads = s.num_kv_heads * (1u << (rng() % 3));
    s.page_tokens = 1u << (rng() % 5);
    s.kv_chunk_tokens = rng() % 3 == 0 ? s.page_tokens * (1 + static_cast<uint32_t>(rng() % 4)) : 0;
    const uint32_t n = 1 + static_cast<uint32_t>(rng() % 5);
    Batch b;
    for (uint32_t r = 0; r < n; ++r) {
      const int32_t q = static_cast<int32_t>(rng() % 4 == 0 ? rng() % 3 : 1 + rng() % 40);
      const int32_t kv = q + static_cast<int32_t>(rng() % 300) + (q == 0 ? 1 : 0);
      const int32_t pt = static_cast<int32_t>(s.page_tokens);
      const int32_t pages = (kv + pt - 1) / pt;
      b.add(q, pages, kv - (pages - 1) * pt);
    }
    swiftkv::FlashInferSchedule sc;
    const uint32_t ctas = rng() % 2 ? 2 + static_cast<uint32_t>(rng() % 16) : 264;
    const auto r = swiftkv::flashinfer_schedule(s, b.view(), ctas, &sc);
    if (r == swiftkv::FlashInferRefusal::no_queries) continue;
    assert_int_equal(r, swiftkv::FlashInferRefusal::none);
    (sc.split ? split : unsplit)++;
    interpret_and_compare(s, b, sc, rng);
  }
  std::printf("split %d, unsplit %d\n", split, unsplit);
  assert_true(split >= 20 && unsplit >= 20);
}

// The bound swiftkv_attention_workspace_size adds for FlashInfer holds every batch within it.
void the_workspace_bound_holds_random_batches(void **) {
  std::mt19937_64 rng(45);
  for (int trial = 0; trial < 400; ++trial) {
    AttentionShape s = shape();
    const uint32_t kv_heads[] = {1, 2, 8, 32};
    s.num_kv_heads = kv_heads[rng() % 4];
    s.num_qo_heads = s.num_kv_heads * (1u << (rng() % 4));
    s.head_dim = 64u << (rng() % 3);
    s.page_tokens = 1u << (rng() % 9);
    const uint32_t n = 1 + static_cast<uint32_t>(rng() % 64);
    Batch b;
    for (uint32_t r = 0; r < n; ++r) {
      const int32_t q = static_cast<int32_t>(rng() % 3 == 0 ? rng() % 300 : 1);
      const int32_t kv = q + static_cast<int32_t>(rng() % 5000);
      const int32_t pages =
          (kv + static_cast<int32_t>(s.page_tokens) - 1) / static_cast<int32_t>(s.page_tokens);
      b.add(q, pages, kv - (pages - 1) * static_cast<int32_t>(s.page_tokens));
    }
    swiftkv::FlashInferSchedule sc;
    const uint32_t ctas = 2 * (1 + static_cast<uint32_t>(rng() % 200));  // up to 400 SMs' worth
    const auto r =
        swiftkv::flashinfer_schedule(s, b.view(), std::min(ctas, swiftkv::kFlashInferMaxCtas), &sc);
    if (r == swiftkv::FlashInferRefusal::no_queries) continue;
    assert_int_equal(r, swiftkv::FlashInferRefusal::none);
    const uint64_t q_tokens = static_cast<uint64_t>(b.qo.back());
    const auto l = swiftkv::flashinfer_layout(s, n, q_tokens, sc.ctas(), sc.split, sc.partial_rows);
    const uint64_t bound = swiftkv::flashinfer_workspace_bound(s, n, q_tokens);
    if (l.bytes > bound) {
      fail_msg("trial %d: %llu bytes needed, bound %llu", trial,
               static_cast<unsigned long long>(l.bytes), static_cast<unsigned long long>(bound));
    }
    // Every block is a (request, tile, chunk) the request has, each once.
    assert_int_equal(sc.merge_indptr.size(), q_tokens + 1);
    if (sc.split) assert_int_equal(sc.partial_rows, static_cast<uint64_t>(sc.o_indptr.back()));
  }
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(every_documented_layout_maps),
      cmocka_unit_test(what_flashinfer_cannot_take_is_refused),
      cmocka_unit_test(decode_is_one_block_per_request),
      cmocka_unit_test(a_lone_long_decode_splits),
      cmocka_unit_test(forced_chunks_and_the_arrays_in_the_workspace),
      cmocka_unit_test(prefill_tiles_and_chunks),
      cmocka_unit_test(batches_flashinfer_does_not_take),
      cmocka_unit_test(the_plan_word_round_trips),
      cmocka_unit_test(the_schedule_computes_attention_as_the_kernel_reads_it),
      cmocka_unit_test(the_workspace_bound_holds_random_batches),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
