// Multi-token paged attention kernels: one thread block per work item of the host plan (a tile
// of packed query rows of one KV head over one KV piece), tensor cores through WMMA for
// S = Q.K^T and O += P.V with an online softmax in fp32, then a log-sum-exp merge of pieces.
// Validation, device guards and dtype dispatch live in the caller (core/attention).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

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

// Keys per step of paged_attention_kernel: 64, 32 for the widest heads so the block's shared
// memory stays near 150 KB. The launcher (and the CPU emulation's) instantiate with this.
template <int HEAD_DIM>
constexpr int wmma_kv_tile() {
  return HEAD_DIM == 256 ? 32 : 64;
}

// Shared-memory geometry of one block. Leading dimensions are padded against bank conflicts
// and keep every 16x16 fragment 32-byte aligned, as WMMA loads require.
template <int HEAD_DIM, int TILE, int KV_TILE>
struct AttentionSmem {
  static constexpr int kLdT = HEAD_DIM + 8;  // q, k, v rows (elements of T)
  static constexpr int kLdS = KV_TILE + 4;   // scores (float)
  static constexpr int kLdP = KV_TILE + 8;   // probabilities (T)
  static constexpr int kLdO = HEAD_DIM + 4;  // output accumulator (float)
  static constexpr size_t kQ = 0;
  static constexpr size_t kK = kQ + size_t(TILE) * kLdT * 2;
  static constexpr size_t kV = kK + size_t(KV_TILE) * kLdT * 2;
  static constexpr size_t kS = kV + size_t(KV_TILE) * kLdT * 2;
  static constexpr size_t kP = kS + size_t(TILE) * kLdS * 4;
  static constexpr size_t kO = kP + size_t(TILE) * kLdP * 2;
  static constexpr size_t kRow = kO + size_t(TILE) * kLdO * 4;  // m, l, rescale per row
  static constexpr size_t kBytes = kRow + size_t(3) * TILE * 4;
};

// Copies 8 consecutive elements (16 bytes when `vec`, else one by one) or zeros.
template <class T>
__device__ __forceinline__ void copy8(T *dst, const T *src, bool valid, bool vec) {
  if (!valid) {
    *reinterpret_cast<uint4 *>(dst) = make_uint4(0, 0, 0, 0);
  } else if (vec) {
    *reinterpret_cast<uint4 *>(dst) = __ldg(reinterpret_cast<const uint4 *>(src));
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) dst[e] = src[e];
  }
}

// One block's view of its work item and shared memory, for the stages below. Threads: TILE / 16
// warps; warp w owns packed rows [16w, 16w + 16) of the tile.
template <class T, int HEAD_DIM, int TILE, int KV_TILE>
struct AttentionBlock {
  using S = AttentionSmem<HEAD_DIM, TILE, KV_TILE>;
  static constexpr int kThreads = TILE * 2;
  static constexpr int kChunks = HEAD_DIM / 8;  // 8-element pieces per row
  T *sQ, *sK, *sV, *sP;
  float *sS, *sO, *sM, *sL, *sR;
  AttentionWorkItem w;
  int tid, warp, lane, group, row_end;
  bool vector;

  __device__ __forceinline__ AttentionBlock(unsigned char *smem, const AttentionParams &p,
                                            int vec) {
    sQ = reinterpret_cast<T *>(smem + S::kQ);
    sK = reinterpret_cast<T *>(smem + S::kK);
    sV = reinterpret_cast<T *>(smem + S::kV);
    sS = reinterpret_cast<float *>(smem + S::kS);
    sP = reinterpret_cast<T *>(smem + S::kP);
    sO = reinterpret_cast<float *>(smem + S::kO);
    sM = reinterpret_cast<float *>(smem + S::kRow);
    sL = sM + TILE;
    sR = sL + TILE;
    w = p.work[blockIdx.x];
    tid = threadIdx.x;
    warp = tid / 32;
    lane = tid % 32;
    group = p.group;
    row_end = min(w.q_len * group, w.row_begin + TILE);
    vector = vec != 0;
  }
};

// Queries of the tile's rows (zeros past the end); softmax state and output cleared.
template <class T, int HEAD_DIM, int TILE, int KV_TILE>
__device__ __forceinline__ void load_queries(const AttentionParams &p,
                                             const AttentionBlock<T, HEAD_DIM, TILE, KV_TILE> &b) {
  using B = AttentionBlock<T, HEAD_DIM, TILE, KV_TILE>;
  const T *q = static_cast<const T *>(p.q);
  for (int idx = b.tid; idx < TILE * B::kChunks; idx += B::kThreads) {
    const int r = idx / B::kChunks, c = (idx % B::kChunks) * 8;
    const int row = b.w.row_begin + r;
    const bool valid = row < b.row_end;
    const T *src = q;
    if (valid) {
      const int64_t i = row / b.group, head = int64_t(b.w.kv_head) * b.group + row % b.group;
      src = q + (b.w.q_begin + i) * p.q_token_stride + head * p.q_head_stride + c;
    }
    copy8(b.sQ + r * B::S::kLdT + c, src, valid, b.vector);
  }
  for (int r = b.tid; r < TILE; r += B::kThreads) {
    b.sM[r] = -INFINITY;
    b.sL[r] = 0.0f;
  }
  for (int idx = b.tid; idx < TILE * HEAD_DIM; idx += B::kThreads) {
    b.sO[(idx / HEAD_DIM) * B::S::kLdO + idx % HEAD_DIM] = 0.0f;
  }
}

