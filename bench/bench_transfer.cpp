// bench_transfer: the connector's chunk loads and saves through the public API on the host
// backend, per engine page size, beside (a) one memcpy per page and K/V, as an engine copies
// natively, and (b) one large memcpy of the same bytes, this machine's limit, both on as many
// threads as the copy engine has (transfer_threads in effect), kept for the whole run as it keeps
// its own, alternated repetition by repetition with the library's after a warm-up; median and
// best over --reps. The first save and
// load of a fresh context (first touch of its memory, its threads' start) are reported apart.
// Then the layer-wise pipeline: per-layer compute simulated by a busy wait of c per layer while
// the loads run, for c = 0.5, 1 and 2 times the per-layer transfer time measured in the same
// run, at 32 and 64 layers: the fraction of the hideable transfer time that was hidden.
// And the per-layer hook overhead with nothing to copy: hook_us, a whole request's calls per
// layer (begin and finish included); pair_us, one request's wait_layer_load + save_layer alone;
// batch_us and each_us, per request and layer for 64 open requests through the batch calls and
// through the per-request ones.
// On a CUDA build with a device, the same for a device pool (host chunks to device pages and
// back, through the CUDA executor), beside one cudaMemcpyAsync per page and K/V and one large
// copy of the same bytes from pinned memory; the layer-wise pipeline there, the engine's compute
// a kernel spinning for c on its stream (spin_kernel.cu); and the gather/scatter kernel alone (NHD
// and HND, 16- and 256-token pages, chunk pieces read in place from device memory as lent or
// IPC-mapped chunks are; NHD also with the pieces in a VMM region of 2 MiB granules and spread
// as one layer of 8-layer chunks, KernelChunks; HND also at head dims 80 and 96) beside a
// device-to-device copy of the same bytes;
// loads from another
// process's device memory (a lender started by this program, the peer) into a device pool beside a
// device-to-device copy (and, on every build, from another process's host memory in granules
// into a host pool beside a memcpy), and the layer-wise pipeline over such lent memory
// (measure_peer_overlap); and the decode kernel alone
// (kivi and fp8 layers in device staging decoded into scattered NHD pages, and HND ones of 16
// tokens, also at head dims 80 and 96, checked against its CPU twin) beside a device-to-device copy
// of the decoded bytes; and a load's and a save's bytes moved between pinned host memory and the
// device in each way a transfer engine can, beside one large copy (measure_copy_paths; --copy-paths
// alone).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "swiftkv/swiftkv.h"

#include "core/common/nontemporal_copy.hpp"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#if defined(SWIFTKV_BENCH_HAVE_CUDA)
#include <cuda_runtime_api.h>

#include <cmath>

#include "core/codec/chunk_codec.hpp"
#include "core/codec/layer_decode.hpp"
#include "core/memory/cuda_region.hpp"
#include "core/transfer/copy_items.hpp"
#include "core/transfer/copy_plan.hpp"
#include "core/transfer/cuda_transfer.hpp"

bool bench_spin_on_stream(double seconds, void *stream, uint64_t *stamps);  // spin_kernel.cu
#endif

namespace {

constexpr uint32_t kLayers = 8, kHeads = 8, kDim = 128, kChunk = 256;
// One layer of one chunk, F16, [2, T, H, D], in bytes.
constexpr uint64_t layer_piece_bytes(uint32_t dim) { return 2ull * kChunk * kHeads * dim * 2; }
constexpr uint64_t kLayerPiece = layer_piece_bytes(kDim);
constexpr uint32_t kBatchRequests = 64;  // the requests of a decode step, for the hook figures

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

[[noreturn]] void die(const char *what) {
  std::fprintf(stderr, "bench_transfer: %s\n", what);
  std::exit(1);
}

void check(swiftkv_status s, const char *what) {
  if (s != SWIFTKV_OK) {
    std::fprintf(stderr, "%s: %s (%s)\n", what, swiftkv_status_string(s),
                 swiftkv_last_error_message());
    std::exit(1);
  }
}

// GB/s: the median and the best repetition.
struct Rate {
  double med = 0, best = 0;
};
Rate rate_of(std::vector<double> secs, double bytes) {
  std::sort(secs.begin(), secs.end());
  return Rate{bytes / secs[secs.size() / 2] / 1e9, bytes / secs.front() / 1e9};
}

struct Row {
  uint32_t page;
  Rate load, save, per_page, per_page_nt, large;
  double first_save_gbs = 0, first_load_gbs = 0;  // the first requests of a fresh context
  double hook_us = 0;         // a whole request's calls with nothing to copy, per layer
  double pair_us = 0;         // one request's wait_layer_load + save_layer alone
  double batch_us = 0;        // per request and layer, kBatchRequests through the batch calls
  double per_request_us = 0;  // the same requests through the per-request calls
};

// The seconds of each measured repetition (save, load, the per-page baselines by memcpy and, on
// the host, by non-temporal stores, one large copy), made into a row's rates at the end. A
// device row has no non-temporal baseline: its per_page_nt stays 0.
struct Samples {
  std::vector<double> save, load, per_page, per_page_nt, large;
  void add(double s, double l, double p, double g) {
    save.push_back(s);
    load.push_back(l);
    per_page.push_back(p);
    large.push_back(g);
  }
  void add(double s, double l, double p, double pn, double g) {
    add(s, l, p, g);
    per_page_nt.push_back(pn);
  }
  void into(Row &r, uint64_t bytes) const {
    const auto b = static_cast<double>(bytes);
    r.save = rate_of(save, b);
    r.load = rate_of(load, b);
    r.per_page = rate_of(per_page, b);
    if (!per_page_nt.empty()) r.per_page_nt = rate_of(per_page_nt, b);
    r.large = rate_of(large, b);
  }
};

// Threads for the baselines, as many as the copy engine's and kept for the whole run as it keeps
// its own: this one and n - 1 workers.
class Workers {
 public:
  explicit Workers(unsigned n) {
    for (unsigned i = 1; i < n; ++i) threads_.emplace_back([this, i] { loop(i); });
  }
  ~Workers() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (std::thread &t : threads_) t.join();
  }
  unsigned size() const noexcept { return static_cast<unsigned>(threads_.size()) + 1; }
  // fn(i) on thread i for i in [0, size()); returns when all are done.
  void run(const std::function<void(unsigned)> &fn) {
    {
      std::lock_guard lock(mu_);
      job_ = &fn;
      ++gen_;
      done_ = 0;
    }
    cv_.notify_all();
    fn(0);
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return done_ == threads_.size(); });
  }

 private:
  void loop(unsigned index) {
    uint64_t seen = 0;
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || gen_ != seen; });
      if (stop_) return;
      seen = gen_;
      const std::function<void(unsigned)> *job = job_;
      lock.unlock();
      (*job)(index);
      lock.lock();
      ++done_;
      cv_.notify_all();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  const std::function<void(unsigned)> *job_ = nullptr;
  uint64_t gen_ = 0;
  size_t done_ = 0;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

// The machine's copy limit for `bytes` of KV on a number of threads: one memcpy per page and K/V
// (a page of `page_tokens` tokens) in a scattered order, the same by non-temporal stores (the
// library's own copy, core/common/nontemporal_copy.hpp, fenced once a thread), or one large copy
// split evenly. The memory is touched when it is made, before the first timing.
class CopyLimit {
 public:
  CopyLimit(uint64_t bytes, uint32_t page_tokens, Workers &workers)
      : workers_(workers),
        bytes_(bytes),
        src_(bytes),
        dst_(bytes),
        run_(uint64_t{page_tokens} * kHeads * kDim * 2),
        runs_(bytes / run_) {
    std::memset(src_.data(), 1, bytes);
    std::memset(dst_.data(), 2, bytes);
  }
  // Seconds of one copy of the bytes each way.
  double per_page_s() {
    return pages_s([](void *d, const void *s, size_t n) { std::memcpy(d, s, n); });
  }
  double per_page_nt_s() { return pages_s(swiftkv::nontemporal_copy); }
  // The fastest of the three ways, each timed once.
  double fastest_s() { return std::min({per_page_s(), per_page_nt_s(), large_s()}); }
  double large_s() {
    const uint64_t n = workers_.size();
    return timed([&](unsigned h) {
      const uint64_t from = h * bytes_ / n, to = (h + 1) * bytes_ / n;
      std::memcpy(dst_.data() + from, src_.data() + from, to - from);
    });
  }

 private:
  // Each page and K/V copied by `copy` from consecutive places to scattered ones, each thread
  // fencing its copies at the end (a memcpy's stores need no fence; the cost is noise there).
  template <class Copy>
  double pages_s(Copy copy) {
    const uint64_t n = workers_.size();
    return timed([&](unsigned h) {
      for (uint64_t k = h * runs_ / n; k < (h + 1) * runs_ / n; ++k) {
        const uint64_t p = (k * 2654435761u) % runs_;
        copy(dst_.data() + p * run_, src_.data() + k * run_, run_);
      }
      swiftkv::nontemporal_fence();
    });
  }
  double timed(const std::function<void(unsigned)> &fn) {
    const double t0 = now_s();
    workers_.run(fn);
    return now_s() - t0;
  }
  Workers &workers_;
  const uint64_t bytes_;
  std::vector<std::byte> src_, dst_;
  const uint64_t run_, runs_;  // one page's K (or V), and how many of them
};

// The copy engine's threads in a context made with the default config.
unsigned engine_threads() {
  swiftkv_ctx *ctx = nullptr;
  check(swiftkv_ctx_create(&ctx, nullptr), "ctx_create");
  swiftkv_ctx_config c = SWIFTKV_CTX_CONFIG_INIT;
  check(swiftkv_ctx_get_config(&c, ctx), "ctx_get_config");
  swiftkv_ctx_destroy(ctx);
  return c.transfer_threads;
}

// One request over tokens [0, n) with the given pages; returns seconds from begin to finish.
void spin_for(double seconds) {
  const double end = now_s() + seconds;
  while (now_s() < end) {
  }
}

// A context whose host tier holds twice `bytes` and more, demoting nothing ahead, on the devices
// of `device_mask` (0: none).
swiftkv_ctx *bench_ctx(uint64_t bytes, uint32_t device_mask) {
  swiftkv_ctx_config c = SWIFTKV_CTX_CONFIG_INIT;
  c.device_mask = device_mask;
  c.host_budget_bytes = 2 * bytes + (64ull << 20);
  c.demote_free_percent = 0;
  swiftkv_ctx *ctx = nullptr;
  check(swiftkv_ctx_create(&ctx, &c), "ctx_create");
  return ctx;
}

// The engine's compute of one layer: a busy wait on the host, or on a device pool's stream a
// kernel that spins for as long. `stamps`, where not null: where the compute's start and end go
// (ns; on the GPU device memory that the kernel writes, on the host this process's clock).
void compute_layer(double seconds, void *stream, uint64_t *stamps = nullptr) {
#if defined(SWIFTKV_BENCH_HAVE_CUDA)
  if (stream != nullptr) {
    if (!bench_spin_on_stream(seconds, stream, stamps)) die("the spin kernel did not launch");
    return;
  }
#else
  (void)stream;  // host pools only without CUDA
#endif
  const double t0 = now_s();
  spin_for(seconds);
  if (stamps != nullptr) {
    stamps[0] = static_cast<uint64_t>(t0 * 1e9);
    stamps[1] = static_cast<uint64_t>(now_s() * 1e9);
  }
}

// When the engine's compute of each layer began and ended over one request, to find what
// stands between one layer's compute and the next on the engine's side: on the GPU the spin
// kernel's own timer, written to device memory (so reading it adds nothing to the stream), on the
// host the clock around the busy wait. Gaps are kept over every run, layers 1 to L - 1 (layer
// 0's start waits for its load, which nothing hides).
class ComputeStamps {
 public:
  ComputeStamps(uint32_t layers, void *stream) : layers_(layers), stream_(stream) {
    host_.resize(2 * uint64_t{layers});
#if defined(SWIFTKV_BENCH_HAVE_CUDA)
    if (stream_ != nullptr && cudaMalloc(reinterpret_cast<void **>(&device_),
                                         host_.size() * sizeof(uint64_t)) != cudaSuccess) {
      die("cudaMalloc (compute stamps)");
    }
#endif
  }
  ~ComputeStamps() {
#if defined(SWIFTKV_BENCH_HAVE_CUDA)
    if (device_ != nullptr) cudaFree(device_);
#endif
  }
  ComputeStamps(const ComputeStamps &) = delete;
  ComputeStamps &operator=(const ComputeStamps &) = delete;

  // The compute of `layer`, stamped.
  void compute(uint32_t layer, double seconds) {
    uint64_t *base = device_ != nullptr ? device_ : host_.data();
    compute_layer(seconds, stream_, base + 2 * uint64_t{layer});
  }

  // After a run's last layer is done (the stream synchronized): its gaps, kept.
  void collect() {
#if defined(SWIFTKV_BENCH_HAVE_CUDA)
    if (device_ != nullptr && cudaMemcpy(host_.data(), device_, host_.size() * sizeof(uint64_t),
                                         cudaMemcpyDeviceToHost) != cudaSuccess) {
      die("cudaMemcpy (compute stamps)");
    }
#endif
    for (uint32_t l = 1; l < layers_; ++l) {
      const uint64_t end = host_[2 * l - 1], start = host_[2 * l];
      gaps_.push_back(start > end ? static_cast<double>(start - end) / 1e3 : 0.0);
    }
  }

  // The median gap over every run collected, µs.
  double median_us() {
    if (gaps_.empty()) return 0;
    std::sort(gaps_.begin(), gaps_.end());
    return gaps_[gaps_.size() / 2];
  }

 private:
  uint32_t layers_;
  void *stream_;
  std::vector<uint64_t> host_;
  uint64_t *device_ = nullptr;
  std::vector<double> gaps_;
};

