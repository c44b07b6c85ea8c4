/* Status codes, their strings, the thread-local error message and the version, as promised by
 * the header: pinned numbers, static text, one message per thread. */
#include <pthread.h>

#include "test_support.h"

static void status_numbers_are_pinned(void **state) {
  (void)state;
  /* These numbers are ABI: bindings and engines compare against them. */
  assert_int_equal(SWIFTKV_OK, 0);
  assert_int_equal(SWIFTKV_IN_PROGRESS, 1);
  assert_int_equal(SWIFTKV_EINVAL, -1);
  assert_int_equal(SWIFTKV_ENOMEM, -2);
  assert_int_equal(SWIFTKV_ENOTFOUND, -3);
  assert_int_equal(SWIFTKV_EBUSY, -4);
  assert_int_equal(SWIFTKV_EIO, -5);
  assert_int_equal(SWIFTKV_ECUDA, -6);
  assert_int_equal(SWIFTKV_ENODEV, -7);
  assert_int_equal(SWIFTKV_EPEER, -8);
  assert_int_equal(SWIFTKV_ETIMEDOUT, -9);
  assert_int_equal(SWIFTKV_EVERSION, -10);
  assert_int_equal(SWIFTKV_EUNSUPPORTED, -11);
  assert_int_equal(SWIFTKV_EUSER, -12);
  assert_int_equal(SWIFTKV_ESTATE, -13);
  assert_int_equal(SWIFTKV_EINTERNAL, -14);
}

static void every_status_has_its_own_string(void **state) {
  (void)state;
  static const struct {
    swiftkv_status s;
    const char *name;
  } all[] = {
      {SWIFTKV_OK, "SWIFTKV_OK:"},           {SWIFTKV_IN_PROGRESS, "SWIFTKV_IN_PROGRESS:"},
      {SWIFTKV_EINVAL, "SWIFTKV_EINVAL:"},   {SWIFTKV_ENOMEM, "SWIFTKV_ENOMEM:"},
      {SWIFTKV_ENOTFOUND, "SWIFTKV_ENOTFOUND:"}, {SWIFTKV_EBUSY, "SWIFTKV_EBUSY:"},
      {SWIFTKV_EIO, "SWIFTKV_EIO:"},         {SWIFTKV_ECUDA, "SWIFTKV_ECUDA:"},
      {SWIFTKV_ENODEV, "SWIFTKV_ENODEV:"},   {SWIFTKV_EPEER, "SWIFTKV_EPEER:"},
      {SWIFTKV_ETIMEDOUT, "SWIFTKV_ETIMEDOUT:"}, {SWIFTKV_EVERSION, "SWIFTKV_EVERSION:"},
      {SWIFTKV_EUNSUPPORTED, "SWIFTKV_EUNSUPPORTED:"}, {SWIFTKV_EUSER, "SWIFTKV_EUSER:"},
      {SWIFTKV_ESTATE, "SWIFTKV_ESTATE:"},   {SWIFTKV_EINTERNAL, "SWIFTKV_EINTERNAL:"},
  };
  const size_t n = sizeof all / sizeof all[0];
  for (size_t i = 0; i < n; ++i) {
    const char *s = swiftkv_status_string(all[i].s);
    assert_non_null(s);
    /* Starts with its own enumerator's name, so no two share a string. */
    assert_int_equal(strncmp(s, all[i].name, strlen(all[i].name)), 0);
    assert_true(strlen(s) > strlen(all[i].name) + 1);
  }
  assert_string_equal(swiftkv_status_string((swiftkv_status)-15), "unknown swiftkv_status");
  assert_string_equal(swiftkv_status_string((swiftkv_status)2), "unknown swiftkv_status");
}

static void message_names_function_and_argument(void **state) {
  (void)state;
  swiftkv_model_desc m = qwen3_8b();
  m.num_kv_heads = 0;
  uint64_t out = SENTINEL;
  assert_status(swiftkv_geometry_bytes_per_token(&m, &out), SWIFTKV_EINVAL);
  assert_string_equal(swiftkv_last_error_message(),
                      "swiftkv_geometry_bytes_per_token: m->num_kv_heads is 0; it must be at "
                      "least 1");
  assert_true(out == SENTINEL);
}

struct thread_result {
  char before[64];
  char after[256];
};

static void *fail_in_thread(void *arg) {
  struct thread_result *r = arg;
  snprintf(r->before, sizeof r->before, "%s", swiftkv_last_error_message());
  uint64_t a, b;
  (void)swiftkv_plan_scale_up(1, 0, 1, 1, 10, &a, &b); /* block_tokens 0 */
  snprintf(r->after, sizeof r->after, "%s", swiftkv_last_error_message());
  return NULL;
}

static void message_is_thread_local(void **state) {
  (void)state;
  swiftkv_model_desc m = qwen3_8b();
  m.head_dim = 0;
  uint64_t out;
  assert_status(swiftkv_geometry_bytes_per_token(&m, &out), SWIFTKV_EINVAL);
  const char *expected_here = "swiftkv_geometry_bytes_per_token: m->head_dim is 0; it must be at least 1";
  assert_string_equal(swiftkv_last_error_message(), expected_here);

  struct thread_result r;
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, fail_in_thread, &r), 0);
  assert_int_equal(pthread_join(t, NULL), 0);
  /* A new thread starts with no message, then sees only its own failure ... */
  assert_string_equal(r.before, "");
  assert_string_equal(r.after, "swiftkv_plan_scale_up: block_tokens is 0; it must be at least 1");
  /* ... and this thread's message is unchanged by it. */
  assert_string_equal(swiftkv_last_error_message(), expected_here);
}

static void version_agrees_with_header(void **state) {
  (void)state;
  assert_int_equal(swiftkv_version(), SWIFTKV_VERSION_NUMBER);
  char expected[32];
  snprintf(expected, sizeof expected, "%d.%d.%d", SWIFTKV_VERSION_MAJOR, SWIFTKV_VERSION_MINOR,
           SWIFTKV_VERSION_PATCH);
  assert_string_equal(swiftkv_version_string(), expected);
  assert_int_equal(SWIFTKV_VERSION_NUMBER,
                   SWIFTKV_VERSION_MAJOR * 10000 + SWIFTKV_VERSION_MINOR * 100 +
                       SWIFTKV_VERSION_PATCH);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(status_numbers_are_pinned),
      cmocka_unit_test(every_status_has_its_own_string),
      cmocka_unit_test(message_names_function_and_argument),
      cmocka_unit_test(message_is_thread_local),
      cmocka_unit_test(version_agrees_with_header),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
