// bench_index: the cost per chunk of the chunk index (insert, lookup hit and miss in runs of a
// prompt's 64 chunks, a lone lookup, drop) at 1K to 1M resident chunks, the same through the public API (swiftkv_store and swiftkv_lookup, chunk
// keys hashed on the way), and XXH3-128 chunk-key hashing throughput beside memcpy of the same
// bytes, all measured in one run. Prints a table and a JSON line. Links the core for the index.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/index/chunk_index.hpp"
#include "core/index/chunk_key.hpp"
#include "swiftkv/swiftkv.h"

namespace {

using Clock = std::chrono::steady_clock;

double ns_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
}

struct Row {
  uint64_t chunks;
  double insert_ns, hit_ns, miss_ns, single_hit_ns, drop_ns, api_store_ns, api_lookup_ns;
};

Row measure(uint64_t n, std::mt19937_64 &rng) {
  Row r{};
  r.chunks = n;
  std::vector<swiftkv::ChunkKey> keys(n), absent(n);
  for (auto &k : keys) k = {rng(), rng()};
  for (auto &k : absent) k = {rng(), rng()};
  {
    // Keys come in runs of a prompt's chunks (64), as swiftkv_store and swiftkv_lookup hand
    // them over: the index fetches later keys' slots while it handles earlier ones.
    constexpr size_t kRun = 64, kAhead = 16;
    swiftkv::ChunkIndex index;
    index.reserve(n);  // as the cache does for what its tiers can hold
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
    r.insert_ns = ns_since(t0) / static_cast<double>(n);
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
    r.hit_ns = ns_since(t0) / static_cast<double>(n);
    t0 = Clock::now();
    run_lookups(absent);
    r.miss_ns = ns_since(t0) / static_cast<double>(n);
    t0 = Clock::now();
    for (const auto &k : order) found += index.touch(k, n).has_value();
    r.single_hit_ns = ns_since(t0) / static_cast<double>(n);
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
    r.drop_ns = ns_since(t0) / static_cast<double>(n);
  }
  // Through the API: a tiny model (64-byte chunks of 16 tokens) so the copy of KV bytes is small
  // beside the index; prompts of 64 chunks.
  constexpr uint32_t kChunkTokens = 16, kPrompt = 64;
  swiftkv_ctx_config c = SWIFTKV_CTX_CONFIG_INIT;
  c.host_budget_bytes = n * 64 * 2 + (uint64_t{16} << 20);
  c.demote_free_percent = 0;
  swiftkv_ctx *ctx = nullptr;
  swiftkv_model_desc d = SWIFTKV_MODEL_DESC_INIT;
  d.name = "bench";
  d.num_layers = 1;
  d.num_kv_heads = 1;
  d.head_dim = 1;
  d.block_tokens = kChunkTokens;
  d.chunk_tokens = kChunkTokens;
  swiftkv_model_config mc = SWIFTKV_MODEL_CONFIG_INIT;
  mc.desc = &d;
  uint32_t model = 0;
  if (swiftkv_ctx_create(&ctx, &c) != SWIFTKV_OK || swiftkv_model_register(&model, ctx, &mc) != SWIFTKV_OK) {
    std::fprintf(stderr, "bench_index: %s\n", swiftkv_last_error_message());
    std::exit(1);
  }
  const uint64_t prompts = std::max<uint64_t>(1, n / kPrompt);
  std::vector<uint32_t> tokens(kPrompt * kChunkTokens);
  std::vector<unsigned char> kv(kPrompt * 64, 0x5a);
  double store_ns = 0, lookup_ns = 0;
  for (int pass = 0; pass < 2; ++pass) {
    const auto t0 = Clock::now();
    for (uint64_t p = 0; p < prompts; ++p) {
      for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(p * 7919 + i);
      if (pass == 0) {
        uint64_t cached = 0;
        swiftkv_store(&cached, ctx, model, tokens.data(), tokens.size(), kv.data(), kv.size());
        if (cached != tokens.size()) {
          std::fprintf(stderr, "bench_index: a store did not fit: %s\n", swiftkv_last_error_message());
          std::exit(1);
        }
      } else {
        swiftkv_lookup_result l = SWIFTKV_LOOKUP_RESULT_INIT;
        swiftkv_lookup(&l, nullptr, 0, ctx, model, tokens.data(), tokens.size());
        if (l.prefix_tokens != tokens.size()) std::exit(1);
      }
    }
    (pass == 0 ? store_ns : lookup_ns) = ns_since(t0) / static_cast<double>(prompts * kPrompt);
  }
  swiftkv_ctx_destroy(ctx);
  r.api_store_ns = store_ns;
  r.api_lookup_ns = lookup_ns;
  return r;
}

