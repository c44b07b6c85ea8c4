/* On a GPU machine: the device query sees the devices, a context can take each one and only
 * those, and CUDA_VISIBLE_DEVICES is honoured. Without a usable device it exits 77 (skipped). */
#include <stdlib.h>

#include "gpu_skip.h"
#include "test_support.h"

static uint32_t usable;

static void each_device_can_be_used(void **state) {
  (void)state;
  for (uint32_t d = 0; d < usable && d < 64; ++d) {
    swiftkv_ctx_config c = SWIFTKV_CTX_CONFIG_INIT;
    c.device_mask = UINT64_C(1) << d;
    swiftkv_ctx *ctx = NULL;
    assert_ok(swiftkv_ctx_create(&ctx, &c));
    uint32_t n = 0;
    assert_ok(swiftkv_ctx_device_count(&n, ctx));
    assert_int_equal(n, 1);
    swiftkv_ctx_destroy(ctx);
  }
}

static void all_devices(void **state) {
  (void)state;
  swiftkv_ctx_config c = SWIFTKV_CTX_CONFIG_INIT;
  c.device_mask = SWIFTKV_DEVICE_MASK_ALL;
  swiftkv_ctx *ctx = NULL;
  assert_ok(swiftkv_ctx_create(&ctx, &c));
  uint32_t n = 0;
  assert_ok(swiftkv_ctx_device_count(&n, ctx));
  assert_int_equal(n, usable);
  swiftkv_ctx_config e = SWIFTKV_CTX_CONFIG_INIT;
  assert_ok(swiftkv_ctx_get_config(&e, ctx));
  assert_true(e.device_mask == SWIFTKV_DEVICE_MASK_ALL);
  swiftkv_ctx_destroy(ctx);
}

static void one_past_the_last_device(void **state) {
  (void)state;
  if (usable >= 64) skip();
  swiftkv_ctx_config c = SWIFTKV_CTX_CONFIG_INIT;
  c.device_mask = (UINT64_C(1) << usable) | 1;
  swiftkv_ctx *ctx = (swiftkv_ctx *)(uintptr_t)0x5EED;
  assert_status(swiftkv_ctx_create(&ctx, &c), SWIFTKV_ENODEV);
  char needle[64];
  snprintf(needle, sizeof needle, "names device %u", usable);
  assert_message_contains(needle);
  assert_ptr_equal(ctx, (swiftkv_ctx *)(uintptr_t)0x5EED);
}

int main(void) {
  if (swiftkv_device_count(&usable) != SWIFTKV_OK) {
    fprintf(stderr, "swiftkv_device_count failed: %s\n", swiftkv_last_error_message());
    return 1;
  }
  if (usable == 0) return swiftkv_test_no_gpu("no usable CUDA device (swiftkv_device_count: 0)");
  printf("%u usable CUDA device(s)\n", usable);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(each_device_can_be_used),
      cmocka_unit_test(all_devices),
      cmocka_unit_test(one_past_the_last_device),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
