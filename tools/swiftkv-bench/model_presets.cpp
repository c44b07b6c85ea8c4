// Table 2 of SwiftCache (layers, KV heads, head dim) with fp16 weights from each model's
// published parameter count: LWM-1M-Text is Llama-2-7B-sized (6.74 B), Qwen3-8B 8.19 B,
// Qwen3-14B 14.77 B, Qwen3-32B 32.76 B.
#include "model_presets.hpp"

#include <algorithm>
#include <cctype>

namespace swiftkv::bench {

namespace {

constexpr uint64_t fp16_weights(double billions) {
  return static_cast<uint64_t>(billions * 1e9) * 2;
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

}  // namespace

const std::vector<ModelSpec> &model_presets() {
  static const std::vector<ModelSpec> presets = {
      // Hidden and MLP sizes from the models' configs (LWM-1M-Text is Llama-2-7B's shape).
      {"lwm-1m-text", 32, 32, 128, SWIFTKV_DTYPE_F16, fp16_weights(6.74), 32, 6.74e9, 4096, 11008},
      {"qwen3-8b", 36, 8, 128, SWIFTKV_DTYPE_F16, fp16_weights(8.19), 32, 8.19e9, 4096, 12288},
      {"qwen3-14b", 40, 8, 128, SWIFTKV_DTYPE_F16, fp16_weights(14.77), 40, 14.77e9, 5120, 17408},
      {"qwen3-32b", 64, 8, 128, SWIFTKV_DTYPE_F16, fp16_weights(32.76), 64, 32.76e9, 5120, 25600},
  };
  return presets;
}

std::optional<ModelSpec> find_preset(const std::string &name) {
  const std::string n = lower(name);
  for (const ModelSpec &m : model_presets()) {
    if (m.name == n) return m;
  }
  return std::nullopt;
}

uint64_t bytes_per_token(const ModelSpec &m) {
  return 2 * uint64_t{m.num_layers} * m.num_kv_heads * m.head_dim * swiftkv_dtype_size(m.dtype);
}

uint64_t kv_bytes_on_gpu(const ModelSpec &m, double gpu_gib, double utilization,
                         double activation_gib) {
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  const double usable = gpu_gib * kGiB * utilization - activation_gib * kGiB;
  const double kv = usable - static_cast<double>(m.weight_bytes);
  return kv > 0 ? static_cast<uint64_t>(kv) : 0;
}

swiftkv_model_desc to_desc(const ModelSpec &m, uint32_t block_tokens) {
  swiftkv_model_desc d = SWIFTKV_MODEL_DESC_INIT;
  d.name = m.name.c_str();
  d.num_layers = m.num_layers;
  d.num_kv_heads = m.num_kv_heads;
  d.head_dim = m.head_dim;
  d.block_tokens = block_tokens;
  d.chunk_tokens = block_tokens;  // chunks play no part in capacity planning
  d.dtype = m.dtype;
  return d;
}

}  // namespace swiftkv::bench
