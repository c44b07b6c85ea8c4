// bench_transfer: the connector's chunk loads and saves through the public API on the host
// backend, per engine page size, beside (a) one memcpy per page and K/V, as an engine copies
// natively, and (b) one large memcpy of the same bytes, this machine's limit, both on the copy
// engine's 2 threads, in the same run;
// and the per-layer hook overhead (wait_layer_load + save_layer with nothing to copy).
// On a CUDA build with a device, the same for a device pool (host chunks to device pages and
// back, through the CUDA executor), beside one cudaMemcpyAsync per page and K/V and one large
// copy of the same bytes from pinned memory.
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

#if defined(SWIFTKV_BENCH_HAVE_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace {

constexpr uint32_t kLayers = 8, kHeads = 8, kDim = 128, kChunk = 256;
constexpr uint64_t kLayerPiece = 2ull * kChunk * kHeads * kDim * 2;  // bytes, F16

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void check(swiftkv_status s, const char *what) {
  if (s != SWIFTKV_OK) {
    std::fprintf(stderr, "%s: %s (%s)\n", what, swiftkv_status_string(s),
                 swiftkv_last_error_message());
    std::exit(1);
  }
}

struct Row {
  uint32_t page;
  double load_gbs, save_gbs, per_page_gbs, large_gbs, hook_us;
};

// One request over tokens [0, n) with the given pages; returns seconds from begin to finish.
double run_request(swiftkv_ctx *ctx, uint32_t pool, const std::vector<uint32_t> &tokens,
                   const std::vector<int32_t> &pages, uint64_t *loaded, uint64_t *saved,
                   void *stream = nullptr) {
  swiftkv_request_desc d = SWIFTKV_REQUEST_DESC_INIT;
  d.pool = pool;
  d.tokens = tokens.data();
  d.n_tokens = tokens.size();
  d.pages = pages.data();
  d.n_pages = pages.size();
  const double t0 = now_s();
  uint64_t req = 0;
  check(swiftkv_request_begin(&req, ctx, &d), "request_begin");
  check(swiftkv_start_load(ctx, req, stream), "start_load");
  uint64_t valid = 0;
  for (uint32_t l = 0; l < kLayers; ++l) {
    check(swiftkv_wait_layer_load(&valid, ctx, req, l, stream), "wait_layer_load");
    check(swiftkv_save_layer(ctx, req, l, stream), "save_layer");
  }
  check(swiftkv_wait_save(saved, ctx, req, stream), "wait_save");
#if defined(SWIFTKV_BENCH_HAVE_CUDA)
  if (stream != nullptr) cudaStreamSynchronize(static_cast<cudaStream_t>(stream));
#endif
  swiftkv_request_info info = SWIFTKV_REQUEST_INFO_INIT;
  check(swiftkv_request_finish(&info, ctx, req), "request_finish");
  *loaded = info.valid_end_tokens - info.load_begin_tokens;
  return now_s() - t0;
}

// The benchmark's model: 8 layers, 8 KV heads of 128 dims, 256-token chunks, `page`-token pages.
swiftkv_model_desc bench_model(const char *name, uint32_t page, int32_t device) {
  swiftkv_model_desc m = SWIFTKV_MODEL_DESC_INIT;
  m.name = name;
  m.num_layers = kLayers;
  m.num_kv_heads = kHeads;
  m.head_dim = kDim;
  m.block_tokens = page;
  m.chunk_tokens = kChunk;
  m.device = device;
  return m;
}

// Pages 0..n-1 in a scattered order, as an engine's allocator hands them out.
std::vector<int32_t> scattered_pages(uint32_t n) {
  std::vector<int32_t> pages(n);
  for (uint32_t i = 0; i < n; ++i) pages[i] = static_cast<int32_t>(i);
  for (uint32_t i = n - 1; i > 0; --i) std::swap(pages[i], pages[(i * 2654435761u) % (i + 1)]);
  return pages;
}

