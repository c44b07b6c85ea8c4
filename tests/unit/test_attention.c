/* Multi-token paged attention on the host: the CPU path against a naive fp64 reference over
 * sweeps of head dim, GQA ratio, page size, layout, dtype, causal mode, soft cap and KV splits
 * with ragged batches in random page order; the shapes of Pensieve's dropped-prefix
 * recomputation; exact plan partitions; and bad input leaving outputs untouched. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdlib.h>

#include "attention_fixture.h"
#include "test_support.h"

static void *aligned_workspace(uint64_t bytes) {
  void *w = NULL;
  if (posix_memalign(&w, 256, bytes == 0 ? 256 : (size_t)bytes) != 0) return NULL;
  return w;
}

/* Plans and runs p on the host; returns the plan. */
static swiftkv_attention_plan plan_and_run(att_problem *p, void **ws_out) {
  uint64_t bytes = 0;
  assert_ok(swiftkv_attention_workspace_size(&bytes, &p->desc, p->n_req, (uint64_t)p->q_tokens));
  void *ws = aligned_workspace(bytes);
  assert_non_null(ws);
  swiftkv_attention_plan plan = SWIFTKV_ATTENTION_PLAN_INIT;
  assert_ok(swiftkv_attention_plan_make(&plan, &p->desc, p->qo_indptr, p->kv_indptr,
                                        p->last_page_len, p->n_req, ws, bytes, NULL));
  assert_true(plan.workspace_bytes <= bytes);
  assert_ok(swiftkv_attention_run(&plan, &p->args, ws, NULL));
  if (ws_out != NULL) {
    *ws_out = ws;
  } else {
    free(ws);
  }
  return plan;
}

/* Every output within one unit in the last place of the dtype of the fp64 reference, every lse
 * within 1e-5 relative. Returns the number of mismatches (printing the first few). */
static int compare_with_reference(const att_problem *p) {
  const int64_t hq = p->desc.num_qo_heads, d = p->desc.head_dim;
  double *o = malloc(sizeof(double) * (size_t)d);
  int bad = 0;
  for (uint32_t r = 0; r < p->n_req; ++r) {
    for (int32_t i = 0; i < p->q_len[r]; ++i) {
      const int64_t t = p->qo_indptr[r] + i;
      for (int64_t h = 0; h < hq; ++h) {
        const double lse = att_reference(p, r, i, h, o);
        const float got_lse = p->lse[t * hq + h];
        if (isinf(lse) ? !(isinf(got_lse) && got_lse < 0)
                       : fabs(got_lse - lse) > 1e-5 * fmax(1.0, fabs(lse))) {
          if (bad++ < 5)
            print_error("lse r%u i%d h%ld: %.9g vs %.9g\n", r, i, (long)h, got_lse, lse);
        }
        for (int64_t e = 0; e < d; ++e) {
          const double got = att_load(
              p->desc.dtype,
              p->out + (size_t)(t * p->args.out_token_stride + h * p->args.out_head_stride + e) *
                           p->elem);
          /* The rounding to the dtype, plus the fp32 partials of split KV (values are in
           * [-1, 1], so their error is absolute). */
          const double tol = att_ulp(p->desc.dtype, o[e]) + 1.2e-7;
          if (fabs(got - o[e]) > tol) {
            if (bad++ < 5) {
              print_error("out r%u i%d h%ld d%ld: %.9g vs %.9g\n", r, i, (long)h, (long)e, got,
                          o[e]);
            }
          }
        }
      }
    }
  }
  free(o);
  return bad;
}

/* A zeroed problem with its description and layout; lengths come next, then att_build. */
static void start_problem(att_problem *p, swiftkv_dtype t, uint32_t hq, uint32_t hk, uint32_t d,
                          uint32_t pt, enum att_layout layout) {
  memset(p, 0, sizeof *p);
  p->layout = layout;
  swiftkv_attention_desc desc = SWIFTKV_ATTENTION_DESC_INIT;
  desc.dtype = t;
  desc.num_qo_heads = hq;
  desc.num_kv_heads = hk;
  desc.head_dim = d;
  desc.page_tokens = pt;
  p->desc = desc;
}

