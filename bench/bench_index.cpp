// bench_index: the cost per chunk of the chunk index and of the cache around it, at 1K to 1M
// resident chunks.
//  - The index alone: a store's work (look the run's keys up, insert the absent ones), lookups of
//    present and absent keys in runs of a prompt's 64 chunks, a lone lookup, and drop.
//  - Through the public API (keys hashed, 64-byte chunks so the copy is small): store into a
//    cache with room, and lookup.
//  - Store into a full host tier (every chunk stored evicts one, LRU and retention), beside the
//    same stores into a tier with room (its slabs made before: a store, not the tier's growth,
//    which bench_transfer measures), interleaved repetition by repetition in one run. The full
//    tier is timed after it turned over kTurnovers times (as many chunks stored as it holds,
//    each time): a full tier's stores take their victims' places in memory, and under retention
//    the first turnover, whose victims lie as the fill laid them, is not what a tier that has
//    run for a while costs (it cost 10-20% less before slabs were on huge pages). With the
//    context switches of the whole process per chunk stored (every thread of the library
//    counts: one woken per store shows here). Each row is checked against the design's bar:
//    at most 1 us per chunk and 1.5 times a store with room.
//  - The index rows at a million chunks read against the design's bar for lookup, allocate and
//    free (100 ns a chunk): lookups in runs (hit, miss) and through the API, the index's part of
//    a store (check_insert) and a store through the API, and drop. A lone lookup is shown without
//    a verdict: it is a cache miss for its slot and another for its node, nothing to overlap.
//  - XXH3-128 chunk-key hashing beside memcpy of the same bytes.
// Every figure is the median and the min over --reps repetitions after a warm-up. Prints a
// table and a JSON line. Links the core for the index.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/index/chunk_index.hpp"
#include "core/index/chunk_key.hpp"
#include "swiftkv/swiftkv.h"

namespace {

using Clock = std::chrono::steady_clock;

double ns_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
}

// Context switches of the whole process so far, voluntary and not (every thread's).
uint64_t context_switches() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<uint64_t>(u.ru_nvcsw) + static_cast<uint64_t>(u.ru_nivcsw);
}

// The design's bar for a store into a full tier: per chunk, and against a store with room.
constexpr double kFullBarNs = 1000;
constexpr double kFullBarRatio = 1.5;
// The design's bar for lookup, allocate and free: per chunk, at a million resident chunks.
constexpr double kIndexBarNs = 100;
constexpr uint64_t kIndexBarChunks = uint64_t{1} << 20;

// Median and min of a figure over repetitions.
struct Stat {
  double med = 0, min = 0;
};
Stat stat_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return Stat{v[v.size() / 2], v.front()};
}

[[noreturn]] void die(const char *what) {
  std::fprintf(stderr, "bench_index: %s: %s\n", what, swiftkv_last_error_message());
  std::exit(1);
}

constexpr size_t kRun = 64;    // a prompt's chunks
constexpr size_t kAhead = 16;  // how far a run's keys are fetched ahead
constexpr uint32_t kChunkTokens = 16;
constexpr uint64_t kChunkBytes = 64;  // 1 layer, 1 head of 1 dim, f16, 16 tokens

struct IndexRow {
  uint64_t chunks;
  Stat insert, hit, miss, single_hit, drop;
};

