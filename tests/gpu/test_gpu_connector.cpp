// On a GPU machine: the per-layer data path into device pools. A fake engine writes a known value
// for every (layer, K/V, token, head, dim) into its device pages; the library saves them, moves
// them to host or disk, and a new request loads them back into other pages; every byte is
// compared, for each layout (vLLM, FlashInfer NHD and HND, cross-layer), for f16, bf16 with an
// odd head dim and fp8 with head dim 5 (unaligned segments), and for a library-made pool whose
// stream pages are aliased into every layer (checked to hold layer l at each wait). The device
// images are also compared with the same requests run on host pools, whose copies are the
// kernel's CPU twin. The same loop also runs with no host synchronisation between its steps (and
// a capturing stream is refused), and with chunks stored kivi or fp8, which the device pool
// decodes on the GPU and the host pool on the CPU, and through the batch hooks. Exits 77 without a
// usable device or without CUDA.
#include <unistd.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "gpu_skip.h"

#if defined(SWIFTKV_TEST_HAVE_CUDA)
#include <cuda_runtime_api.h>

#include "gpu_check.h"
#include "swiftkv/swiftkv.h"

// bench/spin_kernel.cu
bool bench_occupy_device(double seconds, void *stream);

namespace {

constexpr uint32_t kLayers = 3, kHeads = 2, kBlock = 16, kChunk = 32, kTokens = 96;

struct Geometry {
  const char *name;
  swiftkv_dtype dtype;
  uint32_t head_dim;
  uint32_t bytes;  // per element
};

// Element strides of one layout, for `pages` pages.
struct Layout {
  const char *name;
  int64_t page, kv, token, head;
  uint64_t span_elems;  // per layer tensor
  bool cross_layer;     // one tensor for all layers, page stride over layers
};

Layout layout_of(const char *name, const Geometry &g, uint32_t pages) {
  const int64_t d = g.head_dim, h = kHeads, b = kBlock;
  const std::string n = name;
  if (n == "vllm")
    return {name, b * h * d, pages * b * h * d, h * d, d, 2ull * pages * b * h * d, false};
  if (n == "nhd")
    return {name, 2 * b * h * d, b * h * d, h * d, d, 2ull * pages * b * h * d, false};
  if (n == "hnd")
    return {name, 2 * b * h * d, b * h * d, d, b * d, 2ull * pages * b * h * d, false};
  // cross-layer [pages, L, 2, B, H, D]: layer l's base is l * 2*B*H*D elements in.
  return {name,      kLayers * 2 * b * h * d,
          b * h * d, h * d,
          d,         static_cast<uint64_t>(kLayers) * 2 * pages * b * h * d,
          true};
}

// Set while chunks are compressed: the codecs take finite values only.
bool g_finite_values = false;

// The engine's value of (layer, c, token, head, dim), as bytes of the element. With
// g_finite_values a 16-bit element's exponent is kept below its top half (finite, |x| < 2).
void value(uint8_t *out, uint32_t bytes, uint32_t l, uint32_t c, uint32_t t, uint32_t h,
           uint32_t d) {
  uint32_t v = (l * 7919u + c * 104729u + t * 613u + h * 97u + d * 13u) ^ 0x5a5au;
  for (uint32_t i = 0; i < bytes; ++i) out[i] = static_cast<uint8_t>(v >> (8 * (i % 4)));
  if (g_finite_values && bytes == 2) out[1] &= 0xbf;
}

uint64_t offset_of(const Layout &lay, uint32_t page, uint32_t c, uint32_t t, uint32_t h,
                   uint32_t d) {
  return static_cast<uint64_t>(page * lay.page + c * lay.kv + t * lay.token + h * lay.head + d);
}

// Writes the engine's values of tokens [0, kTokens) of layer l into a host image of the layer
// (`img` is the layer's base).
void write_layer(uint8_t *img, const Layout &lay, const Geometry &g, uint32_t l,
                 const std::vector<int32_t> &pages) {
  for (uint32_t t = 0; t < kTokens; ++t) {
    for (uint32_t c = 0; c < 2; ++c) {
      for (uint32_t h = 0; h < kHeads; ++h) {
        for (uint32_t d = 0; d < g.head_dim; ++d) {
          const uint64_t at =
              offset_of(lay, static_cast<uint32_t>(pages[t / kBlock]), c, t % kBlock, h, d);
          value(&img[at * g.bytes], g.bytes, l, c, t, h, d);
        }
      }
    }
  }
}

// True when tokens [0, n) of layer l hold the engine's values at `pages` (`img`: the base).
bool layer_holds(const uint8_t *img, const Layout &lay, const Geometry &g, uint32_t l,
                 const std::vector<int32_t> &pages, uint32_t n) {
  std::vector<uint8_t> want(g.bytes);
  for (uint32_t t = 0; t < n; ++t) {
    for (uint32_t c = 0; c < 2; ++c) {
      for (uint32_t h = 0; h < kHeads; ++h) {
        for (uint32_t d = 0; d < g.head_dim; ++d) {
          const uint64_t at =
              offset_of(lay, static_cast<uint32_t>(pages[t / kBlock]), c, t % kBlock, h, d);
          value(want.data(), g.bytes, l, c, t, h, d);
          if (std::memcmp(&img[at * g.bytes], want.data(), g.bytes) != 0) return false;
        }
      }
    }
  }
  return true;
}

struct Rig {
  swiftkv_ctx *ctx = nullptr;
  uint32_t model = 0;
  std::string disk;
};

swiftkv_model_desc desc_of(const Geometry &g, int32_t device) {
  swiftkv_model_desc m = SWIFTKV_MODEL_DESC_INIT;
  m.name = g.name;
  m.num_layers = kLayers;
  m.num_kv_heads = kHeads;
  m.head_dim = g.head_dim;
  m.block_tokens = kBlock;
  m.chunk_tokens = kChunk;
  m.dtype = g.dtype;
  m.device = device;
  return m;
}

// Begins a request of the test's first n tokens (1000, 1001, ...) over `pages`; 0 when it fails.
uint64_t begin_request(swiftkv_ctx *ctx, uint32_t pool, const std::vector<int32_t> &pages,
                       uint32_t n = kTokens) {
  std::vector<uint32_t> tokens(n);
  for (uint32_t i = 0; i < n; ++i) tokens[i] = 1000 + i;
  swiftkv_request_desc d = SWIFTKV_REQUEST_DESC_INIT;
  d.pool = pool;
  d.tokens = tokens.data();
  d.n_tokens = n;
  d.pages = pages.data();
  d.n_pages = pages.size();
  uint64_t req = 0;
  if (swiftkv_request_begin(&req, ctx, &d) != SWIFTKV_OK) {
    std::fprintf(stderr, "request_begin: %s\n", swiftkv_last_error_message());
    return 0;
  }
  return req;
}

// One request over `pages`: loads (checking valid_end at each layer), the engine writes the
// tokens it did not load, saves. Returns the per-layer valid_end; `check_each_layer` asks whether
// layer l's stream pages hold layer l at its wait (device pools only). `before_save`, when set,
// runs just before each save_layer.
std::vector<uint64_t> run_request(swiftkv_ctx *ctx, uint32_t pool,
                                  const std::vector<int32_t> &pages, const Layout &lay,
                                  const Geometry &g, const std::vector<void *> &bases,
                                  uint64_t span, bool device, cudaStream_t s, bool write_all,
                                  bool check_each_layer, void (*before_save)() = nullptr) {
  std::vector<uint64_t> valid;
  const uint64_t req = begin_request(ctx, pool, pages);
  if (req == 0) return valid;
  void *stream = device ? static_cast<void *>(s) : nullptr;
  if (swiftkv_start_load(ctx, req, stream) != SWIFTKV_OK) return valid;
  std::vector<uint8_t> img(span);
  auto fetch = [&](uint32_t l) {
    if (device) {
      cudaStreamSynchronize(s);
      cudaMemcpy(img.data(), bases[l], span, cudaMemcpyDeviceToHost);
    } else {
      std::memcpy(img.data(), bases[l], span);
    }
  };
  for (uint32_t l = 0; l < kLayers; ++l) {
    uint64_t v = 0;
    if (swiftkv_wait_layer_load(&v, ctx, req, l, stream) != SWIFTKV_OK) return {};
    valid.push_back(v);
    if (check_each_layer) {
      // Stream pages hold this layer now: every loaded token of layer l is there.
      fetch(l);
      if (!layer_holds(img.data(), lay, g, l, pages, static_cast<uint32_t>(v))) {
        std::fprintf(stderr, "layer %u: the pages do not hold the layer at its wait\n", l);
        return {};
      }
    }
    if (write_all && v == 0) {
      // The engine computes layer l: its values into the pages (read, modify, write back).
      fetch(l);
      write_layer(img.data(), lay, g, l, pages);
      if (device) {
        cudaMemcpyAsync(bases[l], img.data(), span, cudaMemcpyHostToDevice, s);
        cudaStreamSynchronize(s);
      } else {
        std::memcpy(bases[l], img.data(), span);
      }
    }
    if (before_save != nullptr) before_save();
    if (swiftkv_save_layer(ctx, req, l, stream) != SWIFTKV_OK) return {};
  }
  uint64_t saved = 0;
  if (swiftkv_wait_save(&saved, ctx, req, stream) != SWIFTKV_OK) return {};
  swiftkv_request_info info = SWIFTKV_REQUEST_INFO_INIT;
  if (swiftkv_request_finish(&info, ctx, req) != SWIFTKV_OK) return {};
  return valid;
}

// The description of `pages_n` pages in layout `lay` over layers of `span` bytes at `bases`.
swiftkv_pool_desc pool_desc(const Layout &lay, uint32_t pages_n, uint64_t span,
                            std::vector<void *> &bases) {
  swiftkv_pool_desc pd = SWIFTKV_POOL_DESC_INIT;
  pd.num_pages = pages_n;
  pd.layer_base = bases.data();
  pd.layer_span_bytes = span;
  pd.page_stride = lay.page;
  pd.kv_stride = lay.kv;
  pd.token_stride = lay.token;
  pd.head_stride = lay.head;
  return pd;
}

// The round trip of one layout and geometry on the device, with the same requests on a host
// pool beside it: save, move to `tier`, load into other pages, compare with the values and
// with the host pool's bytes. With `codec`, both contexts store the chunks under it in host
// memory and on disk: the device pool's loads move them compressed and decode them on the GPU,
// the host pool's decode on the CPU, and the two must agree bit for bit (the values themselves
// come back within the codec's bound, not exactly, so they are not compared).
void round_trip(const Geometry &g, const char *layout_name, swiftkv_tier tier,
                const swiftkv_codec_params *codec = nullptr) {
  g_finite_values = codec != nullptr;
  const uint32_t pages_n = 16;
  const Layout lay = layout_of(layout_name, g, pages_n);
  const uint64_t bytes = lay.span_elems * g.bytes;  // one layer's tensor (all, cross-layer)
  cudaStream_t s = nullptr;
  CHECK_CUDA(cudaStreamCreate(&s));
  Rig dev, host;
  for (Rig *r : {&dev, &host}) {
    swiftkv_ctx_config c = SWIFTKV_CTX_CONFIG_INIT;
    c.device_mask = 1;
    c.host_budget_bytes = 16 << 20;
    r->disk = "/tmp/swiftkv-gpu-connector-" + std::to_string(::getpid()) + "-" +
              (r == &dev ? "d" : "h") + "-" + layout_name + "-" + g.name;
    std::system(("rm -rf " + r->disk + " && mkdir -p " + r->disk).c_str());
    c.disk_path = r->disk.c_str();
    c.disk_budget_bytes = 64 << 20;
    CHECK_OK(swiftkv_ctx_create(&r->ctx, &c));
    swiftkv_model_desc m = desc_of(g, r == &dev ? 0 : SWIFTKV_DEVICE_HOST);
    swiftkv_model_config mc = SWIFTKV_MODEL_CONFIG_INIT;
    mc.desc = &m;
    CHECK_OK(swiftkv_model_register(&r->model, r->ctx, &mc));
    if (codec != nullptr) {
      swiftkv_compression_config cc = SWIFTKV_COMPRESSION_CONFIG_INIT;
      cc.accept_lossy = 1;
      cc.host = *codec;
      cc.disk = *codec;
      CHECK_OK(swiftkv_compression_set(r->ctx, r->model, &cc));
    }
  }
  // The engines' tensors: one per layer, or one for all layers (cross-layer).
  std::vector<void *> dbases(kLayers), hbases(kLayers);
  void *dmem = nullptr;
  std::vector<uint8_t> hmem(bytes * (lay.cross_layer ? 1 : kLayers));
  CHECK_CUDA(cudaMalloc(&dmem, hmem.size()));
  CHECK_CUDA(cudaMemset(dmem, 0, hmem.size()));
  for (uint32_t l = 0; l < kLayers; ++l) {
    const uint64_t off =
        lay.cross_layer ? uint64_t{l} * 2 * kBlock * kHeads * g.head_dim * g.bytes : l * bytes;
    dbases[l] = static_cast<uint8_t *>(dmem) + off;
    hbases[l] = hmem.data() + off;
  }
  const uint64_t span = lay.cross_layer ? hmem.size() - uint64_t{(kLayers - 1)} * 2 * kBlock *
                                                            kHeads * g.head_dim * g.bytes
                                        : bytes;
  uint32_t dpool = 0, hpool = 0;
  for (int side = 0; side < 2; ++side) {
    Rig &r = side == 0 ? dev : host;
    const swiftkv_pool_desc pd = pool_desc(lay, pages_n, span, side == 0 ? dbases : hbases);
    CHECK_OK(swiftkv_pool_register(side == 0 ? &dpool : &hpool, r.ctx, r.model, &pd));
  }
  const std::vector<int32_t> first{9, 2, 14, 0, 5, 11}, second{3, 15, 1, 8, 12, 6};
  // Save from `first` (nothing cached yet: every layer is computed).
  auto v = run_request(dev.ctx, dpool, first, lay, g, dbases, span, true, s, true, false);
  CHECK(v.size() == kLayers && v[0] == 0);
  v = run_request(host.ctx, hpool, first, lay, g, hbases, span, false, s, true, false);
  CHECK(v.size() == kLayers && v[0] == 0);
  // Move the chunks down, clear the pages, load into `second`.
  std::vector<uint32_t> tokens(kTokens);
  for (uint32_t i = 0; i < kTokens; ++i) tokens[i] = 1000 + i;
  for (Rig *r : {&dev, &host}) {
    uint64_t there = 0;
    CHECK_OK(swiftkv_move(&there, r->ctx, r->model, tokens.data(), kTokens, tier));
    CHECK(there == kTokens / kChunk);
    if (codec != nullptr) {  // stored as asked, so the loads below decode
      swiftkv_chunk_info info[kTokens / kChunk];
      size_t n = 0;
      CHECK_OK(swiftkv_chunk_info_get(info, kTokens / kChunk, &n, r->ctx, r->model, tokens.data(),
                                      kTokens));
      CHECK(n == kTokens / kChunk);
      for (const swiftkv_chunk_info &ci : info) {
        CHECK(ci.tier == tier && ci.codec == codec->codec && ci.lossy == 1);
      }
    }
  }
  CHECK_CUDA(cudaMemset(dmem, 0, hmem.size()));
  std::fill(hmem.begin(), hmem.end(), 0);
  v = run_request(dev.ctx, dpool, second, lay, g, dbases, span, true, s, false, false);
  CHECK(v.size() == kLayers && v[0] == kTokens && v[kLayers - 1] == kTokens);
  v = run_request(host.ctx, hpool, second, lay, g, hbases, span, false, s, false, false);
  CHECK(v.size() == kLayers && v[kLayers - 1] == kTokens);
  std::vector<uint8_t> back(hmem.size());
  CHECK_CUDA(cudaMemcpy(back.data(), dmem, back.size(), cudaMemcpyDeviceToHost));
  CHECK(back == hmem);  // the kernel and its CPU twin wrote the same bytes
  for (uint32_t l = 0; l < kLayers && codec == nullptr; ++l) {
    CHECK(layer_holds(back.data() + (static_cast<uint8_t *>(hbases[l]) - hmem.data()), lay, g, l,
                      second, kTokens));
  }
  for (Rig *r : {&dev, &host}) {
    swiftkv_ctx_destroy(r->ctx);
    std::system(("rm -rf " + r->disk).c_str());
  }
  cudaFree(dmem);
  cudaStreamDestroy(s);
  if (codec == nullptr) {
    std::printf("%s %s via %s: %u tokens of %u layers back bit-exact\n", g.name, layout_name,
                tier == SWIFTKV_TIER_HOST ? "host" : "disk", kTokens, kLayers);
  } else {
    std::printf("%s %s via %s, codec %d bits %u: decoded on the GPU as on the CPU, bit for bit\n",
                g.name, layout_name, tier == SWIFTKV_TIER_HOST ? "host" : "disk",
                static_cast<int>(codec->codec), codec->bits);
  }
  g_finite_values = false;
}

// A context on device 0 with 16 MiB of host tier and no disk, and a model of `g` on the device.
void device_ctx(const Geometry &g, swiftkv_ctx **ctx, uint32_t *model) {
  swiftkv_ctx_config c = SWIFTKV_CTX_CONFIG_INIT;
  c.device_mask = 1;
  c.host_budget_bytes = 16 << 20;
  CHECK_OK(swiftkv_ctx_create(ctx, &c));
  swiftkv_model_desc m = desc_of(g, 0);
  swiftkv_model_config mc = SWIFTKV_MODEL_CONFIG_INIT;
  mc.desc = &m;
  CHECK_OK(swiftkv_model_register(model, *ctx, &mc));
}

// One device tensor per layer of `span` bytes (one zeroed allocation, *dmem), registered as a
// pool of `pages_n` pages in layout `lay` (*pool); bases gets each layer's base.
void device_pool(swiftkv_ctx *ctx, uint32_t model, const Layout &lay, uint32_t pages_n,
                 uint64_t span, uint32_t *pool, void **dmem, std::vector<void *> *bases) {
  CHECK_CUDA(cudaMalloc(dmem, span * kLayers));
  CHECK_CUDA(cudaMemset(*dmem, 0, span * kLayers));
  bases->resize(kLayers);
  for (uint32_t l = 0; l < kLayers; ++l) (*bases)[l] = static_cast<uint8_t *>(*dmem) + l * span;
  const swiftkv_pool_desc pd = pool_desc(lay, pages_n, span, *bases);
  CHECK_OK(swiftkv_pool_register(pool, ctx, model, &pd));
}

// Two zeroed page-locked images of `bytes`: what the engine writes, and where it reads back.
void pinned_images(uint64_t bytes, uint8_t **write_img, uint8_t **read_img) {
  CHECK_CUDA(cudaMallocHost(reinterpret_cast<void **>(write_img), bytes));
  CHECK_CUDA(cudaMallocHost(reinterpret_cast<void **>(read_img), bytes));
  std::memset(*write_img, 0, bytes);
  std::memset(*read_img, 0, bytes);
}

// Holds the stream back, so that a copy the library forgets to order after the engine's work
// (or the engine's read forgotten after the library's) sees the wrong bytes instead of
// winning the race by luck.
void CUDART_CB hold_stream(void *) { ::usleep(20000); }

// The engine's loop with no host synchronisation anywhere: each layer is written by an
// asynchronous copy queued behind a delay on the engine's stream, saved, moved to `tier`, then
// loaded into other pages after a clearing memset (also behind a delay) and read back by copies
// on the same stream. Only the final stream synchronisation precedes the comparison, so a missing
// cross-stream wait in the library shows as wrong bytes. A start_load on a stream capturing a
// CUDA graph is refused first and changes nothing.
void async_round_trip(const Geometry &g, const char *layout_name, swiftkv_tier tier) {
  const uint32_t pages_n = 16;
  const Layout lay = layout_of(layout_name, g, pages_n);
  const uint64_t span = lay.span_elems * g.bytes;
  cudaStream_t s = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  Rig r;
  swiftkv_ctx_config c = SWIFTKV_CTX_CONFIG_INIT;
  c.device_mask = 1;
  c.host_budget_bytes = 16 << 20;
  r.disk = "/tmp/swiftkv-gpu-async-" + std::to_string(::getpid()) + "-" + layout_name;
  std::system(("rm -rf " + r.disk + " && mkdir -p " + r.disk).c_str());
  c.disk_path = r.disk.c_str();
  c.disk_budget_bytes = 64 << 20;
  CHECK_OK(swiftkv_ctx_create(&r.ctx, &c));
  swiftkv_model_desc m = desc_of(g, 0);
  swiftkv_model_config mc = SWIFTKV_MODEL_CONFIG_INIT;
  mc.desc = &m;
  CHECK_OK(swiftkv_model_register(&r.model, r.ctx, &mc));
  std::vector<void *> bases;
  void *dmem = nullptr;
  uint32_t pool = 0;
  device_pool(r.ctx, r.model, lay, pages_n, span, &pool, &dmem, &bases);
  const std::vector<int32_t> first{9, 2, 14, 0, 5, 11}, second{3, 15, 1, 8, 12, 6};
  // Page-locked images: what the engine writes per layer, and where it reads the layers back.
  uint8_t *write_img = nullptr, *read_img = nullptr;
  pinned_images(span * kLayers, &write_img, &read_img);
  for (uint32_t l = 0; l < kLayers; ++l) write_layer(write_img + l * span, lay, g, l, first);
  std::vector<uint32_t> tokens(kTokens);
  for (uint32_t i = 0; i < kTokens; ++i) tokens[i] = 1000 + i;
  // Save: nothing cached; each layer written behind a delay, then handed to save_layer.
  uint64_t req = begin_request(r.ctx, pool, first);
  CHECK(req != 0);
  CHECK_OK(swiftkv_start_load(r.ctx, req, s));
  for (uint32_t l = 0; l < kLayers; ++l) {
    uint64_t v = 1;
    CHECK_OK(swiftkv_wait_layer_load(&v, r.ctx, req, l, s));
    CHECK(v == 0);
    CHECK_CUDA(cudaLaunchHostFunc(s, hold_stream, nullptr));
    CHECK_CUDA(cudaMemcpyAsync(bases[l], write_img + l * span, span, cudaMemcpyHostToDevice, s));
    CHECK_OK(swiftkv_save_layer(r.ctx, req, l, s));
  }
  uint64_t saved = 0;
  CHECK_OK(swiftkv_wait_save(&saved, r.ctx, req, s));
  CHECK(saved == kTokens);
  swiftkv_request_info info = SWIFTKV_REQUEST_INFO_INIT;
  CHECK_OK(swiftkv_request_finish(&info, r.ctx, req));
  uint64_t there = 0;
  CHECK_OK(swiftkv_move(&there, r.ctx, r.model, tokens.data(), kTokens, tier));
  CHECK(there == kTokens / kChunk);
  // Load: the pages are cleared behind a delay on the engine's stream, so the loads must wait
  // for it; the engine reads each layer back on its stream, so it must wait for the loads.
  CHECK_CUDA(cudaLaunchHostFunc(s, hold_stream, nullptr));
  CHECK_CUDA(cudaMemsetAsync(dmem, 0, span * kLayers, s));
  req = begin_request(r.ctx, pool, second);
  CHECK(req != 0);
  {
    // A stream capturing a CUDA graph is refused, and the request is unchanged by it.
    cudaStream_t cap = nullptr;
    CHECK_CUDA(cudaStreamCreateWithFlags(&cap, cudaStreamNonBlocking));
    CHECK_CUDA(cudaStreamBeginCapture(cap, cudaStreamCaptureModeThreadLocal));
    const swiftkv_status st = swiftkv_start_load(r.ctx, req, cap);
    cudaGraph_t graph = nullptr;
    CHECK_CUDA(cudaStreamEndCapture(cap, &graph));
    if (graph != nullptr) cudaGraphDestroy(graph);
    cudaStreamDestroy(cap);
    CHECK(st == SWIFTKV_EUNSUPPORTED);
  }
  CHECK_OK(swiftkv_start_load(r.ctx, req, s));
  for (uint32_t l = 0; l < kLayers; ++l) {
    uint64_t v = 0;
    CHECK_OK(swiftkv_wait_layer_load(&v, r.ctx, req, l, s));
    CHECK(v == kTokens);
    CHECK_CUDA(cudaMemcpyAsync(read_img + l * span, bases[l], span, cudaMemcpyDeviceToHost, s));
    CHECK_OK(swiftkv_save_layer(r.ctx, req, l, s));
  }
  CHECK_OK(swiftkv_wait_save(&saved, r.ctx, req, s));
  CHECK_OK(swiftkv_request_finish(&info, r.ctx, req));
  CHECK_CUDA(cudaStreamSynchronize(s));
  for (uint32_t l = 0; l < kLayers; ++l) {
    CHECK(layer_holds(read_img + l * span, lay, g, l, second, kTokens));
  }
  swiftkv_ctx_destroy(r.ctx);
  std::system(("rm -rf " + r.disk).c_str());
  cudaFreeHost(write_img);
  cudaFreeHost(read_img);
  cudaFree(dmem);
  cudaStreamDestroy(s);
  std::printf("%s %s via %s, no host syncs: %u tokens of %u layers back bit-exact\n", g.name,
              layout_name, tier == SWIFTKV_TIER_HOST ? "host" : "disk", kTokens, kLayers);
}

cudaStream_t g_busy_stream = nullptr;

// Every multiprocessor held for 5 ms on a stream of its own: the library's gather of the layer
// about to be saved runs late, while the engine's copies (copy engines) do not wait for it.
void occupy_device() {
  if (!bench_occupy_device(5e-3, g_busy_stream)) {
    std::fprintf(stderr, "the kernel that fills the device did not launch\n");
    ++g_failures;
  }
}

// A library-made device pool with stream pages: at each wait_layer_load(l) the stream pages
// hold layer l of the loaded tokens. While saving, each layer's gather is held up behind a
// kernel that fills the device: the engine's write of the next layer into the same memory
// must still wait for it (its wait_layer_load orders the stream after the gather), or the
// chunks saved hold the wrong layer.
void stream_pages(const Geometry &g) {
  swiftkv_ctx *ctx = nullptr;
  uint32_t model = 0;
  device_ctx(g, &ctx, &model);
  uint32_t pool = 0;
  const swiftkv_status st = swiftkv_pool_create(&pool, ctx, model, 8, 4);
  if (st == SWIFTKV_EUNSUPPORTED) {
    std::printf("stream pages: this device has no VMM, skipped\n");
    swiftkv_ctx_destroy(ctx);
    return;
  }
  CHECK(st == SWIFTKV_OK);
  swiftkv_pool_desc pd = SWIFTKV_POOL_DESC_INIT;
  CHECK_OK(swiftkv_pool_get(&pd, nullptr, ctx, pool));
  const Layout lay{"pool",         pd.page_stride,
                   pd.kv_stride,   pd.token_stride,
                   pd.head_stride, pd.layer_span_bytes / g.bytes,
                   false};
  // Blocks 0-3 in the stream pages, 4-5 in regular ones.
  std::vector<int32_t> pages;
  for (uint32_t i = 0; i < 4; ++i) pages.push_back(static_cast<int32_t>(pd.stream_first + i));
  pages.push_back(1);
  pages.push_back(3);
  const std::vector<void *> bases(pd.layer_base, pd.layer_base + kLayers);
  cudaStream_t s = nullptr;
  CHECK_CUDA(cudaStreamCreate(&s));
  // Save (the engine writes each layer into the stream pages as it goes), then load back,
  // checking at each wait that the pages hold that layer.
  CHECK_CUDA(cudaStreamCreateWithFlags(&g_busy_stream, cudaStreamNonBlocking));
  auto v = run_request(ctx, pool, pages, lay, g, bases, pd.layer_span_bytes, true, s, true, false,
                       occupy_device);
  CHECK_CUDA(cudaStreamSynchronize(g_busy_stream));
  CHECK_CUDA(cudaStreamDestroy(g_busy_stream));
  CHECK(v.size() == kLayers && v[0] == 0);
  v = run_request(ctx, pool, pages, lay, g, bases, pd.layer_span_bytes, true, s, false, true);
  CHECK(v.size() == kLayers && v[kLayers - 1] == kTokens);
  swiftkv_ctx_destroy(ctx);
  cudaStreamDestroy(s);
  std::printf("%s stream pages: every layer streamed through the aliased pages intact\n", g.name);
}

const Geometry kGeometries[] = {{"f16-d16", SWIFTKV_DTYPE_F16, 16, 2},
                                {"bf16-d12", SWIFTKV_DTYPE_BF16, 12, 2},
                                {"fp8-d5", SWIFTKV_DTYPE_FP8_E4M3, 5, 1}};

// The batch hooks on a device pool, with no host synchronisation: a batch of a request that
// saves its chunks and one that copies nothing (fewer tokens than a chunk), then a batch of a
// request that loads them into other pages and another that copies nothing. Each layer is
// written (or read back) behind a delay on the engine's stream, so a missing stream wait shows
// as wrong bytes. A batch on a capturing stream is refused and changes nothing.
void batch_round_trip() {
  const Geometry &g = kGeometries[0];
  const uint32_t pages_n = 16;
  const Layout lay = layout_of("nhd", g, pages_n);
  const uint64_t span = lay.span_elems * g.bytes;
  cudaStream_t s = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  swiftkv_ctx *ctx = nullptr;
  uint32_t model = 0;
  device_ctx(g, &ctx, &model);
  std::vector<void *> bases;
  void *dmem = nullptr;
  uint32_t pool = 0;
  device_pool(ctx, model, lay, pages_n, span, &pool, &dmem, &bases);
  const std::vector<int32_t> first{9, 2, 14, 0, 5, 11}, second{3, 15, 1, 8, 12, 6};
  uint8_t *write_img = nullptr, *read_img = nullptr;
  pinned_images(span * kLayers, &write_img, &read_img);
  for (uint32_t l = 0; l < kLayers; ++l) write_layer(write_img + l * span, lay, g, l, first);

  uint64_t reqs[2] = {begin_request(ctx, pool, first), begin_request(ctx, pool, {7}, 10)};
  CHECK(reqs[0] != 0 && reqs[1] != 0);
  for (uint64_t r : reqs) CHECK_OK(swiftkv_start_load(ctx, r, s));
  for (uint32_t l = 0; l < kLayers; ++l) {
    uint64_t v[2] = {1, 1};
    CHECK_OK(swiftkv_wait_layer_load_batch(v, ctx, reqs, 2, l, s));
    CHECK(v[0] == 0 && v[1] == 0);
    CHECK_CUDA(cudaLaunchHostFunc(s, hold_stream, nullptr));
    CHECK_CUDA(cudaMemcpyAsync(bases[l], write_img + l * span, span, cudaMemcpyHostToDevice, s));
    CHECK_OK(swiftkv_save_layer_batch(ctx, reqs, 2, l, s));
  }
  uint64_t saved = 0;
  CHECK_OK(swiftkv_wait_save(&saved, ctx, reqs[0], s));
  CHECK(saved == kTokens);
  CHECK_OK(swiftkv_wait_save(&saved, ctx, reqs[1], s));
  CHECK(saved == 0);
  for (uint64_t r : reqs) CHECK_OK(swiftkv_request_finish(nullptr, ctx, r));

  CHECK_CUDA(cudaLaunchHostFunc(s, hold_stream, nullptr));
  CHECK_CUDA(cudaMemsetAsync(dmem, 0, span * kLayers, s));
  reqs[0] = begin_request(ctx, pool, second);
  reqs[1] = begin_request(ctx, pool, {4}, 10);
  CHECK(reqs[0] != 0 && reqs[1] != 0);
  for (uint64_t r : reqs) CHECK_OK(swiftkv_start_load(ctx, r, s));
  {
    cudaStream_t cap = nullptr;
    CHECK_CUDA(cudaStreamCreateWithFlags(&cap, cudaStreamNonBlocking));
    CHECK_CUDA(cudaStreamBeginCapture(cap, cudaStreamCaptureModeThreadLocal));
    uint64_t v[2] = {7, 7};
    const swiftkv_status st = swiftkv_wait_layer_load_batch(v, ctx, reqs, 2, 0, cap);
    cudaGraph_t graph = nullptr;
    CHECK_CUDA(cudaStreamEndCapture(cap, &graph));
    if (graph != nullptr) cudaGraphDestroy(graph);
    cudaStreamDestroy(cap);
    CHECK(st == SWIFTKV_EUNSUPPORTED && v[0] == 7 && v[1] == 7);
    swiftkv_request_info info = SWIFTKV_REQUEST_INFO_INIT;
    CHECK_OK(swiftkv_request_info_get(&info, ctx, reqs[0]));
    CHECK(info.layers_loaded == 0);
  }
  for (uint32_t l = 0; l < kLayers; ++l) {
    uint64_t v[2] = {0, 1};
    CHECK_OK(swiftkv_wait_layer_load_batch(v, ctx, reqs, 2, l, s));
    CHECK(v[0] == kTokens && v[1] == 0);
    CHECK_CUDA(cudaMemcpyAsync(read_img + l * span, bases[l], span, cudaMemcpyDeviceToHost, s));
    CHECK_OK(swiftkv_save_layer_batch(ctx, reqs, 2, l, s));
  }
  for (uint64_t r : reqs) {
    CHECK_OK(swiftkv_wait_save(&saved, ctx, r, s));
    CHECK(saved == 0);
    CHECK_OK(swiftkv_request_finish(nullptr, ctx, r));
  }
  CHECK_CUDA(cudaStreamSynchronize(s));
  for (uint32_t l = 0; l < kLayers; ++l) {
    CHECK(layer_holds(read_img + l * span, lay, g, l, second, kTokens));
  }
  swiftkv_ctx_destroy(ctx);
  cudaFreeHost(write_img);
  cudaFreeHost(read_img);
  cudaFree(dmem);
  cudaStreamDestroy(s);
  std::printf("batch hooks, no host syncs: %u tokens of %u layers back bit-exact\n", kTokens,
              kLayers);
}

void host_tier_round_trips() {
  for (const Geometry &g : kGeometries) {
    for (const char *layout : {"vllm", "nhd", "hnd", "cross"}) {
      round_trip(g, layout, SWIFTKV_TIER_HOST);
    }
  }
}

void disk_tier_round_trips() {
  for (const Geometry &g : kGeometries) round_trip(g, "nhd", SWIFTKV_TIER_DISK);
}

void stream_pages_round_trip() {
  for (const Geometry &g : kGeometries) stream_pages(g);
}

// Chunks stored kivi or fp8 in host memory or on disk, loaded into device pools: decoded by the
// GPU as the CPU decodes them, for the head dim that takes eight elements a store (16, f16 and
// bf16: each element type is its own instance of the kernel's group path) and one that does not
// (12), in every layout.
void compressed_round_trips() {
  const Geometry bf16_groups{"bf16-d16", SWIFTKV_DTYPE_BF16, 16, 2};
  swiftkv_codec_params kivi4 = SWIFTKV_CODEC_PARAMS_INIT, kivi2 = SWIFTKV_CODEC_PARAMS_INIT,
                       fp8 = SWIFTKV_CODEC_PARAMS_INIT;
  kivi4.codec = kivi2.codec = SWIFTKV_CODEC_KIVI;
  kivi4.bits = 4;
  kivi4.group = 16;
  kivi2.bits = 2;
  kivi2.group = 8;
  fp8.codec = SWIFTKV_CODEC_FP8;
  for (const Geometry &g : {kGeometries[0], kGeometries[1], bf16_groups}) {
    for (const char *layout : {"vllm", "nhd", "hnd", "cross"}) {
      round_trip(g, layout, SWIFTKV_TIER_HOST, &kivi4);
      round_trip(g, layout, SWIFTKV_TIER_HOST, &fp8);
    }
    round_trip(g, "nhd", SWIFTKV_TIER_DISK, &kivi2);
    round_trip(g, "hnd", SWIFTKV_TIER_DISK, &fp8);
  }
}

// Without host synchronisation: the library's own stream waits are all that order the steps.
void async_round_trips() {
  for (const char *layout : {"nhd", "hnd"}) {
    async_round_trip(kGeometries[0], layout, SWIFTKV_TIER_HOST);
    async_round_trip(kGeometries[0], layout, SWIFTKV_TIER_DISK);
  }
}

// The gather/scatter and decode kernels launched the other way (SWIFTKV_COPY_KERNEL=ahead): the
// same round trips, bit-exact, raw, kivi and fp8 chunks; a name that is neither launch
// refuses a pool on the device, created or registered, with EINVAL.
void ahead_kernel_round_trips() {
  CHECK(::setenv("SWIFTKV_COPY_KERNEL", "ahead", 1) == 0);
  swiftkv_codec_params fp8 = SWIFTKV_CODEC_PARAMS_INIT, kivi4 = SWIFTKV_CODEC_PARAMS_INIT;
  fp8.codec = SWIFTKV_CODEC_FP8;
  kivi4.codec = SWIFTKV_CODEC_KIVI;
  kivi4.bits = 4;
  kivi4.group = 16;
  for (const char *layout : {"vllm", "nhd", "hnd", "cross"}) {
    round_trip(kGeometries[0], layout, SWIFTKV_TIER_HOST);
  }
  round_trip(kGeometries[1], "hnd", SWIFTKV_TIER_HOST, &fp8);
  round_trip(kGeometries[0], "nhd", SWIFTKV_TIER_HOST, &kivi4);
  round_trip(kGeometries[1], "vllm", SWIFTKV_TIER_DISK, &kivi4);
  async_round_trip(kGeometries[0], "nhd", SWIFTKV_TIER_DISK);

  CHECK(::setenv("SWIFTKV_COPY_KERNEL", "fastest", 1) == 0);
  swiftkv_ctx *ctx = nullptr;
  uint32_t model = 0;
  device_ctx(kGeometries[0], &ctx, &model);
  uint32_t pool = 0;
  const swiftkv_status created = swiftkv_pool_create(&pool, ctx, model, 8, 4);
  CHECK(created == SWIFTKV_EINVAL);
  CHECK(std::strstr(swiftkv_last_error_message(), "SWIFTKV_COPY_KERNEL") != nullptr);
  void *dmem = nullptr;
  std::vector<void *> bases(kLayers);
  const Layout lay = layout_of("nhd", kGeometries[0], 16);
  const uint64_t span = lay.span_elems * kGeometries[0].bytes;
  CHECK_CUDA(cudaMalloc(&dmem, span * kLayers));
  for (uint32_t l = 0; l < kLayers; ++l) bases[l] = static_cast<uint8_t *>(dmem) + l * span;
  const swiftkv_pool_desc pd = pool_desc(lay, 16, span, bases);
  CHECK(swiftkv_pool_register(&pool, ctx, model, &pd) == SWIFTKV_EINVAL);
  CHECK(::unsetenv("SWIFTKV_COPY_KERNEL") == 0);
  CHECK_OK(swiftkv_pool_register(&pool, ctx, model, &pd));  // the same pool, once it is unset
  swiftkv_ctx_destroy(ctx);
  CHECK_CUDA(cudaFree(dmem));
  std::printf("SWIFTKV_COPY_KERNEL=ahead: round trips bit-exact; another name refused\n");
}

}  // namespace

int main() {
  if (const int rc = swiftkv_test_need_device(); rc != 0) return rc;
  const CMUnitTest tests[] = {
      SWIFTKV_GPU_TEST(host_tier_round_trips),    SWIFTKV_GPU_TEST(disk_tier_round_trips),
      SWIFTKV_GPU_TEST(stream_pages_round_trip),  SWIFTKV_GPU_TEST(async_round_trips),
      SWIFTKV_GPU_TEST(compressed_round_trips),   SWIFTKV_GPU_TEST(batch_round_trip),
      SWIFTKV_GPU_TEST(ahead_kernel_round_trips),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}

#else
int main() { return swiftkv_test_no_gpu("libswiftkv built without CUDA"); }
#endif