// A request of `tokens` over `pages` of `pool`.
swiftkv_request_desc request_desc(uint32_t pool, const std::vector<uint32_t> &tokens,
                                  const std::vector<int32_t> &pages) {
  swiftkv_request_desc d = SWIFTKV_REQUEST_DESC_INIT;
  d.pool = pool;
  d.tokens = tokens.data();
  d.n_tokens = tokens.size();
  d.pages = pages.data();
  d.n_pages = pages.size();
  return d;
}

// One request over tokens [0, n) with the given pages, over `layers` layers, with `compute_s` of
// compute after each wait_layer_load (an engine's layer: compute_layer); returns seconds from
// begin to finish, and in *start_load_s (when given) the host time of start_load alone.
double run_request(swiftkv_ctx *ctx, uint32_t pool, const std::vector<uint32_t> &tokens,
                   const std::vector<int32_t> &pages, uint64_t *loaded, uint64_t *saved,
                   void *stream = nullptr, uint32_t layers = kLayers, double compute_s = 0,
                   double *start_load_s = nullptr, ComputeStamps *stamps = nullptr) {
  const swiftkv_request_desc d = request_desc(pool, tokens, pages);
  const double t0 = now_s();
  uint64_t req = 0;
  check(swiftkv_request_begin(&req, ctx, &d), "request_begin");
  const double t_start = now_s();
  check(swiftkv_start_load(ctx, req, stream), "start_load");
  if (start_load_s != nullptr) *start_load_s = now_s() - t_start;
  uint64_t valid = 0;
  for (uint32_t l = 0; l < layers; ++l) {
    check(swiftkv_wait_layer_load(&valid, ctx, req, l, stream), "wait_layer_load");
    if (compute_s > 0) {
      if (stamps != nullptr) {
        stamps->compute(l, compute_s);
      } else {
        compute_layer(compute_s, stream);
      }
    }
    check(swiftkv_save_layer(ctx, req, l, stream), "save_layer");
  }
  check(swiftkv_wait_save(saved, ctx, req, stream), "wait_save");
#if defined(SWIFTKV_BENCH_HAVE_CUDA)
  if (stream != nullptr) cudaStreamSynchronize(static_cast<cudaStream_t>(stream));
#endif
  swiftkv_request_info info = SWIFTKV_REQUEST_INFO_INIT;
  check(swiftkv_request_finish(&info, ctx, req), "request_finish");
  *loaded = info.valid_end_tokens - info.load_begin_tokens;
  const double t = now_s() - t0;
  if (stamps != nullptr && compute_s > 0) stamps->collect();
  return t;
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

// One save (nothing cached) then one load (everything cached) of `chunks` chunks, new tokens
// for repetition `rep`, then the cache cleared: seconds of each.
void save_and_load(swiftkv_ctx *ctx, uint32_t model, uint32_t pool,
                   const std::vector<int32_t> &pages, uint32_t chunks, int rep, void *stream,
                   double *save_s, double *load_s) {
  std::vector<uint32_t> tokens(uint64_t{chunks} * kChunk);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(rep * 10000000u + i);
  uint64_t loaded = 0, saved = 0;
  *save_s = run_request(ctx, pool, tokens, pages, &loaded, &saved, stream);
  if (saved != tokens.size()) {
    std::fprintf(stderr, "bench_transfer: saved %llu of %zu tokens\n", (unsigned long long)saved,
                 tokens.size());
    std::exit(1);
  }
  *load_s = run_request(ctx, pool, tokens, pages, &loaded, &saved, stream);
  if (loaded != tokens.size()) {
    std::fprintf(stderr, "bench_transfer: loaded %llu of %zu tokens\n", (unsigned long long)loaded,
                 tokens.size());
    std::exit(1);
  }
  uint64_t n = 0;
  check(swiftkv_clear(&n, ctx, model, SWIFTKV_TIERS_ALL, nullptr, 0), "clear");
}

// Hook overhead per layer: requests with no full chunk, so each layer's calls copy nothing.
double hook_us(swiftkv_ctx *ctx, uint32_t pool, uint32_t page, void *stream) {
  std::vector<uint32_t> few(page > 1 ? page - 1 : 1, 7);
  std::vector<int32_t> one{0};
  const int hook_reps = 200;
  std::vector<double> per;
  for (int batch = 0; batch <= 5; ++batch) {  // batch 0 warms up
    const double t0 = now_s();
    for (int i = 0; i < hook_reps; ++i) {
      uint64_t loaded = 0, saved = 0;
      run_request(ctx, pool, few, one, &loaded, &saved, stream);
    }
    if (batch > 0) per.push_back((now_s() - t0) / hook_reps / kLayers * 1e6);
  }
  std::sort(per.begin(), per.end());
  return per[per.size() / 2];
}

// The hooks alone, nothing to copy: `n` requests of fewer tokens than a page are begun and
// started outside the clock, then per layer either each request's wait_layer_load and
// save_layer, or (batch) the two batch calls for all of them. Microseconds per request and
// layer: the median of 5 runs after a warm-up one.
double hooks_only_us(swiftkv_ctx *ctx, uint32_t pool, uint32_t page, uint32_t n, bool batch,
                     void *stream) {
  std::vector<uint32_t> few(page > 1 ? page - 1 : 1, 7);
  const uint32_t rounds = std::max(200u / n, 4u);
  std::vector<int32_t> one{0};
  std::vector<uint64_t> reqs(n), valid(n);
  std::vector<double> per;
  for (int run = 0; run <= 5; ++run) {  // run 0 warms up
    double hooks_s = 0;
    for (uint32_t round = 0; round < rounds; ++round) {
      for (uint32_t i = 0; i < n; ++i) {
        swiftkv_request_desc d = SWIFTKV_REQUEST_DESC_INIT;
        d.pool = pool;
        d.tokens = few.data();
        d.n_tokens = few.size();
        d.pages = one.data();
        d.n_pages = 1;
        check(swiftkv_request_begin(&reqs[i], ctx, &d), "request_begin");
        check(swiftkv_start_load(ctx, reqs[i], stream), "start_load");
      }
      const double t0 = now_s();
      for (uint32_t l = 0; l < kLayers; ++l) {
        if (batch) {
          check(swiftkv_wait_layer_load_batch(valid.data(), ctx, reqs.data(), n, l, stream),
                "wait_layer_load_batch");
          check(swiftkv_save_layer_batch(ctx, reqs.data(), n, l, stream), "save_layer_batch");
        } else {
          for (uint32_t i = 0; i < n; ++i) {
            check(swiftkv_wait_layer_load(&valid[i], ctx, reqs[i], l, stream), "wait_layer_load");
            check(swiftkv_save_layer(ctx, reqs[i], l, stream), "save_layer");
          }
        }
      }
      hooks_s += now_s() - t0;
      for (uint32_t i = 0; i < n; ++i) {
        uint64_t saved = 0;
        check(swiftkv_wait_save(&saved, ctx, reqs[i], stream), "wait_save");
        check(swiftkv_request_finish(nullptr, ctx, reqs[i]), "request_finish");
      }
    }
    if (run > 0) per.push_back(hooks_s / rounds / n / kLayers * 1e6);
  }
  std::sort(per.begin(), per.end());
  return per[per.size() / 2];
}

// The three hook figures of a row.
void measure_hooks(Row &r, swiftkv_ctx *ctx, uint32_t pool, uint32_t page, void *stream) {
  r.hook_us = hook_us(ctx, pool, page, stream);
  r.pair_us = hooks_only_us(ctx, pool, page, 1, false, stream);
  r.batch_us = hooks_only_us(ctx, pool, page, kBatchRequests, true, stream);
  r.per_request_us = hooks_only_us(ctx, pool, page, kBatchRequests, false, stream);
}

Row measure(uint32_t page, uint32_t chunks, int reps, Workers &workers) {
  Row r{};
  r.page = page;
  const uint64_t bytes = uint64_t{chunks} * kLayerPiece * kLayers;
  swiftkv_ctx *ctx = bench_ctx(bytes, 0);
  swiftkv_model_desc m = bench_model("bench", page, SWIFTKV_DEVICE_HOST);
  swiftkv_model_config mc = SWIFTKV_MODEL_CONFIG_INIT;
  mc.desc = &m;
  uint32_t model = 0, pool = 0;
  check(swiftkv_model_register(&model, ctx, &mc), "model_register");
  const uint32_t n_pages = chunks * (kChunk / page);
  check(swiftkv_pool_create(&pool, ctx, model, n_pages, 0), "pool_create");
  const std::vector<int32_t> pages = scattered_pages(n_pages);

  // The first requests of the fresh context: its host tier's memory is touched for the first
  // time and its threads start.
  double save_s = 0, load_s = 0;
  save_and_load(ctx, model, pool, pages, chunks, 0, nullptr, &save_s, &load_s);
  r.first_save_gbs = bytes / save_s / 1e9;
  r.first_load_gbs = bytes / load_s / 1e9;

  // Baselines over the same bytes on the copy engine's number of threads.
  CopyLimit limit(bytes, page, workers);
  Samples samples;
  for (int rep = 1; rep <= reps + 1; ++rep) {  // the first of these warms up
    save_and_load(ctx, model, pool, pages, chunks, rep, nullptr, &save_s, &load_s);
    const double tp = limit.per_page_s();
    const double tn = limit.per_page_nt_s();
    const double tl = limit.large_s();
    if (rep > 1) samples.add(save_s, load_s, tp, tn, tl);
  }
  samples.into(r, bytes);
  measure_hooks(r, ctx, pool, page, nullptr);
  check(swiftkv_pool_destroy(ctx, pool), "pool_destroy");
  swiftkv_ctx_destroy(ctx);
  return r;
}

struct Overlap {
  uint32_t layers;
  double factor;                          // compute per layer / transfer per layer
  double transfer_ms;                     // per layer, measured
  double compute_ms = 0;                  // per layer, the engine's compute alone, measured
  double start_ms = 0;                    // the host time of start_load, median of 5
  double hidden_med = 0, hidden_min = 0;  // hidden / hideable, t the library's own load
  double hidden_limit = 0;                // the same, t at the machine's copy limit
  // The median gap between one layer's compute ending and the next one's starting (µs,
  // ComputeStamps): in the pipeline, in the compute alone, and (GPU) in the compute alone with a
  // cross-stream wait on an idle stream's event before each layer; -1 where not measured.
  double gap_us = -1, gap_alone_us = -1, gap_wait_us = -1;
};

// A load of `tokens` (cached) over `layers` layers with `compute_s` of busy compute per layer:
// the request's seconds.
double pipelined_load(swiftkv_ctx *ctx, uint32_t pool, const std::vector<uint32_t> &tokens,
                      const std::vector<int32_t> &pages, uint32_t layers, double compute_s,
                      void *stream = nullptr, ComputeStamps *stamps = nullptr) {
  uint64_t loaded = 0, saved = 0;
  const double t = run_request(ctx, pool, tokens, pages, &loaded, &saved, stream, layers, compute_s,
                               nullptr, stamps);
  if (loaded != tokens.size()) {
    std::fprintf(stderr, "bench_transfer: loaded %llu of %zu tokens\n", (unsigned long long)loaded,
                 tokens.size());
    std::exit(1);
  }
  return t;
}

// The host time of swiftkv_start_load alone for a request of `layers` layers whose chunks are all
// cached, median of 5 after a warm-up: what holds the engine's first layer back.
double start_load_host_s(swiftkv_ctx *ctx, uint32_t pool, const std::vector<uint32_t> &tokens,
                         const std::vector<int32_t> &pages, uint32_t layers, void *stream) {
  std::vector<double> times;
  for (int rep = 0; rep <= 5; ++rep) {
    uint64_t loaded = 0, saved = 0;
    double t = 0;
    run_request(ctx, pool, tokens, pages, &loaded, &saved, stream, layers, 0, &t);
    if (rep > 0) times.push_back(t);
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

#if defined(SWIFTKV_BENCH_HAVE_CUDA)
// Another stream with nothing on it and an event recorded there before each layer, which the
// engine's stream then waits for: what a cross-stream wait such as wait_layer_load's costs the
// engine's stream when what it waits for is already done.
class IdleWait {
 public:
  IdleWait() {
    if (cudaStreamCreateWithFlags(&idle_, cudaStreamNonBlocking) != cudaSuccess ||
        cudaEventCreateWithFlags(&done_, cudaEventDisableTiming) != cudaSuccess) {
      die("the idle stream's event");
    }
  }
  ~IdleWait() {
    cudaEventDestroy(done_);
    cudaStreamDestroy(idle_);
  }
  IdleWait(const IdleWait &) = delete;
  IdleWait &operator=(const IdleWait &) = delete;
  void before_layer(void *stream) {
    cudaEventRecord(done_, idle_);
    cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), done_, 0);
  }

 private:
  cudaStream_t idle_ = nullptr;
  cudaEvent_t done_ = nullptr;
};
#endif

// The engine's compute alone: `layers` layers of `comp` seconds each (compute_layer), the
// seconds until the last is done. On the GPU this counts the kernels' launches and the gaps
// between them, which the engine pays with or without the library. `stamps`, where given, stamp
// each layer; `cross_waits` (GPU only): each layer's compute after an IdleWait.
double compute_alone(uint32_t layers, double comp, void *stream, ComputeStamps *stamps = nullptr,
                     bool cross_waits = false) {
#if defined(SWIFTKV_BENCH_HAVE_CUDA)
  std::unique_ptr<IdleWait> idle;
  if (cross_waits && stream != nullptr) idle = std::make_unique<IdleWait>();
#else
  if (cross_waits) die("cross-stream waits without CUDA");
#endif
  const double t0 = now_s();
  for (uint32_t l = 0; l < layers; ++l) {
#if defined(SWIFTKV_BENCH_HAVE_CUDA)
    if (idle) idle->before_layer(stream);
#endif
    if (stamps != nullptr) {
      stamps->compute(l, comp);
    } else {
      compute_layer(comp, stream);
    }
  }
#if defined(SWIFTKV_BENCH_HAVE_CUDA)
  if (stream != nullptr) cudaStreamSynchronize(static_cast<cudaStream_t>(stream));
#endif
  const double t = now_s() - t0;
  if (stamps != nullptr) stamps->collect();
  return t;
}

// The rows of one layer count: t per layer from the copy limit (`limit_s`: the seconds to copy
// all layers' bytes, median of 5), then for c = 0.5, 1 and 2 t the library's load with no compute
// and with c per layer (`load_s(c, stamps)`) and the compute alone on `stream`, alternating with
// the copy limit, over `reps` after a warm-up. The serial time is the load with no compute plus
// the compute alone, both measured. The gaps between layers' compute are stamped in the pipeline
// and in the compute alone (on the GPU also with a cross-stream wait before each layer, run
// after the rest of the repetition and outside its figures).
std::vector<Overlap> overlap_rows(uint32_t layers, int reps, const std::function<double()> &limit_s,
                                  const std::function<double(double, ComputeStamps *)> &load_s,
                                  void *stream) {
  std::vector<double> t0s;
  for (int i = 0; i < 5; ++i) t0s.push_back(limit_s());
  std::sort(t0s.begin(), t0s.end());
  const double t_layer = t0s[t0s.size() / 2] / layers;
  std::vector<Overlap> out;
  for (double factor : {0.5, 1.0, 2.0}) {
    const double comp = factor * t_layer;
    std::vector<double> limit, own, piped, alone;
    ComputeStamps piped_gaps(layers, stream), alone_gaps(layers, stream), wait_gaps(layers, stream);
    for (int rep = 0; rep <= reps; ++rep) {  // rep 0 warms up
      const bool kept = rep > 0;
      const double a = limit_s();
      const double b = load_s(0, nullptr);
      const double p = load_s(comp, kept ? &piped_gaps : nullptr);
      const double c = compute_alone(layers, comp, stream, kept ? &alone_gaps : nullptr);
      if (stream != nullptr) compute_alone(layers, comp, stream, kept ? &wait_gaps : nullptr, true);
      if (rep > 0) {
        limit.push_back(a);
        own.push_back(b);
        piped.push_back(p);
        alone.push_back(c);
      }
    }
    for (std::vector<double> *v : {&limit, &own, &piped, &alone}) std::sort(v->begin(), v->end());
    const double comp_s = alone[alone.size() / 2];
    auto hidden = [&](double transfer_s, double piped_s) {
      const double t = transfer_s / layers, c = comp_s / layers;
      return (transfer_s + comp_s - piped_s) / ((layers - 1) * std::min(t, c));
    };
    Overlap o{layers, factor, t_layer * 1e3, comp_s / layers * 1e3};
    o.hidden_med = hidden(own[own.size() / 2], piped[piped.size() / 2]);
    o.hidden_min = hidden(own.front(), piped.back());
    o.hidden_limit = hidden(limit[limit.size() / 2], piped[piped.size() / 2]);
    o.gap_us = piped_gaps.median_us();
    o.gap_alone_us = alone_gaps.median_us();
    if (stream != nullptr) o.gap_wait_us = wait_gaps.median_us();
    out.push_back(o);
  }
  return out;
}

// The layer-wise pipeline: serial time L(t + c) less the measured time, over the hideable part
// (L - 1) min(t, c): layer 0's load has nothing to hide under, and the longer of the two per
// layer cannot hide. t is the machine's copy limit for a layer's bytes: the faster of one memcpy
// per page and K/V and one large memcpy, on the copy engine's number of threads, measured in the
// same repetition. (The library's
// own load with an idle engine is slower than that here, its thread woken once per layer; a
// slower copy than the limit shows as less hidden, never as more.)
std::vector<Overlap> measure_overlap(uint32_t layers, uint32_t chunks, int reps, Workers &threads) {
  const uint64_t bytes = uint64_t{chunks} * kLayerPiece * layers;
  swiftkv_ctx *ctx = bench_ctx(bytes, 0);
  swiftkv_model_desc m = bench_model("overlap", 16, SWIFTKV_DEVICE_HOST);
  m.num_layers = layers;
  swiftkv_model_config mc = SWIFTKV_MODEL_CONFIG_INIT;
  mc.desc = &m;
  uint32_t model = 0, pool = 0;
  check(swiftkv_model_register(&model, ctx, &mc), "model_register");
  const uint32_t n_pages = chunks * (kChunk / 16);
  check(swiftkv_pool_create(&pool, ctx, model, n_pages, 0), "pool_create");
  const std::vector<int32_t> pages = scattered_pages(n_pages);
  std::vector<uint32_t> tokens(uint64_t{chunks} * kChunk);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(i * 7 + 3);
  {
    // Stored once (a save through the same pool), loaded by every request below.
    uint64_t loaded = 0, saved = 0;
    run_request(ctx, pool, tokens, pages, &loaded, &saved, nullptr, layers);
    if (saved != tokens.size()) {
      std::fprintf(stderr, "bench_transfer: saved %llu of %zu tokens\n", (unsigned long long)saved,
                   tokens.size());
      std::exit(1);
    }
  }
  // The copy limit: the faster of the two ways to copy the bytes, as in the table above.
  CopyLimit limit(bytes, 16, threads);
  std::vector<Overlap> out = overlap_rows(
      layers, reps, [&] { return limit.fastest_s(); },
      [&](double comp, ComputeStamps *stamps) {
        return pipelined_load(ctx, pool, tokens, pages, layers, comp, nullptr, stamps);
      },
      nullptr);
  const double start_s = start_load_host_s(ctx, pool, tokens, pages, layers, nullptr);
  for (Overlap &o : out) o.start_ms = start_s * 1e3;
  check(swiftkv_pool_destroy(ctx, pool), "pool_destroy");
  swiftkv_ctx_destroy(ctx);
  return out;
}

#if defined(SWIFTKV_BENCH_HAVE_CUDA)
// The device pool: chunks cached in pinned host memory loaded into device pages and saved back,
// beside one cudaMemcpyAsync per page and K/V (scattered) and one large copy, pinned -> device.
// The engine's own tensors on device 0, NHD per layer ([pages, 2, page, H, D] f16), registered
// as a pool of `model`; *dev is their memory (cudaFree it after the pool is destroyed).
uint32_t engine_pool(swiftkv_ctx *ctx, uint32_t model, uint32_t page, uint32_t n_pages, void **dev,
                     uint32_t layers = kLayers) {
  const uint64_t layer_bytes = uint64_t{n_pages} * 2 * page * kHeads * kDim * 2;
  if (cudaMalloc(dev, layer_bytes * layers) != cudaSuccess) {
    std::fprintf(stderr, "cudaMalloc of %llu bytes failed\n",
                 (unsigned long long)(layer_bytes * layers));
    std::exit(1);
  }
  std::vector<void *> bases(layers);
  for (uint32_t l = 0; l < layers; ++l) bases[l] = static_cast<char *>(*dev) + l * layer_bytes;
  swiftkv_pool_desc pd = SWIFTKV_POOL_DESC_INIT;
  pd.num_pages = n_pages;
  pd.layer_base = bases.data();
  pd.layer_span_bytes = layer_bytes;
  pd.head_stride = kDim;
  pd.token_stride = int64_t{kHeads} * kDim;
  pd.kv_stride = pd.token_stride * page;
  pd.page_stride = 2 * pd.kv_stride;
  uint32_t pool = 0;
  check(swiftkv_pool_register(&pool, ctx, model, &pd), "pool_register");
  return pool;
}

// The layer-wise pipeline on the GPU (SwiftCache §3.3): host chunks loaded into a device pool
// layer by layer while the engine computes, its compute per layer a kernel spinning for c on its
// stream after each wait_layer_load. t per layer from one pinned-to-device copy of all the bytes.
std::vector<Overlap> measure_device_overlap(uint32_t layers, uint32_t chunks, int reps) {
  const uint64_t bytes = uint64_t{chunks} * kLayerPiece * layers;
  swiftkv_ctx *ctx = bench_ctx(bytes, 1);
  swiftkv_model_desc m = bench_model("overlap-device", 16, 0);
  m.num_layers = layers;
  swiftkv_model_config mc = SWIFTKV_MODEL_CONFIG_INIT;
  mc.desc = &m;
  uint32_t model = 0;
  check(swiftkv_model_register(&model, ctx, &mc), "model_register");
  const uint32_t n_pages = chunks * (kChunk / 16);
  void *dev = nullptr;
  const uint32_t pool = engine_pool(ctx, model, 16, n_pages, &dev, layers);
  cudaStream_t s = nullptr;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  const std::vector<int32_t> pages = scattered_pages(n_pages);
  std::vector<uint32_t> tokens(uint64_t{chunks} * kChunk);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(i * 7 + 5);
  {
    uint64_t loaded = 0, saved = 0;
    run_request(ctx, pool, tokens, pages, &loaded, &saved, s, layers);
    if (saved != tokens.size()) die("the device pipeline's chunks were not all saved");
  }
  void *pinned = nullptr, *dst = nullptr;
  if (cudaMallocHost(&pinned, bytes) != cudaSuccess || cudaMalloc(&dst, bytes) != cudaSuccess) {
    die("the device pipeline's copy buffers");
  }
  std::memset(pinned, 1, bytes);
  std::vector<Overlap> out = overlap_rows(
      layers, reps,
      [&] {
        const double t0 = now_s();
        cudaMemcpyAsync(dst, pinned, bytes, cudaMemcpyHostToDevice, s);
        cudaStreamSynchronize(s);
        return now_s() - t0;
      },
      [&](double comp, ComputeStamps *stamps) {
        return pipelined_load(ctx, pool, tokens, pages, layers, comp, s, stamps);
      },
      s);
  const double start_s = start_load_host_s(ctx, pool, tokens, pages, layers, s);
  for (Overlap &o : out) o.start_ms = start_s * 1e3;
  check(swiftkv_pool_destroy(ctx, pool), "pool_destroy");
  swiftkv_ctx_destroy(ctx);
  cudaFreeHost(pinned);
  cudaFree(dst);
  cudaFree(dev);
  cudaStreamDestroy(s);
  return out;
}

Row measure_device(uint32_t page, uint32_t chunks, int reps) {
  Row r{};
  r.page = page;
  const uint64_t bytes = uint64_t{chunks} * kLayerPiece * kLayers;
  swiftkv_ctx *ctx = bench_ctx(bytes, 1);
  swiftkv_model_desc m = bench_model("bench-device", page, 0);
  swiftkv_model_config mc = SWIFTKV_MODEL_CONFIG_INIT;
  mc.desc = &m;
  uint32_t model = 0, pool = 0;
  check(swiftkv_model_register(&model, ctx, &mc), "model_register");
  const uint32_t n_pages = chunks * (kChunk / page);
  void *dev = nullptr;
  pool = engine_pool(ctx, model, page, n_pages, &dev);
  cudaStream_t s = nullptr;
  cudaStreamCreate(&s);
  const std::vector<int32_t> pages = scattered_pages(n_pages);
  double save_s = 0, load_s = 0;
  save_and_load(ctx, model, pool, pages, chunks, 0, s, &save_s, &load_s);
  r.first_save_gbs = bytes / save_s / 1e9;
  r.first_load_gbs = bytes / load_s / 1e9;
  void *pinned = nullptr;
  cudaMallocHost(&pinned, bytes);
  std::memset(pinned, 1, bytes);
  const uint64_t run = uint64_t{page} * kHeads * kDim * 2;
  const uint64_t runs = bytes / run;
  Samples samples;
  for (int rep = 1; rep <= reps + 1; ++rep) {  // the first of these warms up
    save_and_load(ctx, model, pool, pages, chunks, rep, s, &save_s, &load_s);
    double t0 = now_s();
    for (uint64_t k = 0; k < runs; ++k) {
      const uint64_t p = (k * 2654435761u) % runs;
      cudaMemcpyAsync(static_cast<char *>(dev) + p * run, static_cast<char *>(pinned) + k * run,
                      run, cudaMemcpyHostToDevice, s);
    }
    cudaStreamSynchronize(s);
    const double tp = now_s() - t0;
    t0 = now_s();
    cudaMemcpyAsync(dev, pinned, bytes, cudaMemcpyHostToDevice, s);
    cudaStreamSynchronize(s);
    const double tl = now_s() - t0;
    if (rep > 1) samples.add(save_s, load_s, tp, tl);
  }
  samples.into(r, bytes);
  measure_hooks(r, ctx, pool, page, s);
  check(swiftkv_pool_destroy(ctx, pool), "pool_destroy");
  swiftkv_ctx_destroy(ctx);
  cudaFreeHost(pinned);
  cudaFree(dev);
  cudaStreamDestroy(s);
  return r;
}
#endif

#if defined(SWIFTKV_BENCH_HAVE_CUDA)
// A copy of `v` in device memory (cudaFree it).
template <class T>
void *upload(const std::vector<T> &v) {
  void *d = nullptr;
  cudaMalloc(&d, v.size() * sizeof(T));
  cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
  return d;
}

// A non-blocking stream and a pair of events: time(work) is the seconds `work` enqueued on the
// stream took on the device.
struct StreamTimer {
  cudaStream_t stream = nullptr;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  StreamTimer() {
    cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
  }
  ~StreamTimer() {
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaStreamDestroy(stream);
  }
  StreamTimer(const StreamTimer &) = delete;
  StreamTimer &operator=(const StreamTimer &) = delete;
  template <class Work>
  double time(Work &&work) {
    cudaEventRecord(e0, stream);
    work();
    cudaEventRecord(e1, stream);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    return ms / 1e3;
  }
};

// The gather/scatter kernel alone, reading chunk pieces in place from device memory (as it reads
// lent or IPC-mapped chunks) into scattered pages and back, against one cudaMemcpyAsync of the
// same bytes device to device, interleaved repetition by repetition on one stream, timed by
// events. GB/s counts the bytes copied once (each is read once and written once by both).
struct KernelRow {
  const char *layout;
  uint32_t page;
  Rate scatter, gather, copy;
  Rate scatter_ahead, gather_ahead;  // launched as CopyKernel::ahead (the others: spread)
  const char *chunks_in = "malloc";  // KernelChunks, by name
  uint32_t head_dim = kDim;
};

// Where the kernel rows' chunk pieces are. malloc: one cudaMalloc, the pieces side by side (the
// rows since the first GPU run). vmm: the same bytes in a VMM region of the library's, each 2 MiB
// granule its own physical allocation mapped on its own, as a lender's region is and as a
// borrower maps a lease. layer_of_8: the pieces one layer of chunks of 8 layers, 8 MiB apart in
// a cudaMalloc eight times the size, as a request's load reads its chunks' layer. Loads from
// another process's VMM memory ran at 0.57-0.72 of a device copy on the H200 where these rows
// ran at 0.85-0.88; the last two tell the memory's mapping and the spread of the pieces apart.
enum class KernelChunks { malloc, vmm, layer_of_8 };
const char *kernel_chunks_name(KernelChunks c) {
  return c == KernelChunks::vmm ? "vmm" : c == KernelChunks::layer_of_8 ? "layer_of_8" : "malloc";
}

// The copy items of `chunks` chunks in scattered NHD [pages, 2, B, H, D] or HND
// [pages, 2, H, B, D] pages of F16 of `page` tokens and `dim`-element heads, from each chunk's
// copy plan as the library builds it.
std::vector<swiftkv::CopyItem> kernel_items(const char *layout, uint32_t page, uint32_t chunks,
                                            uint32_t dim = kDim) {
  const uint32_t pages = chunks * (kChunk / page);
  const int64_t b = page, h = kHeads, d = dim;
  const std::vector<int32_t> order = scattered_pages(pages);
  swiftkv::PageLayout lay;
  lay.num_pages = pages;
  lay.page_tokens = page;
  lay.heads = kHeads;
  lay.head_dim = dim;
  lay.dtype_bytes = 2;
  lay.page_stride = 2 * b * h * d;
  lay.kv_stride = b * h * d;
  const bool hnd = std::string(layout) == "hnd";
  lay.token_stride = hnd ? d : h * d;
  lay.head_stride = hnd ? b * d : d;
  std::vector<swiftkv::CopyItem> items;
  for (uint32_t i = 0; i < chunks; ++i) {
    const std::span<const int32_t> chunk_pages(order.data() + i * (kChunk / page), kChunk / page);
    const std::vector<swiftkv::CopySegment> plan =
        swiftkv::chunk_copy_plan(lay, chunk_pages, kChunk);
    swiftkv::append_copy_items(reinterpret_cast<const uint64_t *>(plan.data()), plan.size(), i,
                               items);
  }
  return items;
}

KernelRow measure_kernel(const char *layout, uint32_t page, uint32_t chunks, int reps,
                         KernelChunks where = KernelChunks::malloc, uint32_t dim = kDim) {
  const uint64_t piece = layer_piece_bytes(dim);
  const uint64_t bytes = piece * chunks;
  const uint64_t chunk_stride = where == KernelChunks::layer_of_8 ? piece * kLayers : piece;
  const uint32_t pages = chunks * (kChunk / page);
  const int64_t b = page, h = kHeads, d = dim;
  const std::vector<swiftkv::CopyItem> items = kernel_items(layout, page, chunks, dim);
  void *src = nullptr, *dst = nullptr, *pool = nullptr, *d_items = nullptr, *d_chunks = nullptr;
  std::shared_ptr<swiftkv::MemoryRegion> vmm;
  if (where == KernelChunks::vmm) {
    swiftkv::CudaRegionOptions o;
    o.size = bytes;
    o.allocation = swiftkv::CudaAllocation::vmm;
    vmm = swiftkv::create_cuda_region(o);
    vmm->commit(0, vmm->size());
    src = vmm->data();
  } else {
    cudaMalloc(&src, chunk_stride * chunks);
  }
  cudaMalloc(&dst, bytes);
  cudaMalloc(&pool, uint64_t{pages} * 2 * b * h * d * 2);
  cudaMemset(src, 1, bytes);
  std::vector<swiftkv::ChunkSource> table(chunks);
  for (uint32_t i = 0; i < chunks; ++i) {
    table[i].direct = reinterpret_cast<uint64_t>(src) + uint64_t{i} * chunk_stride;
  }
  d_items = upload(items);
  d_chunks = upload(table);
  StreamTimer timer;
  const cudaStream_t s = timer.stream;
  auto timed = [&](auto &&work) { return timer.time(work); };
  const auto n = static_cast<uint32_t>(items.size());
  auto kernel = [&](bool to_pages, swiftkv::CopyKernel k) {
    return [&, to_pages, k] {
      swiftkv::launch_copy_items(0, static_cast<swiftkv::CopyItem *>(d_items), n,
                                 static_cast<swiftkv::ChunkSource *>(d_chunks), 0, nullptr,
                                 static_cast<std::byte *>(pool), to_pages, s, k);
    };
  };
  const auto scatter = kernel(true, swiftkv::CopyKernel::spread);
  const auto gather = kernel(false, swiftkv::CopyKernel::spread);
  const auto scatter_ahead = kernel(true, swiftkv::CopyKernel::ahead);
  const auto gather_ahead = kernel(false, swiftkv::CopyKernel::ahead);
  auto copy = [&] { cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s); };
  // tools/ncu_table.py names a profile's launches by this order and kernel_tables'.
  for (int w = 0; w < 3; ++w) {  // warm-up
    timed(scatter);
    timed(gather);
    timed(scatter_ahead);
    timed(gather_ahead);
    timed(copy);
  }
  std::vector<double> ts, tg, tsa, tga, tc;
  for (int r = 0; r < reps; ++r) {
    ts.push_back(timed(scatter));
    tg.push_back(timed(gather));
    tsa.push_back(timed(scatter_ahead));
    tga.push_back(timed(gather_ahead));
    tc.push_back(timed(copy));
  }
  const auto moved = static_cast<double>(bytes);
  KernelRow row{layout,
                page,
                rate_of(ts, moved),
                rate_of(tg, moved),
                rate_of(tc, moved),
                rate_of(tsa, moved),
                rate_of(tga, moved),
                kernel_chunks_name(where),
                dim};
  if (!vmm) cudaFree(src);
  for (void *p : {dst, pool, d_items, d_chunks}) cudaFree(p);
  return row;
}

