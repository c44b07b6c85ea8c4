// Uses the installed C ABI from C++ through the CMake package: the MEU of Qwen3-14B borrowing
// from Qwen3-8B is 9 borrower blocks for 10 lender blocks.
#include <cstdio>

#include <swiftkv/swiftkv.h>

static swiftkv_model_desc qwen3(uint32_t layers) {
  swiftkv_model_desc m = SWIFTKV_MODEL_DESC_INIT;
  m.num_layers = layers;
  m.num_kv_heads = 8;
  m.head_dim = 128;
  return m;
}

int main() {
  const swiftkv_model_desc borrower = qwen3(40), lender = qwen3(36);
  uint64_t b = 0, l = 0;
  if (swiftkv_geometry_meu(&borrower, &lender, &b, &l) != SWIFTKV_OK) {
    std::fprintf(stderr, "meu failed: %s\n", swiftkv_last_error_message());
    return 1;
  }
  std::printf("libswiftkv %s: MEU %llu borrower / %llu lender blocks\n", swiftkv_version_string(),
              static_cast<unsigned long long>(b), static_cast<unsigned long long>(l));
  return b == 9 && l == 10 ? 0 : 1;
}