// One repetition on a fresh index reserved for n chunks, as the cache reserves it.
void index_rep(uint64_t n, std::mt19937_64 &rng, std::vector<double> *out) {
  std::vector<swiftkv::ChunkKey> keys(n), absent(n);
  for (auto &k : keys) k = {rng(), rng()};
  for (auto &k : absent) k = {rng(), rng()};
  swiftkv::ChunkIndex index;
  index.reserve(n);
  const swiftkv::ChunkMeta meta{{1, 2}, 0, 256, 1 << 20};
  std::vector<std::optional<swiftkv::Tier>> tiers(kRun);
  // An insert as a store makes it: the run's keys are looked up first (touch_many, which
  // fetches their slots), then the absent ones are inserted.
  auto t0 = Clock::now();
  for (uint64_t i = 0; i < n; i += kRun) {
    const size_t len = std::min<uint64_t>(kRun, n - i);
    index.touch_many(std::span<const swiftkv::ChunkKey>(keys.data() + i, len), i, tiers.data());
    for (size_t j = 0; j < len; ++j) {
      if (!tiers[j]) index.insert(keys[i + j], meta, {swiftkv::Tier::host, i + j}, i);
    }
  }
  out[0].push_back(ns_since(t0) / static_cast<double>(n));
  std::vector<swiftkv::ChunkKey> order = keys;
  std::shuffle(order.begin(), order.end(), rng);
  uint64_t found = 0;
  auto run_lookups = [&](const std::vector<swiftkv::ChunkKey> &ks) {
    for (size_t i = 0; i < ks.size(); i += kRun) {
      const size_t len = std::min<size_t>(kRun, ks.size() - i);
      index.touch_many(std::span<const swiftkv::ChunkKey>(ks.data() + i, len), n, tiers.data());
      for (size_t j = 0; j < len; ++j) found += tiers[j].has_value();
    }
  };
  t0 = Clock::now();
  run_lookups(order);
  out[1].push_back(ns_since(t0) / static_cast<double>(n));
  t0 = Clock::now();
  run_lookups(absent);
  out[2].push_back(ns_since(t0) / static_cast<double>(n));
  t0 = Clock::now();
  for (const auto &k : order) found += index.touch(k, n + 1).has_value();
  out[3].push_back(ns_since(t0) / static_cast<double>(n));
  if (found != 2 * n) {
    std::fprintf(stderr, "bench_index: %llu of %llu keys found\n",
                 static_cast<unsigned long long>(found), static_cast<unsigned long long>(2 * n));
    std::exit(1);
  }
  std::vector<swiftkv::SlotRef> to_free;
  t0 = Clock::now();
  for (size_t i = 0; i < order.size(); ++i) {
    if (i % kRun == 0) {
      for (size_t j = i; j < std::min<size_t>(i + kAhead, n); ++j) index.prefetch(order[j]);
    }
    if (i % kRun + kAhead < kRun && i + kAhead < n) index.prefetch(order[i + kAhead]);
    to_free.clear();
    index.drop(order[i], true, std::nullopt, to_free);
  }
  out[4].push_back(ns_since(t0) / static_cast<double>(n));
}

IndexRow measure_index(uint64_t n, int reps, std::mt19937_64 &rng) {
  std::vector<double> v[5];
  index_rep(std::min<uint64_t>(n, 4096), rng, v);  // warm-up
  for (auto &x : v) x.clear();
  for (int r = 0; r < reps; ++r) index_rep(n, rng, v);
  return IndexRow{n, stat_of(v[0]), stat_of(v[1]), stat_of(v[2]), stat_of(v[3]), stat_of(v[4])};
}

// The context's recompute_attention_cost for the full-tier rows (--attention-cost): how many
// cost classes a prompt's 64 chunks span under retention (4 at the default of 1, 18 at 30).
double g_attention_cost = 1.0;

