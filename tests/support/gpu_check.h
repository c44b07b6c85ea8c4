/* The check macros of the C++ GPU tests and their CMocka runner. A failed check prints where
 * and the library's last message, counts, and returns from the current function (helpers that
 * check go on with the next case; no long jump crosses C++ destructors). Each GPU case runs as
 * one CMocka test that fails when any of its checks did. The skip rule (exit 77 without a
 * device, or failure with SWIFTKV_REQUIRE_GPU=1) is gpu_skip.h's, shared with the C tests. */
#ifndef SWIFTKV_GPU_CHECK_H
#define SWIFTKV_GPU_CHECK_H

#include <csetjmp>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>

extern "C" {
#include <cmocka.h>
}

#include "swiftkv/swiftkv.h"

namespace {

int g_failures = 0;

// Case() as one CMocka test.
template <void (*Case)()>
void gpu_case(void **) {
  const int before = g_failures;
  Case();
  if (g_failures != before) fail_msg("%d check(s) failed (printed above)", g_failures - before);
}

}  // namespace

#define SWIFTKV_GPU_TEST(fn) \
  CMUnitTest { #fn, gpu_case < fn>, nullptr, nullptr, nullptr }

#define CHECK(cond)                                                                     \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      std::fprintf(stderr, "%s:%d: check failed: %s (%s)\n", __FILE__, __LINE__, #cond, \
                   swiftkv_last_error_message());                                       \
      ++g_failures;                                                                     \
      return;                                                                           \
    }                                                                                   \
  } while (0)
#define CHECK_OK(call) CHECK((call) == SWIFTKV_OK)
#define CHECK_CUDA(call) CHECK((call) == cudaSuccess)

#endif /* SWIFTKV_GPU_CHECK_H */