/* 60 configurations drawn from the whole space, each a ragged batch with a 1-token query, an
 * empty sub-request and long prefills. */
static void cpu_path_matches_the_fp64_reference(void **state) {
  (void)state;
  static const uint32_t dims[] = {64, 128, 256};
  static const uint32_t groups[][2] = {{4, 4}, {8, 2}, {8, 1}, {6, 3}};
  static const uint32_t pages[] = {1, 3, 16, 64, 256};
  static const swiftkv_dtype types[] = {SWIFTKV_DTYPE_F16, SWIFTKV_DTYPE_BF16, SWIFTKV_DTYPE_F32};
  uint64_t s = 42;
  for (int c = 0; c < 60; ++c) {
    const uint32_t d = dims[c % 3];
    const uint32_t *g = groups[(c / 3) % 4];
    att_problem p;
    start_problem(&p, types[(c / 3 + c / 5) % 3], g[0], g[1], d, pages[c % 5],
                  (enum att_layout)(c % ATT_LAYOUTS));
    p.desc.causal = (uint32_t)(c % 2);
    p.desc.kv_chunk_tokens = (c % 4 == 3) ? 32 : 0;
    if (c % 7 == 0) {
      p.desc.sm_scale = 1.0f;
      p.desc.logits_soft_cap = 5.0f;
    }
    att_ragged_batch(&p, &s, 300, 70, 200);
    att_build(&p, (uint64_t)c + 1, 3);
    plan_and_run(&p, NULL);
    const int bad = compare_with_reference(&p);
    if (bad != 0) {
      print_error(
          "case %d: dtype %d d %u hq %u hk %u page %u layout %d causal %u chunk %u cap %g\n", c,
          (int)p.desc.dtype, d, g[0], g[1], p.desc.page_tokens, (int)p.layout, p.desc.causal,
          p.desc.kv_chunk_tokens, (double)p.desc.logits_soft_cap);
    }
    assert_int_equal(bad, 0);
    att_free(&p);
  }
}

/* Pensieve §4.4: a dropped leading range is recomputed as its own sub-request (it attends to
 * itself) beside the new prompt (which attends to everything), both over the same pages. Both
 * give exactly the rows of one causal pass over the whole sequence. */
