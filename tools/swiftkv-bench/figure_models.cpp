#include "figure_models.hpp"

#include <algorithm>
#include <stdexcept>

#include <swiftkv/swiftkv.h>

namespace swiftkv::bench {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// Bytes a prefill of `tokens` new tokens moves through HBM at least: the weights once and the
// new tokens' KV written.
double prefill_bytes(const ModelSpec &m, uint64_t tokens) {
  return static_cast<double>(m.weight_bytes) +
         static_cast<double>(tokens) * static_cast<double>(bytes_per_token(m));
}

}  // namespace

Interference estimate_interference(const ServerConfig &server, const ModelSpec &master,
                                   const ModelSpec &worker, uint64_t input_tokens,
                                   uint64_t master_prompt, uint64_t worker_prompt,
                                   double hbm_gbps) {
  if (hbm_gbps <= 0 || server.nvlink_gbps <= 0 || server.gpu_tflops <= 0)
    throw std::invalid_argument("estimate_interference: rates must be positive");
  Interference r;
  r.master = master.name;
  r.worker = worker.name;
  r.input_tokens = input_tokens;
  ServerConfig as_master = server;
  as_master.borrower = master;
  const double bytes =
      static_cast<double>((input_tokens + master_prompt) * bytes_per_token(master));
  const double link = bytes / (server.nvlink_gbps * 1e9);
  const double compute = prefill_seconds(as_master, input_tokens, master_prompt);
  const double L = master.num_layers;
  const double lt = link / L, ct = compute / L;
  r.master_seconds = std::max(lt + L * ct, L * lt + ct);
  r.rate_gbps = bytes / r.master_seconds / 1e9;
  r.hbm_share = std::min(r.rate_gbps / hbm_gbps, 0.999);
  const double stretch = 1 / (1 - r.hbm_share);
  r.tpot_increase = stretch - 1;
  ServerConfig as_worker = server;
  as_worker.borrower = worker;
  const double tc = prefill_seconds(as_worker, 0, worker_prompt);
  const double tm = prefill_bytes(worker, worker_prompt) / (hbm_gbps * 1e9);
  r.ttft_increase = std::max(tc, tm * stretch) / std::max(tc, tm) - 1;
  return r;
}

uint64_t activation_bytes(const ModelSpec &m, uint64_t tokens) {
  if (m.hidden == 0 || m.intermediate == 0) return 0;
  const uint64_t per_token =
      (2 * uint64_t{m.hidden} + 3 * uint64_t{m.intermediate}) * swiftkv_dtype_size(m.dtype);
  return tokens * per_token;
}

uint64_t vllm_max_context(const ModelSpec &m, uint64_t avail, uint64_t chunk,
                          uint32_t block_tokens) {
  const uint64_t bpt = bytes_per_token(m);
  const uint64_t a = activation_bytes(m, 1);
  uint64_t ctx = 0;
  // A context of at most `chunk` tokens (or any, without chunking) holds its own activations.
  const uint64_t whole = avail / (bpt + a);
  if (chunk == 0 || whole <= chunk) {
    ctx = whole;
  } else {
    const uint64_t act = activation_bytes(m, chunk);
    ctx = avail > act ? (avail - act) / bpt : 0;
  }
  return ctx / block_tokens * block_tokens;
}

ContextLimits max_contexts(double gpu_gib, const ModelSpec &master,
                           const std::vector<ModelSpec> &workers, double utilization,
                           uint32_t block_tokens) {
  if (activation_bytes(master, 1) == 0)
    throw std::invalid_argument("max_contexts: " + master.name + " has no hidden sizes");
  ContextLimits c;
  c.gpu_gib = gpu_gib;
  const double usable = gpu_gib * kGiB * utilization - static_cast<double>(master.weight_bytes);
  const uint64_t avail = usable > 0 ? static_cast<uint64_t>(usable) : 0;
  c.vllm_8k = vllm_max_context(master, avail, 8192, block_tokens);
  c.vllm_32k = vllm_max_context(master, avail, 32768, block_tokens);
  c.vllm_whole = vllm_max_context(master, avail, 0, block_tokens);
  // swiftkv: the plan (Eq. 1-5) over the KV bytes left after an 8K prefill's activations, and
  // each worker's (with its own 8K activations: its requests are prefilled the same way).
  const double act_gib = static_cast<double>(activation_bytes(master, 8192)) / kGiB;
  const uint64_t own = kv_bytes_on_gpu(master, gpu_gib, utilization, act_gib);
  std::vector<uint64_t> lent;
  for (const ModelSpec &w : workers) {
    c.workers.push_back(w.name);
    const double w_act = static_cast<double>(activation_bytes(w, 8192)) / kGiB;
    lent.push_back(kv_bytes_on_gpu(w, gpu_gib, utilization, w_act));
  }
  const swiftkv_model_desc d = to_desc(master, block_tokens);
  swiftkv_capacity_plan plan = SWIFTKV_CAPACITY_PLAN_INIT;
  if (own > 0 && swiftkv_plan_borrower(&d, own, lent.data(), lent.size(), &plan) == SWIFTKV_OK) {
    c.swiftkv = plan.max_context_tokens;
  }
  return c;
}

}  // namespace swiftkv::bench