// The best of `reps` saves (nothing cached) and loads (everything cached) of `chunks` chunks
// into r.save_gbs and r.load_gbs.
void time_requests(Row &r, swiftkv_ctx *ctx, uint32_t model, uint32_t pool,
                   const std::vector<int32_t> &pages, uint32_t chunks, int reps, void *stream) {
  const uint64_t bytes = uint64_t{chunks} * kLayerPiece * kLayers;
  std::vector<uint32_t> tokens(uint64_t{chunks} * kChunk);
  double best_load = 1e30, best_save = 1e30;
  for (int rep = 0; rep < reps; ++rep) {
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(rep * 10000000u + i);
    uint64_t loaded = 0, saved = 0;
    best_save = std::min(best_save, run_request(ctx, pool, tokens, pages, &loaded, &saved, stream));
    if (saved != tokens.size()) std::fprintf(stderr, "saved only %llu\n", (unsigned long long)saved);
    best_load = std::min(best_load, run_request(ctx, pool, tokens, pages, &loaded, &saved, stream));
    if (loaded != tokens.size()) std::fprintf(stderr, "loaded only %llu\n", (unsigned long long)loaded);
    uint64_t n = 0;
    check(swiftkv_clear(&n, ctx, model, SWIFTKV_TIERS_ALL, nullptr, 0), "clear");
  }
  r.load_gbs = bytes / best_load / 1e9;
  r.save_gbs = bytes / best_save / 1e9;
}

// Hook overhead per layer: requests with no full chunk, so each layer's calls copy nothing.
double hook_us(swiftkv_ctx *ctx, uint32_t pool, uint32_t page, void *stream) {
  std::vector<uint32_t> few(page > 1 ? page - 1 : 1, 7);
  std::vector<int32_t> one{0};
  const int hook_reps = 200;
  const double t0 = now_s();
  for (int i = 0; i < hook_reps; ++i) {
    uint64_t loaded = 0, saved = 0;
    run_request(ctx, pool, few, one, &loaded, &saved, stream);
  }
  return (now_s() - t0) / hook_reps / kLayers * 1e6;
}

Row measure(uint32_t page, uint32_t chunks, int reps) {
  Row r{page, 0, 0, 0, 0, 0};
  const uint64_t bytes = uint64_t{chunks} * kLayerPiece * kLayers;
  swiftkv_ctx_config c = SWIFTKV_CTX_CONFIG_INIT;
  c.host_budget_bytes = 2 * bytes + (64ull << 20);
  c.demote_free_percent = 0;
  swiftkv_ctx *ctx = nullptr;
  check(swiftkv_ctx_create(&ctx, &c), "ctx_create");
  swiftkv_model_desc m = bench_model("bench", page, SWIFTKV_DEVICE_HOST);
  swiftkv_model_config mc = SWIFTKV_MODEL_CONFIG_INIT;
  mc.desc = &m;
  uint32_t model = 0, pool = 0;
  check(swiftkv_model_register(&model, ctx, &mc), "model_register");
  const uint32_t n_pages = chunks * (kChunk / page);
  check(swiftkv_pool_create(&pool, ctx, model, n_pages, 0), "pool_create");
  time_requests(r, ctx, model, pool, scattered_pages(n_pages), chunks, reps, nullptr);

  // Baselines over the same bytes, on as many threads as the library's copy engine (2): per page
  // and K/V in a scattered order, and one large copy split in halves.
  std::vector<std::byte> src(bytes), dst(bytes);
  std::memset(src.data(), 1, bytes);
  std::memset(dst.data(), 2, bytes);
  const uint64_t run = uint64_t{page} * kHeads * kDim * 2;  // one page's K (or V)
  const uint64_t runs = bytes / run;
  auto per_page = [&](uint64_t from, uint64_t to) {
    for (uint64_t k = from; k < to; ++k) {
      const uint64_t p = (k * 2654435761u) % runs;
      std::memcpy(dst.data() + p * run, src.data() + k * run, run);
    }
  };
  auto two = [](auto &&fn) {
    std::thread t([&] { fn(1); });
    fn(0);
    t.join();
  };
  double best_pp = 1e30, best_large = 1e30;
  for (int rep = 0; rep < reps; ++rep) {
    double t0 = now_s();
    two([&](int h) { per_page(h * runs / 2, (h + 1) * runs / 2); });
    best_pp = std::min(best_pp, now_s() - t0);
    t0 = now_s();
    two([&](int h) {
      std::memcpy(dst.data() + h * (bytes / 2), src.data() + h * (bytes / 2), bytes / 2);
    });
    best_large = std::min(best_large, now_s() - t0);
  }
  r.per_page_gbs = bytes / best_pp / 1e9;
  r.large_gbs = bytes / best_large / 1e9;

  r.hook_us = hook_us(ctx, pool, page, nullptr);
  check(swiftkv_pool_destroy(ctx, pool), "pool_destroy");
  swiftkv_ctx_destroy(ctx);
  return r;
}

