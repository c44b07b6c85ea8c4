/* Helpers shared by the CMocka tests: status assertions that print the library's message, and
 * the model geometries of SwiftCache Table 2. */
#ifndef SWIFTKV_TEST_SUPPORT_H
#define SWIFTKV_TEST_SUPPORT_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "paper_models.h"
#include "swiftkv/swiftkv.h"

/* Asserts that `call` returns `expected`; on mismatch prints both statuses and the message. */
#define assert_status(call, expected)                                                              \
  do {                                                                                             \
    swiftkv_status st_ = (call);                                                                   \
    if (st_ != (expected)) {                                                                       \
      print_error("%s returned %s, expected %s; message: %s\n", #call, swiftkv_status_string(st_), \
                  swiftkv_status_string(expected), swiftkv_last_error_message());                  \
    }                                                                                              \
    assert_int_equal(st_, (expected));                                                             \
  } while (0)

#define assert_ok(call) assert_status(call, SWIFTKV_OK)

/* Asserts that the last error message contains `needle`. */
#define assert_message_contains(needle)                                     \
  do {                                                                      \
    const char *m_ = swiftkv_last_error_message();                          \
    if (strstr(m_, (needle)) == NULL) print_error("message was: %s\n", m_); \
    assert_non_null(strstr(m_, (needle)));                                  \
  } while (0)

/* A filler no computation can produce, to check that outputs stay untouched on failure. */
#define SENTINEL UINT64_C(0x5EEDF00DDEADBEEF)

static inline swiftkv_model_desc model(uint32_t layers, uint32_t kv_heads, uint32_t head_dim,
                                       uint32_t block_tokens) {
  swiftkv_model_desc m = SWIFTKV_MODEL_DESC_INIT;
  m.num_layers = layers;
  m.num_kv_heads = kv_heads;
  m.head_dim = head_dim;
  m.block_tokens = block_tokens;
  m.chunk_tokens = 256;
  return m;
}

/* SwiftCache Table 2 (paper_models.h), float16, 16-token blocks, 256-token chunks. */
static inline swiftkv_model_desc paper_model(int which) {
  return swiftkv_paper_desc(which, 16, 256);
}
static inline swiftkv_model_desc lwm_1m_text(void) {
  return paper_model(SWIFTKV_PAPER_LWM_1M_TEXT);
}
static inline swiftkv_model_desc qwen3_8b(void) { return paper_model(SWIFTKV_PAPER_QWEN3_8B); }
static inline swiftkv_model_desc qwen3_14b(void) { return paper_model(SWIFTKV_PAPER_QWEN3_14B); }
static inline swiftkv_model_desc qwen3_32b(void) { return paper_model(SWIFTKV_PAPER_QWEN3_32B); }

#endif /* SWIFTKV_TEST_SUPPORT_H */
