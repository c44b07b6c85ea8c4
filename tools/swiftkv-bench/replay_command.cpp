// The replay subcommand: options, the run of each policy with a progress bar, and the report.
#include "replay_command.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>

#include <swiftkv/swiftkv.h>
#include <nlohmann/json.hpp>

#include "cli_args.hpp"
#include "figure_models.hpp"
#include "model_presets.hpp"
#include "replay.hpp"
#include "svg_plot.hpp"
#include "trace.hpp"

namespace swiftkv::bench {

namespace {

// SIGINT and SIGTERM stop the replay at its next event, which removes its disk tier's directory
// on the way out (a killed replay once left thousands of files in the temp dir). A second
// signal takes the default action.
void on_stop_signal(int sig) {
  note_stop_signal(sig);
  request_stop();
  signal(sig, SIG_DFL);
}

void stop_on_signals() {
  struct sigaction sa = {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

struct Options {
  std::string trace_file;
  GeneratorOptions gen;
  std::string save_trace;
  std::vector<Policy> policies{kAllPolicies.begin(), kAllPolicies.end()};
  ServerConfig server;
  uint64_t long_tokens = 20000;
  std::string out_dir = "replay-out";
  bool table = true;
  bool progress = true;
  std::string preset;           // --preset: a paper's experiment instead of one replay
  uint32_t warmup_turns = 1;    // --preset: turns per session sent first, not measured
  double hbm_gbps = 4000;       // --preset: each GPU's HBM bandwidth (the H20's 4.0 TB/s)
  std::set<std::string> given;  // the options on the command line
};

ModelSpec preset(const std::string &flag, const std::string &name) {
  if (auto m = find_preset(name)) return *m;
  std::string known;
  for (const ModelSpec &m : model_presets()) known += " " + m.name;
  throw UsageError(flag + ": unknown model '" + name + "' (known:" + known + ")");
}

Options parse(const std::vector<std::string> &args) {
  Options o;
  o.server.borrower = *find_preset("lwm-1m-text");
  std::vector<ModelSpec> lenders;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string &a = args[i];
    auto value = [&]() -> const std::string & {
      if (i + 1 >= args.size()) throw UsageError(a + " needs a value");
      return args[++i];
    };
    auto count = [&](double lo, double hi) { return parse_number(a, value(), lo, hi); };
    o.given.insert(a);
    if (a == "--trace")
      o.trace_file = value();
    else if (a == "--workload") {
      const std::string &w = value();
      const auto k = parse_workload(w);
      if (!k) throw UsageError("--workload: '" + w + "' is not sharegpt or docqa");
      o.gen.kind = *k;
    } else if (a == "--sessions")
      o.gen.sessions = static_cast<uint32_t>(count(1, 1e6));
    else if (a == "--rate")
      o.gen.sessions_per_s = count(1e-6, 1e6);
    else if (a == "--think")
      o.gen.think_mean_s = count(0, 1e6);
    else if (a == "--seed") {
      o.gen.seed = static_cast<uint64_t>(count(0, 9e15));
      o.server.seed = o.gen.seed;
    } else if (a == "--save-trace")
      o.save_trace = value();
    else if (a == "--policies") {
      o.policies.clear();
      std::stringstream ss(value());
      for (std::string p; std::getline(ss, p, ',');) {
        const auto pol = parse_policy(p);
        if (!pol)
          throw UsageError("--policies: '" + p +
                           "' is not swiftkv, host-offload, hierarchical or gpu-only");
        o.policies.push_back(*pol);
      }
      if (o.policies.empty()) throw UsageError("--policies: none given");
    } else if (a == "--borrower")
      o.server.borrower = preset(a, value());
    else if (a == "--lender")
      lenders.push_back(preset(a, value()));
    else if (a == "--gpu-gib")
      o.server.gpu_gib = count(1, 1 << 20);
    else if (a == "--host-gib")
      o.server.host_gib = count(0, 1 << 24);
    else if (a == "--disk-gib")
      o.server.disk_gib = count(0, 1 << 30);
    else if (a == "--nvlink-gbps")
      o.server.nvlink_gbps = count(0.001, 1e6);
    else if (a == "--pcie-gbps")
      o.server.pcie_gbps = count(0.001, 1e6);
    else if (a == "--disk-gbps")
      o.server.disk_gbps = count(0.001, 1e6);
    else if (a == "--gpu-tflops")
      o.server.gpu_tflops = count(0.001, 1e6);
    else if (a == "--tpot-ms")
      o.server.tpot_ms = count(0, 1e6);
    else if (a == "--lender-rate")
      o.server.lender_rate = count(1e-6, 1e6);
    else if (a == "--chunk-tokens")
      o.server.chunk_tokens = static_cast<uint32_t>(count(1, 1 << 16));
    else if (a == "--block-tokens")
      o.server.block_tokens = static_cast<uint32_t>(count(1, 1 << 16));
    else if (a == "--long-tokens")
      o.long_tokens = static_cast<uint64_t>(count(1, 1e9));
    else if (a == "--out-dir")
      o.out_dir = value();
    else if (a == "--work-dir")
      o.server.work_dir = value();
    else if (a == "--compression") {
      const std::string &c = value();
      const std::optional<CompressionSpec> spec = parse_compression(c);
      if (!spec) {
        throw UsageError("--compression: '" + c +
                         "' is not none, adaptive or fixed:<codec> (zstd, zstd-planes, kivi8, "
                         "kivi4, kivi2, fp8)");
      }
      const CompressionSpec was = o.server.compression;
      o.server.compression = *spec;
      o.server.compression.alpha = was.alpha;
      o.server.compression.gpu_decode_gbps = was.gpu_decode_gbps;
    } else if (a == "--alpha")
      o.server.compression.alpha = count(0, 1e9);
    else if (a == "--decode-gbps")
      o.server.compression.gpu_decode_gbps = count(1e-3, 1e6);
    else if (a == "--format") {
      const std::string &f = value();
      if (f != "table" && f != "json")
        throw UsageError("--format: '" + f + "' is not table or json");
      o.table = f == "table";
    } else if (a == "--swiftkv-eviction") {
      const std::string &e = value();
      if (e != "retention" && e != "lru")
        throw UsageError("--swiftkv-eviction: '" + e + "' is not retention or lru");
      o.server.swiftkv_retention = e == "retention";
    } else if (a == "--lmcache-layerwise")
      o.server.lmcache_layerwise = true;
    else if (a == "--lmcache-overhead")
      o.server.lmcache_overhead = count(0, 10);
    else if (a == "--hicache-write-policy") {
      const std::string &w = value();
      if (w != "write_through" && w != "write_through_selective") {
        throw UsageError("--hicache-write-policy: '" + w +
                         "' is not write_through or write_through_selective");
      }
      o.server.hicache_selective = w == "write_through_selective";
    } else if (a == "--no-progress")
      o.progress = false;
    else if (a == "--preset") {
      o.preset = value();
      if (o.preset != "swiftcache-fig7") {
        throw UsageError("--preset: '" + o.preset + "' is not swiftcache-fig7");
      }
    } else if (a == "--warmup-turns")
      o.warmup_turns = static_cast<uint32_t>(count(0, 1e6));
    else if (a == "--hbm-gbps")
      o.hbm_gbps = count(1, 1e6);
    else
      throw UsageError("unknown option '" + a + "' (swiftkv-bench replay --help lists them)");
  }
  if (!o.preset.empty()) {
    // The experiment fixes its models, workloads and policies.
    for (const char *fixed : {"--trace", "--workload", "--policies", "--borrower", "--lender",
                              "--save-trace", "--compression"}) {
      if (o.given.count(fixed) != 0) {
        throw UsageError(std::string(fixed) + " cannot be used with --preset " + o.preset);
      }
    }
  } else {
    for (const char *only : {"--warmup-turns", "--hbm-gbps"}) {
      if (o.given.count(only) != 0)
        throw UsageError(std::string(only) + " is an option of --preset");
    }
  }
  o.server.lenders =
      lenders.empty() ? std::vector<ModelSpec>{*find_preset("qwen3-14b"), *find_preset("qwen3-32b")}
                      : lenders;
  if (o.server.chunk_tokens % o.server.block_tokens != 0) {
    throw UsageError("--chunk-tokens must be a multiple of --block-tokens");
  }
  return o;
}

// Nearest-rank percentile of a sorted vector (NaN when empty).
double percentile(const std::vector<double> &sorted, double q) {
  if (sorted.empty()) return NAN;
  const auto rank = static_cast<size_t>(std::ceil(q * static_cast<double>(sorted.size())));
  return sorted[std::min(sorted.size() - 1, rank == 0 ? 0 : rank - 1)];
}

struct Summary {
  double p50 = NAN, p90 = NAN, p99 = NAN, p99_long = NAN;
  std::vector<double> sorted;  // common TTFTs, seconds
};

// TTFT over the turns every policy served: a policy that rejects long turns is not rewarded
// for it.
std::vector<Summary> summarize_ttft(const std::vector<PolicyResult> &rs, uint64_t long_tokens) {
  const size_t n = rs.front().requests.size();
  std::vector<bool> common(n, true);
  for (const PolicyResult &r : rs) {
    for (size_t i = 0; i < n; ++i) common[i] = common[i] && !r.requests[i].rejected;
  }
  std::vector<Summary> out;
  for (const PolicyResult &r : rs) {
    Summary s;
    std::vector<double> lng;
    for (size_t i = 0; i < n; ++i) {
      if (!common[i]) continue;
      s.sorted.push_back(r.requests[i].ttft_s);
      if (r.requests[i].context_tokens >= long_tokens) lng.push_back(r.requests[i].ttft_s);
    }
    std::sort(s.sorted.begin(), s.sorted.end());
    std::sort(lng.begin(), lng.end());
    s.p50 = percentile(s.sorted, 0.50);
    s.p90 = percentile(s.sorted, 0.90);
    s.p99 = percentile(s.sorted, 0.99);
    s.p99_long = percentile(lng, 0.99);
    out.push_back(std::move(s));
  }
  return out;
}

double pct(uint64_t part, uint64_t whole) {
  return whole == 0 ? 0 : 100.0 * static_cast<double>(part) / static_cast<double>(whole);
}

std::string ms(double s) {
  if (std::isnan(s)) return "-";
  char b[32];
  std::snprintf(b, sizeof b, "%.0f", s * 1e3);
  return b;
}

void print_table(const Options &o, const Trace &t, const std::vector<PolicyResult> &rs,
                 const std::vector<Summary> &sum) {
  const TraceSummary ts = summarize(t);
  std::printf("swiftkv-bench replay (libswiftkv %s)\n", swiftkv_version_string());
  std::printf("trace: %s, %" PRIu64 " sessions, %" PRIu64
              " turns, mean session %.0f tokens, "
              "longest %" PRIu64 "\n",
              o.trace_file.empty() ? workload_name(o.gen.kind) : o.trace_file.c_str(), ts.sessions,
              ts.turns, ts.mean_session_tokens, ts.max_session_tokens);
  std::string lenders;
  for (const ModelSpec &l : o.server.lenders) lenders += " " + l.name;
  std::printf(
      "server: borrower %s, lenders%s, %.0f GiB GPUs, host %.0f GiB, disk %.0f GiB, "
      "NVLink %.0f GB/s, PCIe %.0f GB/s, disk %.1f GB/s, %.0f TFLOP/s\n\n",
      o.server.borrower.name.c_str(), lenders.c_str(), o.server.gpu_gib, o.server.host_gib,
      o.server.disk_gib, o.server.nvlink_gbps, o.server.pcie_gbps, o.server.disk_gbps,
      o.server.gpu_tflops);
  const CompressionSpec &cs = o.server.compression;
  if (cs.mode != CompressionSpec::Mode::none) {
    std::printf(
        "compression: %s (host and disk tiers)%s, lossy chunks decoded on the GPU at %.0f "
        "GB/s, zstd on the CPU at %.1f GB/s\n\n",
        compression_name(cs).c_str(),
        cs.mode == CompressionSpec::Mode::adaptive
            ? (", alpha " + std::to_string(cs.alpha) + " s").c_str()
            : "",
        cs.gpu_decode_gbps, cs.cpu_decode_gbps);
  }
  std::printf("%-13s %10s %10s %10s %10s %11s\n", "capacity", "gpu tok", "peer tok", "host tok",
              "disk tok", "max context");
  for (const PolicyResult &r : rs) {
    const Capacity &c = r.capacity;
    std::printf("%-13s %10" PRIu64 " %10" PRIu64 " %10" PRIu64 " %10" PRIu64 " %11" PRIu64 "\n",
                policy_name(r.policy), c.gpu_tokens, c.peer_tokens, c.host_tokens, c.disk_tokens,
                c.max_context);
  }
  std::printf("\nTTFT in ms over the %zu turns every policy served; long: context >= %" PRIu64
              " tokens\n",
              sum.front().sorted.size(), o.long_tokens);
  std::printf("%-13s %6s %6s %7s %7s %7s %8s | %5s %5s %5s %5s %6s | %9s %7s %7s %7s | %8s %8s\n",
              "policy", "served", "reject", "P50", "P90", "P99", "P99 long", "gpu%", "peer%",
              "host%", "disk%", "recomp", "recomp Mt", "NVL GB", "PCIe GB", "disk GB", "max ctx",
              "reclaims");
  for (size_t i = 0; i < rs.size(); ++i) {
    const PolicyResult &r = rs[i];
    const Summary &s = sum[i];
    uint64_t hits = 0;
    for (uint64_t h : r.hit_chunks) hits += h;
    std::printf(
        "%-13s %6" PRIu64 " %6" PRIu64
        " %7s %7s %7s %8s | %5.1f %5.1f %5.1f %5.1f %6.1f |"
        " %9.2f %7.0f %7.0f %7.0f | %8" PRIu64 " %8" PRIu64 "\n",
        policy_name(r.policy), r.served, r.rejected, ms(s.p50).c_str(), ms(s.p90).c_str(),
        ms(s.p99).c_str(), ms(s.p99_long).c_str(), pct(r.hit_chunks[kGpu], r.history_chunks),
        pct(r.hit_chunks[kPeer], r.history_chunks), pct(r.hit_chunks[kHost], r.history_chunks),
        pct(r.hit_chunks[kDisk], r.history_chunks), pct(r.history_chunks - hits, r.history_chunks),
        static_cast<double>(r.recomputed_tokens) / 1e6, static_cast<double>(r.nvlink_bytes) / 1e9,
        static_cast<double>(r.pcie_bytes) / 1e9, static_cast<double>(r.disk_bytes) / 1e9,
        r.max_context, r.reclaims);
  }
  if (cs.mode != CompressionSpec::Mode::none) {
    std::printf("quality of the history chunks served (1: exact), decode time:");
    for (const PolicyResult &r : rs) {
      std::printf(
          " %s %.4f %.1f s;", policy_name(r.policy),
          r.quality_chunks == 0 ? 1.0 : r.quality_sum / static_cast<double>(r.quality_chunks),
          r.decode_seconds);
    }
    std::printf("\n");
  }
  for (size_t i = 0; i < rs.size(); ++i) {
    if (rs[i].policy != Policy::swiftkv) continue;
    for (size_t k = 0; k < rs.size(); ++k) {
      if (k == i || std::isnan(sum[k].p99) || sum[k].p99 <= 0) continue;
      std::printf("P99 TTFT of swiftkv vs %s: %+.1f%%\n", policy_name(rs[k].policy),
                  100.0 * (sum[i].p99 - sum[k].p99) / sum[k].p99);
    }
    std::printf("lenders: %" PRIu64 " scale-ups, %" PRIu64
                " leases reclaimed; the borrower moved %" PRIu64
                " chunks out of them and dropped %" PRIu64 "\n",
                rs[i].lender_scale_ups, rs[i].reclaims, rs[i].reclaim_moved, rs[i].reclaim_dropped);
  }
}

nlohmann::json to_json(const Options &o, const Trace &t, const std::vector<PolicyResult> &rs,
                       const std::vector<Summary> &sum) {
  using nlohmann::json;
  const TraceSummary ts = summarize(t);
  json j;
  j["tool"] = "swiftkv-bench replay";
  j["version"] = swiftkv_version_string();
  j["trace"] = {{"source", o.trace_file.empty() ? workload_name(o.gen.kind) : o.trace_file},
                {"seed", o.gen.seed},
                {"sessions", ts.sessions},
                {"turns", ts.turns},
                {"mean_session_tokens", ts.mean_session_tokens},
                {"prompts_under_132", ts.prompts_under_132},
                {"sessions_over_13k", ts.sessions_over_13k},
                {"sessions_over_56k", ts.sessions_over_56k}};
  json lenders = json::array();
  for (const ModelSpec &l : o.server.lenders) lenders.push_back(l.name);
  const ServerConfig &s = o.server;
  j["server"] = {
      {"borrower", s.borrower.name},
      {"lenders", lenders},
      {"gpu_gib", s.gpu_gib},
      {"host_gib", s.host_gib},
      {"disk_gib", s.disk_gib},
      {"nvlink_gbps", s.nvlink_gbps},
      {"pcie_gbps", s.pcie_gbps},
      {"disk_gbps", s.disk_gbps},
      {"gpu_tflops", s.gpu_tflops},
      {"tpot_ms", s.tpot_ms},
      {"chunk_tokens", s.chunk_tokens},
      {"block_tokens", s.block_tokens},
      {"lender_rate", s.lender_rate},
      {"swiftkv_eviction", s.swiftkv_retention ? "retention" : "lru"},
      {"lmcache_layerwise", s.lmcache_layerwise},
      {"lmcache_overhead", s.lmcache_overhead},
      {"hicache_write_policy", s.hicache_selective ? "write_through_selective" : "write_through"},
      {"compression",
       {{"mode", compression_name(s.compression)},
        {"alpha", s.compression.alpha},
        {"gpu_decode_gbps", s.compression.gpu_decode_gbps},
        {"cpu_decode_gbps", s.compression.cpu_decode_gbps}}}};
  j["common_turns"] = sum.front().sorted.size();
  j["long_tokens"] = o.long_tokens;
  json pol = json::array();
  for (size_t i = 0; i < rs.size(); ++i) {
    const PolicyResult &r = rs[i];
    auto num = [](double v) { return std::isnan(v) ? json(nullptr) : json(v); };
    json hits = json::object();
    for (int k = 0; k < kSourceCount; ++k) {
      hits[source_name(static_cast<Source>(k))] = r.hit_chunks[static_cast<size_t>(k)];
    }
    pol.push_back(
        {{"policy", policy_name(r.policy)},
         {"capacity_tokens",
          {{"gpu", r.capacity.gpu_tokens},
           {"peer", r.capacity.peer_tokens},
           {"host", r.capacity.host_tokens},
           {"disk", r.capacity.disk_tokens},
           {"max_context", r.capacity.max_context}}},
         {"served", r.served},
         {"rejected", r.rejected},
         {"ttft_s",
          {{"p50", num(sum[i].p50)},
           {"p90", num(sum[i].p90)},
           {"p99", num(sum[i].p99)},
           {"p99_long", num(sum[i].p99_long)}}},
         {"history_chunks", r.history_chunks},
         {"hit_chunks", hits},
         {"computed_tokens", r.computed_tokens},
         {"recomputed_tokens", r.recomputed_tokens},
         {"bytes", {{"nvlink", r.nvlink_bytes}, {"pcie", r.pcie_bytes}, {"disk", r.disk_bytes}}},
         {"evicted_chunks", r.evicted_chunks},
         {"quality",
          r.quality_chunks == 0 ? 1.0 : r.quality_sum / static_cast<double>(r.quality_chunks)},
         {"decode_s", r.decode_seconds},
         {"max_context", r.max_context},
         {"lender",
          {{"scale_ups", r.lender_scale_ups},
           {"reclaims", r.reclaims},
           {"chunks_moved", r.reclaim_moved},
           {"chunks_dropped", r.reclaim_dropped},
           {"nvlink_share", r.sim_seconds > 0 ? static_cast<double>(r.nvlink_bytes) /
                                                    (s.nvlink_gbps * 1e9 * r.sim_seconds)
                                              : 0.0}}},
         {"sim_seconds", r.sim_seconds},
         {"wall_seconds", r.wall_seconds}});
  }
  j["policies"] = pol;
  return j;
}

void write_plots(const Options &o, const std::vector<PolicyResult> &rs,
                 const std::vector<Summary> &sum) {
  std::vector<CdfSeries> cdf;
  std::vector<StackedBar> bars;
  for (size_t i = 0; i < rs.size(); ++i) {
    cdf.push_back(CdfSeries{policy_name(rs[i].policy), sum[i].sorted});
    StackedBar b{policy_name(rs[i].policy), {}};
    uint64_t hits = 0;
    for (int k = 0; k < kSourceCount; ++k) {
      const uint64_t h = rs[i].hit_chunks[static_cast<size_t>(k)];
      hits += h;
      b.parts.emplace_back(source_name(static_cast<Source>(k)), pct(h, rs[i].history_chunks));
    }
    b.parts.emplace_back("recomputed", pct(rs[i].history_chunks - hits, rs[i].history_chunks));
    bars.push_back(std::move(b));
  }
  write_file(o.out_dir + "/ttft_cdf.svg", cdf_svg("TTFT (ms), turns every policy served", cdf));
  write_file(o.out_dir + "/hit_rates.svg",
             bars_svg("where each history chunk came from (% of history chunks)", bars));
}

// Runs each policy on the trace, with a progress bar on a terminal and a line per policy.
std::vector<PolicyResult> run_policies(const Options &o, const ServerConfig &server,
                                       const Trace &trace, const std::vector<Policy> &policies,
                                       const std::string &what) {
  std::vector<PolicyResult> results;
  const bool bar = o.progress && isatty(STDERR_FILENO);
  for (Policy p : policies) {
    int shown = -1;
    auto progress = [&](uint64_t done, uint64_t total) {
      if (!bar || total == 0) return;
      const int v = static_cast<int>(100 * done / total);
      if (v == shown) return;
      shown = v;
      std::fprintf(stderr, "\r%-13s [%-40s] %3d%%", policy_name(p),
                   std::string(static_cast<size_t>(v * 40 / 100), '#').c_str(), v);
      std::fflush(stderr);
    };
    results.push_back(run_policy(server, trace, p, progress));
    // The bar is 61 columns ("%-13s [%-40s] %3d%%"): all of them are cleared.
    if (bar) std::fprintf(stderr, "\r%-61s\r", "");
    if (o.progress) {
      std::fprintf(stderr, "replay: %s%s done in %.1f s\n", what.c_str(), policy_name(p),
                   results.back().wall_seconds);
    }
  }
  return results;
}

// --- --preset swiftcache-fig7: SwiftCache §5.1 and Fig. 7 ----------------------------------------

// One bar group of Fig. 7: a master model on a workload.
struct Fig7Cell {
  std::string master, workload;
  uint64_t sessions = 0, turns = 0, measured = 0;
  double mean_session_tokens = 0;
  std::vector<double> p99;  // per policy of kFig7Policies, seconds (NaN: nothing measured)
  std::vector<PolicyResult> results;
};

constexpr Policy kFig7Policies[] = {Policy::swiftkv, Policy::host_offload, Policy::hierarchical};

// The workers' requests under swiftkv that waited for a reclaim, as a share of all of them, and
// the P99 and largest TTFT increase (over every request, a request that did not wait counting 0).
struct ReclaimWaits {
  uint64_t requests = 0, waited = 0;
  double p99_increase = 0, max_increase = 0, max_wait_s = 0;
};
ReclaimWaits reclaim_waits(const PolicyResult &r) {
  ReclaimWaits w;
  w.requests = r.lender_requests;
  w.waited = r.lender_reclaim_waits.size();
  std::vector<double> inc(w.requests - std::min(w.requests, w.waited), 0.0);
  for (const PolicyResult::ReclaimWait &x : r.lender_reclaim_waits) {
    inc.push_back(x.ttft_increase);
    w.max_increase = std::max(w.max_increase, x.ttft_increase);
    w.max_wait_s = std::max(w.max_wait_s, x.seconds);
  }
  std::sort(inc.begin(), inc.end());
  if (!inc.empty()) w.p99_increase = percentile(inc, 0.99);
  return w;
}
// The paper's reductions of P99 TTFT by swiftkv, per dataset (§5.1): against vLLM with LMCache
// (host-offload) and SGLang with HiCache (hierarchical).
struct PaperReduction {
  const char *workload;
  double vs_lmcache, vs_hicache;
};
constexpr PaperReduction kFig7Paper[] = {{"sharegpt", 54, 67}, {"docqa", 58, 69}};
// Fig. 8 (§5.2): a master's turns of these input lengths, the largest TTFT and TPOT increases
// the paper measured on each worker (for Qwen3-32B as the master it gives one pair for both).
struct Fig8Case {
  const char *master, *worker;
  uint64_t inputs[3];
  double ttft_pct, tpot_pct;
};
constexpr Fig8Case kFig8[] = {
    {"lwm-1m-text", "qwen3-14b", {16384, 32768, 65536}, 9.7, 6.5},
    {"lwm-1m-text", "qwen3-32b", {16384, 32768, 65536}, 7.9, 6.4},
    {"qwen3-32b", "lwm-1m-text", {16384, 32768, 40960}, 7.7, 5.6},
    {"qwen3-32b", "qwen3-14b", {16384, 32768, 40960}, 7.7, 5.6},
};
constexpr uint64_t kFig8MasterPrompt = 128;  // the new tokens of the master's turn
// Fig. 9 (§5.3): LWM-1M-Text beside Qwen3-14B and Qwen3-8B, or two Qwen3-8B on 24 GB.
struct Fig9Case {
  double gpu_gib;
  const char *workers[2];
};
constexpr Fig9Case kFig9[] = {{96, {"qwen3-14b", "qwen3-8b"}},
                              {80, {"qwen3-14b", "qwen3-8b"}},
                              {32, {"qwen3-14b", "qwen3-8b"}},
                              {24, {"qwen3-8b", "qwen3-8b"}}};
// Qwen3's longest context (§5: "all three models support a maximum context length of 40K").
constexpr uint64_t kQwen3MaxContext = 40960;

// The P99 TTFT of each policy over the turns that count: past the session's warm-up turns, a
// context of at least min_context, and served by every policy.
std::vector<double> fig7_p99(const Trace &t, const std::vector<PolicyResult> &rs,
                             uint64_t min_context, uint32_t warmup, uint64_t *measured) {
  std::vector<std::vector<double>> ttft(rs.size());
  size_t i = 0;
  for (const Session &s : t.sessions) {
    for (const Turn &turn : s.turns) {
      bool counts = turn.index >= warmup;
      for (const PolicyResult &r : rs) {
        counts = counts && !r.requests[i].rejected && r.requests[i].context_tokens >= min_context;
      }
      for (size_t k = 0; counts && k < rs.size(); ++k) ttft[k].push_back(rs[k].requests[i].ttft_s);
      ++i;
    }
  }
  *measured = ttft.front().size();
  std::vector<double> p99;
  for (auto &v : ttft) {
    std::sort(v.begin(), v.end());
    p99.push_back(percentile(v, 0.99));
  }
  return p99;
}

double reduction(double ours, double theirs) {
  return std::isnan(ours) || std::isnan(theirs) || theirs <= 0 ? NAN : 100.0 * (1 - ours / theirs);
}

int run_fig7(const Options &o) {
  // The testbed (§5): four 96 GB GPUs, NVLink 400 GB/s, PCIe 4.0 at 32 GB/s, 96 GB of CPU memory
  // as the baselines' offloading space (and swiftkv's host tier), no disk tier.
  ServerConfig server = o.server;
  if (o.given.count("--disk-gib") == 0) server.disk_gib = 0;
  GeneratorOptions gen = o.gen;
  if (o.given.count("--sessions") == 0) gen.sessions = 60;
  if (o.given.count("--rate") == 0) gen.sessions_per_s = 0.01;
  const std::vector<Policy> policies(std::begin(kFig7Policies), std::end(kFig7Policies));
  const std::vector<std::string> masters = {"lwm-1m-text", "qwen3-14b", "qwen3-32b"};
  std::vector<Fig7Cell> cells;
  for (const WorkloadKind w : {WorkloadKind::sharegpt, WorkloadKind::docqa}) {
    for (const std::string &m : masters) {
      Fig7Cell c;
      server.borrower = *find_preset(m);
      server.lenders.clear();
      for (const std::string &other : masters) {
        if (other != m) server.lenders.push_back(*find_preset(other));
      }
      gen.kind = w;
      const uint64_t max_context = m == "lwm-1m-text" ? 0 : kQwen3MaxContext;
      const Trace t = generate_long_trace(gen, o.long_tokens, max_context);
      const TraceSummary ts = summarize(t);
      c.master = server.borrower.name;
      c.workload = workload_name(w);
      c.sessions = ts.sessions;
      c.turns = ts.turns;
      c.mean_session_tokens = ts.mean_session_tokens;
      c.results = run_policies(o, server, t, policies, c.master + " " + c.workload + ": ");
      c.p99 = fig7_p99(t, c.results, o.long_tokens, o.warmup_turns, &c.measured);
      cells.push_back(std::move(c));
    }
  }

  using nlohmann::json;
  auto num = [](double v) { return std::isnan(v) ? json(nullptr) : json(v); };
  json jc = json::array();
  for (const Fig7Cell &c : cells) {
    json p = json::object(), detail = json::object();
    for (size_t k = 0; k < policies.size(); ++k) {
      const PolicyResult &r = c.results[k];
      const ReclaimWaits w = reclaim_waits(r);
      p[policy_name(policies[k])] = num(c.p99[k]);
      json hits = json::object();
      for (int s = 0; s < kSourceCount; ++s) {
        hits[source_name(static_cast<Source>(s))] = r.hit_chunks[static_cast<size_t>(s)];
      }
      detail[policy_name(policies[k])] = {
          {"capacity_tokens",
           {{"gpu", r.capacity.gpu_tokens},
            {"peer", r.capacity.peer_tokens},
            {"host", r.capacity.host_tokens},
            {"max_context", r.capacity.max_context}}},
          {"rejected", r.rejected},
          {"history_chunks", r.history_chunks},
          {"hit_chunks", hits},
          {"recomputed_tokens", r.recomputed_tokens},
          {"bytes", {{"nvlink", r.nvlink_bytes}, {"pcie", r.pcie_bytes}}},
          {"lender",
           {{"reclaims", r.reclaims},
            {"chunks_moved", r.reclaim_moved},
            {"chunks_dropped", r.reclaim_dropped},
            {"requests", w.requests},
            {"requests_waiting_for_reclaims", w.waited},
            {"p99_ttft_increase_pct", 100 * w.p99_increase},
            {"max_ttft_increase_pct", 100 * w.max_increase},
            {"max_reclaim_wait_s", w.max_wait_s}}}};
    }
    jc.push_back({{"master", c.master},
                  {"workload", c.workload},
                  {"sessions", c.sessions},
                  {"turns", c.turns},
                  {"mean_session_tokens", c.mean_session_tokens},
                  {"turns_measured", c.measured},
                  {"p99_ttft_s", p},
                  {"policies", detail},
                  {"reduction_pct",
                   {{"vs_host_offload", num(reduction(c.p99[0], c.p99[1]))},
                    {"vs_hierarchical", num(reduction(c.p99[0], c.p99[2]))}}}});
  }
  std::vector<Interference> fig8;
  for (const Fig8Case &f : kFig8) {
    for (uint64_t input : f.inputs) {
      fig8.push_back(estimate_interference(
          server, *find_preset(f.master), *find_preset(f.worker), input, kFig8MasterPrompt,
          static_cast<uint64_t>(server.lender_median_tokens), o.hbm_gbps));
    }
  }
  std::vector<ContextLimits> fig9;
  for (const Fig9Case &f : kFig9) {
    fig9.push_back(max_contexts(f.gpu_gib, *find_preset("lwm-1m-text"),
                                {*find_preset(f.workers[0]), *find_preset(f.workers[1])}, 0.95,
                                server.block_tokens));
  }
  json j8 = json::array(), j9 = json::array();
  for (const Interference &i : fig8) {
    j8.push_back({{"master", i.master},
                  {"worker", i.worker},
                  {"input_tokens", i.input_tokens},
                  {"master_turn_s", i.master_seconds},
                  {"worker_hbm_gbps_used", i.rate_gbps},
                  {"hbm_share", i.hbm_share},
                  {"ttft_increase_pct", 100 * i.ttft_increase},
                  {"tpot_increase_pct", 100 * i.tpot_increase}});
  }
  for (const ContextLimits &c : fig9) {
    j9.push_back({{"gpu_gib", c.gpu_gib},
                  {"workers", c.workers},
                  {"swiftkv", c.swiftkv},
                  {"vllm_chunked_8k", c.vllm_8k},
                  {"vllm_chunked_32k", c.vllm_32k},
                  {"vllm_unchunked", c.vllm_whole}});
  }
  json paper = json::array();
  for (const PaperReduction &p : kFig7Paper) {
    paper.push_back({{"workload", p.workload},
                     {"vs_host_offload", p.vs_lmcache},
                     {"vs_hierarchical", p.vs_hicache}});
  }
  const json j = {{"tool", "swiftkv-bench replay"},
                  {"preset", o.preset},
                  {"version", swiftkv_version_string()},
                  {"seed", gen.seed},
                  {"sessions_per_cell", gen.sessions},
                  {"sessions_per_s", gen.sessions_per_s},
                  {"min_context", o.long_tokens},
                  {"qwen3_max_context", kQwen3MaxContext},
                  {"warmup_turns", o.warmup_turns},
                  {"server",
                   {{"gpu_gib", server.gpu_gib},
                    {"host_gib", server.host_gib},
                    {"disk_gib", server.disk_gib},
                    {"nvlink_gbps", server.nvlink_gbps},
                    {"pcie_gbps", server.pcie_gbps},
                    {"gpu_tflops", server.gpu_tflops},
                    {"swiftkv_eviction", server.swiftkv_retention ? "retention" : "lru"},
                    {"lmcache_layerwise", server.lmcache_layerwise},
                    {"lmcache_overhead", server.lmcache_overhead},
                    {"hicache_write_policy",
                     server.hicache_selective ? "write_through_selective" : "write_through"}}},
                  {"cells", jc},
                  {"paper_reduction_pct", paper},
                  {"hbm_gbps", o.hbm_gbps},
                  {"fig8_interference", j8},
                  {"fig9_max_context", j9}};
  write_file(o.out_dir + "/fig7.json", j.dump(2) + "\n");
  std::vector<BarGroup> groups;
  for (const Fig7Cell &c : cells) {
    BarGroup g{c.master + " " + (c.workload == "docqa" ? "L-Eval-like" : "ShareGPT"), {}};
    for (double v : c.p99) g.values.push_back(std::isnan(v) ? 0 : v);
    groups.push_back(std::move(g));
  }
  write_file(
      o.out_dir + "/fig7.svg",
      grouped_bars_svg(
          "P99 TTFT (s), turns with context >= " + std::to_string(o.long_tokens) + " tokens",
          {"swiftkv", "host-offload (vLLM + LMCache)", "hierarchical (SGLang HiCache)"}, groups));
  if (!o.table) {
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf(
      "swiftkv-bench replay --preset swiftcache-fig7 (libswiftkv %s): SwiftCache §5.1, "
      "Fig. 7\n",
      swiftkv_version_string());
  std::printf(
      "testbed: %.0f GiB GPUs, NVLink %.0f GB/s, PCIe %.0f GB/s, host %.0f GiB for every "
      "policy, disk %.0f GiB, %.0f TFLOP/s; swiftkv evicts by %s; LMCache loads %s, +%.0f%%; "
      "HiCache %s\n",
      server.gpu_gib, server.nvlink_gbps, server.pcie_gbps, server.host_gib, server.disk_gib,
      server.gpu_tflops, server.swiftkv_retention ? "retention" : "LRU",
      server.lmcache_layerwise ? "layer by layer" : "before the prefill",
      100 * server.lmcache_overhead,
      server.hicache_selective ? "write_through_selective" : "write_through");
  std::printf("workload: %u sessions per cell reaching %" PRIu64 " tokens (Qwen3 cut at %" PRIu64
              "), %.3f sessions/s, seed %" PRIu64 "; P99 TTFT over turns with context >= %" PRIu64
              " after %u warm-up turn(s) per session, served by every policy\n\n",
              gen.sessions, o.long_tokens, kQwen3MaxContext, gen.sessions_per_s, gen.seed,
              o.long_tokens, o.warmup_turns);
  std::printf(
      "| master | workload | turns measured | swiftkv ms | host-offload ms | hierarchical "
      "ms | vs host-offload | vs hierarchical |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (const Fig7Cell &c : cells) {
    std::printf("| %s | %s | %" PRIu64 " | %s | %s | %s | %+.0f%% | %+.0f%% |\n", c.master.c_str(),
                c.workload.c_str(), c.measured, ms(c.p99[0]).c_str(), ms(c.p99[1]).c_str(),
                ms(c.p99[2]).c_str(), -reduction(c.p99[0], c.p99[1]),
                -reduction(c.p99[0], c.p99[2]));
  }
  // The median of the three masters: one saturated or starved cell does not decide the row.
  std::printf(
      "\nP99 TTFT reduction by swiftkv, median of the three masters, beside the paper's:\n");
  std::printf(
      "| workload | vs host-offload | paper vs vLLM + LMCache | vs hierarchical | paper vs "
      "SGLang HiCache |\n| --- | --- | --- | --- | --- |\n");
  for (const PaperReduction &p : kFig7Paper) {
    std::vector<double> a, b;
    for (const Fig7Cell &c : cells) {
      if (c.workload != p.workload) continue;
      a.push_back(reduction(c.p99[0], c.p99[1]));
      b.push_back(reduction(c.p99[0], c.p99[2]));
    }
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v.empty() ? NAN : v[v.size() / 2];
    };
    std::printf("| %s | %.0f%% | %.0f%% | %.0f%% | %.0f%% |\n", p.workload, median(a), p.vs_lmcache,
                median(b), p.vs_hicache);
  }
  std::printf(
      "\nFig. 8: a master's turn loading its whole history from a worker, while it lasts "
      "(docs/replay.md; HBM %.0f GB/s, worker prefill of %.0f tokens):\n",
      o.hbm_gbps, server.lender_median_tokens);
  std::printf(
      "| master | worker | input tokens | master turn ms | worker HBM GB/s used | TTFT + | TPOT + "
      "| paper max TTFT + / TPOT + |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n");
  size_t k = 0;
  for (const Fig8Case &f : kFig8) {
    for (size_t n = 0; n < std::size(f.inputs); ++n, ++k) {
      const Interference &i = fig8[k];
      std::printf("| %s | %s | %" PRIu64 " | %.1f | %.0f | %.1f%% | %.1f%% | %.1f%% / %.1f%% |\n",
                  i.master.c_str(), i.worker.c_str(), i.input_tokens, 1e3 * i.master_seconds,
                  i.rate_gbps, 100 * i.ttft_increase, 100 * i.tpot_increase, f.ttft_pct,
                  f.tpot_pct);
    }
  }
  std::printf(
      "\nFig. 8 in the run: the workers' requests under swiftkv that waited for the master to "
      "move chunks out of reclaimed leases (the bytes over PCIe):\n");
  std::printf(
      "| master | workload | worker requests | waited | P99 TTFT + | max TTFT + | max wait ms "
      "|\n| --- | --- | --- | --- | --- | --- | --- |\n");
  for (const Fig7Cell &c : cells) {
    const ReclaimWaits w = reclaim_waits(c.results[0]);
    std::printf("| %s | %s | %" PRIu64 " | %" PRIu64 " | %.1f%% | %.1f%% | %.1f |\n",
                c.master.c_str(), c.workload.c_str(), w.requests, w.waited, 100 * w.p99_increase,
                100 * w.max_increase, 1e3 * w.max_wait_s);
  }
  std::printf(
      "\nFig. 9: LWM-1M-Text's longest context (tokens; swiftkv with an 8K chunked prefill's "
      "activations reserved):\n");
  std::printf(
      "| GPU GiB | workers | swiftkv | vLLM chunked 8K | vLLM chunked 32K | vLLM unchunked | gain "
      "vs 8K | gain vs 32K / unchunked |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (const ContextLimits &c : fig9) {
    auto gain = [&](uint64_t base) {
      char b[32] = "-";
      if (base != 0) {
        std::snprintf(b, sizeof b, "%.2fx",
                      static_cast<double>(c.swiftkv) / static_cast<double>(base));
      }
      return std::string(b);
    };
    std::printf("| %.0f | %s, %s | %" PRIu64 " | %" PRIu64 " | %" PRIu64 " | %" PRIu64
                " | %s | %s / %s |\n",
                c.gpu_gib, c.workers[0].c_str(), c.workers[1].c_str(), c.swiftkv, c.vllm_8k,
                c.vllm_32k, c.vllm_whole, gain(c.vllm_8k).c_str(), gain(c.vllm_32k).c_str(),
                gain(c.vllm_whole).c_str());
  }
  std::printf("paper: 1.58x-3.98x against vLLM chunked 8K, 1.81x-6.66x against the other two\n");
  std::printf("\nJSON: %s/fig7.json  plot: %s/fig7.svg\n", o.out_dir.c_str(), o.out_dir.c_str());
  return 0;
}

}  // namespace

void print_replay_usage() {
  std::printf(
      "swiftkv-bench replay [options]: multi-turn traces through the library under each policy\n"
      "  --trace FILE             a JSONL trace (docs/replay.md); default: the generator\n"
      "  --workload sharegpt|docqa  the generator's workload (sharegpt)\n"
      "  --sessions N --rate R --think S --seed N   generator: sessions (400), new sessions per\n"
      "                           second (0.1), mean think time in s (60), seed (1)\n"
      "  --save-trace FILE        also write the trace that was replayed\n"
      "  --policies LIST          comma-separated: swiftkv,host-offload,hierarchical,gpu-only "
      "(all)\n"
      "  --borrower NAME --lender NAME...   presets (lwm-1m-text; qwen3-14b and qwen3-32b)\n"
      "  --gpu-gib F --host-gib F --disk-gib F   96, 96, 1024\n"
      "  --nvlink-gbps F --pcie-gbps F --disk-gbps F   400, 32, 6 (GB/s)\n"
      "  --gpu-tflops F --tpot-ms F   effective prefill TFLOP/s (120), decode ms per token (25)\n"
      "  --lender-rate R          requests per second to each lender (0.5)\n"
      "  --swiftkv-eviction retention|lru   how swiftkv's tiers evict (retention)\n"
      "  --lmcache-layerwise      host-offload loads layer by layer under the compute (off)\n"
      "  --lmcache-overhead F     host-offload's prefills take 1 + F times as long (0.05)\n"
      "  --hicache-write-policy write_through|write_through_selective   when hierarchical\n"
      "                           backs a chunk up to host memory (write_through)\n"
      "  --chunk-tokens N --block-tokens N   256, 16\n"
      "  --long-tokens N          the 'long' TTFT column: contexts of at least N tokens (20000)\n"
      "  --out-dir DIR            JSON and plots go here (replay-out)\n"
      "  --compression MODE       none, fixed:<codec> (zstd, zstd-planes, kivi8, kivi4, kivi2,\n"
      "                           fp8) or adaptive, in the host and disk tiers (none)\n"
      "  --alpha F                adaptive: seconds one reuse's full quality is worth (0.1)\n"
      "  --decode-gbps F          GB/s at which the GPU decodes lossy chunks (500)\n"
      "  --work-dir DIR           the disk tier's files go under DIR, made if missing (the\n"
      "                           system's temp dir)\n"
      "  --format table|json      what goes to stdout (table); the JSON file is always written\n"
      "  --no-progress            no progress bar\n"
      "  --preset swiftcache-fig7 SwiftCache's Fig. 7 experiment (docs/replay.md): each of\n"
      "                           LWM-1M-Text, Qwen3-14B and Qwen3-32B as the borrower beside the\n"
      "                           other two, on long ShareGPT-like and docqa sessions; --sessions\n"
      "                           per cell (60), --rate (0.01), --long-tokens (20000), --seed and\n"
      "                           the server's options apply; --disk-gib defaults to 0\n"
      "  --warmup-turns N         --preset: turns per session sent first, not measured (1)\n"
      "  --hbm-gbps F             --preset: each GPU's HBM bandwidth in GB/s, for Fig. 8 (4000)\n");
}

int run_replay(const std::vector<std::string> &args) {
  for (const std::string &a : args) {
    if (a == "-h" || a == "--help") {
      print_replay_usage();
      return 0;
    }
  }
  Options o;
  Trace trace;
  try {
    o = parse(args);
    trace = o.trace_file.empty() ? generate_trace(o.gen) : load_trace(o.trace_file);
    if (!o.save_trace.empty()) save_trace(trace, o.save_trace);
  } catch (const UsageError &e) {
    std::fprintf(stderr, "swiftkv-bench replay: %s\n", e.what());
    return 2;
  } catch (const TraceError &e) {
    std::fprintf(stderr, "swiftkv-bench replay: %s\n", e.what());
    return 2;
  }
  try {
    std::filesystem::create_directories(o.out_dir);
    // Both directories are made when missing (--work-dir once had to exist already).
    if (!o.server.work_dir.empty()) std::filesystem::create_directories(o.server.work_dir);
    stop_on_signals();
    if (!o.preset.empty()) return run_fig7(o);
    const std::vector<PolicyResult> results = run_policies(o, o.server, trace, o.policies, "");
    const std::vector<Summary> sum = summarize_ttft(results, o.long_tokens);
    const nlohmann::json j = to_json(o, trace, results, sum);
    write_file(o.out_dir + "/replay.json", j.dump(2) + "\n");
    write_plots(o, results, sum);
    if (o.table) {
      print_table(o, trace, results, sum);
      std::printf("\nJSON: %s/replay.json  plots: %s/ttft_cdf.svg %s/hit_rates.svg\n",
                  o.out_dir.c_str(), o.out_dir.c_str(), o.out_dir.c_str());
    } else {
      std::printf("%s\n", j.dump().c_str());
    }
    return 0;
  } catch (const Interrupted &) {
    std::fprintf(stderr,
                 "\nswiftkv-bench replay: stopped by signal %d; its disk tier's files "
                 "are removed\n",
                 stop_signal());
    return 128 + stop_signal();
  } catch (const std::exception &e) {
    std::fprintf(stderr, "swiftkv-bench replay: %s\n", e.what());
    return 1;
  }
}

}  // namespace swiftkv::bench