#if defined(SWIFTKV_BENCH_HAVE_CUDA)
// The device pool: chunks cached in pinned host memory loaded into device pages and saved back,
// beside one cudaMemcpyAsync per page and K/V (scattered) and one large copy, pinned -> device.
Row measure_device(uint32_t page, uint32_t chunks, int reps) {
  Row r{page, 0, 0, 0, 0, 0};
  const uint64_t bytes = uint64_t{chunks} * kLayerPiece * kLayers;
  swiftkv_ctx_config c = SWIFTKV_CTX_CONFIG_INIT;
  c.device_mask = 1;
  c.host_budget_bytes = 2 * bytes + (64ull << 20);
  c.demote_free_percent = 0;
  swiftkv_ctx *ctx = nullptr;
  check(swiftkv_ctx_create(&ctx, &c), "ctx_create");
  swiftkv_model_desc m = bench_model("bench-device", page, 0);
  swiftkv_model_config mc = SWIFTKV_MODEL_CONFIG_INIT;
  mc.desc = &m;
  uint32_t model = 0, pool = 0;
  check(swiftkv_model_register(&model, ctx, &mc), "model_register");
  const uint32_t n_pages = chunks * (kChunk / page);
  // The engine's own tensors, NHD per layer.
  const uint64_t layer_bytes = uint64_t{n_pages} * 2 * page * kHeads * kDim * 2;
  void *dev = nullptr;
  if (cudaMalloc(&dev, layer_bytes * kLayers) != cudaSuccess) {
    std::fprintf(stderr, "cudaMalloc of %llu bytes failed\n", (unsigned long long)(layer_bytes * kLayers));
    std::exit(1);
  }
  std::vector<void *> bases(kLayers);
  for (uint32_t l = 0; l < kLayers; ++l) bases[l] = static_cast<char *>(dev) + l * layer_bytes;
  swiftkv_pool_desc pd = SWIFTKV_POOL_DESC_INIT;
  pd.num_pages = n_pages;
  pd.layer_base = bases.data();
  pd.layer_span_bytes = layer_bytes;
  pd.head_stride = kDim;
  pd.token_stride = int64_t{kHeads} * kDim;
  pd.kv_stride = pd.token_stride * page;
  pd.page_stride = 2 * pd.kv_stride;
  check(swiftkv_pool_register(&pool, ctx, model, &pd), "pool_register");
  cudaStream_t s = nullptr;
  cudaStreamCreate(&s);
  time_requests(r, ctx, model, pool, scattered_pages(n_pages), chunks, reps, s);
  void *pinned = nullptr;
  cudaMallocHost(&pinned, bytes);
  const uint64_t run = uint64_t{page} * kHeads * kDim * 2;
  const uint64_t runs = bytes / run;
  double best_pp = 1e30, best_large = 1e30;
  for (int rep = 0; rep < reps; ++rep) {
    double t0 = now_s();
    for (uint64_t k = 0; k < runs; ++k) {
      const uint64_t p = (k * 2654435761u) % runs;
      cudaMemcpyAsync(static_cast<char *>(dev) + p * run, static_cast<char *>(pinned) + k * run,
                      run, cudaMemcpyHostToDevice, s);
    }
    cudaStreamSynchronize(s);
    best_pp = std::min(best_pp, now_s() - t0);
    t0 = now_s();
    cudaMemcpyAsync(dev, pinned, bytes, cudaMemcpyHostToDevice, s);
    cudaStreamSynchronize(s);
    best_large = std::min(best_large, now_s() - t0);
  }
  r.per_page_gbs = bytes / best_pp / 1e9;
  r.large_gbs = bytes / best_large / 1e9;
  r.hook_us = hook_us(ctx, pool, page, s);
  check(swiftkv_pool_destroy(ctx, pool), "pool_destroy");
  swiftkv_ctx_destroy(ctx);
  cudaFreeHost(pinned);
  cudaFree(dev);
  cudaStreamDestroy(s);
  return r;
}
#endif