static void dropped_prefix_and_new_prompt_share_pages(void **state) {
  (void)state;
  att_problem p;
  start_problem(&p, SWIFTKV_DTYPE_F16, 8, 2, 128, 16, ATT_NHD);
  p.n_req = 1;
  p.q_len[0] = 200;
  p.kv_len[0] = 200;
  att_build(&p, 7, 2);
  plan_and_run(&p, NULL);
  assert_int_equal(compare_with_reference(&p), 0);
  const size_t row = (size_t)p.args.out_token_stride * p.elem;
  unsigned char *full = malloc(p.out_bytes);
  memcpy(full, p.out, p.out_bytes);
  float *full_lse = malloc(sizeof(float) * 200 * 8);
  memcpy(full_lse, p.lse, sizeof(float) * 200 * 8);

  /* Tokens [0, 48) were dropped (3 pages); [48, 160) are cached; [160, 200) are the new prompt.
   * Queries: the dropped range and the new prompt, packed as rows 0..47 and 48..87. */
  const int32_t dropped = 48, cached_end = 160, n = 200;
  unsigned char *q2 = calloc(1, p.q_bytes);
  memcpy(q2, p.q, row * (size_t)dropped);
  memcpy(q2 + row * (size_t)dropped, p.q + row * (size_t)cached_end,
         row * (size_t)(n - cached_end));
  const int32_t qo[3] = {0, dropped, dropped + n - cached_end};
  const int32_t kv[3] = {0, 3, 3 + 13};
  const int32_t last[2] = {16, 200 - 12 * 16};
  int32_t idx[16];
  memcpy(idx, p.kv_indices, 3 * sizeof(int32_t));
  memcpy(idx + 3, p.kv_indices, 13 * sizeof(int32_t));
  uint64_t bytes = 0;
  assert_ok(swiftkv_attention_workspace_size(&bytes, &p.desc, 2, 88));
  void *ws = aligned_workspace(bytes);
  swiftkv_attention_plan plan = SWIFTKV_ATTENTION_PLAN_INIT;
  assert_ok(swiftkv_attention_plan_make(&plan, &p.desc, qo, kv, last, 2, ws, bytes, NULL));
  assert_int_equal(plan.q_tokens, 88);
  assert_int_equal(plan.kv_tokens, 248);
  swiftkv_attention_args a = p.args;
  a.q = q2;
  a.kv_indices = idx;
  memset(p.out, 0, p.out_bytes);
  assert_ok(swiftkv_attention_run(&plan, &a, ws, NULL));
  /* Row for row the same bits as the full pass. */
  assert_memory_equal(p.out, full, row * (size_t)dropped);
  assert_memory_equal(p.out + row * (size_t)dropped, full + row * (size_t)cached_end,
                      row * (size_t)(n - cached_end));
  assert_memory_equal(p.lse, full_lse, sizeof(float) * 8 * (size_t)dropped);
  assert_memory_equal(p.lse + 8 * dropped, full_lse + 8 * cached_end,
                      sizeof(float) * 8 * (size_t)(n - cached_end));
  free(ws);
  free(q2);
  free(full);
  free(full_lse);
  att_free(&p);
}

/* Queries that see no key: zeros and -inf. A sub-request without pages, and causal queries
 * beyond their KV (q_len > kv_len) in their first rows. */
static void queries_that_see_no_key_get_zero_and_minus_infinity(void **state) {
  (void)state;
  att_problem p;
  start_problem(&p, SWIFTKV_DTYPE_BF16, 4, 4, 64, 16, ATT_HND);
  p.desc.causal = 1;
  p.n_req = 2;
  p.q_len[0] = 3;
  p.kv_len[0] = 0;
  p.q_len[1] = 10;
  p.kv_len[1] = 6;
  att_build(&p, 3, 0);
  memset(p.out, 0x7f, p.out_bytes);
  plan_and_run(&p, NULL);
  assert_int_equal(compare_with_reference(&p), 0);
  for (int t = 0; t < 3 + 4; ++t) { /* sub-request 0, and the first 4 rows of sub-request 1 */
    for (int h = 0; h < 4; ++h) {
      assert_true(isinf(p.lse[t * 4 + h]) && p.lse[t * 4 + h] < 0);
      for (int e = 0; e < 64; ++e) {
        assert_true(att_load(p.desc.dtype,
                             p.out + (size_t)(t * p.args.out_token_stride + h * 64 + e) * p.elem) ==
                    0.0);
      }
    }
  }
  att_free(&p);
}

/* The partition is exact: tiles of 16 rows for decode-like batches and 64 otherwise, times KV
 * heads, times pieces of kv_chunk_tokens; merges per split (sub-request, KV head). */
