// What the attention kernels share: element conversions and the log-sum-exp merge of KV pieces
// (the plan's merge items over fp32 partial rows written by the fa2 kernel).
// Validation, device guards and dtype dispatch live in the caller (core/attention).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/attention_work.h"

namespace swiftkv::kernels {

template <class T>
__device__ __forceinline__ float to_float(T v);
template <>
__device__ __forceinline__ float to_float<half>(half v) {
  return __half2float(v);
}
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

template <class T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ half from_float<half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// p.merge[blockIdx.x]: one warp per packed row, combining the pieces by their lse.
template <class T, int HEAD_DIM>
__global__ void __launch_bounds__(128) merge_pieces_kernel(AttentionParams p) {
  const AttentionMergeItem g = p.merge[blockIdx.x];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int rows = g.q_len * p.group;
  T *out = static_cast<T *>(p.out);
  for (int row = warp; row < rows; row += 4) {
    float m = -INFINITY;
    for (int k = 0; k < g.pieces; ++k) m = fmaxf(m, p.partial_lse[g.partial_base + k * rows + row]);
    float acc[HEAD_DIM / 32];
#pragma unroll
    for (int e = 0; e < HEAD_DIM / 32; ++e) acc[e] = 0.0f;
    float l = 0.0f;
    if (m != -INFINITY) {
      for (int k = 0; k < g.pieces; ++k) {
        const int64_t pr = int64_t(g.partial_base) + int64_t(k) * rows + row;
        const float wgt = expf(p.partial_lse[pr] - m);
        l += wgt;
#pragma unroll
        for (int e = 0; e < HEAD_DIM / 32; ++e) {
          acc[e] += wgt * p.partial_o[pr * HEAD_DIM + lane + 32 * e];
        }
      }
    }
    const int64_t t = g.q_begin + row / p.group;
    const int64_t head = int64_t(g.kv_head) * p.group + row % p.group;
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
    for (int e = 0; e < HEAD_DIM / 32; ++e) {
      out[t * p.out_token_stride + head * p.out_head_stride + lane + 32 * e] =
          from_float<T>(acc[e] * inv);
    }
    if (lane == 0 && p.lse != nullptr) {
      p.lse[t * p.num_qo_heads + head] = l > 0.0f ? m + logf(l) : -INFINITY;
    }
  }
}

}  // namespace swiftkv::kernels
