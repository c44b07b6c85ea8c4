// libFuzzer target: page-layout descriptors through swiftkv_pool_register, then a save and a
// load through the connector whose bytes are checked. The input gives the descriptor (pages,
// stream pages, strides, span, base misalignment) and the order of the pages a request uses.
// Oracle: a descriptor the library refuses is SWIFTKV_EINVAL; one it accepts must be sound as
// the header defines it (strides > 0, no two elements of a layer at one address, every element
// inside the span), checked here element by element, and then every element a request saves out
// of its pages comes back exact into other pages (stream pages in the engine's order: a layer's
// loads are checked at its wait, before the next layer overwrites them).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "fuzz/fuzz_support.hpp"
#include "swiftkv/swiftkv.h"

namespace {

// 2 layers, 2 KV heads of 4, F16, 4-token pages, 8-token chunks.
constexpr uint32_t kLayers = 2, kHeads = 2, kDim = 4, kBlock = 4, kChunk = 8;
constexpr uint64_t kMaxSpan = 1 << 16;  // bytes of each layer's arena at most

void check(bool ok, const char *what) { swiftkv::fuzz::check(ok, "fuzz_pool", what); }

struct Pool {
  swiftkv_pool_desc d = SWIFTKV_POOL_DESC_INIT;
  std::vector<std::vector<uint64_t>> arena;  // per layer, 8-byte aligned
  std::vector<void *> base;
  uint32_t misalign = 0;  // bytes past the arena's start (0 or 2 keeps F16 alignment)

