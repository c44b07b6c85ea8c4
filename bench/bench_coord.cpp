// bench_coord: the coordinator's costs, through the public API, with the lender and the borrower
// in two contexts talking over an ipc:// endpoint (the same protocol as between processes).
//   1. Reclaim latency against the chunks to evacuate: the borrower fills a lease with N chunks,
//      the lender grows over it and waits (swiftkv_elastic_wait_reclaims), and the time from the
//      reclaim request to the borrower's ack is read from the lender's coordinator (the borrower
//      copies the chunks to host meanwhile), beside a memcpy of the same bytes in the same
//      repetition. Median and min over --reps after a warm-up. The reclaim comes once the
//      borrower has settled (held its lease 300 ms: its host tier makes the room an evacuation
//      takes in the background, as a lease is borrowed), and, alternating with it, right after
//      the borrow and the stores (unsettled: that room is still being made).
//   2. Heartbeat overhead: the CPU time both contexts spend per second with L leases held while
//      the borrower heartbeats every 1 or 10 ms (--periods for others), less the same with the same
//      leases held and no heartbeat in the window (the borrower's coord_heartbeat_ms a minute),
//      measured just before in the same repetition: what holding leases costs (the cache's
//      maintenance of them) is in both, so the difference is the heartbeats'. The lender keeps its
//      default heartbeat (100 ms); leases last 10 minutes, so the period is the borrower's own.
//      Heartbeats through the beat page (the default on one host) and, in the same repetition,
//      as messages (SWIFTKV_COORD_HEARTBEAT=message, as over UCX). Beside them, what the least
//      exchanges cost: a bare ZeroMQ request and answer of a heartbeat's sizes between two
//      contexts at the same period, the same over a Unix seqpacket socket pair with nothing
//      between the two threads, and one thread's bare timer wake-up (poll with a timeout and
//      nothing to poll: the least a beat that wakes a thread can cost); these three once a
//      repetition for all lease counts of a period, as they hold no lease.
//      At a 100 ms period the beat page's few beats a second are within the baseline's spread
//      (docs/coordinator.md), so the 10 ms rows bound a beat's cost and the default run leaves
//      it out: about two minutes, within a GPU validation run's share.
// Prints a table and a JSON line. --quick: a small run for the test suite; --heartbeats: only
// the second part; --reclaims: only the first; --periods 1,10,100: the heartbeat periods in ms;
// --leases 1,64: the lease counts of the second part; --reps N.
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "swiftkv/swiftkv.h"

#include <zmq.h>

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