// The decode kernel alone: `chunks` chunks' layer payloads under `params` (one chunk of smooth
// f16 KV encoded once, its payload repeated) in device staging, decoded into scattered NHD or HND
// pages of `page` tokens, against one device-to-device copy of the decoded bytes, interleaved on
// one stream. GB/s counts decoded bytes written. The pages are then compared with the CPU twin's.
struct DecodeRow {
  std::string codec;
  const char *layout;  // nhd or hnd
  uint32_t page;
  uint32_t head_dim;
  double ratio;
  Rate decode, copy;
  bool exact;
  Rate decode_ahead;  // launched as CopyKernel::ahead (decode: spread)
  bool exact_ahead;
};

DecodeRow measure_decode(const char *name, const swiftkv::codec::CodecParams &params,
                         const char *layout, uint32_t page, uint32_t chunks, int reps,
                         uint32_t dim = kDim) {
  namespace cd = swiftkv::codec;
  const cd::ChunkShape shape{1, kChunk, kHeads, dim, SWIFTKV_DTYPE_F16};
  const uint64_t piece = layer_piece_bytes(dim);  // decoded
  std::vector<std::byte> raw(shape.bytes());
  for (uint64_t e = 0; e < shape.elements(); ++e) {
    const uint64_t ch = e % (uint64_t{kHeads} * dim), t = e / (uint64_t{kHeads} * dim);
    const float x = 0.25f * static_cast<float>(ch % 13) - 1.5f +
                    0.1f * std::sin(0.05f * static_cast<float>(t) + static_cast<float>(ch));
    const uint16_t b = cd::float_to_element(x, SWIFTKV_DTYPE_F16);
    std::memcpy(raw.data() + 2 * e, &b, 2);
  }
  const std::vector<std::byte> frame = cd::encode(shape, params, raw);
  const cd::LayerShape ls = cd::layer_shape_of(shape);
  uint32_t encoding = static_cast<uint32_t>(params.codec) | (params.bits << 8);
  if (params.codec == cd::Codec::kivi) {
    encoding |= static_cast<uint32_t>(__builtin_ctz(params.group)) << 16;
  }
  const uint64_t payload = cd::layer_payload_bytes(ls, encoding);
  const uint64_t slot = (payload + 15) / 16 * 16;
  std::vector<std::byte> staging(slot * chunks);
  for (uint32_t i = 0; i < chunks; ++i) {
    std::memcpy(staging.data() + i * slot, frame.data() + cd::kFrameHeaderBytes, payload);
  }
  const uint32_t pages = chunks * (kChunk / page);
  const int64_t b = page, h = kHeads, d = dim;
  const std::vector<swiftkv::CopyItem> items = kernel_items(layout, page, chunks, dim);
  std::vector<swiftkv::ChunkSource> table(chunks);
  for (uint32_t i = 0; i < chunks; ++i) table[i] = swiftkv::ChunkSource{0, i * slot, encoding, 0};
  const uint64_t bytes = piece * chunks;
  const uint64_t pool_bytes = uint64_t{pages} * 2 * b * h * d * 2;
  void *src = nullptr, *dst = nullptr, *pool = nullptr, *d_staging = nullptr, *d_items = nullptr,
       *d_chunks = nullptr;
  cudaMalloc(&src, bytes);
  cudaMalloc(&dst, bytes);
  cudaMalloc(&pool, pool_bytes);
  cudaMemset(src, 1, bytes);
  cudaMemset(pool, 0, pool_bytes);
  d_staging = upload(staging);
  d_items = upload(items);
  d_chunks = upload(table);
  StreamTimer timer;
  const cudaStream_t s = timer.stream;
  auto timed = [&](auto &&work) { return timer.time(work); };
  const auto n = static_cast<uint32_t>(items.size());
  auto launch = [&](swiftkv::CopyKernel k) {
    return [&, k] {
      swiftkv::launch_decode_items(0, static_cast<swiftkv::CopyItem *>(d_items), n,
                                   static_cast<swiftkv::ChunkSource *>(d_chunks),
                                   static_cast<std::byte *>(d_staging),
                                   static_cast<std::byte *>(pool), ls, s, k);
    };
  };
  const auto decode = launch(swiftkv::CopyKernel::spread);
  const auto decode_ahead = launch(swiftkv::CopyKernel::ahead);
  auto copy = [&] { cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s); };
  // tools/ncu_table.py names a profile's launches by this order (the exactness checks' below
  // included) and kernel_tables'.
  for (int w = 0; w < 3; ++w) {  // warm-up
    timed(decode);
    timed(decode_ahead);
    timed(copy);
  }
  std::vector<double> td, ta, tc;
  for (int r = 0; r < reps; ++r) {
    if (r % 2 == 0) {
      td.push_back(timed(decode));
      ta.push_back(timed(decode_ahead));
      tc.push_back(timed(copy));
    } else {
      tc.push_back(timed(copy));
      ta.push_back(timed(decode_ahead));
      td.push_back(timed(decode));
    }
  }
  // Each launch's pages from zero, against the CPU twin's.
  std::vector<std::byte> want(pool_bytes);
  swiftkv::decode_items_cpu(items.data(), items.size(), table.data(), ls, staging.data(),
                            want.data());
  auto exact = [&](const std::function<void()> &run) {
    std::vector<std::byte> got(pool_bytes);
    cudaMemsetAsync(pool, 0, pool_bytes, s);
    run();
    cudaStreamSynchronize(s);
    cudaMemcpy(got.data(), pool, pool_bytes, cudaMemcpyDeviceToHost);
    return got == want;
  };
  const auto moved = static_cast<double>(bytes);
  DecodeRow row{name,
                layout,
                page,
                dim,
                static_cast<double>(piece) / static_cast<double>(payload),
                rate_of(td, moved),
                rate_of(tc, moved),
                exact(decode),
                rate_of(ta, moved),
                exact(decode_ahead)};
  for (void *p : {src, dst, pool, d_staging, d_items, d_chunks}) cudaFree(p);
  return row;
}

