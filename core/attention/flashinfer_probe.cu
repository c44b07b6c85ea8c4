// The build's proof that FlashInfer's batch-prefill kernel compiles here, with this nvcc and the
// pinned headers (cmake/FlashInfer.cmake), for every architecture the library is built for:
// one instantiation (f16, head dim 128, causal, KV through paged_kv_t with explicit strides, as
// core/attention/flashinfer_map.hpp maps a run). Not linked into the library: the attention
// path's own instantiations replace it (docs/attention.md). Its compile time is the unit the
// build-time budget of those is measured in.
#include <cuda_fp16.h>

#include <cstdint>
#include <flashinfer/attention/default_prefill_params.cuh>
#include <flashinfer/attention/prefill.cuh>
#include <flashinfer/attention/scheduler.cuh>
#include <flashinfer/attention/variants.cuh>

namespace swiftkv::flashinfer_probe {

using Params = flashinfer::BatchPrefillPagedParams<half, half, half, int32_t>;
using Variant = flashinfer::DefaultAttention</*custom_mask=*/false, /*sliding_window=*/false,
                                             /*logits_soft_cap=*/false, /*alibi=*/false>;

// Enqueues one planned batch (plan as PrefillPlan wrote it into int_buffer).
cudaError_t batch_prefill(const flashinfer::PrefillPlanInfo &plan, Params params, void *int_buffer,
                          void *float_buffer, cudaStream_t stream) {
  params.request_indices =
      flashinfer::GetPtrFromBaseOffset<int32_t>(int_buffer, plan.request_indices_offset);
  params.qo_tile_indices =
      flashinfer::GetPtrFromBaseOffset<int32_t>(int_buffer, plan.qo_tile_indices_offset);
  params.kv_tile_indices =
      flashinfer::GetPtrFromBaseOffset<int32_t>(int_buffer, plan.kv_tile_indices_offset);
  params.o_indptr = flashinfer::GetPtrFromBaseOffset<int32_t>(int_buffer, plan.o_indptr_offset);
  params.kv_chunk_size_ptr =
      flashinfer::GetPtrFromBaseOffset<int32_t>(int_buffer, plan.kv_chunk_size_ptr_offset);
  half *tmp_v = nullptr;
  float *tmp_s = nullptr;
  if (plan.split_kv) {
    params.merge_indptr =
        flashinfer::GetPtrFromBaseOffset<int32_t>(int_buffer, plan.merge_indptr_offset);
    tmp_v = flashinfer::GetPtrFromBaseOffset<half>(float_buffer, plan.v_offset);
    tmp_s = flashinfer::GetPtrFromBaseOffset<float>(float_buffer, plan.s_offset);
  }
  params.padded_batch_size = plan.padded_batch_size;
  params.max_total_num_rows = plan.total_num_rows;
  params.partition_kv = false;
  cudaError_t status = cudaSuccess;
  DISPATCH_CTA_TILE_Q(plan.cta_tile_q, CTA_TILE_Q, {
    status = flashinfer::BatchPrefillWithPagedKVCacheDispatched<
        /*SAME_KV_STRIDES=*/true, CTA_TILE_Q, 128, 128, flashinfer::PosEncodingMode::kNone,
        /*USE_FP16_QK_REDUCTION=*/false, flashinfer::MaskMode::kCausal, Variant, Params>(
        params, tmp_v, tmp_s, /*enable_pdl=*/false, stream);
  });
  return status;
}

}  // namespace swiftkv::flashinfer_probe