// Hashing 256-token chunks (1 KiB of token ids each) against memcpy of the same bytes.
void hash_vs_memcpy(double *hash_gbs, double *memcpy_gbs) {
  constexpr size_t kChunks = 16384, kTokens = 256;
  std::vector<uint32_t> tokens(kChunks * kTokens);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(i * 2654435761u);
  std::vector<uint32_t> copy(tokens.size());
  std::vector<swiftkv::ChunkKey> keys(kChunks);
  const swiftkv::ChunkKey fp{1, 2};
  const double bytes = static_cast<double>(tokens.size() * sizeof(uint32_t));
  double best_hash = 1e30, best_copy = 1e30;
  for (int rep = 0; rep < 7; ++rep) {
    auto t0 = Clock::now();
    swiftkv::chunk_keys(keys.data(), fp, tokens.data(), tokens.size(), kTokens);
    best_hash = std::min(best_hash, ns_since(t0));
    t0 = Clock::now();
    std::memcpy(copy.data(), tokens.data(), bytes);
    best_copy = std::min(best_copy, ns_since(t0));
    if (copy[rep] != tokens[rep] || keys[0] == keys[1]) std::exit(1);
  }
  *hash_gbs = bytes / best_hash;
  *memcpy_gbs = bytes / best_copy;
}

}  // namespace

int main(int argc, char **argv) {
  uint64_t max_chunks = uint64_t{1} << 20;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--max-chunks") == 0 && i + 1 < argc) {
      char *end = nullptr;
      max_chunks = std::strtoull(argv[++i], &end, 10);
      if (*end != '\0' || max_chunks < 1024) {
        std::fprintf(stderr, "bench_index: --max-chunks needs a number >= 1024\n");
        return 2;
      }
    } else {
      std::fprintf(stderr, "usage: bench_index [--max-chunks N]\n");
      return 2;
    }
  }
  std::mt19937_64 rng(42);
  std::vector<Row> rows;
  for (uint64_t n = 1024; n <= max_chunks; n *= 4) rows.push_back(measure(n, rng));
  double hash_gbs = 0, memcpy_gbs = 0;
  hash_vs_memcpy(&hash_gbs, &memcpy_gbs);

  std::printf("%10s %16s %10s %10s %14s %10s %14s %15s\n", "chunks", "check_insert_ns", "hit_ns",
              "miss_ns", "single_hit_ns", "drop_ns", "api_store_ns", "api_lookup_ns");
  for (const Row &r : rows) {
    std::printf("%10llu %16.1f %10.1f %10.1f %14.1f %10.1f %14.1f %15.1f\n",
                static_cast<unsigned long long>(r.chunks), r.insert_ns, r.hit_ns, r.miss_ns,
                r.single_hit_ns, r.drop_ns, r.api_store_ns, r.api_lookup_ns);
  }
  std::printf("chunk-key hashing %.2f GB/s, memcpy of the same bytes %.2f GB/s (%.2fx)\n",
              hash_gbs, memcpy_gbs, hash_gbs / memcpy_gbs);
  std::printf("{\"bench\":\"chunk_index\",\"rows\":[");
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row &r = rows[i];
    std::printf("%s{\"chunks\":%llu,\"check_insert_ns\":%.1f,\"hit_ns\":%.1f,\"miss_ns\":%.1f,"
                "\"single_hit_ns\":%.1f,\"drop_ns\":%.1f,\"api_store_ns\":%.1f,\"api_lookup_ns\":%.1f}",
                i ? "," : "", static_cast<unsigned long long>(r.chunks), r.insert_ns, r.hit_ns,
                r.miss_ns, r.single_hit_ns, r.drop_ns, r.api_store_ns, r.api_lookup_ns);
  }
  std::printf("],\"hash_gbs\":%.2f,\"memcpy_gbs\":%.2f,\"hash_over_memcpy\":%.3f}\n", hash_gbs,
              memcpy_gbs, hash_gbs / memcpy_gbs);
  return 0;
}