// Keys and values [kt0, kt0 + KV_TILE) through the page table; zeros past kv_stop and for a
// page index outside the pages (never read).
template <class T, int HEAD_DIM, int TILE, int KV_TILE>
__device__ __forceinline__ void load_kv_tile(const AttentionParams &p,
                                             const AttentionBlock<T, HEAD_DIM, TILE, KV_TILE> &b,
                                             int kt0, int kv_stop) {
  using B = AttentionBlock<T, HEAD_DIM, TILE, KV_TILE>;
  const T *k = static_cast<const T *>(p.k);
  const T *v = static_cast<const T *>(p.v);
  for (int idx = b.tid; idx < KV_TILE * B::kChunks; idx += B::kThreads) {
    const int r = idx / B::kChunks, c = (idx % B::kChunks) * 8;
    const int j = kt0 + r;
    bool valid = j < kv_stop;
    int64_t off = 0;
    if (valid) {
      const int32_t page = p.kv_indices[b.w.page_begin + j / p.page_tokens];
      valid = page >= 0 && page < p.num_pages;
      off = int64_t(page) * p.page_stride + int64_t(j % p.page_tokens) * p.token_stride +
            int64_t(b.w.kv_head) * p.head_stride + c;
    }
    copy8(b.sK + r * B::S::kLdT + c, k + off, valid, b.vector);
    copy8(b.sV + r * B::S::kLdT + c, v + off, valid, b.vector);
  }
}

// S = Q . K^T for this warp's 16 rows.
template <class T, int HEAD_DIM, int TILE, int KV_TILE>
__device__ __forceinline__ void warp_scores(const AttentionBlock<T, HEAD_DIM, TILE, KV_TILE> &b) {
  namespace wmma = nvcuda::wmma;
  using S = typename AttentionBlock<T, HEAD_DIM, TILE, KV_TILE>::S;
  for (int n = 0; n < KV_TILE / 16; ++n) {
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.0f);
#pragma unroll
    for (int kk = 0; kk < HEAD_DIM / 16; ++kk) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> m;
      wmma::load_matrix_sync(a, b.sQ + b.warp * 16 * S::kLdT + kk * 16, S::kLdT);
      wmma::load_matrix_sync(m, b.sK + n * 16 * S::kLdT + kk * 16, S::kLdT);
      wmma::mma_sync(acc, a, m, acc);
    }
    wmma::store_matrix_sync(b.sS + b.warp * 16 * S::kLdS + n * 16, acc, S::kLdS,
                            wmma::mem_row_major);
  }
}

// The online softmax over this tile of scores, one row at a time across the warp: P, the new
// running max and sum, and each row's rescale of what O holds.
template <class T, int HEAD_DIM, int TILE, int KV_TILE>
__device__ __forceinline__ void warp_softmax(const AttentionParams &p,
                                             const AttentionBlock<T, HEAD_DIM, TILE, KV_TILE> &b,
                                             int kt0, int kv_stop) {
  using S = typename AttentionBlock<T, HEAD_DIM, TILE, KV_TILE>::S;
  const float log2e = 1.4426950408889634f;
  for (int rr = 0; rr < 16; ++rr) {
    const int r = b.warp * 16 + rr;
    const int row = b.w.row_begin + r;
    const int limit = row >= b.row_end ? 0
                      : p.causal       ? min(kv_stop, b.w.kv_len - b.w.q_len + row / b.group + 1)
                                       : kv_stop;
    float s[KV_TILE / 32];
    float mx = -INFINITY;
#pragma unroll
    for (int e = 0; e < KV_TILE / 32; ++e) {
      const int c = b.lane + 32 * e;
      float x = b.sS[r * S::kLdS + c] * p.sm_scale;
      if (p.soft_cap > 0.0f) x = p.soft_cap * tanhf(x / p.soft_cap);
      if (kt0 + c >= limit) x = -INFINITY;
      s[e] = x;
      mx = fmaxf(mx, x);
    }
#pragma unroll
    for (int o = 16; o > 0; o /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    const float m_old = b.sM[r];
    const float m_new = fmaxf(m_old, mx);
    float sum = 0.0f;
#pragma unroll
    for (int e = 0; e < KV_TILE / 32; ++e) {
      const float pe = m_new == -INFINITY ? 0.0f : exp2f((s[e] - m_new) * log2e);
      sum += pe;
      b.sP[r * S::kLdP + b.lane + 32 * e] = from_float<T>(pe);
    }
#pragma unroll
    for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (b.lane == 0) {
      const float rescale = m_new == -INFINITY ? 1.0f : exp2f((m_old - m_new) * log2e);
      b.sL[r] = b.sL[r] * rescale + sum;
      b.sM[r] = m_new;
      b.sR[r] = rescale;
    }
  }
}

// O = O * rescale + P . V for this warp's rows.
template <class T, int HEAD_DIM, int TILE, int KV_TILE>
__device__ __forceinline__ void warp_accumulate(
    const AttentionBlock<T, HEAD_DIM, TILE, KV_TILE> &b) {
  namespace wmma = nvcuda::wmma;
  using S = typename AttentionBlock<T, HEAD_DIM, TILE, KV_TILE>::S;
  for (int idx = b.lane; idx < 16 * HEAD_DIM; idx += 32) {
    const int r = b.warp * 16 + idx / HEAD_DIM;
    b.sO[r * S::kLdO + idx % HEAD_DIM] *= b.sR[r];
  }
  __syncwarp();
  for (int n = 0; n < HEAD_DIM / 16; ++n) {
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    float *o = b.sO + b.warp * 16 * S::kLdO + n * 16;
    wmma::load_matrix_sync(acc, o, S::kLdO, wmma::mem_row_major);
#pragma unroll
    for (int kk = 0; kk < KV_TILE / 16; ++kk) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> m;
      wmma::load_matrix_sync(a, b.sP + b.warp * 16 * S::kLdP + kk * 16, S::kLdP);
      wmma::load_matrix_sync(m, b.sV + kk * 16 * S::kLdT + n * 16, S::kLdT);
      wmma::mma_sync(acc, a, m, acc);
    }
    wmma::store_matrix_sync(o, acc, S::kLdO, wmma::mem_row_major);
  }
}