// Where a load's or a save's time goes between pinned host memory and the device: the bytes of a
// request of `chunks` chunks (kLayers layers of one kLayerPiece piece each, chunk after chunk in
// pinned memory as the host tier keeps them: a layer's pieces are a chunk apart), moved layer by
// layer in each way a transfer engine can move them, every way timed by events on one stream and
// run in turn repetition by repetition after a warm-up. Host to device (loads), into a device
// staging buffer of the layer's pieces side by side unless said otherwise:
//   large       one copy of all the bytes (the bar's baseline: one large pinned copy)
//   batch       per layer one cudaMemcpyBatchAsync of the pieces (what the library does today)
//   each        per layer one cudaMemcpyAsync per piece
//   two_streams the same, the pieces alternating between two streams
//   2d          per layer one cudaMemcpy2DAsync: its rows are the pieces, a chunk apart
//   in_place    per layer the scatter kernel reading the pieces where they are, in pinned host
//               memory, into scattered 16-token NHD pages (no staging, no copy engine)
// and device to host (saves), from the staging buffer or (in_place) the pages: large, batch, 2d,
// and the gather kernel writing the pieces in place. GB/s counts the bytes moved once.
struct CopyPathRow {
  std::string path, dir;
  Rate rate;
  bool ok;
};

std::vector<CopyPathRow> measure_copy_paths(uint32_t chunks, int reps) {
  const uint64_t piece = kLayerPiece, chunk_bytes = piece * kLayers;
  const uint64_t bytes = chunk_bytes * chunks, layer_bytes = piece * chunks;
  const uint32_t page = 16, pages = chunks * (kChunk / page);
  const uint64_t pool_bytes = uint64_t{pages} * 2 * page * kHeads * kDim * 2;
  void *host = nullptr, *dev = nullptr, *staging = nullptr, *pool = nullptr;
  if (cudaMallocHost(&host, bytes) != cudaSuccess || cudaMalloc(&dev, bytes) != cudaSuccess ||
      cudaMalloc(&staging, layer_bytes) != cudaSuccess ||
      cudaMalloc(&pool, pool_bytes) != cudaSuccess) {
    die("the copy paths' buffers");
  }
  std::memset(host, 1, bytes);
  cudaMemset(dev, 2, bytes);
  const std::vector<swiftkv::CopyItem> items = kernel_items("nhd", page, chunks);
  std::vector<swiftkv::ChunkSource> table(chunks);
  for (uint32_t i = 0; i < chunks; ++i) {
    table[i].direct = reinterpret_cast<uint64_t>(host) + uint64_t{i} * chunk_bytes;
  }
  void *d_items = upload(items), *d_chunks = upload(table);
  StreamTimer timer;
  const cudaStream_t s = timer.stream;
  cudaStream_t s2 = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;
  cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking);
  cudaEventCreateWithFlags(&fork, cudaEventDisableTiming);
  cudaEventCreateWithFlags(&join, cudaEventDisableTiming);
  auto *h = static_cast<char *>(host);
  auto *st = static_cast<char *>(staging);
  // A piece's place in host memory and in staging.
  auto host_piece = [&](uint32_t l, uint32_t i) { return h + i * chunk_bytes + l * piece; };
  auto staged = [&](uint32_t i) { return st + i * piece; };
  std::vector<void *> dsts(chunks);
  std::vector<const void *> srcs(chunks);
  std::vector<size_t> sizes(chunks, piece);
  // Each way returns false when a call fails (a runtime without batched copies, say).
  auto batch = [&](bool h2d) {
    for (uint32_t l = 0; l < kLayers; ++l) {
      for (uint32_t i = 0; i < chunks; ++i) {
        dsts[i] = h2d ? static_cast<void *>(staged(i)) : host_piece(l, i);
        srcs[i] = h2d ? static_cast<const void *>(host_piece(l, i)) : staged(i);
      }
#if CUDART_VERSION >= 13000
      cudaMemcpyAttributes attr{};
      attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
      size_t first = 0;
      if (cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), chunks, &attr, &first, 1,
                               s) != cudaSuccess) {
        return false;
      }
