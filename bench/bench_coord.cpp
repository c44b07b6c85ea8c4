// bench_coord: the coordinator's costs, through the public API, with the lender and the borrower
// in two contexts talking over an ipc:// endpoint (the same protocol as between processes).
//   1. Reclaim latency against the chunks to evacuate: the borrower fills a lease with N chunks,
//      the lender grows over it and waits (swiftkv_elastic_wait_reclaims), and the time from the
//      reclaim request to the borrower's ack is read from the lender's coordinator (the borrower
//      copies the chunks to host meanwhile), beside a memcpy of the same bytes in the same
//      repetition. Median and min over --reps after a warm-up.
//   2. Heartbeat overhead: the CPU time both contexts spend per second with L leases at
//      heartbeat periods of 1, 10 and 100 ms, less the idle baseline measured just before in the
//      same repetition: the same two contexts with the region offered and nothing borrowed.
// Prints a table and a JSON line. --quick: a small run for the test suite; --heartbeats: only
// the second part; --reclaims: only the first; --reps N.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "swiftkv/swiftkv.h"

namespace {

using Clock = std::chrono::steady_clock;

// Borrower: 8 layers, 8 KV heads of 128 dims, 64-token chunks in f16: 2 MiB a chunk. The lender
// has the same geometry with 16-token blocks: a lending unit is 4 blocks = 1 chunk.
constexpr uint64_t kChunkBytes = 2ull * 8 * 8 * 128 * 64 * 2;

[[noreturn]] void die(const char *what) {
  std::fprintf(stderr, "bench_coord: %s: %s\n", what, swiftkv_last_error_message());
  std::exit(1);
}

void ok(swiftkv_status s, const char *what) {
  if (s != SWIFTKV_OK && s != SWIFTKV_IN_PROGRESS) die(what);
}

swiftkv_model_desc desc(uint32_t block_tokens, const char *name) {
  swiftkv_model_desc m = SWIFTKV_MODEL_DESC_INIT;
  m.name = name;
  m.num_layers = 8;
  m.num_kv_heads = 8;
  m.head_dim = 128;
  m.block_tokens = block_tokens;
  m.chunk_tokens = 64;
  return m;
}

double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

struct Pair {
  swiftkv_ctx *lender = nullptr;
  swiftkv_elastic *region = nullptr;
  swiftkv_ctx *borrower = nullptr;
  uint32_t model = 0;
  std::string endpoint;
};

Pair make_pair(uint64_t units, uint32_t heartbeat_ms, uint64_t host_bytes) {
  static int n = 0;
  Pair p;
  p.endpoint =
      "ipc:///tmp/swiftkv-bench-coord-" + std::to_string(::getpid()) + "-" + std::to_string(n++);
  swiftkv_ctx_config lc = SWIFTKV_CTX_CONFIG_INIT;
  lc.host_budget_bytes = (units + 1) * kChunkBytes + (64 << 20);
  lc.coord_endpoint = p.endpoint.c_str();
  ok(swiftkv_ctx_create(&p.lender, &lc), "lender context");
  swiftkv_model_desc ld = desc(16, "lender");
  swiftkv_model_desc bd = desc(64, "borrower");
  swiftkv_elastic_config ec = SWIFTKV_ELASTIC_CONFIG_INIT;
  ec.lender = &ld;
  ec.borrower = &bd;
  ec.capacity_blocks = (units + 1) * 4;
  ec.owned_blocks = 4;
  ok(swiftkv_elastic_create(&p.region, p.lender, &ec), "region");
  ok(swiftkv_elastic_offer(p.region, "bench"), "offer");
  swiftkv_ctx_config bc = SWIFTKV_CTX_CONFIG_INIT;
  bc.host_budget_bytes = host_bytes;
  bc.demote_free_percent = 0;
  bc.coord_heartbeat_ms = heartbeat_ms;
  ok(swiftkv_ctx_create(&p.borrower, &bc), "borrower context");
  swiftkv_model_config mc = SWIFTKV_MODEL_CONFIG_INIT;
  mc.desc = &bd;
  ok(swiftkv_model_register(&p.model, p.borrower, &mc), "register");
  return p;
}

void end_pair(Pair &p) {
  swiftkv_ctx_destroy(p.borrower);
  swiftkv_elastic_destroy(p.region);
  swiftkv_ctx_destroy(p.lender);
}

struct ReclaimRow {
  uint64_t chunks;
  double ack_ms;     // request to ack, from the lender's coordinator
  double settle_ms;  // scale_for_request to all blocks ready, seen by the lender
  double memcpy_ms;  // the same bytes copied once, for scale
};

ReclaimRow reclaim_once(uint64_t chunks) {
  const uint64_t units = std::max<uint64_t>(chunks, 1);
  Pair p = make_pair(units, 100, units * kChunkBytes + (64 << 20));
  uint64_t lease = 0;
  ok(swiftkv_borrow_remote(&lease, p.borrower, p.model, p.endpoint.c_str(), "bench", units),
     "borrow");
  std::vector<uint32_t> tokens(chunks * 64);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(i);
  std::vector<uint8_t> kv(chunks * kChunkBytes, 0x5a);
  uint64_t cached = 0;
  if (chunks != 0) {
    ok(swiftkv_store(&cached, p.borrower, p.model, tokens.data(), tokens.size(), kv.data(),
                     kv.size()),
       "store");
  }
  std::vector<uint8_t> dst(kv.size() + 1, 0);
  const auto c0 = Clock::now();
  if (!kv.empty()) std::memcpy(dst.data(), kv.data(), kv.size());
  const double memcpy_ms = std::chrono::duration<double, std::milli>(Clock::now() - c0).count();

  const auto t0 = Clock::now();
  uint64_t blocks = 0, bc = 0;
  ok(swiftkv_elastic_scale_for_request(&blocks, &bc, p.region, (units + 1) * 4 * 16), "scale");
  ok(swiftkv_elastic_wait_reclaims(p.region, 60'000), "wait_reclaims");
  const double settle_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  swiftkv_coord_stats cs = SWIFTKV_COORD_STATS_INIT;
  ok(swiftkv_coord_stats_get(&cs, p.lender), "coord stats");
  // The lender counts the ack before the region has the lease back, so this holds at once.
  if (cs.reclaims_acked != 1) die("the reclaim was not acked once");
  end_pair(p);
  return ReclaimRow{chunks, static_cast<double>(cs.reclaim_ns_max) * 1e-6, settle_ms, memcpy_ms};
}

struct HeartbeatRow {
  uint32_t period_ms;
  uint64_t leases;
  double cpu_ms_per_s = 0, cpu_ms_per_s_min = 0;  // both contexts, less the idle baseline
  double idle_ms_per_s = 0;                       // the baseline itself (median)
  double heartbeats_per_s = 0;
  double us_per_heartbeat = 0;  // CPU time per heartbeat and its answer, both sides
};

// CPU ms per second of this process over `seconds` while it sleeps.
double cpu_over(double seconds) {
  const double c0 = cpu_seconds();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  return (cpu_seconds() - c0) * 1e3 / seconds;
}

// One repetition: the idle baseline (the region offered, nothing borrowed), then the same two
// contexts with `leases` leases renewed every period_ms. Returns (with, idle) CPU ms/s and
// heartbeats/s.
void heartbeat_rep(uint32_t period_ms, uint64_t leases, double seconds, double *with, double *idle,
                   double *beats) {
  Pair p = make_pair(leases, period_ms, 64 << 20);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  *idle = cpu_over(seconds);
  for (uint64_t i = 0; i < leases; ++i) {
    uint64_t lease = 0;
    ok(swiftkv_borrow_remote(&lease, p.borrower, p.model, p.endpoint.c_str(), "bench", 1),
       "borrow");
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  swiftkv_coord_stats a = SWIFTKV_COORD_STATS_INIT, b = SWIFTKV_COORD_STATS_INIT;
  ok(swiftkv_coord_stats_get(&a, p.borrower), "coord stats");
  *with = cpu_over(seconds);
  ok(swiftkv_coord_stats_get(&b, p.borrower), "coord stats");
  end_pair(p);
  *beats = static_cast<double>(b.heartbeats_answered - a.heartbeats_answered) / seconds;
}

HeartbeatRow heartbeat_row(uint32_t period_ms, uint64_t leases, double seconds, int reps) {
  std::vector<double> net, idle, beats;
  for (int r = 0; r <= reps; ++r) {  // r 0 warms up
    double w = 0, i = 0, b = 0;
    heartbeat_rep(period_ms, leases, seconds, &w, &i, &b);
    if (r == 0) continue;
    net.push_back(w - i);
    idle.push_back(i);
    beats.push_back(b);
  }
  std::sort(net.begin(), net.end());
  std::sort(idle.begin(), idle.end());
  std::sort(beats.begin(), beats.end());
  HeartbeatRow h;
  h.period_ms = period_ms;
  h.leases = leases;
  h.cpu_ms_per_s = net[net.size() / 2];
  h.cpu_ms_per_s_min = net.front();
  h.idle_ms_per_s = idle[idle.size() / 2];
  h.heartbeats_per_s = beats[beats.size() / 2];
  h.us_per_heartbeat = h.heartbeats_per_s > 0 ? h.cpu_ms_per_s * 1e3 / h.heartbeats_per_s : 0;
  return h;
}

}  // namespace

int main(int argc, char **argv) {
  bool quick = false, beats_only = false, reclaims_only = false;
  int reps = 5;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
      reps = 1;
    } else if (std::strcmp(argv[i], "--heartbeats") == 0) {
      beats_only = true;
    } else if (std::strcmp(argv[i], "--reclaims") == 0) {
      reclaims_only = true;
    } else if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
      if (reps < 1) {
        std::fprintf(stderr, "bench_coord: --reps must be at least 1\n");
        return 2;
      }
    } else {
      std::fprintf(stderr, "usage: bench_coord [--quick] [--heartbeats|--reclaims] [--reps N]\n");
      return 2;
    }
  }
  setenv("SWIFTKV_LOG", "off", 0);
  const std::vector<uint64_t> sizes =
      quick ? std::vector<uint64_t>{0, 4} : std::vector<uint64_t>{0, 1, 4, 16, 64, 256};
  std::printf(
      "reclaim: request to ack against chunks to evacuate (%.0f MiB a chunk), median/min "
      "over %d repetitions\n",
      static_cast<double>(kChunkBytes) / (1 << 20), reps);
  std::printf("%8s %17s %10s %12s %12s\n", "chunks", "ack ms", "settle ms", "memcpy ms",
              "evac GB/s");
  struct Reclaim {
    ReclaimRow med;
    double ack_min_ms;
  };
  std::vector<Reclaim> rr;
  for (uint64_t n : sizes) {
    if (beats_only) break;
    std::vector<ReclaimRow> runs;
    for (int r = 0; r <= reps; ++r) {
      const ReclaimRow row = reclaim_once(n);
      if (r > 0) runs.push_back(row);  // r 0 warms up
    }
    std::sort(runs.begin(), runs.end(),
              [](const ReclaimRow &x, const ReclaimRow &y) { return x.ack_ms < y.ack_ms; });
    const ReclaimRow &m = runs[runs.size() / 2];
    rr.push_back(Reclaim{m, runs.front().ack_ms});
    const double gbs = m.ack_ms > 0 ? static_cast<double>(n * kChunkBytes) / (m.ack_ms * 1e6) : 0;
    std::printf("%8llu %8.3f/%8.3f %10.3f %12.3f %12.2f\n", static_cast<unsigned long long>(n),
                m.ack_ms, runs.front().ack_ms, m.settle_ms, m.memcpy_ms, gbs);
  }
  std::printf(
      "\nheartbeats: CPU time of both contexts less the idle baseline (the same contexts, "
      "region offered, nothing borrowed) measured before it in each repetition\n");
  std::printf("%10s %8s %18s %12s %12s %14s\n", "period ms", "leases", "cpu ms/s med/min",
              "idle ms/s", "beats/s", "cpu us/beat");
  std::vector<HeartbeatRow> hr;
  const double secs = quick ? 0.2 : 1.0;
  for (uint32_t period : {1u, 10u, 100u}) {
    if (reclaims_only) break;
    for (uint64_t leases : {uint64_t{1}, uint64_t{64}}) {
      if (quick && (period != 10 || leases == 64)) continue;
      const HeartbeatRow h = heartbeat_row(period, leases, secs, reps);
      hr.push_back(h);
      std::printf("%10u %8llu %9.3f/%8.3f %12.3f %12.1f %14.2f\n", h.period_ms,
                  static_cast<unsigned long long>(h.leases), h.cpu_ms_per_s, h.cpu_ms_per_s_min,
                  h.idle_ms_per_s, h.heartbeats_per_s, h.us_per_heartbeat);
    }
  }
  std::printf("{\"bench\":\"coord\",\"chunk_bytes\":%llu,\"reps\":%d,\"reclaim\":[",
              static_cast<unsigned long long>(kChunkBytes), reps);
  for (size_t i = 0; i < rr.size(); ++i) {
    std::printf(
        "%s{\"chunks\":%llu,\"ack_ms\":%.4f,\"ack_min_ms\":%.4f,\"settle_ms\":%.4f,"
        "\"memcpy_ms\":%.4f}",
        i ? "," : "", static_cast<unsigned long long>(rr[i].med.chunks), rr[i].med.ack_ms,
        rr[i].ack_min_ms, rr[i].med.settle_ms, rr[i].med.memcpy_ms);
  }
  std::printf("],\"heartbeat\":[");
  for (size_t i = 0; i < hr.size(); ++i) {
    std::printf(
        "%s{\"period_ms\":%u,\"leases\":%llu,\"cpu_ms_per_s\":%.4f,"
        "\"cpu_ms_per_s_min\":%.4f,\"idle_ms_per_s\":%.4f,\"beats_per_s\":%.2f}",
        i ? "," : "", hr[i].period_ms, static_cast<unsigned long long>(hr[i].leases),
        hr[i].cpu_ms_per_s, hr[i].cpu_ms_per_s_min, hr[i].idle_ms_per_s, hr[i].heartbeats_per_s);
  }
  std::printf("]}\n");
  return 0;
}
