// What FlashInfer's batch-prefill kernel is handed for one swiftkv_attention_run, decided on the
// host, without FlashInfer's headers (so every build, sanitizers included, tests it).
//
// The plan: which batches the kernel takes (FlashInferRefusal says why not), its schedule (the
// query tiles and KV chunks each thread block computes, in the arrays the kernel reads:
// request_indices, qo_tile_indices, kv_tile_indices, o_indptr, merge_indptr, kv_chunk_size),
// and where those arrays, the batch's own indptr arrays and the split partials lie in the
// workspace. The schedule is the library's own, made to the kernel's contract: a block b
// computes query tile qo_tile_indices[b] of request request_indices[b] over KV chunk
// kv_tile_indices[b] (kv_chunk_size tokens each, when split), and writes partial row
// o_indptr[r] + token * chunks_r + chunk, merged per query token by merge_indptr.
//
// The run: the tensors as FlashInfer's paged_kv_t takes them (one set of K/V strides, 32-bit, in
// (page, token, head) order for its NHD form; 16-byte vectors; a dense output).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/attention/attention_plan.hpp"
#include "swiftkv/swiftkv.h"

namespace swiftkv {

// Why a planned batch does not run on FlashInfer's kernel (it runs on the fa2 kernel instead).
// Stored in the plan: the values are part of the plan's internal encoding.
enum class FlashInferRefusal : uint32_t {
  none = 0,
  not_built = 1,       // this library was built without FlashInfer
  host = 2,            // a host plan
  dtype = 3,           // neither f16 nor bf16
  soft_cap = 4,        // logits_soft_cap > 0: not instantiated (build time)
  not_causal = 5,      // causal = 0 with a sub-request of more than one query token
  unseen_queries = 6,  // a query that sees no key (out 0, lse -inf: not known of FlashInfer)
  forced_split = 7,    // kv_chunk_tokens not a multiple of page_tokens
  no_queries = 8,      // nothing to compute
  workspace = 9,       // the workspace has no room for FlashInfer's arrays and partials
  too_large = 10,      // offsets past FlashInfer's 32-bit indices
};
inline constexpr uint32_t kFlashInferRefusalMax = 10;
const char *flashinfer_refusal_text(FlashInferRefusal r);

// Thread blocks a split schedule may use, at most (two per multiprocessor, 160 multiprocessors):
// the workspace bound holds for any device; a device with more multiprocessors splits as if it
// had 160.
inline constexpr uint32_t kFlashInferMaxCtas = 320;

struct FlashInferSchedule {
  uint32_t cta_tile_q = 0;    // packed query rows per block: 16, 64 or 128
  bool split = false;         // KV split into chunks, partials merged after
  uint32_t chunk_tokens = 0;  // KV tokens per chunk (kv_chunk_size)
  std::vector<int32_t> request_indices, qo_tile_indices, kv_tile_indices;  // one per block
  std::vector<int32_t> o_indptr;      // [n_requests + 1]: partial rows before each request
  std::vector<int32_t> merge_indptr;  // [q_tokens + 1]: partial rows before each query token
  uint64_t partial_rows = 0;          // o_indptr[n_requests] when split, else 0

  uint32_t ctas() const { return static_cast<uint32_t>(request_indices.size()); }
};

// The query tile FlashInfer's kernel is run with for a batch whose sub-requests have `packed`
// rows (query tokens x group) on average: 16 up to 16, 64 up to 64, then 128 (64 at head dim
// 256).
uint32_t flashinfer_cta_tile_q(uint64_t avg_packed_rows, uint32_t head_dim);

// The schedule of a batch (arrays already checked by plan_attention), or the refusal. `max_ctas`
// bounds the blocks (times num_kv_heads) an automatic split may make; kv_chunk_tokens > 0 in the
// shape forces chunks of that many tokens.
FlashInferRefusal flashinfer_schedule(const AttentionShape &shape, const AttentionBatch &batch,
                                      uint32_t max_ctas, FlashInferSchedule *out);

// Byte offsets, from the start of FlashInfer's part of the workspace (256-byte aligned), of
// everything its kernel reads or writes; tmp_v and tmp_s only when split.
struct FlashInferLayout {
  uint64_t qo_indptr = 0, kv_indptr = 0, last_page_len = 0;
  uint64_t request_indices = 0, qo_tile_indices = 0, kv_tile_indices = 0;
  uint64_t o_indptr = 0, merge_indptr = 0, kv_chunk_size = 0;
  uint64_t int_bytes = 0;  // the arrays above end here (what the plan copies)
  uint64_t tmp_v = 0, tmp_s = 0;
  uint64_t bytes = 0;
};
FlashInferLayout flashinfer_layout(const AttentionShape &shape, uint32_t n_requests,
                                   uint64_t q_tokens, uint32_t ctas, bool split,
                                   uint64_t partial_rows);

// Writes the int arrays (layout.int_bytes, gaps zeroed) into `dst`: the batch's qo_indptr,
// kv_indptr and kv_last_page_len (0 for a sub-request with no pages) and the schedule's.
void serialize_flashinfer_plan(const FlashInferSchedule &sched, const AttentionBatch &batch,
                               const FlashInferLayout &layout, void *dst);

// Bytes FlashInfer's part needs for any batch within the bounds (automatic splits).
uint64_t flashinfer_workspace_bound(const AttentionShape &shape, uint32_t max_requests,
                                    uint64_t max_q_tokens);

// The plan word that carries the causal flag, the library's tile and FlashInfer's part of a plan
// (swiftkv_attention_plan.internal[4]): causal (bit 0), tile rows (bits 1-8), the refusal (bits
// 9-16), the query tile (bits 17-18: 16, 64, 128), split (bit 19) | blocks per KV head (high 32).
struct AttentionPlanWord {
  bool causal = false;
  uint32_t tile_rows = 0;  // 16 or 64
  FlashInferRefusal refusal = FlashInferRefusal::none;
  uint32_t cta_tile_q = 16;  // 16, 64 or 128
  bool split = false;
  uint32_t ctas = 0;
};
uint64_t encode_plan_word(const AttentionPlanWord &w);
// A word that does not decode (a refusal past the last, a query tile code 3) decodes as refused.
AttentionPlanWord decode_plan_word(uint64_t word);

struct FlashInferTensors {
  // K and V (the same strides for both), in elements, for paged_kv_t's NHD form.
  uint32_t page_stride = 0;
  uint32_t token_stride = 0;
  uint32_t head_stride = 0;
  // q, in elements (BatchPrefillPagedParams' q_stride_n and q_stride_h, 32-bit signed).
  int32_t q_token_stride = 0;
  int32_t q_head_stride = 0;
};

// The mapping of `args` under `shape` for a run of q_tokens query tokens, or nothing with the
// reason in *why (the first rule the run breaks, in words a log can carry). Reads no tensor:
// pointers only for their alignment.
std::optional<FlashInferTensors> flashinfer_tensors(const AttentionShape &shape,
                                                    const swiftkv_attention_args &args,
                                                    uint64_t q_tokens, std::string *why);

// Which kernel a device run uses, from SWIFTKV_ATTENTION_KERNEL (read at each run): automatic
// (unset or empty: FlashInfer where it can, else fa2), flashinfer (FlashInfer or
// SWIFTKV_EUNSUPPORTED saying why not), fa2. Any other value is SWIFTKV_EINVAL.
enum class AttentionKernelChoice { automatic, flashinfer, fa2 };
AttentionKernelChoice attention_kernel_choice();

}  // namespace swiftkv
