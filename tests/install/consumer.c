/* A C program built against an installed libswiftkv through pkg-config only: it must compile,
 * link, load the installed library and get the paper's worked example right. */
#include <stdio.h>

#include <swiftkv/swiftkv.h>

int main(void) {
  swiftkv_model_desc m = SWIFTKV_MODEL_DESC_INIT;
  m.num_layers = 10;
  m.num_kv_heads = 1;
  m.head_dim = 1; /* a 64-byte layer block, so K_master = 100 and K = 9 + 8 */
  const uint64_t lenders[] = {9 * 640, 8 * 640};
  swiftkv_capacity_plan p = SWIFTKV_CAPACITY_PLAN_INIT;
  swiftkv_status st = swiftkv_plan_borrower(&m, 100 * 64, lenders, 2, &p);
  if (st != SWIFTKV_OK) {
    fprintf(stderr, "plan failed: %s: %s\n", swiftkv_status_string(st),
            swiftkv_last_error_message());
    return 1;
  }
  printf("libswiftkv %s: %llu stream + %llu regular blocks\n", swiftkv_version_string(),
         (unsigned long long)p.stream_blocks, (unsigned long long)p.regular_blocks);
  return (p.stream_blocks == 17 && p.regular_blocks == 8 &&
          swiftkv_version() == SWIFTKV_VERSION_NUMBER)
             ? 0
             : 1;
}