static void plans_partition_exactly(void **state) {
  (void)state;
  swiftkv_attention_desc desc = SWIFTKV_ATTENTION_DESC_INIT;
  desc.num_qo_heads = 32;
  desc.num_kv_heads = 8;
  desc.head_dim = 128;
  desc.page_tokens = 16;
  /* decode: 3 sub-requests of 1 query (4 rows each), KV 100, 16 and 0 tokens */
  const int32_t qo[4] = {0, 1, 2, 3};
  const int32_t kv[4] = {0, 7, 8, 8};
  const int32_t last[3] = {4, 16, 0};
  uint64_t bytes = 0;
  assert_ok(swiftkv_attention_workspace_size(&bytes, &desc, 3, 3));
  void *ws = aligned_workspace(bytes);
  swiftkv_attention_plan plan = SWIFTKV_ATTENTION_PLAN_INIT;
  assert_ok(swiftkv_attention_plan_make(&plan, &desc, qo, kv, last, 3, ws, bytes, NULL));
  assert_int_equal(plan.n_requests, 3);
  assert_int_equal(plan.work_items, 3 * 8); /* host: no automatic split */
  assert_int_equal(plan.q_tokens, 3);
  assert_int_equal(plan.kv_tokens, 100 + 16);
  assert_int_equal(plan.split_requests, 0);
  assert_int_equal(plan.max_kv_pieces, 1);
  /* pieces of 16 keys: 100 keys -> 7, 16 -> 1, 0 -> 1 */
  desc.kv_chunk_tokens = 16;
  assert_ok(swiftkv_attention_plan_make(&plan, &desc, qo, kv, last, 3, ws, bytes, NULL));
  assert_int_equal(plan.work_items, (7 + 1 + 1) * 8);
  assert_int_equal(plan.split_requests, 1);
  assert_int_equal(plan.max_kv_pieces, 7);
  /* a prefill of 100 queries (400 rows: 7 tiles of 64) and a decode step */
  const int32_t qo2[3] = {0, 100, 101};
  const int32_t kv2[3] = {0, 13, 14};
  const int32_t last2[2] = {4, 5};
  desc.kv_chunk_tokens = 0;
  free(ws);
  assert_ok(swiftkv_attention_workspace_size(&bytes, &desc, 2, 101));
  ws = aligned_workspace(bytes);
  assert_ok(swiftkv_attention_plan_make(&plan, &desc, qo2, kv2, last2, 2, ws, bytes, NULL));
  assert_int_equal(plan.work_items, (7 + 1) * 8);
  assert_int_equal(plan.kv_tokens, 196 + 5);
  free(ws);
}

/* The library's own pools are a layout like any other: attention over a swiftkv_pool_create
 * pool's pages (regular and stream) through swiftkv_pool_get. */
static void attention_reads_a_library_pool(void **state) {
  (void)state;
  swiftkv_ctx_config cfg = SWIFTKV_CTX_CONFIG_INIT;
  swiftkv_ctx *ctx = NULL;
  assert_ok(swiftkv_ctx_create(&ctx, &cfg));
  swiftkv_model_config mc = SWIFTKV_MODEL_CONFIG_INIT;
  swiftkv_model_desc m = model(2, 2, 64, 16);
  m.name = "attention-pool";
  mc.desc = &m;
  mc.role = SWIFTKV_ROLE_BORROWER;
  uint32_t id = 0;
  assert_ok(swiftkv_model_register(&id, ctx, &mc));
  uint32_t pool = 0;
  assert_ok(swiftkv_pool_create(&pool, ctx, id, 8, 4));
  swiftkv_pool_desc pd = SWIFTKV_POOL_DESC_INIT;
  uint32_t owner = 0;
  assert_ok(swiftkv_pool_get(&pd, &owner, ctx, pool));

  /* One sequence of 70 tokens on pages 9, 2, 11 (stream), 0, 5 of layer 1. */
  const int32_t pages[5] = {9, 2, 11, 0, 5};
  att_problem p;
  start_problem(&p, SWIFTKV_DTYPE_F16, 4, 2, 64, 16, ATT_NHD);
  p.n_req = 1;
  p.q_len[0] = 30;
  p.kv_len[0] = 70;
  att_build(&p, 11, 0);
  unsigned char *base = pd.layer_base[1];
  for (int32_t j = 0; j < 70; ++j) {
    for (int h = 0; h < 2; ++h) {
      for (int e = 0; e < 64; ++e) {
        const int64_t at =
            pages[j / 16] * pd.page_stride + (j % 16) * pd.token_stride + h * pd.head_stride + e;
        const int64_t li = ((int64_t)j * 2 + h) * 64 + e;
        att_store(SWIFTKV_DTYPE_F16, base + at * 2, p.k_ref[li]);
        att_store(SWIFTKV_DTYPE_F16, base + (at + pd.kv_stride) * 2, p.v_ref[li]);
      }
    }
  }
  memcpy(p.kv_indices, pages, sizeof pages);
  p.args.k_base = base;
  p.args.v_base = base + pd.kv_stride * 2;
  p.args.page_stride = pd.page_stride;
  p.args.token_stride = pd.token_stride;
  p.args.head_stride = pd.head_stride;
  p.args.num_pages = pd.num_pages;
  plan_and_run(&p, NULL);
  assert_int_equal(compare_with_reference(&p), 0);
  att_free(&p);
  assert_ok(swiftkv_pool_destroy(ctx, pool));
  swiftkv_ctx_destroy(ctx);
}

