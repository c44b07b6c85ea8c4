// SwiftCache's Fig. 8 (interference on the workers) and Fig. 9 (maximum context), each from a
// documented model (docs/replay.md): what the replay's preset prints beside the paper.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model_presets.hpp"
#include "replay.hpp"

namespace swiftkv::bench {

// A master's turn whose whole history of `input_tokens` sits in one worker's memory: it loads
// that history over NVLink layer by layer under the prefill of `master_prompt` new tokens and
// saves the new tokens back. Those bytes are read from and written to the worker's HBM, at
// `rate_gbps` while the turn lasts. A share u of the worker's HBM bandwidth (`hbm_gbps`) is then
// the master's:
//  - the worker's decode steps read weights and KV, bound by HBM: each takes 1 / (1 - u) times
//    as long while the master's turn runs;
//  - the worker's prefill of `worker_prompt` tokens takes max(flops / F, bytes / B) on a
//    roofline, and only its memory side stretches by 1 / (1 - u).
// Both are upper bounds over a run: they hold while a master's turn overlaps, not between them.
struct Interference {
  std::string master, worker;
  uint64_t input_tokens = 0;
  double master_seconds = 0;  // the master's turn, loads overlapped with the prefill
  double rate_gbps = 0;       // the master's bytes on the worker's HBM per second meanwhile
  double hbm_share = 0;       // u
  double tpot_increase = 0;   // fraction: 1 / (1 - u) - 1
  double ttft_increase = 0;   // fraction
};
Interference estimate_interference(const ServerConfig &server, const ModelSpec &master,
                                   const ModelSpec &worker, uint64_t input_tokens,
                                   uint64_t master_prompt, uint64_t worker_prompt, double hbm_gbps);

// The activations one forward pass over `tokens` tokens holds at its peak, in the MLP: for each
// token the residual and normalised hidden states and the gate, up and activated MLP outputs,
// (2 * hidden + 3 * intermediate) elements of the model's dtype. FlashAttention keeps no
// tokens x tokens scores, and the logits are the last token's only. 0 when the sizes are unknown.
uint64_t activation_bytes(const ModelSpec &m, uint64_t tokens);

// The longest context of a master on GPUs of `gpu_gib` GiB beside `workers`: under swiftkv (the
// library's plan, with an 8K chunked prefill's activations reserved) and under vLLM with
// chunked prefill of 8K and 32K tokens and without it (the whole prompt's activations at once),
// in whole blocks. Each is HBM * utilization - weights - activations, over the KV bytes per token.
struct ContextLimits {
  double gpu_gib = 0;
  std::vector<std::string> workers;
  uint64_t swiftkv = 0, vllm_8k = 0, vllm_32k = 0, vllm_whole = 0;
};
ContextLimits max_contexts(double gpu_gib, const ModelSpec &master,
                           const std::vector<ModelSpec> &workers, double utilization,
                           uint32_t block_tokens);

// vLLM's longest context with prefill chunks of `chunk` tokens (0: no chunking) when `avail`
// bytes hold the KV and the activations.
uint64_t vllm_max_context(const ModelSpec &m, uint64_t avail, uint64_t chunk,
                          uint32_t block_tokens);

}  // namespace swiftkv::bench