// A context whose host tier holds `capacity` chunks of the bench model, and its model.
struct Cache {
  swiftkv_ctx *ctx = nullptr;
  uint32_t model = 0;
  Cache(uint64_t capacity, swiftkv_eviction_policy policy) {
    swiftkv_ctx_config c = SWIFTKV_CTX_CONFIG_INIT;
    // Whole pages of whole chunks: the tier then holds exactly `capacity` chunks.
    c.host_budget_bytes = (capacity * kChunkBytes + 4095) / 4096 * 4096;
    c.demote_free_percent = 0;  // evict when a store needs room, on the storing thread
    c.eviction_policy = policy;
    c.recompute_attention_cost = g_attention_cost;
    swiftkv_model_desc d = SWIFTKV_MODEL_DESC_INIT;
    d.name = "bench";
    d.num_layers = 1;
    d.num_kv_heads = 1;
    d.head_dim = 1;
    d.block_tokens = kChunkTokens;
    d.chunk_tokens = kChunkTokens;
    swiftkv_model_config mc = SWIFTKV_MODEL_CONFIG_INIT;
    mc.desc = &d;
    if (swiftkv_ctx_create(&ctx, &c) != SWIFTKV_OK) die("ctx_create");
    if (swiftkv_model_register(&model, ctx, &mc) != SWIFTKV_OK) die("model_register");
  }
  ~Cache() { swiftkv_ctx_destroy(ctx); }
  Cache(const Cache &) = delete;
  Cache &operator=(const Cache &) = delete;

  // Stores prompts [first, first + count) of 64 chunks each; ns per chunk.
  double store(uint64_t first, uint64_t count) {
    std::vector<uint32_t> tokens(kRun * kChunkTokens);
    std::vector<unsigned char> kv(kRun * kChunkBytes, 0x5a);
    const auto t0 = Clock::now();
    for (uint64_t p = first; p < first + count; ++p) {
      for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(p * 7919 + i);
      uint64_t cached = 0;
      if (swiftkv_store(&cached, ctx, model, tokens.data(), tokens.size(), kv.data(), kv.size()) !=
          SWIFTKV_OK) {
        die("store");
      }
      if (cached != tokens.size()) die("a store did not fit");
    }
    return ns_since(t0) / static_cast<double>(count * kRun);
  }
  // Looks prompts [first, first + count) up, each wholly resident; ns per chunk.
  double lookup(uint64_t first, uint64_t count) {
    std::vector<uint32_t> tokens(kRun * kChunkTokens);
    const auto t0 = Clock::now();
    for (uint64_t p = first; p < first + count; ++p) {
      for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(p * 7919 + i);
      swiftkv_lookup_result l = SWIFTKV_LOOKUP_RESULT_INIT;
      if (swiftkv_lookup(&l, nullptr, 0, ctx, model, tokens.data(), tokens.size()) != SWIFTKV_OK) {
        die("lookup");
      }
      if (l.prefix_tokens != tokens.size()) die("a stored prompt is not resident");
    }
    return ns_since(t0) / static_cast<double>(count * kRun);
  }
  // Makes the tier's slabs for all of it, so that later stores find room without growing it
  // (growth is bench_transfer's row): fills it with throwaway prompts, then clears them prompt
  // by prompt in the order they were stored (slabs stay with the tier). Slots and the index's
  // nodes then come back in the order a tier's own use frees them, oldest first, as a full
  // tier's evictions free them; a clear in one call would free them in hash order.
  void make_slabs(uint64_t prompts) {
    const uint64_t first = uint64_t{1} << 30;
    store(first, prompts);
    std::vector<uint32_t> tokens(kRun * kChunkTokens);
    for (uint64_t p = first; p < first + prompts; ++p) {
      for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(p * 7919 + i);
      uint64_t cleared = 0;
      if (swiftkv_clear(&cleared, ctx, model, SWIFTKV_TIERS_ALL, tokens.data(), tokens.size()) !=
              SWIFTKV_OK ||
          cleared != kRun) {
        die("clear");
      }
    }
  }
  uint64_t evictions() const {
    swiftkv_stats s = SWIFTKV_STATS_INIT;
    if (swiftkv_stats_get(&s, ctx) != SWIFTKV_OK) die("stats_get");
    return s.evictions;
  }
};

struct ApiRow {
  uint64_t chunks;
  Stat store, lookup;
};

