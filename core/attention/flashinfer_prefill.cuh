// FlashInfer's batch prefill over paged KV, as the library runs it: one instantiation per dtype
// and head dim (flashinfer_instance.cu.in), causal, no soft cap, KV through paged_kv_t with the
// caller's strides, the schedule the library made (flashinfer_map.hpp) read from the workspace.
// Decode runs through the same kernel with one query row a request. Compiled only with
// FlashInfer's headers (cmake/FlashInfer.cmake).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <exception>
#include <flashinfer/attention/default_prefill_params.cuh>
#include <flashinfer/attention/prefill.cuh>
#include <flashinfer/attention/variants.cuh>
#include <string>

#include "core/attention/cuda_attention.hpp"

namespace swiftkv {

// The launch of one planned run; returns the CUDA status, with FlashInfer's own error message
// (it throws) in *error.
template <class T, uint32_t HEAD_DIM>
cudaError_t flashinfer_prefill(const FlashInferLaunch &l, uint32_t num_qo_heads,
                               uint32_t num_kv_heads, uint32_t page_tokens, float sm_scale,
                               cudaStream_t stream, std::string *error) {
  using Params = flashinfer::BatchPrefillPagedParams<T, T, T, int32_t>;
  using Variant = flashinfer::DefaultAttention</*custom_mask=*/false, /*sliding_window=*/false,
                                               /*logits_soft_cap=*/false, /*alibi=*/false>;
  const int64_t strides[3] = {l.page_stride, l.token_stride, l.head_stride};
  Params p;
  p.q = static_cast<T *>(const_cast<void *>(l.q));
  p.paged_kv = flashinfer::paged_kv_t<T, int32_t>(
      num_kv_heads, page_tokens, HEAD_DIM, l.n_requests, flashinfer::QKVLayout::kNHD,
      static_cast<T *>(const_cast<void *>(l.k)), static_cast<T *>(const_cast<void *>(l.v)), strides,
      strides, l.kv_indices, l.kv_indptr, l.last_page_len);
  p.q_indptr = l.qo_indptr;
  p.o = static_cast<T *>(l.out);
  p.lse = l.lse;
  p.group_size = flashinfer::uint_fastdiv(num_qo_heads / num_kv_heads);
  p.num_qo_heads = num_qo_heads;
  p.q_stride_n = l.q_token_stride;
  p.q_stride_h = l.q_head_stride;
  p.window_left = -1;
  p.logits_soft_cap = 0.0f;
  p.sm_scale = sm_scale;
  p.rope_rcp_scale = 1.0f;
  p.rope_rcp_theta = 1.0f;
  p.request_indices = l.request_indices;
  p.qo_tile_indices = l.qo_tile_indices;
  p.kv_tile_indices = l.kv_tile_indices;
  p.merge_indptr = l.merge_indptr;
  p.o_indptr = l.o_indptr;
  p.block_valid_mask = nullptr;
  p.kv_chunk_size_ptr = l.kv_chunk_size;
  p.max_total_num_rows = l.q_tokens;
  p.total_num_rows = nullptr;
  p.padded_batch_size = l.ctas;
  p.partition_kv = false;
  cudaError_t status = cudaSuccess;
  try {
    DISPATCH_CTA_TILE_Q(l.cta_tile_q, CTA_TILE_Q, {
      status = flashinfer::BatchPrefillWithPagedKVCacheDispatched<
          /*SAME_KV_STRIDES=*/true, CTA_TILE_Q, HEAD_DIM, HEAD_DIM,
          flashinfer::PosEncodingMode::kNone, /*USE_FP16_QK_REDUCTION=*/false,
          flashinfer::MaskMode::kCausal, Variant, Params>(p, static_cast<T *>(l.tmp_v), l.tmp_s,
                                                          /*enable_pdl=*/false, stream);
    });
  } catch (const std::exception &e) {
    *error = e.what();
    return cudaErrorUnknown;
  }
  return status;
}

}  // namespace swiftkv