/* Bad descriptions and batches: the status, a message naming what is wrong, and the plan
 * struct untouched. */
static void bad_plans_are_refused_and_change_nothing(void **state) {
  (void)state;
  swiftkv_attention_desc good = SWIFTKV_ATTENTION_DESC_INIT;
  good.num_qo_heads = 8;
  good.num_kv_heads = 2;
  good.head_dim = 64;
  good.page_tokens = 16;
  const int32_t qo[3] = {0, 5, 6};
  const int32_t kv[3] = {0, 2, 3};
  const int32_t last[2] = {7, 16};
  uint64_t bytes = 0;
  assert_ok(swiftkv_attention_workspace_size(&bytes, &good, 2, 6));
  void *ws = aligned_workspace(bytes + 256);
  swiftkv_attention_plan plan = SWIFTKV_ATTENTION_PLAN_INIT;
  memset(plan.internal, 0x5e, sizeof plan.internal);
  const swiftkv_attention_plan before = plan;

#define REFUSED(call, status, needle)                 \
  do {                                                \
    assert_status(call, status);                      \
    assert_message_contains(needle);                  \
    assert_memory_equal(&plan, &before, sizeof plan); \
  } while (0)

  swiftkv_attention_desc d = good;
  d.head_dim = 96;
  REFUSED(swiftkv_attention_plan_make(&plan, &d, qo, kv, last, 2, ws, bytes, NULL),
          SWIFTKV_EUNSUPPORTED, "head_dim is 96");
  d = good;
  d.num_qo_heads = 7;
  REFUSED(swiftkv_attention_plan_make(&plan, &d, qo, kv, last, 2, ws, bytes, NULL), SWIFTKV_EINVAL,
          "num_qo_heads is 7");
  d = good;
  d.page_tokens = 257;
  REFUSED(swiftkv_attention_plan_make(&plan, &d, qo, kv, last, 2, ws, bytes, NULL), SWIFTKV_EINVAL,
          "page_tokens is 257");
  d = good;
  d.kv_chunk_tokens = 40;
  REFUSED(swiftkv_attention_plan_make(&plan, &d, qo, kv, last, 2, ws, bytes, NULL), SWIFTKV_EINVAL,
          "kv_chunk_tokens is 40");
  d = good;
  d.dtype = SWIFTKV_DTYPE_FP8_E4M3;
  REFUSED(swiftkv_attention_plan_make(&plan, &d, qo, kv, last, 2, ws, bytes, NULL),
          SWIFTKV_EUNSUPPORTED, "dtype 3");
  d = good;
  d.dtype = SWIFTKV_DTYPE_F32;
  d.device = 0;
  REFUSED(swiftkv_attention_plan_make(&plan, &d, qo, kv, last, 2, ws, bytes, NULL),
          SWIFTKV_EUNSUPPORTED, "host only");
  d = good;
  d.sm_scale = -1.0f;
  REFUSED(swiftkv_attention_plan_make(&plan, &d, qo, kv, last, 2, ws, bytes, NULL), SWIFTKV_EINVAL,
          "sm_scale");
  d = good;
  d.version = 2;
  REFUSED(swiftkv_attention_plan_make(&plan, &d, qo, kv, last, 2, ws, bytes, NULL),
          SWIFTKV_EVERSION, "desc->version is 2");
  uint32_t devices = 0;
  assert_ok(swiftkv_device_count(&devices));
  if (devices == 0) {
    d = good;
    d.device = 0;
    REFUSED(swiftkv_attention_plan_make(&plan, &d, qo, kv, last, 2, ws, bytes, NULL),
            SWIFTKV_ENODEV, "device 0");
  }

  const int32_t qo_down[3] = {0, 5, 4};
  REFUSED(swiftkv_attention_plan_make(&plan, &good, qo_down, kv, last, 2, ws, bytes, NULL),
          SWIFTKV_EINVAL, "qo_indptr[2] is 4");
  const int32_t qo_start[3] = {1, 5, 6};
  REFUSED(swiftkv_attention_plan_make(&plan, &good, qo_start, kv, last, 2, ws, bytes, NULL),
          SWIFTKV_EINVAL, "qo_indptr[0] is 1");
  const int32_t last_zero[2] = {0, 16};
  REFUSED(swiftkv_attention_plan_make(&plan, &good, qo, kv, last_zero, 2, ws, bytes, NULL),
          SWIFTKV_EINVAL, "kv_last_page_len[0] is 0");
  const int32_t last_long[2] = {7, 17};
  REFUSED(swiftkv_attention_plan_make(&plan, &good, qo, kv, last_long, 2, ws, bytes, NULL),
          SWIFTKV_EINVAL, "kv_last_page_len[1] is 17");
  const int32_t kv_down[3] = {0, 2, 1};
  REFUSED(swiftkv_attention_plan_make(&plan, &good, qo, kv_down, last, 2, ws, bytes, NULL),
          SWIFTKV_EINVAL, "kv_indptr[2] is 1");
  REFUSED(swiftkv_attention_plan_make(&plan, &good, qo, kv, last, 2, (char *)ws + 16, bytes, NULL),
          SWIFTKV_EINVAL, "256-byte aligned");
  REFUSED(swiftkv_attention_plan_make(&plan, &good, qo, kv, last, 2, ws, 256, NULL), SWIFTKV_ENOMEM,
          "workspace bytes");
  REFUSED(swiftkv_attention_plan_make(&plan, &good, qo, kv, last, 2, ws, bytes, (void *)1),
          SWIFTKV_EINVAL, "stream");
  REFUSED(swiftkv_attention_plan_make(&plan, &good, NULL, kv, last, 2, ws, bytes, NULL),
          SWIFTKV_EINVAL, "qo_indptr is NULL");
  REFUSED(swiftkv_attention_plan_make(&plan, &good, qo, kv, last, 2, NULL, bytes, NULL),
          SWIFTKV_EINVAL, "workspace is NULL");
#undef REFUSED
  free(ws);
}

