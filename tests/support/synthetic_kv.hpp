// KV shaped like real keys and values, for the codec tests and bench_codec: per-channel offsets
// and scales (every 37th key channel an outlier), smooth change along the tokens, and noise.
// Synthetic: a ratio measured on it is not a ratio on a model's KV.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/codec/chunk_codec.hpp"

inline std::vector<std::byte> synthetic_kv(const swiftkv::codec::ChunkShape &s, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> noise(0.0f, 1.0f);
  std::vector<std::byte> out(s.bytes());
  uint64_t i = 0;
  const uint64_t row = uint64_t{s.heads} * s.dim;
  for (uint32_t l = 0; l < s.layers; ++l) {
    for (uint32_t kv = 0; kv < 2; ++kv) {
      std::vector<float> offset(row), scale(row);
      for (uint64_t c = 0; c < row; ++c) {
        offset[c] = noise(rng) * (kv == 0 ? 2.0f : 0.2f);
        scale[c] = (kv == 0 && c % 37 == 0) ? 8.0f : 0.5f + std::fabs(noise(rng)) * 0.5f;
      }
      for (uint32_t t = 0; t < s.tokens; ++t) {
        for (uint64_t c = 0; c < row; ++c, ++i) {
          const float wave = std::sin(0.05f * static_cast<float>(t) + static_cast<float>(c));
          const float x = offset[c] + scale[c] * (0.6f * wave + 0.4f * noise(rng));
          const uint16_t v = swiftkv::codec::float_to_element(x, s.dtype);
          std::memcpy(&out[i * 2], &v, 2);
        }
      }
    }
  }
  return out;
}