// Each warp writes its rows: normalised output and lse, or the piece's partial rows.
template <class T, int HEAD_DIM, int TILE, int KV_TILE>
__device__ __forceinline__ void warp_write_rows(
    const AttentionParams &p, const AttentionBlock<T, HEAD_DIM, TILE, KV_TILE> &b) {
  using S = typename AttentionBlock<T, HEAD_DIM, TILE, KV_TILE>::S;
  T *out = static_cast<T *>(p.out);
  for (int rr = 0; rr < 16; ++rr) {
    const int r = b.warp * 16 + rr;
    const int row = b.w.row_begin + r;
    if (row >= b.row_end) break;
    const float l = b.sL[r];
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    const float lse = l > 0.0f ? b.sM[r] + logf(l) : -INFINITY;
    const int64_t i = row / b.group, head = int64_t(b.w.kv_head) * b.group + row % b.group;
    if (b.w.partial >= 0) {
      const int64_t pr = int64_t(b.w.partial) + row;
      for (int d = b.lane; d < HEAD_DIM; d += 32) {
        p.partial_o[pr * HEAD_DIM + d] = b.sO[r * S::kLdO + d] * inv;
      }
      if (b.lane == 0) p.partial_lse[pr] = lse;
    } else {
      const int64_t t = b.w.q_begin + i;
      for (int d = b.lane; d < HEAD_DIM; d += 32) {
        out[t * p.out_token_stride + head * p.out_head_stride + d] =
            from_float<T>(b.sO[r * S::kLdO + d] * inv);
      }
      if (b.lane == 0 && p.lse != nullptr) p.lse[t * p.num_qo_heads + head] = lse;
    }
  }
}

// p.work[blockIdx.x]: a tile of packed query rows of one KV head over one KV piece.
// q    [q_tokens, num_qo_heads, HEAD_DIM] through q strides
// k, v [pages, page_tokens, kv_heads, HEAD_DIM] through page/token/head strides
// out  [q_tokens, num_qo_heads, HEAD_DIM] through out strides, or the partial rows (fp32)
template <class T, int HEAD_DIM, int TILE, int KV_TILE>
__global__ void __launch_bounds__(TILE * 2) paged_attention_kernel(AttentionParams p, int vec) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  extern __shared__ __align__(128) unsigned char smem[];
  const AttentionBlock<T, HEAD_DIM, TILE, KV_TILE> b(smem, p, vec);
  load_queries(p, b);
  // Rows are initialised by threads of other warps than their owners; a work item with no key
  // to load reaches the output without the loop's barrier.
  __syncthreads();

  // Keys past the last one the tile's last query sees are never loaded.
  int kv_stop = b.w.kv_end;
  if (p.causal && b.row_end > b.w.row_begin) {
    const int last_i = (b.row_end - 1) / b.group;
    kv_stop = min(kv_stop, max(0, b.w.kv_len - b.w.q_len + last_i + 1));
  }
  for (int kt0 = b.w.kv_begin; kt0 < kv_stop; kt0 += KV_TILE) {
    __syncthreads();  // every warp is done with the previous K/V tile
    load_kv_tile(p, b, kt0, kv_stop);
    __syncthreads();
    warp_scores(b);
    __syncwarp();
    warp_softmax(p, b, kt0, kv_stop);
    __syncwarp();
    warp_accumulate(b);
    __syncwarp();
  }
  __syncwarp();
  warp_write_rows(p, b);
#else
  __trap();  // the launcher refuses devices below compute capability 8.0
#endif
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
