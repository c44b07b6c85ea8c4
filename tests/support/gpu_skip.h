/* The GPU tests' way out when there is nothing to run on: exit status 77 (ctest: skipped), or,
 * with SWIFTKV_REQUIRE_GPU=1 in the environment, 1: a machine meant to have a GPU (the GPU
 * validation sets it) fails when the build has no CUDA, no device is usable, or the driver is
 * too old, instead of skipping silently. C and C++. */
#ifndef SWIFTKV_GPU_SKIP_H
#define SWIFTKV_GPU_SKIP_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static inline int swiftkv_test_no_gpu(const char *why) {
  const char *required = getenv("SWIFTKV_REQUIRE_GPU");
  if (required != NULL && strcmp(required, "1") == 0) {
    fprintf(stderr, "SWIFTKV_REQUIRE_GPU=1 but %s: failed\n", why);
    return 1;
  }
  printf("%s: skipped\n", why);
  return 77;
}

#if defined(SWIFTKV_TEST_HAVE_CUDA)
#include <cuda_runtime_api.h>

/* 0 when this process can use a CUDA device; otherwise swiftkv_test_no_gpu's status, with the
 * runtime's reason. */
static inline int swiftkv_test_need_device(void) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e == cudaSuccess && n > 0) return 0;
  char why[160];
  snprintf(why, sizeof why, "no usable CUDA device (cudaGetDeviceCount: %s, %d devices)",
           cudaGetErrorName(e), n);
  return swiftkv_test_no_gpu(why);
}
#endif

#endif /* SWIFTKV_GPU_SKIP_H */
