// Multi-token paged attention in the FlashAttention-2 style over the library's own plan: its work
// items, fp32 partial rows and merge (kernels/attention_merge.cuh), with S, P and O in registers.
// It runs what FlashInfer's kernel does not take (docs/attention.md says which runs those are).
//
// A block has 4 warps (128 threads) and one work item: a tile of TILE packed query rows of one KV
// head over one KV piece. With TILE = 64 (prefill) each warp owns 16 rows and every key; with
// TILE = 16 (decode) the four warps own the same 16 rows and a quarter of each KV tile's keys
// each, and merge their softmax states at the end (split-KV inside the block).
//  - Q is loaded once into shared memory, and for head dims up to 128 into registers as mma
//    A fragments (ldmatrix), where it stays for the whole item.
//  - K and V tiles of KV_TILE keys go through a two-stage cp.async pipeline: tile t+1 is in
//    flight while tile t is computed. Each 16-byte piece is read through the page table by the
//    thread that loads it (the threads of one key row read the same page id: one L1 broadcast).
//  - S = Q.K^T with mma.sync m16n8k16 (K fragments by ldmatrix), the online softmax on the
//    accumulators (row max and sum across a quad by shuffles), P rounded to the element type and
//    reused as A fragments in registers, O += P.V with V fragments by ldmatrix.trans.
// Rows and keys are masked, scaled, capped and merged as the CPU twin does them. The launcher
// (core/attention/cuda_attention.cu) runs this kernel only for 16-byte aligned tensors;
// SWIFTKV_ATTENTION_KERNEL=fa2 selects it for every run.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/attention_merge.cuh"
#include "kernels/attention_work.h"

namespace swiftkv::kernels::fa2 {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;

// Keys per step: prefill tiles take 64, 32 for the widest heads (their O takes 128
// registers); decode tiles take 64 keys, 16 per warp. The launcher instantiates with this.
template <int D, int TILE>
constexpr int kv_tile() {
  return TILE == 64 && D == 256 ? 32 : 64;
}

template <int D, int TILE, int KV_TILE>
struct Config {
  static constexpr int kRowWarps = TILE / 16;                      // warps side by side over rows
  static constexpr int kKvWarps = kWarps / kRowWarps;              // warps side by side over keys
  static constexpr int kKeysPerWarp = KV_TILE / kKvWarps;          // of each KV tile
  static constexpr int kLd = D + 8;                                // shared rows, in elements
  static constexpr bool kQInRegisters = D <= 128;                  // else ldmatrix at every use
  static constexpr size_t kQBytes = size_t(TILE) * kLd * 2;        // the Q tile
  static constexpr size_t kTileBytes = size_t(KV_TILE) * kLd * 2;  // one K or V tile
  static constexpr size_t kBytes = kQBytes + 4 * kTileBytes;       // Q, then K0 V0 K1 V1
  // The split-KV merge reuses the K/V stages: per warp its O accumulators, m and l, by lane.
  static constexpr size_t kMergeBytes = size_t(kWarps) * (D / 8 * 4 + 4) * 32 * 4;
  static_assert(TILE == 16 || TILE == 64, "the plan's tiles");
  static_assert(kRowWarps * kKvWarps == kWarps, "every warp has rows and keys");
  static_assert(kKeysPerWarp % 16 == 0, "whole k16 steps of P.V per warp");
  static_assert(D % 16 == 0, "whole k16 steps of Q.K^T");
  static_assert(kKvWarps == 1 || kMergeBytes <= 4 * kTileBytes, "the merge fits the stages");
};

__device__ __forceinline__ uint32_t smem_addr(const void *p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// The inline PTX below has a CPU emulation (tests/emu/cuda_emu.hpp) through which a test runs
// this kernel's source without a device; SWIFTKV_CUDA_EMULATION selects it.
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
#if defined(SWIFTKV_CUDA_EMULATION)
  swiftkv_emu::ldmatrix_x4(r, addr, false);
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
#endif
}

__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], uint32_t addr) {
#if defined(SWIFTKV_CUDA_EMULATION)
  swiftkv_emu::ldmatrix_x4(r, addr, true);
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
#endif
}

// d += a . b for one m16n8k16 tile, fp32 accumulators.
template <class T>
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1);
template <>
__device__ __forceinline__ void mma<half>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
#if defined(SWIFTKV_CUDA_EMULATION)
  swiftkv_emu::mma_m16n8k16<half>(d, a, b0, b1);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}