void print_rows(const char *backend, const std::vector<Row> &rows, uint32_t chunks) {
  std::printf("%s backend, %u chunks of %u tokens, %u layers x %llu KiB per chunk\n", backend,
              chunks, kChunk, kLayers, static_cast<unsigned long long>(kLayerPiece >> 10));
  std::printf("%6s %10s %10s %14s %12s %12s %12s\n", "page", "load_GB/s", "save_GB/s",
              "per_page_GB/s", "large_GB/s", "load/large", "hook_us");
  for (const Row &r : rows) {
    std::printf("%6u %10.2f %10.2f %14.2f %12.2f %12.2f %12.2f\n", r.page, r.load_gbs, r.save_gbs,
                r.per_page_gbs, r.large_gbs, r.load_gbs / r.large_gbs, r.hook_us);
  }
}

void print_json(const char *backend, const std::vector<Row> &rows, uint32_t chunks) {
  std::printf("{\"bench\":\"transfer\",\"backend\":\"%s\",\"chunks\":%u,\"rows\":[", backend,
              chunks);
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row &r = rows[i];
    std::printf("%s{\"page\":%u,\"load_gbs\":%.3f,\"save_gbs\":%.3f,\"per_page_gbs\":%.3f,"
                "\"large_gbs\":%.3f,\"hook_us\":%.2f}",
                i ? "," : "", r.page, r.load_gbs, r.save_gbs, r.per_page_gbs, r.large_gbs,
                r.hook_us);
  }
  std::printf("]}\n");
}

}  // namespace

int main(int argc, char **argv) {
  uint32_t chunks = 16;
  int reps = 5;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--chunks") == 0 && i + 1 < argc) {
      chunks = static_cast<uint32_t>(std::strtoul(argv[++i], nullptr, 10));
    } else if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: bench_transfer [--chunks N] [--reps N]\n");
      return 2;
    }
  }
  std::vector<Row> rows;
  for (uint32_t page : {16u, 64u, 256u}) rows.push_back(measure(page, chunks, reps));
  print_rows("host", rows, chunks);
  print_json("host", rows, chunks);
#if defined(SWIFTKV_BENCH_HAVE_CUDA)
  uint32_t devices = 0;
  if (swiftkv_device_count(&devices) == SWIFTKV_OK && devices > 0) {
    std::vector<Row> dev_rows;
    for (uint32_t page : {16u, 64u, 256u}) dev_rows.push_back(measure_device(page, chunks, reps));
    print_rows("cuda", dev_rows, chunks);
    print_json("cuda", dev_rows, chunks);
  }
#endif
  return 0;
}
