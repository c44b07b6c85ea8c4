/* The check macros of the GPU tests (and the multi-process ones that run without cmocka): a
 * failed check prints where and the library's last message, counts, and returns from the
 * current test function; main() turns g_failures into the exit status. */
#ifndef SWIFTKV_GPU_CHECK_H
#define SWIFTKV_GPU_CHECK_H

#include <cstdio>

#include "swiftkv/swiftkv.h"

namespace {

int g_failures = 0;

}  // namespace

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
