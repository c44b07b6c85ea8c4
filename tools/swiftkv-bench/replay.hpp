// The replay simulator behind `swiftkv-bench replay`: a trace of multi-turn conversations served
// by one borrower GPU under a caching policy. Every cache decision (what is resident where, what
// a full tier evicts, what a lender's reclaim evacuates) is made by the real library through its
// public API; a cost model turns the bytes moved and the tokens computed into time.
//
// The library runs on "shadow" geometries: every model keeps its block and chunk sizes in tokens
// but its bytes per token are divided by one common factor, and every budget is the same whole
// number of chunks (or blocks) as on the real server. The library's decisions depend only on
// those counts, so they are the real server's decisions with a few megabytes of memory; the
// cost model uses the real bytes. docs/replay.md has the whole model.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "model_presets.hpp"
#include "trace.hpp"

namespace swiftkv::bench {

enum class Policy { swiftkv, host_offload, hierarchical, gpu_only };
constexpr std::array<Policy, 4> kAllPolicies = {Policy::swiftkv, Policy::host_offload,
                                                Policy::hierarchical, Policy::gpu_only};
const char *policy_name(Policy p);
std::optional<Policy> parse_policy(const std::string &name);

// Where a loaded chunk came from.
enum Source : uint8_t { kGpu = 0, kPeer = 1, kHost = 2, kDisk = 3, kSourceCount = 4 };
const char *source_name(Source s);

// What the tiers do with compression (--compression): nothing, one codec in host memory and on
// disk, or the library's adaptive policy. docs/replay.md "Compression" has the cost model.
struct CompressionSpec {
  enum class Mode : uint8_t { none, fixed, adaptive };
  Mode mode = Mode::none;
  std::string codec;   // fixed: zstd, zstd-planes, kivi8, kivi4, kivi2 or fp8
  double alpha = 0.1;  // adaptive: seconds one reuse's full quality is worth (the library: 1)
  // Lossy chunks decode on the GPU after the link at this rate (GB/s of decoded bytes): an
  // assumption until the CUDA decoders are measured. zstd decodes on the CPU before the link.
  double gpu_decode_gbps = 500;
  double cpu_decode_gbps = 1.8;  // zstd over byte planes, one core (docs/codecs.md)
};
// "none", "fixed:<codec>" or "adaptive"; nullopt for anything else.
std::optional<CompressionSpec> parse_compression(const std::string &s);
std::string compression_name(const CompressionSpec &c);

struct ServerConfig {
  ModelSpec borrower;
  std::vector<ModelSpec> lenders;  // each on a GPU of its own
  double gpu_gib = 96;             // HBM of every GPU
  double host_gib = 96;            // host memory for KV (SwiftCache §5.2 gives baselines 96 GB)
  double disk_gib = 1024;
  double utilization = 0.95;  // as in `plan`
  double activation_gib = 1;
  uint32_t block_tokens = 16;
  uint32_t chunk_tokens = 256;
  double nvlink_gbps = 400;  // GB/s (1e9 bytes) per direction, borrower to each lender
  double pcie_gbps = 32;     // GB/s between the borrower's GPU and host memory
  double disk_gbps = 6;      // GB/s of the SSD
  double gpu_tflops = 120;   // effective prefill throughput (H20 dense fp16: 148 peak)
  double tpot_ms = 25;       // decode time per output token, off the prefill queue
  double lender_rate = 0.5;  // requests per second to each lender
  double lender_median_tokens = 2000;
  uint64_t lender_initial_tokens = 32768;  // each lender's owned part at the start
  uint64_t seed = 1;                       // the lenders' own requests
  std::string work_dir;  // where the disk tier's files go (a fresh directory is made)
  CompressionSpec compression;
  // swiftkv's tiers evict by Pensieve's retention value (true) or by LRU, as the baselines do.
  bool swiftkv_retention = true;
  // host-offload (vLLM + LMCache): layer-wise pipelined loads (LMCache's use_layerwise; off by
  // default, so the whole prefix loads before the first layer), and the prefill's slowdown from
  // LMCache's data movement sharing the engine's process (its tech report, §4.2: 5-10%).
  bool lmcache_layerwise = false;
  double lmcache_overhead = 0.05;
  // hierarchical (SGLang HiCache): a chunk is written through to host memory when stored
  // (write_through, hit threshold 1), or only once a later turn uses it from the GPU
  // (write_through_selective, threshold 2); a chunk the GPU drops before then is lost.
  bool hicache_selective = false;
};

// What a policy has, in tokens of the borrower.
struct Capacity {
  uint64_t gpu_tokens = 0;   // the borrower's own GPU prefix cache (regular cache for swiftkv)
  uint64_t peer_tokens = 0;  // borrowed from lenders at the start
  uint64_t host_tokens = 0;
  uint64_t disk_tokens = 0;
  uint64_t max_context = 0;  // the longest context the borrower can run
};

struct RequestRecord {
  double ready_s = 0;            // when the turn could be sent
  double ttft_s = -1;            // < 0: not served (rejected)
  uint64_t context_tokens = 0;   // history + prompt
  uint64_t computed_tokens = 0;  // prefilled, including recomputed history
  bool rejected = false;
};

struct PolicyResult {
  Policy policy = Policy::swiftkv;
  Capacity capacity;
  std::vector<RequestRecord> requests;  // one per turn, session by session in trace order
  uint64_t served = 0, rejected = 0;
  uint64_t history_chunks = 0;                      // full chunks of history in served requests
  std::array<uint64_t, kSourceCount> hit_chunks{};  // of them, used from each source
  uint64_t computed_tokens = 0, recomputed_tokens = 0;
  uint64_t max_context = 0;  // longest context served (history + prompt + answer)
  // Bytes on each link: loads, stores and demotions.
  uint64_t nvlink_bytes = 0, pcie_bytes = 0, disk_bytes = 0;
  uint64_t evicted_chunks = 0;  // dropped from the last tier of the library
  // History chunks served from the cache, and the sum of their quality (1: exact; a lossy
  // chunk: 1 - the relative RMS error of its codec on the replay's synthetic KV).
  uint64_t quality_chunks = 0;
  double quality_sum = 0;
  double decode_seconds = 0;  // decoding loaded chunks, summed over turns
  // Lenders (swiftkv): their own scale-ups, leases they asked back, and the borrower's chunks
  // that moved out (to host or disk) or were dropped because of it.
  uint64_t lender_scale_ups = 0, reclaims = 0, reclaim_moved = 0, reclaim_dropped = 0;
  // Lenders' own requests, and for each that had to reclaim: how long it waited for the
  // borrower to move the chunks out (their bytes over PCIe, and the disk for those that went
  // there) and that wait over the request's own prefill time (its TTFT increase).
  uint64_t lender_requests = 0;
  struct ReclaimWait {
    double seconds, ttft_increase;
  };
  std::vector<ReclaimWait> lender_reclaim_waits;
  double sim_seconds = 0;  // simulated time from the first arrival to the last event
  double wall_seconds = 0;
};

// How a turn's prefill treats its history: which full chunks it loads and what it computes.
struct PrefillPlan {
  std::vector<uint8_t> load;     // per full chunk: 1 loaded, 0 computed
  uint64_t computed_tokens = 0;  // tokens not loaded: a head, and the rest after the run loaded
  double compute_seconds = 0;    // their prefill time, each range after the tokens before it
  uint64_t streamed_tokens = 0;  // computed tokens at or past `gpu_tokens` (saved out)
};

// The plan for a context of `context_tokens` whose full chunks are cached where `resident` is
// not 0. Prefix caching (vLLM, LMCache, HiCache) loads the cached run from chunk 0 and computes
// everything after its first miss. With recompute_head (swiftkv, whose retention order gives up
// a conversation's cheapest chunks first, in each tier on its own, and so can leave a miss
// before or between cached chunks) it loads the longest cached run, the earliest of equal ones,
// as swiftkv_lookup reports it: the tokens before it are recomputed as a request of their own
// (Pensieve), cached or not, and those after it computed with the new ones. Throws
// std::invalid_argument when the chunks pass the context.
PrefillPlan plan_prefill(const ServerConfig &cfg, bool recompute_head,
                         const std::vector<uint8_t> &resident, uint64_t context_tokens,
                         uint64_t gpu_tokens);

// Computes each policy's capacities without running anything.
Capacity policy_capacity(const ServerConfig &cfg, Policy p);

using ProgressFn = std::function<void(uint64_t done, uint64_t total)>;

// Asks a replay running on any thread to stop at its next event: it throws Interrupted, after
// removing its disk tier's directory. Async-signal-safe (a SIGINT or SIGTERM handler calls it).
void request_stop() noexcept;
// The signal that asked for the stop (0: none yet).
int stop_signal() noexcept;
void note_stop_signal(int sig) noexcept;

struct Interrupted : std::runtime_error {
  Interrupted() : std::runtime_error("interrupted") {}
};

// Replays the trace under one policy. Throws std::runtime_error on a library failure or a
// configuration the library refuses, Interrupted after request_stop.
PolicyResult run_policy(const ServerConfig &cfg, const Trace &trace, Policy p,
                        const ProgressFn &progress = {});

// The prefill time of `tokens` new tokens after `context` cached ones, in seconds.
double prefill_seconds(const ServerConfig &cfg, uint64_t context, uint64_t tokens);

}  // namespace swiftkv::bench
