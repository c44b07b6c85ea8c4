// bench_attention: multi-token paged attention throughput (TFLOP/s of the attended pairs) at
// page sizes 16 and 64, each beside the same KV in pages of the same size laid out in order (one
// contiguous run of memory per sub-request), the two alternated repetition by repetition after
// a warm-up; median and best over --reps. On the host the CPU twin (an fp64 reference path, not
// a fast one; at small shapes where a device is); on a GPU the kernels, for prefill (8 sub-requests
// x 512 new tokens over 8K and 32K cached tokens) and decode (64 sub-requests x 1 token), for both
// kernels (FlashInfer's batch prefill and the library's FlashAttention-2 style one,
// SWIFTKV_ATTENTION_KERNEL). Prints a table and one JSON line. bench/bench_attention_sdpa.py adds
// PyTorch's scaled_dot_product_attention as the contiguous baseline on a GPU machine.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#if defined(SWIFTKV_BENCH_HAVE_CUDA)
#include <cuda_runtime_api.h>
#endif

#include "swiftkv/swiftkv.h"

namespace {

struct Shape {
  const char *name;
  uint32_t n_req;
  uint32_t q_len;
  uint32_t cached;  // KV before the new tokens
};

struct Stat {
  double med = 0, best = 0;
};
// TFLOP/s from seconds: the median and the best (least time) repetition.
Stat tflops_of(std::vector<double> secs, double flop) {
  std::sort(secs.begin(), secs.end());
  return Stat{flop / secs[secs.size() / 2] / 1e12, flop / secs.front() / 1e12};
}

struct Result {
  std::string where, shape;
  uint32_t page;
  Stat paged, contiguous;
};

[[noreturn]] void die(const char *what) {
  std::fprintf(stderr, "bench_attention: %s: %s\n", what, swiftkv_last_error_message());
  std::exit(1);
}

// Attended (query, key) pairs of a causal batch: each query sees the cached KV and the new
// tokens up to itself.
double pairs(const Shape &s) {
  const double q = s.q_len, c = s.cached;
  return s.n_req * (q * c + q * (q + 1) / 2);
}

// The page table of `s` with `page` tokens per page: pages in a random order (the paged case)
// or in order (the contiguous baseline, one run of memory per sub-request).
struct Table {
  std::vector<int32_t> qo, kv, last, indices;
  uint32_t num_pages = 0;
};

Table make_table(const Shape &s, uint32_t page, bool shuffled) {
  Table t;
  t.qo.push_back(0);
  t.kv.push_back(0);
  const uint32_t kv_len = s.cached + s.q_len;
  const uint32_t pages = (kv_len + page - 1) / page;
  for (uint32_t r = 0; r < s.n_req; ++r) {
    t.qo.push_back(t.qo.back() + int32_t(s.q_len));
    t.kv.push_back(t.kv.back() + int32_t(pages));
    t.last.push_back(int32_t(kv_len - (pages - 1) * page));
  }
  t.num_pages = pages * s.n_req;
  for (uint32_t i = 0; i < t.num_pages; ++i) t.indices.push_back(int32_t(i));
  if (shuffled) {
    uint64_t x = 88172645463325252ull;
    for (uint32_t i = t.num_pages; i > 1; --i) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      std::swap(t.indices[i - 1], t.indices[x % i]);
    }
  }
  return t;
}

constexpr uint32_t kHq = 32, kHkv = 8, kDim = 128;

swiftkv_attention_desc desc_for(int32_t device, uint32_t page) {
  swiftkv_attention_desc d = SWIFTKV_ATTENTION_DESC_INIT;
  d.device = device;
  d.dtype = SWIFTKV_DTYPE_BF16;
  d.num_qo_heads = kHq;
  d.num_kv_heads = kHkv;
  d.head_dim = kDim;
  d.page_tokens = page;
  return d;
}

// NHD pages [pages, 2, page, Hkv, D] at `kv`; q and out [tokens, Hq, D].
swiftkv_attention_args args_for(const Table &t, uint32_t page, void *q, void *kv, void *out,
                                const int32_t *indices) {
  swiftkv_attention_args a = SWIFTKV_ATTENTION_ARGS_INIT;
  a.q = q;
  a.q_token_stride = kHq * kDim;
  a.q_head_stride = kDim;
  a.k_base = kv;
  a.v_base = static_cast<char *>(kv) + size_t(page) * kHkv * kDim * 2;
  a.page_stride = int64_t(2) * page * kHkv * kDim;
  a.token_stride = kHkv * kDim;
  a.head_stride = kDim;
  a.num_pages = t.num_pages;
  a.kv_indices = indices;
  a.out = out;
  a.out_token_stride = kHq * kDim;
  a.out_head_stride = kDim;
  return a;
}

