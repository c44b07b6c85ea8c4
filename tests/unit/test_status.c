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
      {SWIFTKV_OK, "SWIFTKV_OK:"},
      {SWIFTKV_IN_PROGRESS, "SWIFTKV_IN_PROGRESS:"},
      {SWIFTKV_EINVAL, "SWIFTKV_EINVAL:"},
      {SWIFTKV_ENOMEM, "SWIFTKV_ENOMEM:"},
      {SWIFTKV_ENOTFOUND, "SWIFTKV_ENOTFOUND:"},
      {SWIFTKV_EBUSY, "SWIFTKV_EBUSY:"},
      {SWIFTKV_EIO, "SWIFTKV_EIO:"},
      {SWIFTKV_ECUDA, "SWIFTKV_ECUDA:"},
      {SWIFTKV_ENODEV, "SWIFTKV_ENODEV:"},
      {SWIFTKV_EPEER, "SWIFTKV_EPEER:"},
      {SWIFTKV_ETIMEDOUT, "SWIFTKV_ETIMEDOUT:"},
      {SWIFTKV_EVERSION, "SWIFTKV_EVERSION:"},
      {SWIFTKV_EUNSUPPORTED, "SWIFTKV_EUNSUPPORTED:"},
      {SWIFTKV_EUSER, "SWIFTKV_EUSER:"},
      {SWIFTKV_ESTATE, "SWIFTKV_ESTATE:"},
      {SWIFTKV_EINTERNAL, "SWIFTKV_EINTERNAL:"},
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
  const char *expected_here =
      "swiftkv_geometry_bytes_per_token: m->head_dim is 0; it must be at least 1";
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
  assert_int_equal(SWIFTKV_VERSION_NUMBER, SWIFTKV_VERSION_MAJOR * 10000 +
                                               SWIFTKV_VERSION_MINOR * 100 + SWIFTKV_VERSION_PATCH);
}

/* Each swiftkv_<struct>_init fills what its INIT macro says: size and version for every one
 * (over a struct filled with 0xa5, so nothing is left unwritten there), and the non-zero
 * defaults field by field. NULL is accepted. */
#define CHECK_INIT(TYPE, MACRO)                  \
  do {                                           \
    TYPE want = MACRO, got;                      \
    memset(&got, 0xa5, sizeof got);              \
    TYPE##_init(&got);                           \
    assert_int_equal(got.size, want.size);       \
    assert_int_equal(got.version, want.version); \
    TYPE##_init(NULL);                           \
  } while (0)