// The borrower heartbeats every heartbeat_ms; leases last lease_ms (0: the default).
Pair make_pair(uint64_t units, uint32_t heartbeat_ms, uint64_t host_bytes, uint64_t lease_ms = 0) {
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
  if (lease_ms != 0) ec.lease_ms = lease_ms;
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

// The design's bars: the borrower evacuates at >= 50% of memcpy's speed; a heartbeat costs
// <= 50 us of CPU.
constexpr double kEvacuateBar = 0.5;
constexpr double kHeartbeatBarUs = 50;

struct ReclaimRow {
  uint64_t chunks;
  double ack_ms;     // request to ack, from the lender's coordinator
  double settle_ms;  // scale_for_request to all blocks ready, seen by the lender
  double memcpy_ms;  // the same bytes copied once, for scale
  // A reclaim with chunks to evacuate is within the bar (one with none has no bytes to time).
  bool meets() const { return chunks == 0 || memcpy_ms >= kEvacuateBar * ack_ms; }
};

ReclaimRow reclaim_once(uint64_t chunks, bool settled) {
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
  // A settled borrower has held its lease for a while: its host tier has made the room an
  // evacuation takes (in the background, as a lease is borrowed). Unsettled: the reclaim comes
  // right after the borrow and the stores, while that room is still being made.
  if (settled) std::this_thread::sleep_for(std::chrono::milliseconds(300));
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
  double cpu_ms_per_s = 0, cpu_ms_per_s_min = 0;  // both contexts, less the baseline
  double idle_ms_per_s = 0;  // the baseline itself, leases held and no heartbeat (median)
  double heartbeats_per_s = 0;
  double answered_per_s = 0;    // beats the lender answered (it reads the page at its own scan)
  double us_per_heartbeat = 0;  // CPU time per heartbeat and its answer, both sides
  double message_heartbeats_per_s = 0;
  double message_us_per_heartbeat = 0;  // the same with heartbeats as messages
  double round_trip_us = 0;       // a bare ZeroMQ request and answer of the same sizes (median)
  double unix_round_trip_us = 0;  // the same over a Unix socket pair (median)
  double wakeup_us = 0;           // one thread's bare timer wake-up (median)
  bool meets() const { return us_per_heartbeat <= kHeartbeatBarUs; }
};

// CPU ms per second of this process over `seconds` while it sleeps.
double cpu_over(double seconds) {
  const double c0 = cpu_seconds();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  return (cpu_seconds() - c0) * 1e3 / seconds;
}

// CPU ms/s of both contexts over `seconds` with `leases` leases held, the borrower heartbeating
// every period_ms through the beat page or as messages; and its heartbeats sent and answered
// per second.
double held_cpu(uint32_t period_ms, uint64_t leases, bool page, double seconds, double *sent,
                double *answered) {
  setenv("SWIFTKV_COORD_HEARTBEAT", page ? "page" : "message", 1);  // read as contexts are made
  Pair p = make_pair(leases, period_ms, 64 << 20, 600'000);
  unsetenv("SWIFTKV_COORD_HEARTBEAT");
  for (uint64_t i = 0; i < leases; ++i) {
    uint64_t lease = 0;
    ok(swiftkv_borrow_remote(&lease, p.borrower, p.model, p.endpoint.c_str(), "bench", 1),
       "borrow");
  }
  // Settled: the host tier has made the room the leases' evacuation would take (once, as they
  // are borrowed), so what is measured is holding the leases and heartbeating.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  swiftkv_coord_stats a = SWIFTKV_COORD_STATS_INIT, b = SWIFTKV_COORD_STATS_INIT;
  ok(swiftkv_coord_stats_get(&a, p.borrower), "coord stats");
  const double cpu = cpu_over(seconds);
  ok(swiftkv_coord_stats_get(&b, p.borrower), "coord stats");
  end_pair(p);
  *sent = static_cast<double>(b.heartbeats_sent - a.heartbeats_sent) / seconds;
  *answered = static_cast<double>(b.heartbeats_answered - a.heartbeats_answered) / seconds;
  return cpu;
}

// CPU us per round trip of `trip` (one request and its answer) made every period_ms for
// `seconds`, less the idle baseline measured just before; `wait(ms)` waits as the caller's side
// would between requests.
template <class Trip, class Wait>
double paced_round_trips_us(uint32_t period_ms, double seconds, Trip trip, Wait wait) {
  const double idle = cpu_over(seconds);
  const double c0 = cpu_seconds();
  const auto start = Clock::now();
  const auto period = std::chrono::milliseconds(period_ms);
  uint64_t trips = 0;
  for (auto next = start; Clock::now() - start < std::chrono::duration<double>(seconds);) {
    trip();
    ++trips;
    next += period;
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(next - Clock::now());
    if (ms.count() > 0) wait(ms.count());
  }
  const double cpu_ms = (cpu_seconds() - c0) * 1e3;
  const double secs = std::chrono::duration<double>(Clock::now() - start).count();
  return trips == 0 ? 0 : (cpu_ms - idle * secs) * 1e3 / static_cast<double>(trips);
}

// What a heartbeat is at least: one small request and its answer (46 and 63 bytes, a heartbeat
// and its ack) between a DEALER and a ROUTER in two ZeroMQ contexts over ipc://, as between two
// coordinators, each side waiting in zmq_poll, the request sent every period_ms. CPU us per round
// trip, less the idle baseline (the answering thread polling, nothing sent) measured before it.
double zmq_round_trip_us(uint32_t period_ms, double seconds) {
  static int n = 0;
  const std::string ep =
      "ipc:///tmp/swiftkv-bench-zmq-" + std::to_string(::getpid()) + "-" + std::to_string(n++);
  void *sctx = zmq_ctx_new(), *cctx = zmq_ctx_new();
  void *router = zmq_socket(sctx, ZMQ_ROUTER), *dealer = zmq_socket(cctx, ZMQ_DEALER);
  if (zmq_bind(router, ep.c_str()) != 0 || zmq_connect(dealer, ep.c_str()) != 0) {
    die("zmq baseline sockets");
  }
  std::atomic<bool> stop{false};
  std::thread answer([&] {
    char id[256], msg[256], ack[63] = {};
    while (!stop.load()) {
      zmq_pollitem_t item{router, 0, ZMQ_POLLIN, 0};
      if (zmq_poll(&item, 1, 50) <= 0) continue;
      const int idn = zmq_recv(router, id, sizeof id, 0);
      if (idn < 0 || zmq_recv(router, msg, sizeof msg, 0) < 0) continue;
      zmq_send(router, id, static_cast<size_t>(idn), ZMQ_SNDMORE);
      zmq_send(router, ack, sizeof ack, 0);
    }
  });
  char beat[46] = {}, reply[256];
  zmq_send(dealer, beat, sizeof beat, 0);  // connects, and warms both sides
  zmq_recv(dealer, reply, sizeof reply, 0);
  const double us = paced_round_trips_us(
      period_ms, seconds,
      [&] {
        zmq_send(dealer, beat, sizeof beat, 0);
        zmq_recv(dealer, reply, sizeof reply, 0);
      },
      [&](long ms) {
        zmq_pollitem_t item{dealer, 0, ZMQ_POLLIN, 0};
        zmq_poll(&item, 1, ms);
      });
  stop = true;
  answer.join();
  zmq_close(dealer);
  zmq_close(router);
  zmq_ctx_term(cctx);
  zmq_ctx_term(sctx);
  return us;
}

// The same request and answer over a Unix SOCK_SEQPACKET socket pair, each thread waiting in
// poll: no library between them, so what a round trip costs in system calls and wake-ups alone.
double unix_round_trip_us(uint32_t period_ms, double seconds) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) != 0) die("socketpair");
  std::thread answer([&] {
    char msg[256], ack[63] = {};
    for (;;) {
      pollfd p{sv[1], POLLIN, 0};
      if (poll(&p, 1, -1) <= 0) continue;
      if (recv(sv[1], msg, sizeof msg, 0) <= 0) return;  // the pair closed: done
      if (send(sv[1], ack, sizeof ack, 0) < 0) return;
    }
  });
  char beat[46] = {}, reply[256];
  if (send(sv[0], beat, sizeof beat, 0) < 0 || recv(sv[0], reply, sizeof reply, 0) < 0) {
    die("socket pair round trip");
  }
  const double us = paced_round_trips_us(
      period_ms, seconds,
      [&] {
        pollfd p{sv[0], POLLIN, 0};
        if (send(sv[0], beat, sizeof beat, 0) < 0 || poll(&p, 1, -1) <= 0 ||
            recv(sv[0], reply, sizeof reply, 0) < 0) {
          die("socket pair round trip");
        }
      },
      [](long ms) { poll(nullptr, 0, static_cast<int>(ms)); });
  shutdown(sv[0], SHUT_RDWR);
  answer.join();
  close(sv[0]);
  close(sv[1]);
  return us;
}