// Stores into a cache with room, then looks every prompt up, in halves per repetition so that
// each repetition stores new chunks: n/2 are resident first, and each rep adds n / (2 reps).
ApiRow measure_api(uint64_t n, int reps) {
  const uint64_t prompts = std::max<uint64_t>(2, n / kRun);
  Cache c(prompts * kRun + kRun, SWIFTKV_EVICT_LRU);
  uint64_t next = 0;
  const uint64_t base = prompts / 2;
  c.store(next, base);
  next += base;
  const uint64_t per_rep =
      std::max<uint64_t>(1, (prompts - base) / static_cast<uint64_t>(reps + 1));
  std::vector<double> st, lk;
  for (int r = 0; r <= reps; ++r) {  // rep 0 warms up
    const double s = c.store(next, per_rep);
    next += per_rep;
    // Lookups over every resident prompt, in a scattered order of prompt groups.
    const double l = c.lookup(0, next);
    if (r > 0) {
      st.push_back(s);
      lk.push_back(l);
    }
  }
  return ApiRow{next * kRun, stat_of(st), stat_of(lk)};
}

struct FullRow {
  uint64_t chunks;
  swiftkv_eviction_policy policy;
  Stat full, room;
  double full_switches, room_switches;  // context switches per chunk stored
  uint64_t evicted;
  bool meets() const { return full.med <= kFullBarNs && full.med <= kFullBarRatio * room.med; }
};

// Times the full tier after this many turnovers.
constexpr uint64_t kTurnovers = 3;

// Store into a full host tier of n chunks (each chunk evicts one) against the same stores into
// a tier with room, alternating repetition by repetition on this thread.
FullRow measure_full(uint64_t n, swiftkv_eviction_policy policy, int reps) {
  const uint64_t prompts = n / kRun;
  const uint64_t per_rep = std::max<uint64_t>(8, prompts / 8);
  const uint64_t room_prompts = prompts + per_rep * static_cast<uint64_t>(reps + 1);
  Cache full(prompts * kRun, policy);
  Cache room(room_prompts * kRun, policy);
  room.make_slabs(room_prompts);
  full.store(0, prompts);
  room.store(0, prompts);
  if (full.evictions() != 0) die("the full tier evicted while filling");
  full.store(prompts, kTurnovers * prompts);
  uint64_t next = prompts * (1 + kTurnovers);
  std::vector<double> f, r;
  uint64_t full_switches = 0, room_switches = 0;
  for (int i = 0; i <= reps; ++i) {  // rep 0 warms up
    const uint64_t c0 = context_switches();
    const double a = full.store(next, per_rep);
    const uint64_t c1 = context_switches();
    const double b = room.store(next, per_rep);
    const uint64_t c2 = context_switches();
    next += per_rep;
    if (i > 0) {
      f.push_back(a);
      r.push_back(b);
      full_switches += c1 - c0;
      room_switches += c2 - c1;
    }
  }
  const uint64_t evicted = full.evictions();
  if (evicted != (next - prompts) * kRun || room.evictions() != 0) die("eviction count");
  const auto stored = static_cast<double>(per_rep * kRun * static_cast<uint64_t>(reps));
  return FullRow{n,
                 policy,
                 stat_of(f),
                 stat_of(r),
                 static_cast<double>(full_switches) / stored,
                 static_cast<double>(room_switches) / stored,
                 evicted};
}

