// Models the planner knows by name: SwiftCache Table 2's geometries with their fp16 weight
// sizes, plus any the user defines on the command line.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <swiftkv/swiftkv.h>

namespace swiftkv::bench {

struct ModelSpec {
  std::string name;
  uint32_t num_layers;
  uint32_t num_kv_heads;
  uint32_t head_dim;
  swiftkv_dtype dtype;
  uint64_t weight_bytes;      // parameters * bytes per parameter
  uint32_t num_q_heads = 0;   // query heads (GQA); 0: as many as KV heads
  double params = 0;          // parameter count; 0: weight_bytes / 2
  uint32_t hidden = 0;        // hidden size; 0: unknown (no activation estimate)
  uint32_t intermediate = 0;  // MLP intermediate size; 0: unknown
};

// Bytes of KV one token takes in all layers: 2 * L * H_kv * D * dtype bytes.
uint64_t bytes_per_token(const ModelSpec &m);

// The KV memory a model has on a GPU of gpu_gib GiB: HBM * utilization - activation reserve -
// weights, or 0 when the model does not fit.
uint64_t kv_bytes_on_gpu(const ModelSpec &m, double gpu_gib, double utilization,
                         double activation_gib);

const std::vector<ModelSpec> &model_presets();

// A preset by name, case-insensitive; nullopt when unknown.
std::optional<ModelSpec> find_preset(const std::string &name);

// The descriptor the library takes, with the planner's block size.
swiftkv_model_desc to_desc(const ModelSpec &m, uint32_t block_tokens);

}  // namespace swiftkv::bench