size_t kv_bytes(const Table &t, uint32_t page) {
  return size_t(t.num_pages) * 2 * page * kHkv * kDim * 2;
}

double flop_of(const Shape &s) { return 4.0 * pairs(s) * kHq * kDim; }

// One layout of one shape on the host, planned once; run() times one call.
struct HostCase {
  Table t;
  swiftkv_attention_desc d;
  uint64_t bytes = 0;
  void *ws = nullptr;
  std::vector<uint16_t> q, out, kv;
  swiftkv_attention_plan plan = SWIFTKV_ATTENTION_PLAN_INIT;
  swiftkv_attention_args a;
  HostCase(const Shape &s, uint32_t page, bool shuffled)
      : t(make_table(s, page, shuffled)), d(desc_for(SWIFTKV_DEVICE_HOST, page)) {
    if (swiftkv_attention_workspace_size(&bytes, &d, s.n_req, uint64_t(s.n_req) * s.q_len) !=
        SWIFTKV_OK)
      die("workspace_size");
    ws = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
    q.assign(size_t(s.n_req) * s.q_len * kHq * kDim, 0x3c00);
    out.assign(q.size(), 0);
    kv.assign(kv_bytes(t, page) / 2, 0x3800);
    if (swiftkv_attention_plan_make(&plan, &d, t.qo.data(), t.kv.data(), t.last.data(), s.n_req, ws,
                                    bytes, nullptr) != SWIFTKV_OK)
      die("plan");
    a = args_for(t, page, q.data(), kv.data(), out.data(), t.indices.data());
  }
  ~HostCase() { std::free(ws); }
  HostCase(const HostCase &) = delete;
  HostCase &operator=(const HostCase &) = delete;
  double run() {
    const auto t0 = std::chrono::steady_clock::now();
    if (swiftkv_attention_run(&plan, &a, ws, nullptr) != SWIFTKV_OK) die("run");
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
};

Result host_result(const Shape &s, uint32_t page, int reps) {
  HostCase paged(s, page, true), contiguous(s, page, false);
  std::vector<double> p, c;
  for (int rep = 0; rep <= reps; ++rep) {  // rep 0 warms up
    const double tc = contiguous.run();
    const double tp = paged.run();
    if (rep > 0) {
      c.push_back(tc);
      p.push_back(tp);
    }
  }
  return Result{"host", s.name, page, tflops_of(p, flop_of(s)), tflops_of(c, flop_of(s))};
}

#if defined(SWIFTKV_BENCH_HAVE_CUDA)
// One layout of one shape on device 0, planned once; run() times `iters` launches by events.
struct DeviceCase {
  Table t;
  swiftkv_attention_desc d;
  uint64_t bytes = 0;
  void *ws = nullptr, *q = nullptr, *kv = nullptr, *out = nullptr, *idx = nullptr;
  swiftkv_attention_plan plan = SWIFTKV_ATTENTION_PLAN_INIT;
  swiftkv_attention_args a;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  DeviceCase(const Shape &s, uint32_t page, bool shuffled)
      : t(make_table(s, page, shuffled)), d(desc_for(0, page)) {
    if (swiftkv_attention_workspace_size(&bytes, &d, s.n_req, uint64_t(s.n_req) * s.q_len) !=
        SWIFTKV_OK)
      die("workspace_size");
    const size_t qb = size_t(s.n_req) * s.q_len * kHq * kDim * 2;
    cudaMalloc(&ws, bytes);
    cudaMalloc(&q, qb);
    cudaMalloc(&out, qb);
    cudaMalloc(&kv, kv_bytes(t, page));
    cudaMalloc(&idx, t.indices.size() * sizeof(int32_t));
    cudaMemset(q, 0x3c, qb);
    cudaMemset(kv, 0x38, kv_bytes(t, page));
    cudaMemcpy(idx, t.indices.data(), t.indices.size() * sizeof(int32_t), cudaMemcpyHostToDevice);
    if (swiftkv_attention_plan_make(&plan, &d, t.qo.data(), t.kv.data(), t.last.data(), s.n_req, ws,
                                    bytes, nullptr) != SWIFTKV_OK)
      die("plan");
    a = args_for(t, page, q, kv, out, static_cast<const int32_t *>(idx));
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
  }
  ~DeviceCase() {
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaFree(ws);
    cudaFree(q);
    cudaFree(out);
    cudaFree(kv);
    cudaFree(idx);
  }
  DeviceCase(const DeviceCase &) = delete;
  DeviceCase &operator=(const DeviceCase &) = delete;
  double run(int iters) {
    cudaEventRecord(e0);
    for (int i = 0; i < iters; ++i) {
      if (swiftkv_attention_run(&plan, &a, ws, nullptr) != SWIFTKV_OK) die("run");
    }
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    return ms / 1e3 / iters;
  }
};

// `kernel`: the attention kernel the runs use (SWIFTKV_ATTENTION_KERNEL, read at each run).
Result device_result(const Shape &s, uint32_t page, int reps, const char *kernel) {
  setenv("SWIFTKV_ATTENTION_KERNEL", kernel, 1);
  DeviceCase paged(s, page, true), contiguous(s, page, false);
  std::vector<double> p, c;
  for (int rep = 0; rep <= reps; ++rep) {  // rep 0 warms up
    const double tc = contiguous.run(20);
    const double tp = paged.run(20);
    if (rep > 0) {
      c.push_back(tc);
      p.push_back(tp);
    }
  }
  unsetenv("SWIFTKV_ATTENTION_KERNEL");
  return Result{std::string("gpu ") + kernel, s.name, page, tflops_of(p, flop_of(s)),
                tflops_of(c, flop_of(s))};
}
#endif

}  // namespace