// Hashing 256-token chunks (1 KiB of token ids each) against memcpy of the same bytes.
void hash_vs_memcpy(int reps, Stat *hash_gbs, Stat *memcpy_gbs) {
  constexpr size_t kChunks = 16384, kTokens = 256;
  std::vector<uint32_t> tokens(kChunks * kTokens);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(i * 2654435761u);
  std::vector<uint32_t> copy(tokens.size());
  std::vector<swiftkv::ChunkKey> keys(kChunks);
  const swiftkv::ChunkKey fp{1, 2};
  const double bytes = static_cast<double>(tokens.size() * sizeof(uint32_t));
  std::vector<double> h, m;
  for (int rep = 0; rep <= reps; ++rep) {
    auto t0 = Clock::now();
    swiftkv::chunk_keys(keys.data(), fp, tokens.data(), tokens.size(), kTokens);
    const double th = ns_since(t0);
    t0 = Clock::now();
    std::memcpy(copy.data(), tokens.data(), static_cast<size_t>(bytes));
    const double tm = ns_since(t0);
    if (copy[static_cast<size_t>(rep)] != tokens[static_cast<size_t>(rep)] || keys[0] == keys[1]) {
      std::exit(1);
    }
    if (rep > 0) {
      h.push_back(bytes / th);
      m.push_back(bytes / tm);
    }
  }
  // GB/s: the median, and the best (a rate's best is its max: reported in `min` as the
  // repetition with the least time).
  std::sort(h.begin(), h.end());
  std::sort(m.begin(), m.end());
  *hash_gbs = Stat{h[h.size() / 2], h.back()};
  *memcpy_gbs = Stat{m[m.size() / 2], m.back()};
}

const char *policy_name(swiftkv_eviction_policy p) {
  return p == SWIFTKV_EVICT_LRU ? "lru" : "retention";
}

}  // namespace

