/* The borrower's capacity plan, Eq. 1-5: SwiftCache §3.2's worked example, its edges, a
 * realistic LWM split, and bad input leaving the caller's plan untouched. */
#include "test_support.h"

/* A geometry whose single-layer block is 64 bytes (2 * 16 tokens * 1 * 1 * 2) and whose full
 * block, over 10 layers, is 640: the worked example's numbers become byte counts directly. */
static swiftkv_model_desc tiny10(void) { return model(10, 1, 1, 16); }

static swiftkv_capacity_plan plan(swiftkv_model_desc m, uint64_t own, const uint64_t *lenders,
                                  size_t n) {
  swiftkv_capacity_plan p = SWIFTKV_CAPACITY_PLAN_INIT;
  assert_ok(swiftkv_plan_borrower(&m, own, lenders, n, &p));
  assert_int_equal(p.size, sizeof p);
  assert_int_equal(p.version, SWIFTKV_CAPACITY_PLAN_VERSION);
  return p;
}

static void worked_example(void **state) {
  (void)state;
  /* K_master = 100 single-layer blocks (plus 63 bytes that make no block), K_1 = 9 full blocks
   * (plus 639 bytes), K_2 = 8. */
  const uint64_t lenders[] = {9 * 640 + 639, 8 * 640};
  swiftkv_capacity_plan p = plan(tiny10(), 100 * 64 + 63, lenders, 2);
  assert_int_equal(p.lender_full_blocks, 17);
  assert_int_equal(p.stream_blocks, 17); /* min(9 + 8, 100) */
  assert_int_equal(p.regular_blocks, 8); /* floor(83 / 10) */
  assert_int_equal(p.max_context_tokens, 25 * 16);
  assert_int_equal(p.baseline_context_tokens, 10 * 16);
}

static void lenders_beyond_the_borrowers_memory(void **state) {
  (void)state;
  /* sum K_i >= K_master: the stream cache takes all local memory and no regular cache remains. */
  const uint64_t lenders[] = {150 * 640, 50 * 640};
  swiftkv_capacity_plan p = plan(tiny10(), 100 * 64, lenders, 2);
  assert_int_equal(p.lender_full_blocks, 200);
  assert_int_equal(p.stream_blocks, 100);
  assert_int_equal(p.regular_blocks, 0);
  assert_int_equal(p.max_context_tokens, 100 * 16);
  /* Exactly equal is the same branch. */
  const uint64_t exact[] = {100 * 640};
  p = plan(tiny10(), 100 * 64, exact, 1);
  assert_int_equal(p.stream_blocks, 100);
  assert_int_equal(p.regular_blocks, 0);
}

static void no_lenders_is_the_baseline(void **state) {
  (void)state;
  swiftkv_capacity_plan p = plan(tiny10(), 100 * 64, NULL, 0);
  assert_int_equal(p.stream_blocks, 0);
  assert_int_equal(p.regular_blocks, 10);
  assert_int_equal(p.max_context_tokens, p.baseline_context_tokens);
  assert_int_equal(p.baseline_context_tokens, 160);
  /* Lenders too small for one full block change nothing either. */
  const uint64_t crumbs[] = {639, 639, 0};
  p = plan(tiny10(), 100 * 64, crumbs, 3);
  assert_int_equal(p.stream_blocks, 0);
  assert_int_equal(p.max_context_tokens, 160);
}

static void floors_at_every_step(void **state) {
  (void)state;
  /* 99 single-layer blocks: the baseline holds 9 full blocks, not 9.9. */
  swiftkv_capacity_plan p = plan(tiny10(), 99 * 64, NULL, 0);
  assert_int_equal(p.baseline_context_tokens, 9 * 16);
  /* One stream block leaves 98: regular floor(98/10) = 9; total 10 blocks. */
  const uint64_t one[] = {640};
  p = plan(tiny10(), 99 * 64, one, 1);
  assert_int_equal(p.stream_blocks, 1);
  assert_int_equal(p.regular_blocks, 9);
  /* Less than one single-layer block of memory: nothing at all. */
  p = plan(tiny10(), 63, one, 1);
  assert_int_equal(p.stream_blocks, 0);
  assert_int_equal(p.regular_blocks, 0);
  assert_int_equal(p.max_context_tokens, 0);
  assert_int_equal(p.baseline_context_tokens, 0);
}

static void lwm_with_two_lenders(void **state) {
  (void)state;
  /* LWM-1M-Text: M_block = 2*16*32*128*2 = 256 KiB, full block 8 MiB. 40 GiB of its own memory
   * is 163840 single-layer blocks; lenders of 20 and 30 GiB hold 2560 + 3840 full blocks. */
  const uint64_t gib = UINT64_C(1) << 30;
  const uint64_t lenders[] = {20 * gib, 30 * gib};
  swiftkv_capacity_plan p = plan(lwm_1m_text(), 40 * gib, lenders, 2);
  assert_int_equal(p.stream_blocks, 6400);
  assert_int_equal(p.regular_blocks, (163840 - 6400) / 32);
  assert_int_equal(p.max_context_tokens, (6400 + 4920) * 16);
  assert_int_equal(p.baseline_context_tokens, 163840 / 32 * 16);
}

