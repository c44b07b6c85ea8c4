// What FlashInfer's batch-prefill kernel is handed for one swiftkv_attention_run, decided on the
// host. The API's batch arrays are FlashInfer's own (qo_indptr, kv_indptr, kv_indices,
// kv_last_page_len, in the same units), so they pass through; what needs mapping is the tensors:
// FlashInfer's paged_kv_t takes one set of K/V strides as 32-bit element counts in (page, token,
// head) order for its NHD form, reads every head's D elements as 16-byte vectors, and writes the
// output densely as [q_tokens, num_qo_heads, head_dim]. A run that fits none of that is the fa2
// kernel's (docs/attention.md says which).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "core/attention/attention_plan.hpp"
#include "swiftkv/swiftkv.h"

namespace swiftkv {

struct FlashInferTensors {
  // K and V (the same strides for both), in elements, for paged_kv_t's NHD form.
  uint32_t page_stride = 0;
  uint32_t token_stride = 0;
  uint32_t head_stride = 0;
  // q, in elements (BatchPrefillPagedParams' q_stride_n and q_stride_h).
  uint32_t q_token_stride = 0;
  uint32_t q_head_stride = 0;
};

// The mapping of `args` under `shape`, or nothing with the reason in *why (the first rule the run
// breaks, in words a log can carry). Reads no tensor: pointers only for their alignment.
std::optional<FlashInferTensors> flashinfer_tensors(const AttentionShape &shape,
                                                    const swiftkv_attention_args &args,
                                                    std::string *why);

}  // namespace swiftkv
