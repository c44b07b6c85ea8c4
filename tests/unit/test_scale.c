/* Algorithm 1 (ScaleUp / ScaleDown) at and around its boundaries, the minimality of every step
 * over a sweep, and bad input leaving the outputs untouched. */
#include "test_support.h"

typedef struct {
  uint64_t lender, borrower;
} delta;

static delta up(uint64_t owned, uint32_t b, uint64_t meu_l, uint64_t meu_b, uint64_t req) {
  delta d = {SENTINEL, SENTINEL};
  assert_ok(swiftkv_plan_scale_up(owned, b, meu_l, meu_b, req, &d.lender, &d.borrower));
  return d;
}

static delta down(uint64_t owned, uint32_t b, uint64_t meu_l, uint64_t meu_b, uint64_t max) {
  delta d = {SENTINEL, SENTINEL};
  assert_ok(swiftkv_plan_scale_down(owned, b, meu_l, meu_b, max, &d.lender, &d.borrower));
  return d;
}

#define assert_delta(d, l, b)           \
  do {                                  \
    delta d_ = (d);                     \
    assert_int_equal(d_.lender, (l));   \
    assert_int_equal(d_.borrower, (b)); \
  } while (0)

static void scale_up_boundaries(void **state) {
  (void)state;
  /* 10 blocks of 16 tokens; MEU 4 lender blocks per 3 borrower blocks. */
  assert_delta(up(10, 16, 4, 3, 0), 0, 0);
  assert_delta(up(10, 16, 4, 3, 160), 0, 0); /* need 10 = owned: lines 12-13 */
  assert_delta(up(10, 16, 4, 3, 161), 4, 3); /* need 11: one MEU, rounded up */
  assert_delta(up(10, 16, 4, 3, 224), 4, 3); /* need 14: still one MEU */
  assert_delta(up(10, 16, 4, 3, 225), 8, 6); /* need 15: two */
  assert_delta(up(0, 16, 4, 3, 1), 4, 3);
  assert_delta(up(0, 16, 1, 1, 0), 0, 0);
  /* ceil(request / B) without the overflow of request + B - 1. */
  assert_delta(up(0, 16, 1, 1, UINT64_MAX), UINT64_C(1) << 60, UINT64_C(1) << 60);
}

static void scale_down_boundaries(void **state) {
  (void)state;
  assert_delta(down(10, 16, 4, 3, 160), 0, 0);  /* max_need 10 = owned: lines 24-25 */
  assert_delta(down(10, 16, 4, 3, 1000), 0, 0); /* more than owned */
  assert_delta(down(10, 16, 4, 3, 144), 0, 0);  /* 1 spare block: less than one MEU */
  assert_delta(down(10, 16, 4, 3, 97), 0, 0);   /* need 7, 3 spare */
  assert_delta(down(10, 16, 4, 3, 96), 4, 3);   /* need 6, 4 spare: one MEU */
  assert_delta(down(10, 16, 4, 3, 0), 8, 6);    /* idle window: floor(10/4) MEUs */
  assert_delta(down(0, 16, 4, 3, 0), 0, 0);
}

static void every_step_is_minimal_and_sufficient(void **state) {
  (void)state;
  const uint32_t b = 16;
  const uint64_t meu_l = 5, meu_b = 7;
  for (uint64_t owned = 0; owned <= 40; owned += 3) {
    for (uint64_t tokens = 0; tokens <= 1000; ++tokens) {
      const uint64_t need = (tokens + b - 1) / b;
      delta u = up(owned, b, meu_l, meu_b, tokens);
      assert_int_equal(u.lender % meu_l, 0);
      assert_int_equal(u.borrower, u.lender / meu_l * meu_b);
      assert_true(owned + u.lender >= need);                          /* enough for the request */
      if (u.lender > 0) assert_true(owned + u.lender - meu_l < need); /* and no MEU more */
      delta d = down(owned, b, meu_l, meu_b, tokens);
      assert_int_equal(d.lender % meu_l, 0);
      assert_int_equal(d.borrower, d.lender / meu_l * meu_b);
      if (need >= owned) {
        assert_int_equal(d.lender, 0);
      } else {
        assert_true(owned - d.lender >= need);        /* keeps what the window needed */
        assert_true(owned - d.lender < need + meu_l); /* and releases every whole MEU */
      }
    }
  }
}

static void bad_input_leaves_outputs_untouched(void **state) {
  (void)state;
  uint64_t l = SENTINEL, b = SENTINEL;
  assert_status(swiftkv_plan_scale_up(10, 0, 4, 3, 100, &l, &b), SWIFTKV_EINVAL);
  assert_message_contains("block_tokens is 0");
  assert_status(swiftkv_plan_scale_up(10, 16, 0, 3, 100, &l, &b), SWIFTKV_EINVAL);
  assert_message_contains("meu_lender is 0");
  assert_status(swiftkv_plan_scale_down(10, 16, 4, 0, 100, &l, &b), SWIFTKV_EINVAL);
  assert_message_contains("meu_borrower is 0");
  assert_status(swiftkv_plan_scale_down(10, 0, 4, 3, 100, &l, &b), SWIFTKV_EINVAL);
  assert_status(swiftkv_plan_scale_up(10, 16, 4, 3, 100, NULL, &b), SWIFTKV_EINVAL);
  assert_message_contains("lender_delta_out is NULL");
  assert_status(swiftkv_plan_scale_down(10, 16, 4, 3, 100, &l, NULL), SWIFTKV_EINVAL);
  assert_message_contains("borrower_delta_out is NULL");
  /* k = 2^64 - 1 MEUs of one lender block fits; twice that many borrower blocks does not. */
  assert_status(swiftkv_plan_scale_up(0, 1, 1, 2, UINT64_MAX, &l, &b), SWIFTKV_EINVAL);
  assert_message_contains("borrower delta (k * meu_borrower) does not fit in 64 bits");
  assert_status(swiftkv_plan_scale_down(UINT64_MAX, 1, 1, 2, 0, &l, &b), SWIFTKV_EINVAL);
  assert_true(l == SENTINEL && b == SENTINEL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(scale_up_boundaries),
      cmocka_unit_test(scale_down_boundaries),
      cmocka_unit_test(every_step_is_minimal_and_sufficient),
      cmocka_unit_test(bad_input_leaves_outputs_untouched),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
