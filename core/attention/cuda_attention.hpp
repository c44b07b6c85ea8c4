// The CUDA half of paged attention as the rest of the library sees it. Two implementations provide
// it: cuda_attention.cu (CUDA builds) and cuda_attention_nocuda.cpp (SWIFTKV_ENODEV otherwise).
#pragma once

#include <cstdint>

#include "core/attention/attention_plan.hpp"
#include "kernels/attention_work.h"

namespace swiftkv {

// How many work items keep `device` busy (two blocks per multiprocessor). ENODEV for a device
// this process cannot use; EUNSUPPORTED below compute capability 8.0.
uint32_t attention_device_parallelism(int32_t device);

// Copies a serialised plan (host, `bytes`) into the device workspace on `stream`.
void attention_copy_plan(int32_t device, void *workspace, const void *plan, uint64_t bytes,
                         void *stream);

// Launches the fa2 kernel's work items, then the merges, on `stream`. The tensors are 16-byte
// aligned with strides of whole 16-byte pieces (the caller checked). No allocation, no
// synchronisation: capturable in a CUDA graph.
void attention_run_cuda(const AttentionShape &shape, const AttentionParams &p, void *stream);

// One run of FlashInfer's batch prefill, every pointer in the device's memory: the tensors, the
// batch's arrays and the schedule's (flashinfer_map.hpp), and the split partials.
struct FlashInferLaunch {
  const void *q = nullptr;
  const void *k = nullptr;
  const void *v = nullptr;
  void *out = nullptr;
  float *lse = nullptr;  // may be null
  int32_t q_token_stride = 0, q_head_stride = 0;
  uint32_t page_stride = 0, token_stride = 0, head_stride = 0;
  int32_t *kv_indices = nullptr;
  int32_t *qo_indptr = nullptr, *kv_indptr = nullptr, *last_page_len = nullptr;
  int32_t *request_indices = nullptr, *qo_tile_indices = nullptr, *kv_tile_indices = nullptr;
  int32_t *o_indptr = nullptr, *merge_indptr = nullptr, *kv_chunk_size = nullptr;
  void *tmp_v = nullptr;   // split only: partial outputs, in the dtype
  float *tmp_s = nullptr;  // split only: their log-sum-exps
  uint32_t n_requests = 0;
  uint32_t q_tokens = 0;
  uint32_t ctas = 0;        // blocks per KV head
  uint32_t cta_tile_q = 0;  // 16, 64 or 128
};

// Whether this build carries FlashInfer's kernels.
bool flashinfer_built();

// Enqueues FlashInfer's kernel (and its merge when split) on `stream`, then turns the lse it
// writes (base 2) into the API's natural log. Capturable in a CUDA graph.
void attention_run_flashinfer(const AttentionShape &shape, const FlashInferLaunch &launch,
                              void *stream);

}  // namespace swiftkv