static void init_functions_fill_the_macros(void **state) {
  (void)state;
  CHECK_INIT(swiftkv_model_desc, SWIFTKV_MODEL_DESC_INIT);
  CHECK_INIT(swiftkv_capacity_plan, SWIFTKV_CAPACITY_PLAN_INIT);
  CHECK_INIT(swiftkv_ctx_config, SWIFTKV_CTX_CONFIG_INIT);
  CHECK_INIT(swiftkv_elastic_config, SWIFTKV_ELASTIC_CONFIG_INIT);
  CHECK_INIT(swiftkv_layer_view, SWIFTKV_LAYER_VIEW_INIT);
  CHECK_INIT(swiftkv_lease, SWIFTKV_LEASE_INIT);
  CHECK_INIT(swiftkv_elastic_stats, SWIFTKV_ELASTIC_STATS_INIT);
  CHECK_INIT(swiftkv_model_config, SWIFTKV_MODEL_CONFIG_INIT);
  CHECK_INIT(swiftkv_lookup_result, SWIFTKV_LOOKUP_RESULT_INIT);
  CHECK_INIT(swiftkv_stats, SWIFTKV_STATS_INIT);
  CHECK_INIT(swiftkv_coord_stats, SWIFTKV_COORD_STATS_INIT);
  CHECK_INIT(swiftkv_pool_desc, SWIFTKV_POOL_DESC_INIT);
  CHECK_INIT(swiftkv_request_desc, SWIFTKV_REQUEST_DESC_INIT);
  CHECK_INIT(swiftkv_request_info, SWIFTKV_REQUEST_INFO_INIT);
  CHECK_INIT(swiftkv_attention_desc, SWIFTKV_ATTENTION_DESC_INIT);
  CHECK_INIT(swiftkv_attention_plan, SWIFTKV_ATTENTION_PLAN_INIT);
  CHECK_INIT(swiftkv_attention_args, SWIFTKV_ATTENTION_ARGS_INIT);
  swiftkv_model_desc m;
  memset(&m, 0xa5, sizeof m);
  swiftkv_model_desc_init(&m);
  assert_null(m.name);
  assert_null(m.identity);
  assert_int_equal(m.num_layers, 0);
  assert_int_equal(m.block_tokens, 16);
  assert_int_equal(m.chunk_tokens, 256);
  assert_int_equal(m.dtype, SWIFTKV_DTYPE_F16);
  assert_int_equal(m.device, SWIFTKV_DEVICE_HOST);
  swiftkv_ctx_config c;
  memset(&c, 0xa5, sizeof c);
  swiftkv_ctx_config_init(&c);
  const swiftkv_ctx_config cw = SWIFTKV_CTX_CONFIG_INIT;
  assert_int_equal(c.device_mask, cw.device_mask);
  assert_int_equal(c.host_budget_bytes, 0);
  assert_int_equal(c.host_numa_node, SWIFTKV_NUMA_NODE_AUTO);
  assert_null(c.disk_path);
  assert_int_equal(c.eviction_policy, SWIFTKV_EVICT_RETENTION);
  assert_int_equal(c.demote_free_percent, 25);
  assert_true(c.recompute_token_cost == 1.0 && c.recompute_attention_cost == 1.0);
  assert_null(c.attention_cost_table);
  assert_int_equal(c.maintenance_interval_ms, 10);
  assert_null(c.clock);
  assert_null(c.coord_endpoint);
  assert_int_equal(c.coord_heartbeat_ms, 100);
  assert_int_equal(c.coord_timeout_ms, 5000);
  assert_int_equal(c.disk_sync_ms, 1000);
  assert_int_equal(c.max_open_requests, 4096);
  assert_int_equal(c.write_back_on_close, 1);
  assert_int_equal(c.reserved0 | c.reserved1 | c.reserved2, 0);
  swiftkv_elastic_config e;
  memset(&e, 0xa5, sizeof e);
  swiftkv_elastic_config_init(&e);
  assert_null(e.lender);
  assert_int_equal(e.window_ms, 60000);
  assert_int_equal(e.lease_ms, 10000);
  assert_int_equal(e.cuda_alloc, SWIFTKV_CUDA_ALLOC_AUTO);
  assert_int_equal(e.flags, 0);
  assert_int_equal(e.reclaim_deadline_ms, 30000);
  swiftkv_request_desc r;
  memset(&r, 0xa5, sizeof r);
  swiftkv_request_desc_init(&r);
  assert_int_equal(r.shape, SWIFTKV_REQUEST_LOAD_AND_SAVE);
  assert_null(r.tokens);
  assert_int_equal(r.load_from_tokens, 0);
  swiftkv_attention_desc a;
  memset(&a, 0xa5, sizeof a);
  swiftkv_attention_desc_init(&a);
  assert_int_equal(a.page_tokens, 16);
  assert_int_equal(a.causal, 1);
  assert_int_equal(a.device, SWIFTKV_DEVICE_HOST);
  assert_true(a.sm_scale == 0.0f && a.logits_soft_cap == 0.0f);
  swiftkv_model_config mc;
  memset(&mc, 0xa5, sizeof mc);
  swiftkv_model_config_init(&mc);
  assert_null(mc.desc);
  assert_int_equal(mc.role, SWIFTKV_ROLE_BORROWER);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(status_numbers_are_pinned),
      cmocka_unit_test(every_status_has_its_own_string),
      cmocka_unit_test(message_names_function_and_argument),
      cmocka_unit_test(message_is_thread_local),
      cmocka_unit_test(version_agrees_with_header),
      cmocka_unit_test(init_functions_fill_the_macros),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
