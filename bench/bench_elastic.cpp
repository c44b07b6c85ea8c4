// bench_elastic: the time of resizing by one lending unit (MEU) at region sizes from 1K to 1M
// blocks, for the block-major elastic region (through the public API, memory commit included)
// beside a layer-major (n_layers, n_blocks, ...) cache that must move blocks to resize
// (SwiftCache Fig. 5 vs Fig. 6), both measured in the same run. Prints a table and a JSON line.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "swiftkv/swiftkv.h"

namespace {

using Clock = std::chrono::steady_clock;

// Lender: 8 layers, 1 KV head of 8 dims, 16-token blocks in f16: a layer block is 512 bytes and
// a full block 4 KiB. Borrower: 8 layers, 2 heads, 32-token chunks: 16 KiB. The unit is 4 blocks.
constexpr uint32_t kLayers = 8;
constexpr uint64_t kLayerBlock = 512;
constexpr uint64_t kFullBlock = kLayers * kLayerBlock;
constexpr uint64_t kUnit = 4;

struct Row {
  uint64_t blocks;
  double bm_grow_us, bm_shrink_us, lm_grow_us, lm_shrink_us;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double us_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

[[noreturn]] void die(const char *what) {
  std::fprintf(stderr, "bench_elastic: %s: %s\n", what, swiftkv_last_error_message());
  std::exit(1);
}

uint64_t fake_now(void *user) { return *static_cast<uint64_t *>(user); }

// Grow by one unit for a request one block too long, then shrink by one unit once the window
// only remembers a request that fits the original size.
void block_major(uint64_t n, int reps, Row &row) {
  swiftkv_ctx_config cc = SWIFTKV_CTX_CONFIG_INIT;
  cc.host_budget_bytes = (n + kUnit) * kFullBlock;
  swiftkv_ctx *ctx = nullptr;
  if (swiftkv_ctx_create(&ctx, &cc) != SWIFTKV_OK) die("ctx_create");
  swiftkv_model_desc lender = SWIFTKV_MODEL_DESC_INIT, borrower = SWIFTKV_MODEL_DESC_INIT;
  lender.num_layers = kLayers;
  lender.num_kv_heads = 1;
  lender.head_dim = 8;
  borrower.num_layers = kLayers;
  borrower.num_kv_heads = 2;
  borrower.head_dim = 8;
  borrower.chunk_tokens = 32;
  uint64_t now = 1;
  swiftkv_elastic_config c = SWIFTKV_ELASTIC_CONFIG_INIT;
  c.lender = &lender;
  c.borrower = &borrower;
  c.capacity_blocks = n + kUnit;
  c.owned_blocks = n;
  c.window_ms = 1;
  c.clock = fake_now;
  c.clock_user_data = &now;
  swiftkv_elastic *e = nullptr;
  if (swiftkv_elastic_create(&e, ctx, &c) != SWIFTKV_OK) die("elastic_create");
  swiftkv_layer_view v = SWIFTKV_LAYER_VIEW_INIT;
  if (swiftkv_elastic_layer_view(&v, e, 0) != SWIFTKV_OK) die("layer_view");
  std::memset(v.base, 1, n * kFullBlock);  // the owned part holds data, as in a live cache
  std::vector<double> grow, shrink;
  uint64_t blocks = 0, chunks = 0;
  for (int i = 0; i < reps; ++i) {
    auto t0 = Clock::now();
    if (swiftkv_elastic_scale_for_request(&blocks, &chunks, e, n * 16 + 1) != SWIFTKV_OK ||
        blocks != kUnit) {
      die("scale_for_request");
    }
    grow.push_back(us_since(t0));
    now += 2'000'000;  // the long request leaves the 1 ms window
    if (swiftkv_elastic_scale_for_request(&blocks, &chunks, e, n * 16) != SWIFTKV_OK) die("scale");
    t0 = Clock::now();
    if (swiftkv_elastic_tick(&blocks, &chunks, e, 0) != SWIFTKV_OK || blocks != kUnit) die("tick");
    shrink.push_back(us_since(t0));
  }
  row.bm_grow_us = median(grow);
  row.bm_shrink_us = median(shrink);
  swiftkv_elastic_destroy(e);
  swiftkv_ctx_destroy(ctx);
}

// The layer-major cache: layer l's n blocks at l * n * kLayerBlock. Resizing every layer by one
// unit moves every layer after the first to its new place.
void layer_major(uint64_t n, int reps, Row &row) {
  const uint64_t cap = n + kUnit;
  std::vector<unsigned char> buf(kLayers * cap * kLayerBlock, 1);
  unsigned char *b = buf.data();
  std::vector<double> grow, shrink;
  for (int i = 0; i < reps; ++i) {
    auto t0 = Clock::now();
    for (uint32_t l = kLayers - 1; l >= 1; --l) {  // last layer first: moves never overlap badly
      std::memmove(b + l * cap * kLayerBlock, b + l * n * kLayerBlock, n * kLayerBlock);
    }
    for (uint32_t l = 0; l < kLayers; ++l) {  // the new blocks of each layer
      std::memset(b + (l * cap + n) * kLayerBlock, 0, kUnit * kLayerBlock);
    }
    grow.push_back(us_since(t0));
    t0 = Clock::now();
    for (uint32_t l = 1; l < kLayers; ++l) {
      std::memmove(b + l * n * kLayerBlock, b + l * cap * kLayerBlock, n * kLayerBlock);
    }
    shrink.push_back(us_since(t0));
  }
  row.lm_grow_us = median(grow);
  row.lm_shrink_us = median(shrink);
}

constexpr double kFlatBar = 2.0;

int usage(const char *msg) {
  std::fprintf(stderr,
               "bench_elastic: %s\nusage: bench_elastic [--max-blocks N (1024..1048576, default "
               "1048576)] [--reps R (default 50)]\n",
               msg);
  return 2;
}

}  // namespace

int main(int argc, char **argv) {
  uint64_t max_blocks = 1 << 20;
  int reps = 50;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "--max-blocks" || a == "--reps") && i + 1 < argc) {
      char *end = nullptr;
      const unsigned long long v = std::strtoull(argv[++i], &end, 10);
      if (*end != '\0' || v == 0) return usage(("bad number for " + a).c_str());
      if (a == "--max-blocks")
        max_blocks = v;
      else
        reps = static_cast<int>(std::min<unsigned long long>(v, 100000));
    } else {
      return usage(("unknown argument '" + a + "'").c_str());
    }
  }
  if (max_blocks < 1024 || max_blocks > (1u << 20)) return usage("--max-blocks out of range");
  std::vector<Row> rows;
  for (uint64_t n = 1024; n <= max_blocks; n *= 4) {
    Row r{n, 0, 0, 0, 0};
    block_major(n, reps, r);
    // Layer-major resizes move up to GiBs each; fewer repetitions keep the run short.
    layer_major(n, std::max(3, reps / static_cast<int>(std::max<uint64_t>(1, n / 4096))), r);
    rows.push_back(r);
  }
  std::printf("resize by one MEU (%llu blocks of %llu bytes, %u layers); median microseconds\n",
              static_cast<unsigned long long>(kUnit), static_cast<unsigned long long>(kFullBlock),
              kLayers);
  std::printf("%10s %14s %14s %14s %14s %10s\n", "blocks", "block-major+", "block-major-",
              "layer-major+", "layer-major-", "lm/bm");
  for (const Row &r : rows) {
    std::printf("%10llu %14.2f %14.2f %14.1f %14.1f %9.0fx\n",
                static_cast<unsigned long long>(r.blocks), r.bm_grow_us, r.bm_shrink_us,
                r.lm_grow_us, r.lm_shrink_us,
                (r.lm_grow_us + r.lm_shrink_us) / (r.bm_grow_us + r.bm_shrink_us));
  }
  const Row &lo = rows.front(), &hi = rows.back();
  // The design's bar: a resize's time independent of the region's size, read here as the
  // largest region's block-major resize within twice the smallest's.
  const double flat = (hi.bm_grow_us + hi.bm_shrink_us) / (lo.bm_grow_us + lo.bm_shrink_us);
  std::printf(
      "the design's bar: block-major resize at %llu blocks is %.2fx the one at %llu "
      "(bar: independent of size, <= %.1fx): %s\n",
      static_cast<unsigned long long>(hi.blocks), flat, static_cast<unsigned long long>(lo.blocks),
      kFlatBar, flat <= kFlatBar ? "met" : "MISSED");
  std::printf(
      "{\"bench\":\"elastic_resize\",\"unit_blocks\":%llu,\"full_block_bytes\":%llu,"
      "\"rows\":[",
      static_cast<unsigned long long>(kUnit), static_cast<unsigned long long>(kFullBlock));
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row &r = rows[i];
    std::printf(
        "%s{\"blocks\":%llu,\"block_major_grow_us\":%.3f,\"block_major_shrink_us\":%.3f,"
        "\"layer_major_grow_us\":%.3f,\"layer_major_shrink_us\":%.3f}",
        i ? "," : "", static_cast<unsigned long long>(r.blocks), r.bm_grow_us, r.bm_shrink_us,
        r.lm_grow_us, r.lm_shrink_us);
  }
  std::printf(
      "],\"block_major_largest_over_smallest\":%.3f,"
      "\"layer_major_largest_over_smallest\":%.3f,\"meets_bar\":%s}\n",
      flat, (hi.lm_grow_us + hi.lm_shrink_us) / (lo.lm_grow_us + lo.lm_shrink_us),
      flat <= kFlatBar ? "true" : "false");
  return 0;
}