// One thread waking from poll every period_ms with nothing to poll: CPU us per wake-up, less the
// idle baseline. No beat that needs a thread to wake can cost less.
double timer_wakeup_us(uint32_t period_ms, double seconds) {
  return paced_round_trips_us(
      period_ms, seconds, [] {}, [](long ms) { poll(nullptr, 0, static_cast<int>(ms)); });
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The rows of one heartbeat period, one for each lease count. Each repetition measures, for each
// lease count, the baseline (no heartbeat in the window) just before the beat page and the
// messages; then the bare exchanges once, as they do not depend on the leases held.
std::vector<HeartbeatRow> heartbeat_rows(uint32_t period_ms, const std::vector<uint64_t> &leases,
                                         double seconds, int reps) {
  struct Samples {
    std::vector<double> net, idle, beats, answered, msg_net, msg_beats;
  };
  std::vector<Samples> s(leases.size());
  std::vector<double> trip, unix_trip, wake;
  for (int r = 0; r <= reps; ++r) {  // r 0 warms up, briefly; the baselines alternate
    const double window = r == 0 ? std::min(seconds, 0.2) : seconds;
    for (size_t l = 0; l < leases.size(); ++l) {
      double b = 0, a = 0, mb = 0, ma = 0, nb = 0, na = 0;
      const double i = held_cpu(60'000, leases[l], true, window, &nb, &na);  // no heartbeat
      const double w = held_cpu(period_ms, leases[l], true, window, &b, &a);
      const double mw = held_cpu(period_ms, leases[l], false, window, &mb, &ma);
      if (r == 0) continue;
      s[l].net.push_back(w - i);
      s[l].idle.push_back(i);
      s[l].beats.push_back(b);
      s[l].answered.push_back(a);
      s[l].msg_net.push_back(mw - i);
      s[l].msg_beats.push_back(mb);
    }
    const double t = zmq_round_trip_us(period_ms, window);
    const double u = unix_round_trip_us(period_ms, window);
    const double k = timer_wakeup_us(period_ms, window);
    if (r == 0) continue;
    trip.push_back(t);
    unix_trip.push_back(u);
    wake.push_back(k);
  }
  std::vector<HeartbeatRow> rows;
  for (size_t l = 0; l < leases.size(); ++l) {
    HeartbeatRow h;
    h.period_ms = period_ms;
    h.leases = leases[l];
    h.cpu_ms_per_s = median(s[l].net);
    h.cpu_ms_per_s_min = *std::min_element(s[l].net.begin(), s[l].net.end());
    h.idle_ms_per_s = median(s[l].idle);
    h.heartbeats_per_s = median(s[l].beats);
    h.answered_per_s = median(s[l].answered);
    h.us_per_heartbeat = h.heartbeats_per_s > 0 ? h.cpu_ms_per_s * 1e3 / h.heartbeats_per_s : 0;
    h.message_heartbeats_per_s = median(s[l].msg_beats);
    h.message_us_per_heartbeat = h.message_heartbeats_per_s > 0
                                     ? median(s[l].msg_net) * 1e3 / h.message_heartbeats_per_s
                                     : 0;
    h.round_trip_us = median(trip);
    h.unix_round_trip_us = median(unix_trip);
    h.wakeup_us = median(wake);
    rows.push_back(h);
  }
  return rows;
}

// "1,10,100" as numbers from 1 to `most`; false if it is not such a list.
template <typename T>
bool parse_list(const char *text, unsigned long most, std::vector<T> *out) {
  out->clear();
  for (const char *p = text;;) {
    if (*p < '0' || *p > '9') return false;
    char *end = nullptr;
    const unsigned long v = std::strtoul(p, &end, 10);
    if (end == p || v < 1 || v > most || (*end != ',' && *end != '\0')) return false;
    out->push_back(static_cast<T>(v));
    if (*end == '\0') return true;
    p = end + 1;
  }
}

}  // namespace

int main(int argc, char **argv) {
  bool quick = false, beats_only = false, reclaims_only = false;
  int reps = 5;
  std::vector<uint32_t> periods{1, 10};
  std::vector<uint64_t> lease_counts{1, 64};
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
      reps = 1;
    } else if (std::strcmp(argv[i], "--heartbeats") == 0) {
      beats_only = true;
    } else if (std::strcmp(argv[i], "--reclaims") == 0) {
      reclaims_only = true;
    } else if (std::strcmp(argv[i], "--periods") == 0 && i + 1 < argc) {
      if (!parse_list(argv[++i], 60'000, &periods)) {
        std::fprintf(stderr, "bench_coord: --periods takes periods in ms, 1 to 60000: 1,10,100\n");
        return 2;
      }
    } else if (std::strcmp(argv[i], "--leases") == 0 && i + 1 < argc) {
      // A lender grants one borrower at most 1024 leases (what a heartbeat message names).
      if (!parse_list(argv[++i], 1024, &lease_counts)) {
        std::fprintf(stderr, "bench_coord: --leases takes lease counts, 1 to 1024: 1,64,256\n");
        return 2;
      }
    } else if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
      if (reps < 1) {
        std::fprintf(stderr, "bench_coord: --reps must be at least 1\n");
        return 2;
      }
    } else {
      std::fprintf(stderr,
                   "usage: bench_coord [--quick] [--heartbeats|--reclaims] [--periods MS,...] "
                   "[--leases N,...] [--reps N]\n");
      return 2;
    }
  }
  setenv("SWIFTKV_LOG", "off", 0);
  const std::vector<uint64_t> sizes =
      quick ? std::vector<uint64_t>{0, 4} : std::vector<uint64_t>{0, 1, 4, 16, 64, 256};
  if (!beats_only) {  // the headings of the parts that run
    std::printf(
        "reclaim: request to ack against chunks to evacuate (%.0f MiB a chunk), median/min "
        "over %d repetitions\n",
        static_cast<double>(kChunkBytes) / (1 << 20), reps);
    std::printf("%8s %17s %10s %12s %12s %10s %18s %7s\n", "chunks", "ack ms", "settle ms",
                "memcpy ms", "evac GB/s", "memcpy/ack", "unsettled ack ms", "bar");
  }
  struct Reclaim {
    ReclaimRow med;
    double ack_min_ms;
    double unsettled_ms;  // median, the reclaim right after the borrow
  };
  std::vector<Reclaim> rr;
  for (uint64_t n : sizes) {
    if (beats_only) break;
    std::vector<ReclaimRow> runs;
    std::vector<double> unsettled;
    for (int r = 0; r <= reps; ++r) {  // r 0 warms up; settled and unsettled alternate
      const ReclaimRow row = reclaim_once(n, true);
      const ReclaimRow cold = reclaim_once(n, false);
      if (r == 0) continue;
      runs.push_back(row);
      unsettled.push_back(cold.ack_ms);
    }
    std::sort(runs.begin(), runs.end(),
              [](const ReclaimRow &x, const ReclaimRow &y) { return x.ack_ms < y.ack_ms; });
    std::sort(unsettled.begin(), unsettled.end());
    const ReclaimRow &m = runs[runs.size() / 2];
    rr.push_back(Reclaim{m, runs.front().ack_ms, unsettled[unsettled.size() / 2]});
    const double gbs = m.ack_ms > 0 ? static_cast<double>(n * kChunkBytes) / (m.ack_ms * 1e6) : 0;
    std::printf("%8llu %8.3f/%8.3f %10.3f %12.3f %12.2f %10.2f %18.3f %7s\n",
                static_cast<unsigned long long>(n), m.ack_ms, runs.front().ack_ms, m.settle_ms,
                m.memcpy_ms, gbs, m.ack_ms > 0 ? m.memcpy_ms / m.ack_ms : 0, rr.back().unsettled_ms,
                n == 0      ? "-"
                : m.meets() ? "met"
                            : "MISSED");
  }
  if (!reclaims_only) {
    std::printf(
        "\nheartbeats: CPU time of both contexts less the same contexts holding the same leases "
        "with no heartbeat, measured before it in each repetition; through the beat page, then as "
        "messages\n");
    std::printf("%10s %8s %18s %10s %9s %9s %12s %12s %11s %11s %11s %11s %7s\n", "period ms",
                "leases", "cpu ms/s med/min", "held ms/s", "beats/s", "answered", "cpu us/beat",
                "msg us/beat", "msg beats/s", "zmq rt us", "unix rt us", "wake-up us", "bar");
  }
  std::vector<HeartbeatRow> hr;
  if (quick) periods = {10};
  for (uint32_t period : periods) {
    if (reclaims_only) break;
    // Windows of at least 10 heartbeats and half a second.
    const double secs = quick ? 0.2 : std::max(0.5, 10 * period / 1000.0);
    const std::vector<uint64_t> leases = quick ? std::vector<uint64_t>{1} : lease_counts;
    for (const HeartbeatRow &h : heartbeat_rows(period, leases, secs, reps)) {
      hr.push_back(h);
      std::printf(
          "%10u %8llu %9.3f/%8.3f %10.3f %9.1f %9.1f %12.2f %12.2f %11.1f %11.2f %11.2f %11.2f "
          "%7s\n",
          h.period_ms, static_cast<unsigned long long>(h.leases), h.cpu_ms_per_s,
          h.cpu_ms_per_s_min, h.idle_ms_per_s, h.heartbeats_per_s, h.answered_per_s,
          h.us_per_heartbeat, h.message_us_per_heartbeat, h.message_heartbeats_per_s,
          h.round_trip_us, h.unix_round_trip_us, h.wakeup_us, h.meets() ? "met" : "MISSED");
    }
  }
  std::printf("{\"bench\":\"coord\",\"chunk_bytes\":%llu,\"reps\":%d,\"reclaim\":[",
              static_cast<unsigned long long>(kChunkBytes), reps);
  for (size_t i = 0; i < rr.size(); ++i) {
    std::printf(
        "%s{\"chunks\":%llu,\"ack_ms\":%.4f,\"ack_min_ms\":%.4f,\"settle_ms\":%.4f,"
        "\"memcpy_ms\":%.4f,\"unsettled_ack_ms\":%.4f,\"meets_bar\":%s}",
        i ? "," : "", static_cast<unsigned long long>(rr[i].med.chunks), rr[i].med.ack_ms,
        rr[i].ack_min_ms, rr[i].med.settle_ms, rr[i].med.memcpy_ms, rr[i].unsettled_ms,
        rr[i].med.meets() ? "true" : "false");
  }
  std::printf("],\"heartbeat\":[");
  for (size_t i = 0; i < hr.size(); ++i) {
    std::printf(
        "%s{\"period_ms\":%u,\"leases\":%llu,\"cpu_ms_per_s\":%.4f,"
        "\"cpu_ms_per_s_min\":%.4f,\"held_ms_per_s\":%.4f,\"beats_per_s\":%.2f,"
        "\"answered_per_s\":%.2f,"
        "\"us_per_beat\":%.2f,\"message_beats_per_s\":%.2f,\"message_us_per_beat\":%.2f,"
        "\"zmq_round_trip_us\":%.2f,\"unix_round_trip_us\":%.2f,\"wakeup_us\":%.2f,"
        "\"meets_bar\":%s}",
        i ? "," : "", hr[i].period_ms, static_cast<unsigned long long>(hr[i].leases),
        hr[i].cpu_ms_per_s, hr[i].cpu_ms_per_s_min, hr[i].idle_ms_per_s, hr[i].heartbeats_per_s,
        hr[i].answered_per_s, hr[i].us_per_heartbeat, hr[i].message_heartbeats_per_s,
        hr[i].message_us_per_heartbeat, hr[i].round_trip_us, hr[i].unix_round_trip_us,
        hr[i].wakeup_us, hr[i].meets() ? "true" : "false");
  }
  std::printf("]}\n");
  return 0;
}