#else
      return false;
#endif
    }
    return true;
  };
  auto each = [&](int streams) {
    if (streams > 1) {
      cudaEventRecord(fork, s);
      cudaStreamWaitEvent(s2, fork, 0);
    }
    bool ok = true;
    for (uint32_t l = 0; l < kLayers; ++l) {
      for (uint32_t i = 0; i < chunks; ++i) {
        ok &= cudaMemcpyAsync(staged(i), host_piece(l, i), piece, cudaMemcpyHostToDevice,
                              streams > 1 && i % 2 == 1 ? s2 : s) == cudaSuccess;
      }
    }
    if (streams > 1) {
      cudaEventRecord(join, s2);
      cudaStreamWaitEvent(s, join, 0);
    }
    return ok;
  };
  auto two_d = [&](bool h2d) {
    bool ok = true;
    for (uint32_t l = 0; l < kLayers; ++l) {
      ok &= (h2d ? cudaMemcpy2DAsync(staging, piece, host_piece(l, 0), chunk_bytes, piece, chunks,
                                     cudaMemcpyHostToDevice, s)
                 : cudaMemcpy2DAsync(host_piece(l, 0), chunk_bytes, staging, piece, piece, chunks,
                                     cudaMemcpyDeviceToHost, s)) == cudaSuccess;
    }
    return ok;
  };
  auto in_place = [&](bool scatter) {
    for (uint32_t l = 0; l < kLayers; ++l) {
      swiftkv::launch_copy_items(
          0, static_cast<swiftkv::CopyItem *>(d_items), static_cast<uint32_t>(items.size()),
          static_cast<swiftkv::ChunkSource *>(d_chunks), l * piece, nullptr,
          static_cast<std::byte *>(pool), scatter, s, swiftkv::copy_kernel_choice());
    }
    return cudaGetLastError() == cudaSuccess;
  };
  struct Way {
    const char *path, *dir;
    std::function<bool()> run;
    std::vector<double> secs;
    bool ok = true;
  };
  std::vector<Way> ways;
  auto add = [&](const char *path, const char *dir, std::function<bool()> run) {
    ways.push_back(Way{path, dir, std::move(run), {}, true});
  };
  add("large", "h2d",
      [&] { return cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, s) == cudaSuccess; });
  add("batch", "h2d", [&] { return batch(true); });
  add("each", "h2d", [&] { return each(1); });
  add("two_streams", "h2d", [&] { return each(2); });
  add("2d", "h2d", [&] { return two_d(true); });
  add("in_place", "h2d", [&] { return in_place(true); });
  add("large", "d2h",
      [&] { return cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, s) == cudaSuccess; });
  add("batch", "d2h", [&] { return batch(false); });
  add("2d", "d2h", [&] { return two_d(false); });
  add("in_place", "d2h", [&] { return in_place(false); });
  for (int rep = 0; rep <= reps; ++rep) {  // rep 0 warms up
    for (size_t k = 0; k < ways.size(); ++k) {
      Way &w = ways[(k + rep) % ways.size()];  // a different way first in each repetition
      if (!w.ok) continue;
      bool ok = true;
      const double t = timer.time([&] { ok = w.run(); });
      if (!ok || cudaGetLastError() != cudaSuccess) {
        w.ok = false;
        continue;
      }
      if (rep > 0) w.secs.push_back(t);
    }
  }
  std::vector<CopyPathRow> rows;
  for (const Way &w : ways) {
    rows.push_back(
        {w.path, w.dir, w.ok ? rate_of(w.secs, static_cast<double>(bytes)) : Rate{}, w.ok});
  }
  cudaEventDestroy(fork);
  cudaEventDestroy(join);
  cudaStreamDestroy(s2);
  cudaFreeHost(host);
  for (void *p : {dev, staging, pool, d_items, d_chunks}) cudaFree(p);
  return rows;
}

void print_copy_paths(const std::vector<CopyPathRow> &rows, uint32_t chunks, int reps) {
  std::printf(
      "\npinned host memory <-> device, the bytes of a request of %u chunks (%u layers x %llu "
      "KiB each), layer by layer in each way, GB/s median/best of %d, and over the large copy "
      "of the same direction:\n",
      chunks, kLayers, static_cast<unsigned long long>(kLayerPiece >> 10), reps);
  std::printf("%-4s %-12s %16s %8s\n", "dir", "path", "GB/s", "/large");
  for (const CopyPathRow &r : rows) {
    double large = 0;
    for (const CopyPathRow &q : rows) {
      if (q.dir == r.dir && q.path == "large" && q.ok) large = q.rate.med;
    }
    if (!r.ok) {
      std::printf("%-4s %-12s %16s\n", r.dir.c_str(), r.path.c_str(), "failed");
      continue;
    }
    std::printf("%-4s %-12s %7.1f/%7.1f  %8.2f\n", r.dir.c_str(), r.path.c_str(), r.rate.med,
                r.rate.best, large > 0 ? r.rate.med / large : 0.0);
  }
  std::printf("{\"bench\":\"copy_paths\",\"chunks\":%u,\"piece_bytes\":%llu,\"reps\":%d,\"rows\":[",
              chunks, static_cast<unsigned long long>(kLayerPiece), reps);
  for (size_t i = 0; i < rows.size(); ++i) {
    const CopyPathRow &r = rows[i];
    std::printf("%s{\"dir\":\"%s\",\"path\":\"%s\",\"ok\":%s,\"gbs\":%.2f,\"best_gbs\":%.2f}",
                i ? "," : "", r.dir.c_str(), r.path.c_str(), r.ok ? "true" : "false", r.rate.med,
                r.rate.best);
  }
  std::printf("]}\n");
}

void print_decode(const std::vector<DecodeRow> &rows, uint32_t chunks, int reps) {
  std::printf(
      "\ndecode kernel on the device, %u chunks of one layer piece (%llu bytes at head dim %u) "
      "decoded from device staging into NHD or HND pages, GB/s of decoded bytes, median/best of "
      "%d, beside a device-to-device copy of the decoded bytes:\n",
      chunks, static_cast<unsigned long long>(kLayerPiece), kDim, reps);
  std::printf("%-12s %-6s %5s %4s %6s %-7s %16s %16s %8s %s\n", "codec", "layout", "page", "dim",
              "ratio", "launch", "decode", "device copy", "de/copy", "CPU twin");
  for (const DecodeRow &r : rows) {
    for (const bool ahead : {false, true}) {
      const Rate &d = ahead ? r.decode_ahead : r.decode;
      std::printf("%-12s %-6s %5u %4u %6.2f %-7s %7.1f/%7.1f  %7.1f/%7.1f  %8.2f %s\n",
                  r.codec.c_str(), r.layout, r.page, r.head_dim, r.ratio,
                  ahead ? "ahead" : "spread", d.med, d.best, r.copy.med, r.copy.best,
                  d.med / r.copy.med, (ahead ? r.exact_ahead : r.exact) ? "bit-exact" : "DIFFERS");
    }
  }
  std::printf("{\"bench\":\"decode_kernel\",\"reps\":%d,\"rows\":[", reps);
  for (size_t i = 0; i < rows.size(); ++i) {
    const DecodeRow &r = rows[i];
    std::printf(
        "%s{\"codec\":\"%s\",\"layout\":\"%s\",\"page\":%u,\"head_dim\":%u,"
        "\"ratio\":%.3f,\"decode_gbs\":%.2f,\"decode_ahead_gbs\":%.2f,\"copy_gbs\":%.2f,"
        "\"exact\":%s}",
        i ? "," : "", r.codec.c_str(), r.layout, r.page, r.head_dim, r.ratio, r.decode.med,
        r.decode_ahead.med, r.copy.med, r.exact && r.exact_ahead ? "true" : "false");
  }
  std::printf("]}\n");
}

void print_kernel(const std::vector<KernelRow> &rows, uint32_t chunks, int reps) {
  std::printf(
      "\ngather/scatter kernel on the device, %u chunks of one layer piece (%llu bytes at head "
      "dim %u), pieces read in place, GB/s median/best of %d, beside a device-to-device copy:\n",
      chunks, static_cast<unsigned long long>(kLayerPiece), kDim, reps);
  std::printf("%-7s %-10s %5s %4s %-7s %16s %16s %16s %8s %8s\n", "layout", "chunks in", "page",
              "dim", "launch", "scatter", "gather", "device copy", "sc/copy", "ga/copy");
  for (const KernelRow &r : rows) {
    for (const bool ahead : {false, true}) {
      const Rate &sc = ahead ? r.scatter_ahead : r.scatter, &ga = ahead ? r.gather_ahead : r.gather;
      std::printf("%-7s %-10s %5u %4u %-7s %7.1f/%7.1f  %7.1f/%7.1f  %7.1f/%7.1f  %8.2f %8.2f\n",
                  r.layout, r.chunks_in, r.page, r.head_dim, ahead ? "ahead" : "spread", sc.med,
                  sc.best, ga.med, ga.best, r.copy.med, r.copy.best, sc.med / r.copy.med,
                  ga.med / r.copy.med);
    }
  }
  std::printf("{\"bench\":\"copy_kernel\",\"reps\":%d,\"rows\":[", reps);
  for (size_t i = 0; i < rows.size(); ++i) {
    const KernelRow &r = rows[i];
    std::printf(
        "%s{\"layout\":\"%s\",\"chunks_in\":\"%s\",\"page\":%u,\"head_dim\":%u,"
        "\"scatter_gbs\":%.2f,\"gather_gbs\":%.2f,\"scatter_ahead_gbs\":%.2f,"
        "\"gather_ahead_gbs\":%.2f,\"copy_gbs\":%.2f}",
        i ? "," : "", r.layout, r.chunks_in, r.page, r.head_dim, r.scatter.med, r.gather.med,
        r.scatter_ahead.med, r.gather_ahead.med, r.copy.med);
  }
  std::printf("]}\n");
}
#endif

void print_rows(const char *backend, const std::vector<Row> &rows, uint32_t chunks, int reps) {
  std::printf(
      "%s backend, %u chunks of %u tokens, %u layers x %llu KiB per chunk; GB/s median/best "
      "over %d repetitions\n",
      backend, chunks, kChunk, kLayers, static_cast<unsigned long long>(kLayerPiece >> 10), reps);
  std::printf("%5s %13s %13s %13s %13s %13s %10s %10s %10s %8s %8s %8s %8s\n", "page", "load",
              "save", "per_page", "nt_page", "large", "load/limit", "1st_save", "1st_load",
              "hook_us", "pair_us", "batch_us", "each_us");
  for (const Row &r : rows) {
    // The machine's copy limit: the fastest of the baselines (which one differs by machine).
    const double limit = std::max({r.per_page.med, r.per_page_nt.med, r.large.med});
    std::printf(
        "%5u %6.2f/%6.2f %6.2f/%6.2f %6.2f/%6.2f %6.2f/%6.2f %6.2f/%6.2f %10.2f %10.2f %10.2f "
        "%8.2f %8.3f %8.3f %8.3f\n",
        r.page, r.load.med, r.load.best, r.save.med, r.save.best, r.per_page.med, r.per_page.best,
        r.per_page_nt.med, r.per_page_nt.best, r.large.med, r.large.best, r.load.med / limit,
        r.first_save_gbs, r.first_load_gbs, r.hook_us, r.pair_us, r.batch_us, r.per_request_us);
  }
}

