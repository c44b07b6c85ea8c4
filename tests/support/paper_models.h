/* SwiftCache Table 2's models (float16): the one list of their KV geometries that the tests and
 * the benchmarks use. The planner's presets (tools/swiftkv-bench/model_presets.cpp) add weight
 * sizes and query heads; test_replay checks that they agree with this list. C and C++. */
#ifndef SWIFTKV_PAPER_MODELS_H
#define SWIFTKV_PAPER_MODELS_H

#include <stdint.h>

#include "swiftkv/swiftkv.h"

typedef struct swiftkv_paper_model {
  const char *name;
  uint32_t num_layers;
  uint32_t num_kv_heads;
  uint32_t head_dim;
} swiftkv_paper_model;

enum {
  SWIFTKV_PAPER_LWM_1M_TEXT,
  SWIFTKV_PAPER_QWEN3_8B,
  SWIFTKV_PAPER_QWEN3_14B,
  SWIFTKV_PAPER_QWEN3_32B,
  SWIFTKV_PAPER_MODEL_COUNT
};

static const swiftkv_paper_model swiftkv_paper_models[SWIFTKV_PAPER_MODEL_COUNT] = {
    {"LWM-1M-Text", 32, 32, 128},
    {"Qwen3-8B", 36, 8, 128},
    {"Qwen3-14B", 40, 8, 128},
    {"Qwen3-32B", 64, 8, 128},
};

/* The model's descriptor with the given block and chunk sizes, float16. */
static inline swiftkv_model_desc swiftkv_paper_desc(int which, uint32_t block_tokens,
                                                    uint32_t chunk_tokens) {
  swiftkv_model_desc d = SWIFTKV_MODEL_DESC_INIT;
  d.name = swiftkv_paper_models[which].name;
  d.num_layers = swiftkv_paper_models[which].num_layers;
  d.num_kv_heads = swiftkv_paper_models[which].num_kv_heads;
  d.head_dim = swiftkv_paper_models[which].head_dim;
  d.block_tokens = block_tokens;
  d.chunk_tokens = chunk_tokens;
  d.dtype = SWIFTKV_DTYPE_F16;
  return d;
}

#endif /* SWIFTKV_PAPER_MODELS_H */