static void expect_refused(swiftkv_model_desc m, uint64_t own, const uint64_t *lenders, size_t n,
                           swiftkv_status want, const char *needle) {
  swiftkv_capacity_plan p = SWIFTKV_CAPACITY_PLAN_INIT;
  p.stream_blocks = SENTINEL;
  p.regular_blocks = SENTINEL;
  p.max_context_tokens = SENTINEL;
  p.baseline_context_tokens = SENTINEL;
  p.lender_full_blocks = SENTINEL;
  swiftkv_capacity_plan before = p;
  assert_status(swiftkv_plan_borrower(&m, own, lenders, n, &p), want);
  assert_message_contains(needle);
  assert_memory_equal(&p, &before, sizeof p);
}

static void bad_input_leaves_the_plan_untouched(void **state) {
  (void)state;
  const uint64_t lenders[] = {640};
  swiftkv_model_desc m = tiny10();
  m.num_layers = 0;
  expect_refused(m, 6400, lenders, 1, SWIFTKV_EINVAL, "borrower->num_layers is 0");
  m = tiny10();
  m.chunk_tokens = 24;
  expect_refused(m, 6400, lenders, 1, SWIFTKV_EINVAL, "not a multiple of block_tokens");
  expect_refused(tiny10(), 6400, NULL, 2, SWIFTKV_EINVAL,
                 "lender_kv_bytes is NULL but n_lenders is 2");
  /* The smallest geometry (1 layer, 1 token, 1 head of 1 byte: 2-byte full block) makes
   * K_i = 2^63 - 1 per maxed-out lender; three of them overflow the sum. */
  swiftkv_model_desc t = model(1, 1, 1, 1);
  t.dtype = SWIFTKV_DTYPE_I8;
  t.chunk_tokens = 1;
  const uint64_t huge[] = {UINT64_MAX, UINT64_MAX, UINT64_MAX};
  expect_refused(t, 6400, huge, 3, SWIFTKV_EINVAL, "does not fit in 64 bits");
  /* Two of them still fit. */
  swiftkv_capacity_plan p = plan(t, 6400, huge, 2);
  assert_int_equal(p.lender_full_blocks, UINT64_MAX - 1);
  assert_int_equal(p.stream_blocks, 3200);
}

static void bad_output_struct(void **state) {
  (void)state;
  swiftkv_model_desc m = tiny10();
  assert_status(swiftkv_plan_borrower(&m, 6400, NULL, 0, NULL), SWIFTKV_EINVAL);
  assert_message_contains("out is NULL");
  swiftkv_capacity_plan p;
  memset(&p, 0, sizeof p);
  assert_status(swiftkv_plan_borrower(&m, 6400, NULL, 0, &p), SWIFTKV_EVERSION);
  assert_message_contains("SWIFTKV_CAPACITY_PLAN_INIT");
  swiftkv_capacity_plan newer = SWIFTKV_CAPACITY_PLAN_INIT;
  newer.version = SWIFTKV_CAPACITY_PLAN_VERSION + 1;
  assert_status(swiftkv_plan_borrower(&m, 6400, NULL, 0, &newer), SWIFTKV_EVERSION);
  assert_int_equal(newer.stream_blocks, 0);
  assert_int_equal(newer.regular_blocks, 0);
}

static void output_written_only_within_its_size(void **state) {
  (void)state;
  /* A caller whose struct is larger (padding it owns after ours) keeps those bytes. */
  struct {
    swiftkv_capacity_plan plan;
    uint64_t canary;
  } big;
  swiftkv_capacity_plan init = SWIFTKV_CAPACITY_PLAN_INIT;
  big.plan = init;
  big.canary = SENTINEL;
  swiftkv_model_desc m = tiny10();
  assert_ok(swiftkv_plan_borrower(&m, 6400, NULL, 0, &big.plan));
  assert_int_equal(big.plan.regular_blocks, 10);
  assert_true(big.canary == SENTINEL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(worked_example),
      cmocka_unit_test(lenders_beyond_the_borrowers_memory),
      cmocka_unit_test(no_lenders_is_the_baseline),
      cmocka_unit_test(floors_at_every_step),
      cmocka_unit_test(lwm_with_two_lenders),
      cmocka_unit_test(bad_input_leaves_the_plan_untouched),
      cmocka_unit_test(bad_output_struct),
      cmocka_unit_test(output_written_only_within_its_size),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