int main(int argc, char **argv) {
  // --quick: tiny host shapes and one repetition, for the test suite's smoke run.
  bool quick = false;
  int reps = 5;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
      reps = 1;
    } else if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
      if (reps < 1) {
        std::fprintf(stderr, "bench_attention: --reps must be at least 1\n");
        return 2;
      }
    } else {
      std::fprintf(stderr, "usage: bench_attention [--quick] [--reps N]\n");
      return 2;
    }
  }
  std::vector<Result> results;
  uint32_t devices = 0;
  if (swiftkv_device_count(&devices) != SWIFTKV_OK) die("device_count");
  // The CPU twin is an fp64 reference: small shapes keep the run short. Where a device is, the
  // smallest: at the larger ones the twin took about 60 of this program's 145 s on the H200 run
  // (its rows' TFLOP/s times their repetitions), device time that measured nothing of the
  // device.
  const bool small_host = quick || devices > 0;
  const std::vector<Shape> host_shapes =
      small_host ? std::vector<Shape>{{"prefill 2x16 over 256", 2, 16, 256},
                                      {"decode 4x1 over 512", 4, 1, 512}}
                 : std::vector<Shape>{{"prefill 4x64 over 1K", 4, 64, 1024},
                                      {"decode 16x1 over 4K", 16, 1, 4096}};
  for (const Shape &s : host_shapes) {
    for (uint32_t page : {16u, 64u}) results.push_back(host_result(s, page, reps));
  }
#if defined(SWIFTKV_BENCH_HAVE_CUDA)
  if (devices > 0 && !quick) {
    const Shape gpu_shapes[] = {{"prefill 8x512 over 8K", 8, 512, 8192},
                                {"prefill 8x512 over 32K", 8, 512, 32768},
                                {"decode 64x1 over 8K", 64, 1, 8192},
                                {"decode 64x1 over 32K", 64, 1, 32768}};
    for (const Shape &s : gpu_shapes) {
      for (uint32_t page : {16u, 64u}) {
        for (const char *kernel : {"flashinfer", "fa2"}) {
          results.push_back(device_result(s, page, reps, kernel));
        }
      }
    }
  }
#endif
  std::printf(
      "multi-token paged attention, bf16, %u query / %u KV heads, head dim %u, causal; "
      "TFLOP/s median/best over %d repetitions; contiguous: the same page size in order\n",
      kHq, kHkv, kDim, reps);
  std::printf("%-8s %-24s %5s %19s %19s %8s\n", "where", "shape", "page", "paged", "contiguous",
              "ratio");
  for (const Result &r : results) {
    std::printf("%-8s %-24s %5u %9.4f/%9.4f %9.4f/%9.4f %8.3f\n", r.where.c_str(), r.shape.c_str(),
                r.page, r.paged.med, r.paged.best, r.contiguous.med, r.contiguous.best,
                r.paged.med / r.contiguous.med);
  }
  if (devices == 0) std::printf("(no GPU here: host figures only)\n");
  std::printf("{\"bench\":\"attention\",\"gpu\":%s,\"reps\":%d,\"results\":[",
              devices > 0 ? "true" : "false", reps);
  for (size_t i = 0; i < results.size(); ++i) {
    const Result &r = results[i];
    std::printf(
        "%s{\"where\":\"%s\",\"shape\":\"%s\",\"page\":%u,\"paged_tflops\":%.5f,"
        "\"paged_best_tflops\":%.5f,\"contiguous_tflops\":%.5f,"
        "\"contiguous_best_tflops\":%.5f,\"contiguous_over_paged\":%.4f}",
        i ? "," : "", r.where.c_str(), r.shape.c_str(), r.page, r.paged.med, r.paged.best,
        r.contiguous.med, r.contiguous.best, r.contiguous.med / r.paged.med);
  }
  std::printf("]}\n");
  return 0;
}