// lent: the chunks are in another process's memory (measure_peer_overlap), else in this one's
// host memory.
void print_overlap(const char *backend, const std::vector<Overlap> &rows, uint32_t chunks, int reps,
                   bool lent = false) {
  const bool host = std::strcmp(backend, "host") == 0;
  const char *limit = host   ? "the faster memcpy"
                      : lent ? "one device-to-device copy of the bytes"
                             : "one pinned-to-device copy of the bytes";
  std::printf(
      "\nlayer-wise pipeline (%s), %u chunks per request%s: compute c per layer as %s after "
      "each wait_layer_load;\nhidden = (L(t + c) - measured) / ((L - 1) min(t, c)), "
      "layer 0's load having nothing to hide under; t the library's own load with no compute "
      "(median/min),\nor a layer's bytes at the copy limit (%s); c the compute alone "
      "(measured: c_ms); all in the same %d repetitions; start_ms: the host time of start_load;\n"
      "gap_us: the median time from one layer's compute ending to the next one's starting, in the "
      "pipeline / in the compute alone%s\n",
      backend, chunks,
      !lent  ? ""
      : host ? " in another process's host memory"
             : " in another process's VMM memory",
      host ? "a busy wait" : "a kernel spinning on the engine's stream", limit, reps,
      host ? "" : " / alone with a cross-stream wait on a done event before each layer");
  std::printf("%7s %6s %14s %8s %16s %18s %9s %22s\n", "layers", "c/t", "t_per_layer_ms", "c_ms",
              "hidden_fraction", "vs_copy_limit", "start_ms", "gap_us");
  for (const Overlap &o : rows) {
    char gaps[64];
    if (o.gap_wait_us >= 0) {
      std::snprintf(gaps, sizeof gaps, "%.1f/%.1f/%.1f", o.gap_us, o.gap_alone_us, o.gap_wait_us);
    } else {
      std::snprintf(gaps, sizeof gaps, "%.1f/%.1f", o.gap_us, o.gap_alone_us);
    }
    std::printf("%7u %6.1f %14.3f %8.3f %8.3f/%7.3f %18.3f %9.3f %22s\n", o.layers, o.factor,
                o.transfer_ms, o.compute_ms, o.hidden_med, o.hidden_min, o.hidden_limit, o.start_ms,
                gaps);
  }
}

// The host tier growing: requests of `chunks` fresh chunks saved into a fresh context until
// `total` bytes are cached, so that the tier makes its slabs as the saves need them (on its own
// thread, page-locked where the context has a device), beside the same saves into that context
// once cleared, its slabs made: what growing costs a save; then as many again into the full
// tier, each chunk taking the slot of one evicted (its lines long out of the caches). In that
// order within each repetition; a fresh context each repetition, the first of them a warm-up.
struct Growth {
  Rate grow, refill, full;
};

Growth measure_growth(bool device, uint32_t chunks, uint64_t total, int reps) {
  const uint64_t request_bytes = uint64_t{chunks} * kLayerPiece * kLayers;
  const uint64_t requests = std::max<uint64_t>(1, total / request_bytes);
  const uint32_t page = 256, n_pages = chunks * (kChunk / page);
  const std::vector<int32_t> pages = scattered_pages(n_pages);
  std::vector<double> grow_s, refill_s, full_s;
  for (int rep = 0; rep <= reps; ++rep) {
    swiftkv_ctx_config c = SWIFTKV_CTX_CONFIG_INIT;
    c.device_mask = device ? 1 : 0;
    c.host_budget_bytes = requests * request_bytes + (uint64_t{64} << 20);
    c.demote_free_percent = 0;
    swiftkv_ctx *ctx = nullptr;
    check(swiftkv_ctx_create(&ctx, &c), "ctx_create");
    swiftkv_model_desc m = bench_model("bench-growth", page, device ? 0 : SWIFTKV_DEVICE_HOST);
    swiftkv_model_config mc = SWIFTKV_MODEL_CONFIG_INIT;
    mc.desc = &m;
    uint32_t model = 0, pool = 0;
    check(swiftkv_model_register(&model, ctx, &mc), "model_register");
    [[maybe_unused]] void *dev = nullptr;
    void *stream = nullptr;
#if defined(SWIFTKV_BENCH_HAVE_CUDA)
    if (device) {
      pool = engine_pool(ctx, model, page, n_pages, &dev);
      cudaStream_t s = nullptr;
      cudaStreamCreate(&s);
      stream = s;
    }
#endif
    if (!device) check(swiftkv_pool_create(&pool, ctx, model, n_pages, 0), "pool_create");
    std::vector<uint32_t> tokens(uint64_t{chunks} * kChunk);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(i);
    auto save_all = [&](uint32_t round) {
      const double t0 = now_s();
      for (uint64_t r = 0; r < requests; ++r) {
        tokens[0] = 0x80000000u | (round << 16) | static_cast<uint32_t>(r);  // fresh keys
        uint64_t loaded = 0, saved = 0;
        run_request(ctx, pool, tokens, pages, &loaded, &saved, stream);
        if (saved != tokens.size()) {
          std::fprintf(stderr, "bench_transfer: growth saved %llu of %zu tokens\n",
                       (unsigned long long)saved, tokens.size());
          std::exit(1);
        }
      }
      return now_s() - t0;
    };
    const double g = save_all(3 * static_cast<uint32_t>(rep));
    uint64_t n = 0;
    check(swiftkv_clear(&n, ctx, model, SWIFTKV_TIERS_ALL, nullptr, 0), "clear");
    const double f = save_all(3 * static_cast<uint32_t>(rep) + 1);
    const double e = save_all(3 * static_cast<uint32_t>(rep) + 2);
    if (rep > 0) {
      grow_s.push_back(g);
      refill_s.push_back(f);
      full_s.push_back(e);
    }
    check(swiftkv_pool_destroy(ctx, pool), "pool_destroy");
    swiftkv_ctx_destroy(ctx);
#if defined(SWIFTKV_BENCH_HAVE_CUDA)
    if (device) {
      cudaStreamDestroy(static_cast<cudaStream_t>(stream));
      cudaFree(dev);
    }
#endif
  }
  const double bytes = static_cast<double>(requests * request_bytes);
  return Growth{rate_of(grow_s, bytes), rate_of(refill_s, bytes), rate_of(full_s, bytes)};
}

void print_growth(const char *backend, const Growth &g, uint32_t chunks, uint64_t total, int reps) {
  std::printf(
      "\n%s backend: the host tier growing to %llu MiB, requests of %u fresh chunks saved into a "
      "fresh context (its slabs made as they are needed), beside the same saves once it is "
      "cleared, and as many again into the full tier (each evicting); GB/s median/best of %d\n",
      backend, (unsigned long long)(total >> 20), chunks, reps);
  std::printf("       grow        refill          full  grow/refill\n");
  std::printf("%6.2f/%6.2f %6.2f/%6.2f %6.2f/%6.2f %12.2f\n", g.grow.med, g.grow.best, g.refill.med,
              g.refill.best, g.full.med, g.full.best, g.grow.med / g.refill.med);
  std::printf(
      "{\"bench\":\"growth\",\"backend\":\"%s\",\"total_mib\":%llu,\"chunks\":%u,\"reps\":%d,"
      "\"grow_gbs\":%.3f,\"grow_best_gbs\":%.3f,\"refill_gbs\":%.3f,\"refill_best_gbs\":%.3f,"
      "\"full_gbs\":%.3f,\"full_best_gbs\":%.3f,\"grow_over_refill\":%.3f}\n",
      backend, (unsigned long long)(total >> 20), chunks, reps, g.grow.med, g.grow.best,
      g.refill.med, g.refill.best, g.full.med, g.full.best, g.grow.med / g.refill.med);
}

// "overlap":[...], the rows of a pipeline table.
void print_overlap_json(const std::vector<Overlap> &ov) {
  std::printf("\"overlap\":[");
  for (size_t i = 0; i < ov.size(); ++i) {
    std::printf(
        "%s{\"layers\":%u,\"compute_over_transfer\":%.1f,\"transfer_ms\":%.4f,"
        "\"compute_ms\":%.4f,\"hidden_fraction\":%.4f,\"hidden_fraction_min\":%.4f,"
        "\"hidden_vs_copy_limit\":%.4f,\"start_load_ms\":%.4f,\"gap_us\":%.2f,"
        "\"gap_alone_us\":%.2f",
        i ? "," : "", ov[i].layers, ov[i].factor, ov[i].transfer_ms, ov[i].compute_ms,
        ov[i].hidden_med, ov[i].hidden_min, ov[i].hidden_limit, ov[i].start_ms, ov[i].gap_us,
        ov[i].gap_alone_us);
    if (ov[i].gap_wait_us >= 0) std::printf(",\"gap_wait_us\":%.2f", ov[i].gap_wait_us);
    std::printf("}");
  }
  std::printf("]");
}

void print_json(const char *backend, const std::vector<Row> &rows, const std::vector<Overlap> &ov,
                uint32_t chunks, int reps) {
  std::printf("{\"bench\":\"transfer\",\"backend\":\"%s\",\"chunks\":%u,\"reps\":%d,\"rows\":[",
              backend, chunks, reps);
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row &r = rows[i];
    std::printf(
        "%s{\"page\":%u,\"load_gbs\":%.3f,\"load_best_gbs\":%.3f,\"save_gbs\":%.3f,"
        "\"save_best_gbs\":%.3f,\"per_page_gbs\":%.3f,\"per_page_nt_gbs\":%.3f,\"large_gbs\":%.3f,"
        "\"large_best_gbs\":%.3f,\"first_save_gbs\":%.3f,\"first_load_gbs\":%.3f,"
        "\"hook_us\":%.2f,\"hook_pair_us\":%.3f,\"hook_batch_us\":%.3f,"
        "\"hook_per_request_us\":%.3f,\"batch_requests\":%u}",
        i ? "," : "", r.page, r.load.med, r.load.best, r.save.med, r.save.best, r.per_page.med,
        r.per_page_nt.med, r.large.med, r.large.best, r.first_save_gbs, r.first_load_gbs, r.hook_us,
        r.pair_us, r.batch_us, r.per_request_us, kBatchRequests);
  }
  std::printf("],");
  print_overlap_json(ov);
  std::printf("}\n");
}

// The pipeline over lent memory: {"bench":"peer_overlap",...,"overlap":[...]}.
void print_peer_overlap_json(const char *backend, const std::vector<Overlap> &ov, uint32_t chunks,
                             int reps) {
  std::printf("{\"bench\":\"peer_overlap\",\"backend\":\"%s\",\"chunks\":%u,\"reps\":%d,", backend,
              chunks, reps);
  print_overlap_json(ov);
  std::printf("}\n");
}

// Loads from a peer's memory: a second process (this program, --lender) offers a region through
// the coordinator, this one borrows it, stores `chunks` chunks there, and loads them into a pool
// of `page`-token pages, reading the lent memory in place. On the device: the lender's region is
// VMM memory on device 0 and the pool the engine's tensors there, beside one device-to-device
// cudaMemcpyAsync of the same bytes. On the host: the region is host memory in 2 MiB granules
// (passed with the grant, as VMM memory is) and the pool a host pool, beside one large memcpy of
// the same bytes on the copy engine's threads. Timed from start_load to the end of the last
// layer (request_begin, the host's planning, is left out), alternated with the baseline
// repetition by repetition after a warm-up. GB/s counts the bytes loaded. On the device the
// first pool launches the gather/scatter kernel as SWIFTKV_COPY_KERNEL says (spread when unset),
// and the same loads also go into a second pool over tensors of its own that launches it ahead
// (the variable set to ahead as its first request began), in the same repetitions.
struct PeerRow {
  uint32_t page;
  Rate load, copy;
  Rate load_ahead;  // device only
};

extern "C" char **environ;

// The lender's process: a region on `device` (SWIFTKV_DEVICE_HOST: host granules) big enough for
// `chunks` chunks of `layers` layers and one unit of its own, offered as "bench" at `endpoint`;
// "ready" on stdout, gone at end of stdin.
int lender_main(const char *endpoint, uint32_t chunks, int32_t device, uint32_t layers) {
  const uint64_t unit_blocks = kChunk / 16;
  swiftkv_ctx_config c = SWIFTKV_CTX_CONFIG_INIT;
  c.device_mask = device >= 0 ? 1u << device : 0;
  c.host_budget_bytes = device >= 0 ? 0 : (uint64_t{chunks} + 1) * kLayerPiece * layers;
  c.coord_endpoint = endpoint;
  swiftkv_ctx *ctx = nullptr;
  check(swiftkv_ctx_create(&ctx, &c), "lender ctx_create");
  swiftkv_model_desc ld = bench_model("lender", 16, device);
  swiftkv_model_desc bd = bench_model("bench", kChunk, SWIFTKV_DEVICE_HOST);
  ld.num_layers = bd.num_layers = layers;
  swiftkv_elastic_config ec = SWIFTKV_ELASTIC_CONFIG_INIT;
  ec.lender = &ld;
  ec.borrower = &bd;
  ec.capacity_blocks = (chunks + 1) * unit_blocks;
  ec.owned_blocks = unit_blocks;
  ec.cuda_alloc = SWIFTKV_CUDA_ALLOC_VMM;
  if (device < 0) ec.host_granule_bytes = 2 << 20;
  swiftkv_elastic *e = nullptr;
  check(swiftkv_elastic_create(&e, ctx, &ec), "lender elastic_create");
  check(swiftkv_elastic_offer(e, "bench"), "lender elastic_offer");
  std::printf("ready\n");
  std::fflush(stdout);
  char line[64];
  while (std::fgets(line, sizeof line, stdin) != nullptr) {
  }
  swiftkv_elastic_destroy(e);
  swiftkv_ctx_destroy(ctx);
  return 0;
}