/* Bad runs: the status, and out and lse untouched. */
static void bad_runs_are_refused_and_write_nothing(void **state) {
  (void)state;
  att_problem p;
  start_problem(&p, SWIFTKV_DTYPE_F16, 4, 2, 64, 16, ATT_VLLM);
  p.n_req = 2;
  p.q_len[0] = 4;
  p.kv_len[0] = 40;
  p.q_len[1] = 1;
  p.kv_len[1] = 17;
  att_build(&p, 5, 1);
  void *ws = NULL;
  swiftkv_attention_plan plan = plan_and_run(&p, &ws);
  assert_int_equal(compare_with_reference(&p), 0);
  memset(p.out, 0xab, p.out_bytes);
  memset(p.lse, 0xcd, sizeof(float) * 5 * 4);
  unsigned char *out_before = malloc(p.out_bytes);
  memcpy(out_before, p.out, p.out_bytes);
  float lse_before[20];
  memcpy(lse_before, p.lse, sizeof lse_before);

#define RUN_REFUSED(plan_ptr, args_ptr, ws_ptr, status, needle)                     \
  do {                                                                              \
    assert_status(swiftkv_attention_run(plan_ptr, args_ptr, ws_ptr, NULL), status); \
    assert_message_contains(needle);                                                \
    assert_memory_equal(p.out, out_before, p.out_bytes);                            \
    assert_memory_equal(p.lse, lse_before, sizeof lse_before);                      \
  } while (0)

  /* A page id past the pages, in the last sub-request's table. */
  swiftkv_attention_args a = p.args;
  const int32_t saved = p.kv_indices[3];
  p.kv_indices[3] = (int32_t)p.num_pages;
  RUN_REFUSED(&plan, &a, ws, SWIFTKV_EINVAL, "kv_indices[3]");
  p.kv_indices[3] = -1;
  RUN_REFUSED(&plan, &a, ws, SWIFTKV_EINVAL, "is -1");
  p.kv_indices[3] = saved;
  a.token_stride = 0;
  RUN_REFUSED(&plan, &a, ws, SWIFTKV_EINVAL, "token_stride is 0");
  a = p.args;
  a.page_stride = INT64_MAX / 2;
  RUN_REFUSED(&plan, &a, ws, SWIFTKV_EINVAL, "64 bits");
  a = p.args;
  a.reserved0 = 1;
  RUN_REFUSED(&plan, &a, ws, SWIFTKV_EINVAL, "reserved0");
  a = p.args;
  a.q = NULL;
  RUN_REFUSED(&plan, &a, ws, SWIFTKV_EINVAL, "args->q is NULL");
  a = p.args;
  a.size = 0;
  a.version = 0;
  RUN_REFUSED(&plan, &a, ws, SWIFTKV_EVERSION, "SWIFTKV_ATTENTION_ARGS_INIT");
  /* A plan changed after it was made, or run with another workspace. */
  swiftkv_attention_plan forged = plan;
  forged.work_items += 1;
  RUN_REFUSED(&forged, &p.args, ws, SWIFTKV_EINVAL, "was changed since");
  forged = plan;
  forged.internal[7] += 1;
  RUN_REFUSED(&forged, &p.args, ws, SWIFTKV_EINVAL, "was changed since");
  void *other = aligned_workspace(plan.workspace_bytes);
  RUN_REFUSED(&plan, &p.args, other, SWIFTKV_EINVAL, "not the one the plan was made in");
  free(other);
  /* The workspace planned into again: the old plan no longer runs. */
  swiftkv_attention_plan newer = SWIFTKV_ATTENTION_PLAN_INIT;
  assert_ok(swiftkv_attention_plan_make(&newer, &p.desc, p.qo_indptr, p.kv_indptr, p.last_page_len,
                                        1, ws, plan.workspace_bytes, NULL));
  RUN_REFUSED(&plan, &p.args, ws, SWIFTKV_EINVAL, "no longer holds this plan");
#undef RUN_REFUSED
  free(out_before);
  free(ws);
  att_free(&p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(cpu_path_matches_the_fp64_reference),
      cmocka_unit_test(dropped_prefix_and_new_prompt_share_pages),
      cmocka_unit_test(queries_that_see_no_key_get_zero_and_minus_infinity),
      cmocka_unit_test(plans_partition_exactly),
      cmocka_unit_test(attention_reads_a_library_pool),
      cmocka_unit_test(bad_plans_are_refused_and_change_nothing),
      cmocka_unit_test(bad_runs_are_refused_and_write_nothing),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