template <>
__device__ __forceinline__ void mma<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4],
                                                   uint32_t b0, uint32_t b1) {
#if defined(SWIFTKV_CUDA_EMULATION)
  swiftkv_emu::mma_m16n8k16<__nv_bfloat16>(d, a, b0, b1);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// Two floats rounded to the element type, the first in the low half.
template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<half>(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t *>(&h);
}
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t *>(&h);
}

// 16 bytes from global to shared memory, or zeros when !valid (src-size 0: nothing is read).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, bool valid) {
#if defined(SWIFTKV_CUDA_EMULATION)
  swiftkv_emu::cp_async16(dst, src, valid ? 16 : 0);
#else
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0));
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(SWIFTKV_CUDA_EMULATION)
  swiftkv_emu::cp_async_commit();
#else
  asm volatile("cp.async.commit_group;\n");
#endif
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if defined(SWIFTKV_CUDA_EMULATION)
  swiftkv_emu::cp_async_wait(N);
#else
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

// Keys and values [kt0, kt0 + KV_TILE) into one stage, through the page table; zeros past
// kv_stop and for a page index outside the pages.
template <class T, int D, int KV_TILE>
__device__ __forceinline__ void issue_kv_tile(const AttentionParams &p, const AttentionWorkItem &w,
                                              T *sK, T *sV, int kt0, int kv_stop) {
  constexpr int kLd = D + 8, kChunks = D / 8;
  const T *k = static_cast<const T *>(p.k);
  const T *v = static_cast<const T *>(p.v);
  for (int idx = threadIdx.x; idx < KV_TILE * kChunks; idx += kThreads) {
    const int r = idx / kChunks, c = (idx % kChunks) * 8;
    const int j = kt0 + r;
    bool valid = j < kv_stop;
    int64_t off = 0;
    if (valid) {
      const int32_t page = p.kv_indices[w.page_begin + j / p.page_tokens];
      valid = page >= 0 && page < p.num_pages;
      off = int64_t(page) * p.page_stride + int64_t(j % p.page_tokens) * p.token_stride +
            int64_t(w.kv_head) * p.head_stride + c;
    }
    cp_async16(smem_addr(sK + r * kLd + c), valid ? k + off : k, valid);
    cp_async16(smem_addr(sV + r * kLd + c), valid ? v + off : v, valid);
  }
}

// The A fragment of rows [row0, row0 + 16) x columns [col0, col0 + 16) of a row-major shared
// tile with leading dimension ld (elements).
template <class T>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const T *tile, int ld, int row0, int col0,
                                       int lane) {
  const int row = row0 + (lane & 7) + ((lane >> 3) & 1) * 8;
  const int col = col0 + (lane >> 4) * 8;
  ldsm_x4(a, smem_addr(tile + row * ld + col));
}