// What the borrower holds after storing into lent memory, for a run that finds the chunks
// elsewhere than in the lender's memory: the store's count, where the lookup finds them, and the
// tiers' sizes.
[[noreturn]] void die_placement(swiftkv_ctx *ctx, uint64_t cached, uint64_t tokens,
                                const swiftkv_lookup_result &l) {
  swiftkv_stats st = SWIFTKV_STATS_INIT;
  swiftkv_stats_get(&st, ctx);
  swiftkv_coord_stats cs = SWIFTKV_COORD_STATS_INIT;
  swiftkv_coord_stats_get(&cs, ctx);
  std::fprintf(stderr,
               "bench_transfer: the chunks are not all in the lent memory: stored %llu of %llu "
               "tokens; found %llu in peer, %llu in host, %llu on disk; peer tier %llu chunks of "
               "%llu capacity bytes, host tier %llu chunks; stores rejected %llu, evictions %llu; "
               "grants refused %llu, leases lost %llu\n",
               (unsigned long long)cached, (unsigned long long)tokens,
               (unsigned long long)l.chunks_per_tier[SWIFTKV_TIER_PEER],
               (unsigned long long)l.chunks_per_tier[SWIFTKV_TIER_HOST],
               (unsigned long long)l.chunks_per_tier[SWIFTKV_TIER_DISK],
               (unsigned long long)st.chunks[SWIFTKV_TIER_PEER],
               (unsigned long long)st.capacity_bytes[SWIFTKV_TIER_PEER],
               (unsigned long long)st.chunks[SWIFTKV_TIER_HOST],
               (unsigned long long)st.stores_rejected, (unsigned long long)st.evictions,
               (unsigned long long)cs.grants_refused, (unsigned long long)cs.leases_lost);
  std::exit(1);
}

#if defined(SWIFTKV_BENCH_HAVE_CUDA)
// A device-to-device copy of `bytes` on a stream of its own, the baseline of loads whose chunks
// are in device memory; the same stream carries the loads timed beside it.
class DeviceCopy {
 public:
  explicit DeviceCopy(uint64_t bytes) : bytes_(bytes) {
    if (cudaMalloc(&src_, bytes) != cudaSuccess || cudaMalloc(&dst_, bytes) != cudaSuccess ||
        cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking) != cudaSuccess) {
      die("the device copy's buffers");
    }
  }
  ~DeviceCopy() {
    cudaStreamDestroy(stream_);
    cudaFree(src_);
    cudaFree(dst_);
  }
  DeviceCopy(const DeviceCopy &) = delete;
  DeviceCopy &operator=(const DeviceCopy &) = delete;
  cudaStream_t stream() const noexcept { return stream_; }
  double seconds() {  // one copy, from its launch to its end
    const double t0 = now_s();
    cudaMemcpyAsync(dst_, src_, bytes_, cudaMemcpyDeviceToDevice, stream_);
    cudaStreamSynchronize(stream_);
    return now_s() - t0;
  }

 private:
  const uint64_t bytes_;
  void *src_ = nullptr, *dst_ = nullptr;
  cudaStream_t stream_ = nullptr;
};
#endif

// The borrowing side of a peer measurement: a lender process (this program, --lender) offering a
// region on `device` for `chunks` chunks of `layers` layers, and a context that borrows all of it
// for model "bench" (`page`-token pages on `device`) and stores `tokens` there; every chunk is
// checked to be in the lent memory. Destroying it ends both.
class PeerBorrower {
 public:
  PeerBorrower(const char *self, int32_t device, uint32_t page, uint32_t chunks, uint32_t layers)
      : ep_("ipc:///tmp/swiftkv-bench-peer-" + std::to_string(::getpid())) {
    int to[2], from[2];
    if (pipe2(to, O_CLOEXEC) != 0 || pipe2(from, O_CLOEXEC) != 0) die("pipe2");
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, to[0], 0);
    posix_spawn_file_actions_adddup2(&fa, from[1], 1);
    std::string n = std::to_string(chunks), dev = std::to_string(device),
                ls = std::to_string(layers);
    char *argv[] = {const_cast<char *>(self),
                    const_cast<char *>("--lender"),
                    const_cast<char *>(ep_.c_str()),
                    n.data(),
                    dev.data(),
                    ls.data(),
                    nullptr};
    if (posix_spawn(&pid_, self, &fa, nullptr, argv, environ) != 0) die("posix_spawn");
    posix_spawn_file_actions_destroy(&fa);
    close(to[0]);
    close(from[1]);
    to_lender_ = to[1];
    from_lender_ = fdopen(from[0], "r");
    char line[64] = {0};
    if (std::fgets(line, sizeof line, from_lender_) == nullptr ||
        std::strcmp(line, "ready\n") != 0) {
      die("the lender process did not start");
    }

    const uint64_t bytes = uint64_t{chunks} * kLayerPiece * layers;
    swiftkv_ctx_config c = SWIFTKV_CTX_CONFIG_INIT;
    c.device_mask = device >= 0 ? 1u << device : 0;
    c.host_budget_bytes = 64ull << 20;
    c.demote_free_percent = 0;
    check(swiftkv_ctx_create(&ctx, &c), "ctx_create");
    swiftkv_model_desc m = bench_model("bench", page, device);
    m.num_layers = layers;
    swiftkv_model_config mc = SWIFTKV_MODEL_CONFIG_INIT;
    mc.desc = &m;
    check(swiftkv_model_register(&model, ctx, &mc), "model_register");
    uint64_t lease = 0;
    check(swiftkv_borrow_remote(&lease, ctx, model, ep_.c_str(), "bench", chunks), "borrow_remote");
    tokens.resize(uint64_t{chunks} * kChunk);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(i + 17);
    std::vector<uint8_t> kv(bytes, 0x3c);
    uint64_t cached = 0;
    check(swiftkv_store(&cached, ctx, model, tokens.data(), tokens.size(), kv.data(), kv.size()),
          "store");
    swiftkv_lookup_result l = SWIFTKV_LOOKUP_RESULT_INIT;
    check(swiftkv_lookup(&l, nullptr, 0, ctx, model, tokens.data(), tokens.size()), "lookup");
    if (cached != tokens.size() || l.chunks_per_tier[SWIFTKV_TIER_PEER] != chunks) {
      die_placement(ctx, cached, tokens.size(), l);
    }
  }
  ~PeerBorrower() {
    swiftkv_ctx_destroy(ctx);
    close(to_lender_);  // the lender's stdin ends: it leaves
    int status = 0;
    waitpid(pid_, &status, 0);
    std::fclose(from_lender_);
  }
  PeerBorrower(const PeerBorrower &) = delete;
  PeerBorrower &operator=(const PeerBorrower &) = delete;

  swiftkv_ctx *ctx = nullptr;
  uint32_t model = 0;
  std::vector<uint32_t> tokens;  // the chunks' tokens, all in the lent memory

 private:
  const std::string ep_;
  pid_t pid_ = -1;
  int to_lender_ = -1;
  FILE *from_lender_ = nullptr;
};

PeerRow measure_peer(const char *self, int32_t device, uint32_t page, uint32_t chunks, int reps,
                     Workers &workers) {
  PeerBorrower peer(self, device, page, chunks, kLayers);
  swiftkv_ctx *ctx = peer.ctx;
  const uint32_t model = peer.model;
  const std::vector<uint32_t> &tokens = peer.tokens;
  const uint64_t bytes = uint64_t{chunks} * kLayerPiece * kLayers;
  uint32_t pool = 0, pool_ahead = 0;
  const uint32_t n_pages = chunks * (kChunk / page);
  void *stream = nullptr;
  std::function<double()> copy;
  std::unique_ptr<CopyLimit> limit;
#if defined(SWIFTKV_BENCH_HAVE_CUDA)
  void *dev_pool = nullptr, *dev_pool_ahead = nullptr;
  std::unique_ptr<DeviceCopy> device_copy;
#endif
  if (device >= 0) {
#if defined(SWIFTKV_BENCH_HAVE_CUDA)
    pool = engine_pool(ctx, model, page, n_pages, &dev_pool);
    pool_ahead = engine_pool(ctx, model, page, n_pages, &dev_pool_ahead);
    device_copy = std::make_unique<DeviceCopy>(bytes);
    stream = device_copy->stream();
    copy = [&] { return device_copy->seconds(); };
#endif
  } else {
    check(swiftkv_pool_create(&pool, ctx, model, n_pages, 0), "pool_create");
    limit = std::make_unique<CopyLimit>(bytes, page, workers);
    copy = [&] { return limit->large_s(); };
  }
  const std::vector<int32_t> pages = scattered_pages(n_pages);
  auto load_into = [&](uint32_t into) {
    swiftkv_request_desc d = SWIFTKV_REQUEST_DESC_INIT;
    d.pool = into;
    d.tokens = tokens.data();
    d.n_tokens = tokens.size();
    d.pages = pages.data();
    d.n_pages = pages.size();
    d.shape = SWIFTKV_REQUEST_LOAD_ONLY;
    uint64_t req = 0, valid = 0;
    check(swiftkv_request_begin(&req, ctx, &d), "request_begin");
#if defined(SWIFTKV_BENCH_HAVE_CUDA)
    if (stream != nullptr) cudaStreamSynchronize(static_cast<cudaStream_t>(stream));
#endif
    const double t0 = now_s();
    check(swiftkv_start_load(ctx, req, stream), "start_load");
    for (uint32_t l = 0; l < kLayers; ++l) {
      check(swiftkv_wait_layer_load(&valid, ctx, req, l, stream), "wait_layer_load");
    }
#if defined(SWIFTKV_BENCH_HAVE_CUDA)
    if (stream != nullptr) cudaStreamSynchronize(static_cast<cudaStream_t>(stream));
#endif
    const double t = now_s() - t0;
    swiftkv_request_info info = SWIFTKV_REQUEST_INFO_INIT;
    check(swiftkv_request_finish(&info, ctx, req), "request_finish");
    if (valid != tokens.size()) die("a peer load came back short");
    return t;
  };
  auto load = [&] { return load_into(pool); };
  auto load_ahead = [&] {
    if (device < 0) return 0.0;
    // The pool's lanes, made at its first request, read the variable then.
    const char *was = std::getenv("SWIFTKV_COPY_KERNEL");
    const std::string saved = was != nullptr ? was : "";
    ::setenv("SWIFTKV_COPY_KERNEL", "ahead", 1);
    const double t = load_into(pool_ahead);
    if (was != nullptr) {
      ::setenv("SWIFTKV_COPY_KERNEL", saved.c_str(), 1);
    } else {
      ::unsetenv("SWIFTKV_COPY_KERNEL");
    }
    return t;
  };
  std::vector<double> tl, ta, tc;
  for (int rep = 0; rep <= reps; ++rep) {  // rep 0 warms up
    double a = 0, b = 0, c2 = 0;
    if (rep % 2 == 0) {
      a = load();
      c2 = load_ahead();
      b = copy();
    } else {
      b = copy();
      c2 = load_ahead();
      a = load();
    }
    if (rep == 0) continue;
    tl.push_back(a);
    ta.push_back(c2);
    tc.push_back(b);
  }
  PeerRow row{page, rate_of(tl, static_cast<double>(bytes)),
              rate_of(tc, static_cast<double>(bytes)), rate_of(ta, static_cast<double>(bytes))};
  if (device >= 0) check(swiftkv_pool_destroy(ctx, pool_ahead), "pool_destroy");
  check(swiftkv_pool_destroy(ctx, pool), "pool_destroy");
#if defined(SWIFTKV_BENCH_HAVE_CUDA)
  for (void *p : {dev_pool, dev_pool_ahead}) {
    if (p != nullptr) cudaFree(p);
  }
#endif
  return row;
}

// The layer-wise pipeline over lent memory (SwiftCache §3.3 with the memory borrowed): `chunks`
// chunks of `layers` layers stored in another process's memory (PeerBorrower) and loaded into a
// pool of 16-token pages layer by layer under the engine's compute, as measure_overlap and
// measure_device_overlap do with the chunks in this process's host memory. On the device (VMM
// memory lent on device 0, the engine's tensors there) each wait_layer_load waits on the host
// for the layer's copy, so that the leases are checked after it; what that costs the pipeline is
// what this measures. t per layer from one device-to-device copy of all the bytes (the kernel
// reads the lent memory in place); on the host, from the faster memcpy (CopyLimit).
std::vector<Overlap> measure_peer_overlap(const char *self, int32_t device, uint32_t layers,
                                          uint32_t chunks, int reps, Workers &workers) {
  PeerBorrower peer(self, device, 16, chunks, layers);
  const uint64_t bytes = uint64_t{chunks} * kLayerPiece * layers;
  const uint32_t n_pages = chunks * (kChunk / 16);
  const std::vector<int32_t> pages = scattered_pages(n_pages);
  uint32_t pool = 0;
  void *stream = nullptr;
  std::function<double()> limit_s;
  std::unique_ptr<CopyLimit> limit;
#if defined(SWIFTKV_BENCH_HAVE_CUDA)
  void *dev_pool = nullptr;
  std::unique_ptr<DeviceCopy> device_copy;
#endif
  if (device >= 0) {
#if defined(SWIFTKV_BENCH_HAVE_CUDA)
    pool = engine_pool(peer.ctx, peer.model, 16, n_pages, &dev_pool, layers);
    device_copy = std::make_unique<DeviceCopy>(bytes);
    stream = device_copy->stream();
    limit_s = [&] { return device_copy->seconds(); };
#endif
  } else {
    check(swiftkv_pool_create(&pool, peer.ctx, peer.model, n_pages, 0), "pool_create");
    limit = std::make_unique<CopyLimit>(bytes, 16, workers);
    limit_s = [&] { return limit->fastest_s(); };
  }
  std::vector<Overlap> out = overlap_rows(
      layers, reps, limit_s,
      [&](double comp, ComputeStamps *stamps) {
        return pipelined_load(peer.ctx, pool, peer.tokens, pages, layers, comp, stream, stamps);
      },
      stream);
  const double start_s = start_load_host_s(peer.ctx, pool, peer.tokens, pages, layers, stream);
  for (Overlap &o : out) o.start_ms = start_s * 1e3;
  check(swiftkv_pool_destroy(peer.ctx, pool), "pool_destroy");
#if defined(SWIFTKV_BENCH_HAVE_CUDA)
  if (dev_pool != nullptr) cudaFree(dev_pool);
#endif
  return out;
}