  int64_t element(uint32_t p, uint32_t c, uint32_t t, uint32_t h, uint32_t dim) const {
    return p * d.page_stride + c * d.kv_stride + t * d.token_stride + h * d.head_stride + dim;
  }
  uint16_t *at(uint32_t l, uint32_t p, uint32_t c, uint32_t t, uint32_t h, uint32_t dim) const {
    return static_cast<uint16_t *>(base[l]) + element(p, c, t, h, dim);
  }
};

uint16_t value(uint32_t layer, uint64_t token, uint32_t c, uint32_t h, uint32_t dim) {
  uint64_t x = layer * 7919u + token * 131u + c * 17u + h * 5u + dim + 1;
  x *= 0x9E3779B97F4A7C15ull;
  return static_cast<uint16_t>(x >> 48);
}

// The header's rules, checked independently of the library for a descriptor it accepted.
void check_sound(const Pool &pool) {
  const swiftkv_pool_desc &d = pool.d;
  check(d.page_stride > 0 && d.kv_stride > 0 && d.token_stride > 0 && d.head_stride > 0,
        "accepted a stride that is not > 0");
  const uint64_t elems = uint64_t{d.num_pages} * 2 * kBlock * kHeads * kDim;
  std::vector<uint8_t> seen(d.layer_span_bytes / 2 + 1, 0);
  uint64_t count = 0;
  for (uint32_t p = 0; p < d.num_pages; ++p)
    for (uint32_t c = 0; c < 2; ++c)
      for (uint32_t t = 0; t < kBlock; ++t)
        for (uint32_t h = 0; h < kHeads; ++h)
          for (uint32_t x = 0; x < kDim; ++x) {
            const int64_t e = pool.element(p, c, t, h, x);
            check(e >= 0 && static_cast<uint64_t>(e + 1) * 2 <= d.layer_span_bytes,
                  "accepted an element outside layer_span_bytes");
            check(seen[static_cast<size_t>(e)] == 0, "accepted two elements at one address");
            seen[static_cast<size_t>(e)] = 1;
            ++count;
          }
  check(count == elems, "element count");
}

// One engine step over tokens [0, n) in `pages`: loads what is cached (checked at each layer's
// wait), writes the rest, saves. Returns the tokens loaded.
uint64_t turn(swiftkv_ctx *ctx, uint32_t pool_id, const Pool &pool, const uint32_t *tokens,
              uint64_t n, const std::vector<int32_t> &pages) {
  swiftkv_request_desc d = SWIFTKV_REQUEST_DESC_INIT;
  d.pool = pool_id;
  d.tokens = tokens;
  d.n_tokens = n;
  d.pages = pages.data();
  d.n_pages = pages.size();
  uint64_t req = 0;
  check(swiftkv_request_begin(&req, ctx, &d) == SWIFTKV_OK, "request_begin");
  check(swiftkv_start_load(ctx, req, nullptr) == SWIFTKV_OK, "start_load");
  uint64_t valid = 0;
  for (uint32_t l = 0; l < kLayers; ++l) {
    check(swiftkv_wait_layer_load(&valid, ctx, req, l, nullptr) == SWIFTKV_OK, "wait_layer_load");
    for (uint64_t t = 0; t < n; ++t) {
      const auto page = static_cast<uint32_t>(pages[t / kBlock]);
      for (uint32_t c = 0; c < 2; ++c)
        for (uint32_t h = 0; h < kHeads; ++h)
          for (uint32_t x = 0; x < kDim; ++x) {
            uint16_t *e = pool.at(l, page, c, static_cast<uint32_t>(t % kBlock), h, x);
            if (t < valid) {
              check(*e == value(l, t, c, h, x), "a loaded element differs from the saved one");
            } else {
              *e = value(l, t, c, h, x);
            }
          }
    }
    check(swiftkv_save_layer(ctx, req, l, nullptr) == SWIFTKV_OK, "save_layer");
  }
  uint64_t saved = 0;
  check(swiftkv_wait_save(&saved, ctx, req, nullptr) == SWIFTKV_OK, "wait_save");
  check(swiftkv_request_finish(nullptr, ctx, req) == SWIFTKV_OK, "request_finish");
  return valid;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  swiftkv::fuzz::Reader in{data, size};
  Pool pool;
  swiftkv_pool_desc &d = pool.d;
  d.num_pages = in.take<uint8_t>(8) % 17;  // 0 (refused) to 16
  d.stream_first = in.take<uint8_t>(0) % 20;
  d.stream_pages = in.take<uint8_t>(0) % 20;
  // Strides in elements: small ones make real layouts; the sign bit tries negative ones.
  d.page_stride = in.take<int16_t>(2 * kBlock * kHeads * kDim);
  d.kv_stride = in.take<int16_t>(kBlock * kHeads * kDim);
  d.token_stride = in.take<int16_t>(kHeads * kDim);
  d.head_stride = in.take<int16_t>(kDim);
  d.layer_span_bytes =
      std::min<uint64_t>(in.take<uint32_t>(d.num_pages * 2 * kBlock * kHeads * kDim * 2), kMaxSpan);
  pool.misalign = in.take<uint8_t>(0) % 4;  // 1 and 3 break the F16 alignment
  const uint8_t shuffle = in.take<uint8_t>(1);

  pool.arena.resize(kLayers);
  for (uint32_t l = 0; l < kLayers; ++l) {
    pool.arena[l].assign(kMaxSpan / 8 + 1, 0);
    pool.base.push_back(reinterpret_cast<uint8_t *>(pool.arena[l].data()) + pool.misalign);
  }
  d.layer_base = pool.base.data();

  swiftkv_ctx_config c = SWIFTKV_CTX_CONFIG_INIT;
  c.host_budget_bytes = 1 << 20;
  c.demote_free_percent = 0;
  swiftkv_ctx *ctx = nullptr;
  check(swiftkv_ctx_create(&ctx, &c) == SWIFTKV_OK, "ctx_create");
  swiftkv_model_desc md = SWIFTKV_MODEL_DESC_INIT;
  md.name = "fuzz-pool";
  md.num_layers = kLayers;
  md.num_kv_heads = kHeads;
  md.head_dim = kDim;
  md.block_tokens = kBlock;
  md.chunk_tokens = kChunk;
  swiftkv_model_config mc = SWIFTKV_MODEL_CONFIG_INIT;
  mc.desc = &md;
  uint32_t model = 0;
  check(swiftkv_model_register(&model, ctx, &mc) == SWIFTKV_OK, "model_register");

  uint32_t pool_id = 0;
  const swiftkv_status st = swiftkv_pool_register(&pool_id, ctx, model, &d);
  if (st != SWIFTKV_OK) {
    check(st == SWIFTKV_EINVAL, "a refused descriptor is not EINVAL");
    check(std::strstr(swiftkv_last_error_message(), "desc") != nullptr, "the message names desc");
    swiftkv_ctx_destroy(ctx);
    return 0;
  }
  check(pool.misalign % 2 == 0, "accepted a base not aligned to the dtype");
  check_sound(pool);

  // Two turns over the same tokens in two orders of the pages: the second loads every chunk.
  const uint32_t n_pages = std::min<uint32_t>(d.num_pages, 4);
  const uint64_t n = n_pages * kBlock / kChunk * kChunk;
  if (n > 0) {
    std::vector<uint32_t> tokens(n);
    for (uint64_t i = 0; i < n; ++i) tokens[i] = static_cast<uint32_t>(i * 7 + 3);
    std::vector<int32_t> pages(d.num_pages);
    for (uint32_t p = 0; p < d.num_pages; ++p) pages[p] = static_cast<int32_t>(p);
    std::vector<int32_t> first(pages.begin(), pages.begin() + n / kBlock);
    std::rotate(pages.begin(), pages.begin() + shuffle % d.num_pages, pages.end());
    std::reverse(pages.begin(), pages.end());
    std::vector<int32_t> second(pages.begin(), pages.begin() + n / kBlock);
    check(turn(ctx, pool_id, pool, tokens.data(), n, first) == 0, "a first turn loaded tokens");
    for (auto &a : pool.arena) std::fill(a.begin(), a.end(), 0xEEEEEEEEEEEEEEEEull);
    check(turn(ctx, pool_id, pool, tokens.data(), n, second) == n, "a second turn missed tokens");
  }
  if (std::getenv("SWIFTKV_FUZZ_VERBOSE") != nullptr) {
    std::fprintf(stderr, "fuzz_pool: registered %u pages, %llu tokens round trip\n", d.num_pages,
                 static_cast<unsigned long long>(n));
  }
  check(swiftkv_pool_destroy(ctx, pool_id) == SWIFTKV_OK, "pool_destroy");
  swiftkv_ctx_destroy(ctx);
  return 0;
}