// p.work[blockIdx.x], as paged_attention_kernel (same parameters, same outputs).
template <class T, int D, int TILE, int KV_TILE>
__global__ void __launch_bounds__(kThreads, 1) fa2_attention_kernel(AttentionParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using C = Config<D, TILE, KV_TILE>;
  constexpr int kLd = C::kLd, kNt = D / 8, kKt = D / 16, kSt = C::kKeysPerWarp / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  T *sQ = reinterpret_cast<T *>(smem);
  // Stage s: K at kQBytes + 2 s kTileBytes, V right after it.
  auto stage_k = [&](int st) {
    return reinterpret_cast<T *>(smem + C::kQBytes + 2 * st * C::kTileBytes);
  };
  auto stage_v = [&](int st) { return stage_k(st) + KV_TILE * kLd; };
  const AttentionWorkItem w = p.work[blockIdx.x];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane >> 2, tig = lane & 3;
  const int rw = warp % C::kRowWarps, kw = warp / C::kRowWarps;
  const int group = p.group;
  const int row_end = min(w.q_len * group, w.row_begin + TILE);

  // Keys past the last one the tile's last query sees are never loaded.
  int kv_stop = w.kv_end;
  if (p.causal && row_end > w.row_begin) {
    const int last_i = (row_end - 1) / group;
    kv_stop = min(kv_stop, max(0, w.kv_len - w.q_len + last_i + 1));
  }
  if (w.kv_begin < kv_stop) {
    issue_kv_tile<T, D, KV_TILE>(p, w, stage_k(0), stage_v(0), w.kv_begin, kv_stop);
  }
  cp_async_commit();

  // The query tile (zeros past the rows), then this warp's A fragments.
  {
    const T *q = static_cast<const T *>(p.q);
    for (int idx = threadIdx.x; idx < TILE * (D / 8); idx += kThreads) {
      const int r = idx / (D / 8), c = (idx % (D / 8)) * 8;
      const int row = w.row_begin + r;
      uint4 val = make_uint4(0, 0, 0, 0);
      if (row < row_end) {
        const int64_t i = row / group, head = int64_t(w.kv_head) * group + row % group;
        val = __ldg(reinterpret_cast<const uint4 *>(q + (w.q_begin + i) * p.q_token_stride +
                                                    head * p.q_head_stride + c));
      }
      *reinterpret_cast<uint4 *>(sQ + r * kLd + c) = val;
    }
  }
  __syncthreads();
  uint32_t qf[C::kQInRegisters ? kKt : 1][4];
  if constexpr (C::kQInRegisters) {
#pragma unroll
    for (int kk = 0; kk < kKt; ++kk) load_a(qf[kk], sQ, kLd, rw * 16, kk * 16, lane);
  }

  // This thread's two rows (g and g + 8 of the warp's 16) and the keys each may see.
  int limit[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = w.row_begin + rw * 16 + g + 8 * h;
    limit[h] = row >= row_end ? 0
               : p.causal     ? min(kv_stop, w.kv_len - w.q_len + row / group + 1)
                              : kv_stop;
  }
  float o[kNt][4];
#pragma unroll
  for (int n = 0; n < kNt; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const float log2e = 1.4426950408889634f;

  int stage = 0;
  for (int kt0 = w.kv_begin; kt0 < kv_stop; kt0 += KV_TILE, stage ^= 1) {
    // The next tile's loads go out before this one is computed.
    if (kt0 + KV_TILE < kv_stop) {
      issue_kv_tile<T, D, KV_TILE>(p, w, stage_k(stage ^ 1), stage_v(stage ^ 1), kt0 + KV_TILE,
                                   kv_stop);
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const T *k = stage_k(stage);
    const T *v = stage_v(stage);
    const int key0 = kw * C::kKeysPerWarp;  // this warp's keys in the tile

    // S = Q . K^T: rows g, g + 8 x keys key0 + 8 n + 2 tig, + 1.
    float s[kSt][4];
#pragma unroll
    for (int n = 0; n < kSt; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kKt; ++kk) {
      uint32_t a[4];
      if constexpr (C::kQInRegisters) {
#pragma unroll
        for (int e = 0; e < 4; ++e) a[e] = qf[kk][e];
      } else {
        load_a(a, sQ, kLd, rw * 16, kk * 16, lane);
      }
#pragma unroll
      for (int n2 = 0; n2 < kSt / 2; ++n2) {
        // Keys key0 + 16 n2 + [0, 16) x dims 16 kk + [0, 16): b0, b1 of key tiles 2 n2, 2 n2 + 1.
        uint32_t b[4];
        const int mtx = lane >> 3, r = lane & 7;
        const int key = key0 + 16 * n2 + r + (mtx >> 1) * 8;
        ldsm_x4(b, smem_addr(k + key * kLd + kk * 16 + (mtx & 1) * 8));
        mma<T>(s[2 * n2], a, b[0], b[1]);
        mma<T>(s[2 * n2 + 1], a, b[2], b[3]);
      }
    }

    // The online softmax: scale, cap, mask; the new max and sum of each row over its quad.
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < kSt; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e >> 1;
        const int key = kt0 + key0 + 8 * n + 2 * tig + (e & 1);
        float x = s[n][e] * p.sm_scale;
        if (p.soft_cap > 0.0f) x = p.soft_cap * tanhf(x / p.soft_cap);
        if (key >= limit[h]) x = -INFINITY;
        s[n][e] = x;
        mx[h] = fmaxf(mx[h], x);
      }
    }
    float rescale[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
      const float m_new = fmaxf(m[h], mx[h]);
      rescale[h] = m_new == -INFINITY ? 1.0f : exp2f((m[h] - m_new) * log2e);
      m[h] = m_new;
    }
#pragma unroll
    for (int n = 0; n < kSt; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e >> 1;
        const float pe = m[h] == -INFINITY ? 0.0f : exp2f((s[n][e] - m[h]) * log2e);
        s[n][e] = pe;
        sum[h] += pe;
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      sum[h] += __shfl_xor_sync(0xffffffffu, sum[h], 1);
      sum[h] += __shfl_xor_sync(0xffffffffu, sum[h], 2);
      l[h] = l[h] * rescale[h] + sum[h];
    }
#pragma unroll
    for (int n = 0; n < kNt; ++n) {
      o[n][0] *= rescale[0];
      o[n][1] *= rescale[0];
      o[n][2] *= rescale[1];
      o[n][3] *= rescale[1];
    }

    // O += P . V, P's accumulators reused as A fragments (16 keys a step).
#pragma unroll
    for (int kk = 0; kk < kSt / 2; ++kk) {
      const uint32_t a[4] = {pack2<T>(s[2 * kk][0], s[2 * kk][1]),
                             pack2<T>(s[2 * kk][2], s[2 * kk][3]),
                             pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                             pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int n2 = 0; n2 < kNt / 2; ++n2) {
        // Keys key0 + 16 kk + [0, 16) x dims 16 n2 + [0, 16), transposed: b0, b1 of dim tiles
        // 2 n2 and 2 n2 + 1.
        uint32_t b[4];
        const int mtx = lane >> 3, r = lane & 7;
        const int key = key0 + 16 * kk + r + (mtx & 1) * 8;
        ldsm_x4_trans(b, smem_addr(v + key * kLd + 16 * n2 + (mtx >> 1) * 8));
        mma<T>(o[2 * n2], a, b[0], b[1]);
        mma<T>(o[2 * n2 + 1], a, b[2], b[3]);
      }
    }
    __syncthreads();  // every warp is done with this stage before it is loaded again
  }
  cp_async_wait<0>();

  if constexpr (C::kKvWarps > 1) {
    // Split-KV inside the block: each warp's state by lane; warp 0 merges the four.
    __syncthreads();
    float *area = reinterpret_cast<float *>(smem + C::kQBytes);
    constexpr int kPerWarp = (kNt * 4 + 4) * 32;
    float *mine = area + warp * kPerWarp;
#pragma unroll
    for (int n = 0; n < kNt; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) mine[(n * 4 + e) * 32 + lane] = o[n][e];
    }
    mine[(kNt * 4 + 0) * 32 + lane] = m[0];
    mine[(kNt * 4 + 1) * 32 + lane] = m[1];
    mine[(kNt * 4 + 2) * 32 + lane] = l[0];
    mine[(kNt * 4 + 3) * 32 + lane] = l[1];
    __syncthreads();
    if (warp != 0) return;
    float wgt[kWarps][2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mm = -INFINITY;
#pragma unroll
      for (int x = 0; x < kWarps; ++x)
        mm = fmaxf(mm, area[x * kPerWarp + (kNt * 4 + h) * 32 + lane]);
      float ll = 0.0f;
#pragma unroll
      for (int x = 0; x < kWarps; ++x) {
        const float mx_ = area[x * kPerWarp + (kNt * 4 + h) * 32 + lane];
        wgt[x][h] = mx_ == -INFINITY ? 0.0f : exp2f((mx_ - mm) * log2e);
        ll += wgt[x][h] * area[x * kPerWarp + (kNt * 4 + 2 + h) * 32 + lane];
      }
      m[h] = mm;
      l[h] = ll;
    }
#pragma unroll
    for (int n = 0; n < kNt; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float acc = 0.0f;
#pragma unroll
        for (int x = 0; x < kWarps; ++x)
          acc += wgt[x][e >> 1] * area[x * kPerWarp + (n * 4 + e) * 32 + lane];
        o[n][e] = acc;
      }
    }
  }

  // The rows: normalised output and lse, or the piece's partial rows.
  T *out = static_cast<T *>(p.out);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = w.row_begin + rw * 16 + g + 8 * h;
    if (row >= row_end) continue;
    const float inv = l[h] > 0.0f ? 1.0f / l[h] : 0.0f;
    const float lse = l[h] > 0.0f ? m[h] + logf(l[h]) : -INFINITY;
    const int64_t i = row / group, head = int64_t(w.kv_head) * group + row % group;
    if (w.partial >= 0) {
      const int64_t pr = int64_t(w.partial) + row;
#pragma unroll
      for (int n = 0; n < kNt; ++n) {
        p.partial_o[pr * D + 8 * n + 2 * tig] = o[n][2 * h] * inv;
        p.partial_o[pr * D + 8 * n + 2 * tig + 1] = o[n][2 * h + 1] * inv;
      }
      if (tig == 0) p.partial_lse[pr] = lse;
    } else {
      const int64_t t = w.q_begin + i;
      T *dst = out + t * p.out_token_stride + head * p.out_head_stride;
#pragma unroll
      for (int n = 0; n < kNt; ++n) {
        dst[8 * n + 2 * tig] = from_float<T>(o[n][2 * h] * inv);
        dst[8 * n + 2 * tig + 1] = from_float<T>(o[n][2 * h + 1] * inv);
      }
      if (tig == 0 && p.lse != nullptr) p.lse[t * p.num_qo_heads + head] = lse;
    }
  }
#else
  __trap();  // the launcher refuses devices below compute capability 8.0
#endif
}

}  // namespace swiftkv::kernels::fa2