void print_peer(const char *backend, const std::vector<PeerRow> &rows, uint32_t chunks, int reps) {
  const bool host = std::strcmp(backend, "host") == 0;
  std::printf(
      "\n%s backend: loads from another process's %s into a %s pool, %u chunks of %u layers, "
      "GB/s median/best of %d, beside %s:\n",
      backend, host ? "host memory (2 MiB granules)" : "device memory (VMM, same GPU)",
      host ? "host" : "device", chunks, kLayers, reps,
      host ? "one large memcpy of the same bytes on the copy engine's threads"
           : "a device-to-device copy");
  if (host) {
    std::printf("%5s %16s %16s %8s\n", "page", "peer load", "memcpy", "ld/copy");
  } else {
    std::printf("%5s %16s %16s %16s %8s %8s\n", "page", "peer load", "ahead", "device copy",
                "ld/copy", "ah/copy");
  }
  for (const PeerRow &r : rows) {
    if (host) {
      std::printf("%5u %7.1f/%7.1f  %7.1f/%7.1f  %8.2f\n", r.page, r.load.med, r.load.best,
                  r.copy.med, r.copy.best, r.load.med / r.copy.med);
    } else {
      std::printf("%5u %7.1f/%7.1f  %7.1f/%7.1f  %7.1f/%7.1f  %8.2f %8.2f\n", r.page, r.load.med,
                  r.load.best, r.load_ahead.med, r.load_ahead.best, r.copy.med, r.copy.best,
                  r.load.med / r.copy.med, r.load_ahead.med / r.copy.med);
    }
  }
  std::printf("{\"bench\":\"peer_load\",\"backend\":\"%s\",\"reps\":%d,\"chunks\":%u,\"rows\":[",
              backend, reps, chunks);
  for (size_t i = 0; i < rows.size(); ++i) {
    std::printf(
        "%s{\"page\":%u,\"load_gbs\":%.2f,\"load_best_gbs\":%.2f,\"copy_gbs\":%.2f,"
        "\"copy_best_gbs\":%.2f",
        i ? "," : "", rows[i].page, rows[i].load.med, rows[i].load.best, rows[i].copy.med,
        rows[i].copy.best);
    if (!host) {
      std::printf(",\"load_ahead_gbs\":%.2f,\"load_ahead_best_gbs\":%.2f", rows[i].load_ahead.med,
                  rows[i].load_ahead.best);
    }
    std::printf("}");
  }
  std::printf("]}\n");
}

}  // namespace

#if defined(SWIFTKV_BENCH_HAVE_CUDA)
// Whether a CUDA device is here; when not, says that `what` (plural) are skipped.
bool device_here(const char *what) {
  uint32_t devices = 0;
  if (swiftkv_device_count(&devices) == SWIFTKV_OK && devices > 0) return true;
  std::printf("no CUDA device here: %s are skipped\n", what);
  return false;
}
#endif

// The gather/scatter and decode kernels alone (--kernels: nothing else, for a profiler); 1 when
// a decode differs from its CPU twin.
int kernel_tables(uint32_t chunks, int reps) {
#if defined(SWIFTKV_BENCH_HAVE_CUDA)
  if (!device_here("the kernel rows")) return 0;
  std::vector<KernelRow> kernel_rows;
  for (const char *layout : {"nhd", "hnd"}) {
    for (uint32_t page : {16u, 256u}) {
      kernel_rows.push_back(measure_kernel(layout, page, std::max(chunks, 64u), reps));
    }
  }
  for (const KernelChunks where : {KernelChunks::vmm, KernelChunks::layer_of_8}) {
    if (where == KernelChunks::vmm && !swiftkv::cuda_vmm_supported(0)) continue;
    for (uint32_t page : {16u, 256u}) {
      try {  // the rows above are printed whatever becomes of these
        kernel_rows.push_back(measure_kernel("nhd", page, std::max(chunks, 64u), reps, where));
      } catch (const std::exception &e) {
        std::printf("the %s kernel rows failed: %s\n", kernel_chunks_name(where), e.what());
      }
    }
  }
  // HND rows of head dims that are no power of two words (80: 10 words, 96: 12), which the
  // kernel walks by a multiply and shift from a reciprocal where 64, 128 and 256 take shifts.
  for (uint32_t dim : {80u, 96u}) {
    for (uint32_t page : {16u, 256u}) {
      kernel_rows.push_back(
          measure_kernel("hnd", page, std::max(chunks, 64u), reps, KernelChunks::malloc, dim));
    }
  }
  print_kernel(kernel_rows, std::max(chunks, 64u), reps);
  namespace cd = swiftkv::codec;
  const std::pair<const char *, cd::CodecParams> codecs[] = {
      {"kivi-8 g32", {cd::Codec::kivi, 8, 32}},
      {"kivi-4 g32", {cd::Codec::kivi, 4, 32}},
      {"kivi-2 g32", {cd::Codec::kivi, 2, 32}},
      {"fp8 e4m3", {cd::Codec::fp8, 0, 0}},
  };
  std::vector<DecodeRow> decode_rows;
  for (const auto &[name, params] : codecs) {
    for (uint32_t page : {16u, 256u}) {
      decode_rows.push_back(measure_decode(name, params, "nhd", page, std::max(chunks, 64u), reps));
    }
  }
  // HND pages: each item a head's 128 elements of one token (256 bytes, 16 groups of eight).
  for (const auto &[name, params] : codecs) {
    decode_rows.push_back(measure_decode(name, params, "hnd", 16, std::max(chunks, 64u), reps));
  }
  // And at head dims 80 and 96: rows of 10 and 12 groups, 3 and 2 of them a step.
  for (uint32_t dim : {80u, 96u}) {
    for (size_t c : {size_t{1}, size_t{3}}) {  // kivi-4 g32, fp8
      decode_rows.push_back(measure_decode(codecs[c].first, codecs[c].second, "hnd", 16,
                                           std::max(chunks, 64u), reps, dim));
    }
  }
  print_decode(decode_rows, std::max(chunks, 64u), reps);
  for (const DecodeRow &r : decode_rows) {
    if (!r.exact || !r.exact_ahead) {
      std::fprintf(stderr, "bench_transfer: the decode kernel differs from its CPU twin (%s)\n",
                   r.codec.c_str());
      return 1;
    }
  }
#else
  (void)chunks;
  (void)reps;
  std::printf("libswiftkv was built without CUDA: the kernel rows are skipped\n");
#endif
  return 0;
}

// The ways to move a request's bytes between pinned host memory and the device (--copy-paths:
// nothing else).
int copy_paths_table(uint32_t chunks, int reps) {
#if defined(SWIFTKV_BENCH_HAVE_CUDA)
  if (!device_here("the copy paths")) return 0;
  print_copy_paths(measure_copy_paths(chunks, reps), chunks, reps);
#else
  (void)chunks;
  (void)reps;
  std::printf("libswiftkv was built without CUDA: the copy paths are skipped\n");
#endif
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 6 && std::strcmp(argv[1], "--lender") == 0) {
    return lender_main(argv[2], static_cast<uint32_t>(std::strtoul(argv[3], nullptr, 10)),
                       std::atoi(argv[4]),
                       static_cast<uint32_t>(std::strtoul(argv[5], nullptr, 10)));
  }
  uint32_t chunks = 16, overlap_chunks = 4;
  uint64_t growth_mib = 1024;
  int reps = 5;
  bool kernels_only = false, copy_paths_only = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--kernels") == 0) {
      kernels_only = true;
    } else if (std::strcmp(argv[i], "--copy-paths") == 0) {
      copy_paths_only = true;
    } else if (std::strcmp(argv[i], "--chunks") == 0 && i + 1 < argc) {
      chunks = static_cast<uint32_t>(std::strtoul(argv[++i], nullptr, 10));
    } else if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--overlap-chunks") == 0 && i + 1 < argc) {
      overlap_chunks = static_cast<uint32_t>(std::strtoul(argv[++i], nullptr, 10));
    } else if (std::strcmp(argv[i], "--growth-mib") == 0 && i + 1 < argc) {
      growth_mib = std::strtoull(argv[++i], nullptr, 10);
    } else {
      std::fprintf(stderr,
                   "usage: bench_transfer [--kernels | --copy-paths] [--chunks N] [--reps N] "
                   "[--overlap-chunks N] [--growth-mib N]\n");
      return 2;
    }
  }
  if (chunks == 0 || overlap_chunks == 0 || reps < 1) {
    std::fprintf(stderr,
                 "bench_transfer: --chunks, --overlap-chunks and --reps must be positive\n");
    return 2;
  }
  const unsigned threads = engine_threads();
  std::vector<Row> rows;
  std::vector<Overlap> overlap;
  // The hidden fraction is a small difference of two times: more repetitions than the rest.
  const int overlap_reps = 2 * reps + 1;
  if (kernels_only) return kernel_tables(chunks, reps);
  if (copy_paths_only) return copy_paths_table(chunks, reps);
  {
    Workers workers(threads);
    for (uint32_t page : {16u, 64u, 256u}) rows.push_back(measure(page, chunks, reps, workers));
    for (uint32_t layers : {32u, 64u}) {
      for (const Overlap &o : measure_overlap(layers, overlap_chunks, overlap_reps, workers)) {
        overlap.push_back(o);
      }
    }
  }
  std::printf("the copy engine and the baselines run on %u thread%s\n", threads,
              threads == 1 ? "" : "s");
  print_rows("host", rows, chunks, reps);
  print_overlap("host", overlap, overlap_chunks, overlap_reps);
  print_json("host", rows, overlap, chunks, reps);
  {
    std::vector<PeerRow> peer_rows;
    Workers workers(threads);
    for (uint32_t page : {16u, 256u}) {
      peer_rows.push_back(measure_peer(argv[0], SWIFTKV_DEVICE_HOST, page, chunks, reps, workers));
    }
    print_peer("host", peer_rows, chunks, reps);
    std::vector<Overlap> peer_overlap;
    for (uint32_t layers : {32u, 64u}) {
      for (const Overlap &o : measure_peer_overlap(argv[0], SWIFTKV_DEVICE_HOST, layers,
                                                   overlap_chunks, overlap_reps, workers)) {
        peer_overlap.push_back(o);
      }
    }
    print_overlap("host", peer_overlap, overlap_chunks, overlap_reps, true);
    print_peer_overlap_json("host", peer_overlap, overlap_chunks, overlap_reps);
  }
  if (growth_mib > 0) {
    print_growth("host", measure_growth(false, chunks, growth_mib << 20, reps), chunks,
                 growth_mib << 20, reps);
  }
#if defined(SWIFTKV_BENCH_HAVE_CUDA)
  uint32_t devices = 0;
  if (swiftkv_device_count(&devices) == SWIFTKV_OK && devices > 0) {
    std::vector<Row> dev_rows;
    for (uint32_t page : {16u, 64u, 256u}) dev_rows.push_back(measure_device(page, chunks, reps));
    std::vector<Overlap> dev_overlap;
    for (uint32_t layers : {32u, 64u}) {
      for (const Overlap &o : measure_device_overlap(layers, overlap_chunks, overlap_reps)) {
        dev_overlap.push_back(o);
      }
    }
    print_rows("cuda", dev_rows, chunks, reps);
    print_overlap("cuda", dev_overlap, overlap_chunks, overlap_reps);
    print_json("cuda", dev_rows, dev_overlap, chunks, reps);
    copy_paths_table(chunks, reps);
    if (const int rc = kernel_tables(chunks, reps); rc != 0) return rc;
    std::vector<PeerRow> peer_rows;
    {
      Workers workers(threads);
      for (uint32_t page : {16u, 256u}) {
        peer_rows.push_back(measure_peer(argv[0], 0, page, std::max(chunks, 64u), reps, workers));
      }
    }
    print_peer("cuda", peer_rows, std::max(chunks, 64u), reps);
    std::vector<Overlap> peer_overlap;
    {
      Workers workers(threads);
      for (uint32_t layers : {32u, 64u}) {
        for (const Overlap &o :
             measure_peer_overlap(argv[0], 0, layers, overlap_chunks, overlap_reps, workers)) {
          peer_overlap.push_back(o);
        }
      }
    }
    print_overlap("cuda", peer_overlap, overlap_chunks, overlap_reps, true);
    print_peer_overlap_json("cuda", peer_overlap, overlap_chunks, overlap_reps);
    if (growth_mib > 0) {
      print_growth("cuda", measure_growth(true, chunks, growth_mib << 20, reps), chunks,
                   growth_mib << 20, reps);
    }
  } else {
    std::printf(
        "\nno CUDA device here: the cuda rows (loads, the pipeline, the kernels) are "
        "skipped\n");
  }
#endif
  return 0;
}