int main(int argc, char **argv) {
  uint64_t max_chunks = uint64_t{1} << 20;
  uint64_t min_full_chunks = 16384;  // the smallest full-tier row
  int reps = 5;
  bool full_only = false;  // only the full-tier rows: to compare builds, or under a profiler
  for (int i = 1; i < argc; ++i) {
    char *end = nullptr;
    if (std::strcmp(argv[i], "--full-only") == 0) {
      full_only = true;
    } else if (std::strcmp(argv[i], "--min-full-chunks") == 0 && i + 1 < argc) {
      min_full_chunks = std::strtoull(argv[++i], &end, 10);
      if (*end != '\0' || min_full_chunks < 1024) {
        std::fprintf(stderr, "bench_index: --min-full-chunks needs a number >= 1024\n");
        return 2;
      }
    } else if (std::strcmp(argv[i], "--max-chunks") == 0 && i + 1 < argc) {
      max_chunks = std::strtoull(argv[++i], &end, 10);
      if (*end != '\0' || max_chunks < 1024) {
        std::fprintf(stderr, "bench_index: --max-chunks needs a number >= 1024\n");
        return 2;
      }
    } else if (std::strcmp(argv[i], "--attention-cost") == 0 && i + 1 < argc) {
      g_attention_cost = std::strtod(argv[++i], &end);
      if (*end != '\0' || !(g_attention_cost >= 0) || g_attention_cost > 1e6) {
        std::fprintf(stderr, "bench_index: --attention-cost needs a number from 0 to 1e6\n");
        return 2;
      }
    } else if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
      reps = static_cast<int>(std::strtol(argv[++i], &end, 10));
      if (*end != '\0' || reps < 1 || reps > 1000) {
        std::fprintf(stderr, "bench_index: --reps needs a number from 1 to 1000\n");
        return 2;
      }
    } else {
      std::fprintf(stderr,
                   "usage: bench_index [--max-chunks N] [--reps N] [--full-only] "
                   "[--min-full-chunks N] [--attention-cost X]\n");
      return 2;
    }
  }
  std::mt19937_64 rng(42);
  std::vector<IndexRow> index_rows;
  std::vector<ApiRow> api_rows;
  for (uint64_t n = 1024; !full_only && n <= max_chunks; n *= 4) {
    index_rows.push_back(measure_index(n, reps, rng));
    api_rows.push_back(measure_api(n, reps));
  }
  std::vector<FullRow> full_rows;
  for (uint64_t n = min_full_chunks; n <= max_chunks; n *= 4) {
    for (auto p : {SWIFTKV_EVICT_LRU, SWIFTKV_EVICT_RETENTION}) {
      full_rows.push_back(measure_full(n, p, reps));
    }
  }
  Stat hash_gbs, memcpy_gbs;
  if (!full_only) hash_vs_memcpy(reps, &hash_gbs, &memcpy_gbs);

  std::printf("ns per chunk, median/min over %d repetitions\n", reps);
  if (!full_only) {
    std::printf("%9s %13s %11s %11s %13s %11s | %9s %13s %13s\n", "chunks", "check_insert", "hit",
                "miss", "single_hit", "drop", "api_at", "api_store", "api_lookup");
  }
  for (size_t i = 0; i < index_rows.size(); ++i) {
    const IndexRow &r = index_rows[i];
    const ApiRow &a = api_rows[i];
    std::printf(
        "%9llu %6.1f/%6.1f %5.1f/%5.1f %5.1f/%5.1f %6.1f/%6.1f %5.1f/%5.1f | %9llu "
        "%6.1f/%6.1f %6.1f/%6.1f\n",
        static_cast<unsigned long long>(r.chunks), r.insert.med, r.insert.min, r.hit.med, r.hit.min,
        r.miss.med, r.miss.min, r.single_hit.med, r.single_hit.min, r.drop.med, r.drop.min,
        static_cast<unsigned long long>(a.chunks), a.store.med, a.store.min, a.lookup.med,
        a.lookup.min);
  }
  // The index rows against their bar, at the bar's size when this run measured it.
  struct IndexVerdict {
    const char *name;
    double ns;
    bool meets;
  };
  std::vector<IndexVerdict> index_verdicts;
  bool index_meets = true;
  for (size_t i = 0; i < index_rows.size(); ++i) {
    if (index_rows[i].chunks != kIndexBarChunks) continue;
    const IndexRow &r = index_rows[i];
    const ApiRow &a = api_rows[i];
    for (const auto &[name, ns] : {std::pair<const char *, double>{"check_insert", r.insert.med},
                                   {"hit", r.hit.med},
                                   {"miss", r.miss.med},
                                   {"drop", r.drop.med},
                                   {"api_store", a.store.med},
                                   {"api_lookup", a.lookup.med}}) {
      index_verdicts.push_back(IndexVerdict{name, ns, ns <= kIndexBarNs});
      index_meets &= ns <= kIndexBarNs;
    }
  }
  if (!full_only) {
    if (index_verdicts.empty()) {
      std::printf(
          "the design's bar for lookup, allocate and free (<= %.0f ns a chunk) is at %llu "
          "resident chunks: not measured here (--max-chunks)\n",
          kIndexBarNs, static_cast<unsigned long long>(kIndexBarChunks));
    } else {
      std::printf(
          "the design's bar at %llu resident chunks: lookup, allocate and free <= %.0f ns "
          "a chunk (medians; single_hit, a lone lookup, has none):\n",
          static_cast<unsigned long long>(kIndexBarChunks), kIndexBarNs);
      for (const IndexVerdict &v : index_verdicts) {
        std::printf("  %-12s %7.1f %7s\n", v.name, v.ns, v.meets ? "met" : "MISSED");
      }
      if (!index_meets) {
        std::printf("an index row MISSED the design's bar (%.0f ns a chunk at %llu chunks)\n",
                    kIndexBarNs, static_cast<unsigned long long>(kIndexBarChunks));
      }
    }
  }
  std::printf(
      "\nstore into a full host tier (each chunk evicts one; after %llu turnovers; attention "
      "cost %g) vs the same stores into a tier with room, ns per chunk, median/min; context "
      "switches per chunk; the bar: full <= %.0f ns and <= %.1fx room (medians)\n",
      static_cast<unsigned long long>(kTurnovers), g_attention_cost, kFullBarNs, kFullBarRatio);
  std::printf("%9s %10s %15s %15s %9s %9s %9s %7s\n", "chunks", "policy", "full", "room",
              "full/room", "csw_full", "csw_room", "bar");
  bool all_meet = true;
  for (const FullRow &r : full_rows) {
    all_meet &= r.meets();
    std::printf("%9llu %10s %7.1f/%7.1f %7.1f/%7.1f %9.2f %9.4f %9.4f %7s\n",
                static_cast<unsigned long long>(r.chunks), policy_name(r.policy), r.full.med,
                r.full.min, r.room.med, r.room.min, r.full.med / r.room.med, r.full_switches,
                r.room_switches, r.meets() ? "met" : "MISSED");
  }
  if (!all_meet) {
    std::printf("a full-tier row MISSED the design's bar (%.0f ns, %.1fx a store with room)\n",
                kFullBarNs, kFullBarRatio);
  }
  if (!full_only) {
    std::printf(
        "\nchunk-key hashing %.2f GB/s (best %.2f), memcpy of the same bytes %.2f GB/s "
        "(best %.2f): %.2fx\n",
        hash_gbs.med, hash_gbs.min, memcpy_gbs.med, memcpy_gbs.min, hash_gbs.med / memcpy_gbs.med);
  }

  auto js = [](const Stat &s) {
    char b[64];
    std::snprintf(b, sizeof b, "{\"median\":%.1f,\"min\":%.1f}", s.med, s.min);
    return std::string(b);
  };
  std::printf("{\"bench\":\"chunk_index\",\"reps\":%d,\"rows\":[", reps);
  for (size_t i = 0; i < index_rows.size(); ++i) {
    const IndexRow &r = index_rows[i];
    const ApiRow &a = api_rows[i];
    std::printf(
        "%s{\"chunks\":%llu,\"check_insert_ns\":%s,\"hit_ns\":%s,\"miss_ns\":%s,"
        "\"single_hit_ns\":%s,\"drop_ns\":%s,\"api_chunks\":%llu,\"api_store_ns\":%s,"
        "\"api_lookup_ns\":%s}",
        i ? "," : "", static_cast<unsigned long long>(r.chunks), js(r.insert).c_str(),
        js(r.hit).c_str(), js(r.miss).c_str(), js(r.single_hit).c_str(), js(r.drop).c_str(),
        static_cast<unsigned long long>(a.chunks), js(a.store).c_str(), js(a.lookup).c_str());
  }
  std::printf("],\"index_bar\":");
  if (index_verdicts.empty()) {
    std::printf("null");
  } else {
    std::printf("{\"chunks\":%llu,\"bar_ns\":%.0f,\"rows\":{",
                static_cast<unsigned long long>(kIndexBarChunks), kIndexBarNs);
    for (size_t i = 0; i < index_verdicts.size(); ++i) {
      std::printf("%s\"%s\":%s", i ? "," : "", index_verdicts[i].name,
                  index_verdicts[i].meets ? "true" : "false");
    }
    std::printf("},\"meets_bar\":%s}", index_meets ? "true" : "false");
  }
  std::printf(",\"attention_cost\":%g,\"full_tier\":[", g_attention_cost);
  for (size_t i = 0; i < full_rows.size(); ++i) {
    const FullRow &r = full_rows[i];
    std::printf(
        "%s{\"chunks\":%llu,\"policy\":\"%s\",\"full_ns\":%s,\"room_ns\":%s,"
        "\"full_switches_per_chunk\":%.4f,\"room_switches_per_chunk\":%.4f,"
        "\"evicted\":%llu,\"turnovers_before\":%llu,\"meets_bar\":%s}",
        i ? "," : "", static_cast<unsigned long long>(r.chunks), policy_name(r.policy),
        js(r.full).c_str(), js(r.room).c_str(), r.full_switches, r.room_switches,
        static_cast<unsigned long long>(r.evicted), static_cast<unsigned long long>(kTurnovers),
        r.meets() ? "true" : "false");
  }
  std::printf("]");
  if (!full_only) {
    std::printf(",\"hash_gbs\":%.2f,\"memcpy_gbs\":%.2f,\"hash_over_memcpy\":%.3f", hash_gbs.med,
                memcpy_gbs.med, hash_gbs.med / memcpy_gbs.med);
  }
  std::printf("}\n");
  return 0;
}
