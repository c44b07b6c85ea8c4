// Engine page pools and the connector at the ABI: descriptors checked into core layouts, pool
// and request ids into the objects that do the work.
#include <algorithm>
#include <cstddef>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include "capi/borrower.hpp"
#include "capi/capi_guard.hpp"
#include "capi/context_handle.hpp"
#include "capi/raw_enum.hpp"
#include "capi/versioned.hpp"

namespace swiftkv::capi {

namespace {

constexpr size_t kPoolDescV1Size = offsetof(swiftkv_pool_desc, head_stride) + sizeof(int64_t);
constexpr size_t kRequestDescV1Size =
    offsetof(swiftkv_request_desc, load_from_tokens) + sizeof(uint64_t);
constexpr size_t kRequestInfoV1Size = offsetof(swiftkv_request_info, reserved0) + sizeof(uint32_t);

// A model on a device needs that device in the context (ENODEV otherwise).
void require_usable_device(const swiftkv_ctx *ctx, const RegisteredModel &m) {
  const int32_t d = m.geometry.device;
  if (d != SWIFTKV_DEVICE_HOST && !ctx->core.uses_device(d)) {
    fail(SWIFTKV_ENODEV, "model '" + m.name + "' is on CUDA device " + std::to_string(d) +
                             ", which the context does not use (its config's device_mask)");
  }
}

uint32_t add_pool(swiftkv_ctx *ctx, uint32_t model, const RegisteredModel &m,
                  std::unique_ptr<KvPool> pool) {
  std::lock_guard lock(ctx->io_mu);
  if (ctx->next_pool == UINT32_MAX) fail(SWIFTKV_ENOMEM, "the context has used every pool id");
  const uint32_t id = ctx->next_pool++;
  ctx->pools.emplace(id, RegisteredPool{std::move(pool), model, m.fingerprint});
  return id;
}

// A pool by id; call with ctx->io_mu held. `arg` names the id in the message.
auto find_pool_locked(const swiftkv_ctx *ctx, uint32_t pool, const char *arg) {
  const auto it = ctx->pools.find(pool);
  if (it == ctx->pools.end()) {
    fail(SWIFTKV_ENOTFOUND, std::string(arg) + " " + std::to_string(pool) + " does not exist");
  }
  return it;
}

// An open request by id; call with ctx->io_mu held.
auto find_request_locked(const swiftkv_ctx *ctx, uint64_t request) {
  const auto it = ctx->requests.find(request);
  if (it == ctx->requests.end()) {
    fail(SWIFTKV_ENOTFOUND,
         "request " + std::to_string(request) + " is not open (finished, or never begun)");
  }
  return it;
}

std::shared_ptr<Request> open_request(const swiftkv_ctx *ctx, uint64_t request) {
  std::lock_guard lock(ctx->io_mu);
  return find_request_locked(ctx, request)->second;
}

// The request, with its stream checked: a host pool takes no stream.
std::shared_ptr<Request> request_on(swiftkv_ctx *ctx, uint64_t request, const void *stream) {
  std::shared_ptr<Request> r = open_request(ctx, request);
  if (stream != nullptr && r->pool().layout().device < 0) {
    fail_invalid("stream is not NULL, and host pools take no stream");
  }
  return r;
}

// A batch's requests, each open and named once, with the stream checked as request_on does.
// `any_device` says whether one of them is on a device pool.
std::vector<std::shared_ptr<Request>> batch_on(swiftkv_ctx *ctx, const uint64_t *ids, size_t n,
                                               const void *stream, bool *any_device) {
  std::vector<uint64_t> sorted(ids, ids + n);
  std::sort(sorted.begin(), sorted.end());
  const auto twice = std::adjacent_find(sorted.begin(), sorted.end());
  if (twice != sorted.end()) {
    fail_invalid("request " + std::to_string(*twice) + " is named twice in the batch");
  }
  std::vector<std::shared_ptr<Request>> rs;
  rs.reserve(n);
  {
    std::lock_guard lock(ctx->io_mu);
    for (size_t i = 0; i < n; ++i) rs.push_back(find_request_locked(ctx, ids[i])->second);
  }
  *any_device = false;
  for (const auto &r : rs) {
    if (r->pool().layout().device >= 0) {
      *any_device = true;
    } else if (stream != nullptr) {
      fail_invalid("stream is not NULL, and host pools take no stream");
    }
  }
  return rs;
}

// Removes an open request from the table: no later call finds it.
std::shared_ptr<Request> take_request(swiftkv_ctx *ctx, uint64_t request) {
  std::lock_guard lock(ctx->io_mu);
  const auto it = find_request_locked(ctx, request);
  std::shared_ptr<Request> r = it->second;
  ctx->requests.erase(it);
  return r;
}

swiftkv_request_info to_c(const RequestInfo &i) {
  swiftkv_request_info v = SWIFTKV_REQUEST_INFO_INIT;
  v.load_begin_tokens = i.load_begin;
  v.load_end_tokens = i.load_end;
  v.valid_end_tokens = i.valid_end;
  v.save_tokens = i.save_tokens;
  v.saved_tokens = i.saved_tokens;
  v.layers_loaded = i.layers_loaded;
  v.layers_saved = i.layers_saved;
  v.stream_ordered = i.stream_ordered ? 1 : 0;
  return v;
}

// The descriptor's pages for its tokens: enough of them, each a page of the pool, none twice.
std::vector<int32_t> request_pages(const swiftkv_request_desc &d, uint64_t block,
                                   uint64_t num_pages) {
  const uint64_t need = (d.n_tokens + block - 1) / block;
  if (d.pages == nullptr && d.n_pages != 0) swiftkv::fail_invalid("desc->pages is NULL");
  if (d.n_pages < need) {
    swiftkv::fail_invalid("desc->n_pages (" + std::to_string(d.n_pages) + ") is below the " +
                          std::to_string(need) + " pages that " + std::to_string(d.n_tokens) +
                          " tokens fill");
  }
  std::vector<int32_t> pages(d.pages, d.pages + need);
  for (size_t b = 0; b < pages.size(); ++b) {
    if (pages[b] < 0 || static_cast<uint64_t>(pages[b]) >= num_pages) {
      swiftkv::fail_invalid("desc->pages[" + std::to_string(b) + "] (" + std::to_string(pages[b]) +
                            ") is not a page of pool " + std::to_string(d.pool) + " (" +
                            std::to_string(num_pages) + " pages)");
    }
  }
  std::vector<int32_t> sorted = pages;
  std::sort(sorted.begin(), sorted.end());
  const auto dup = std::adjacent_find(sorted.begin(), sorted.end());
  if (dup != sorted.end()) {
    swiftkv::fail_invalid("desc->pages names page " + std::to_string(*dup) + " twice");
  }
  return pages;
}

// What the connector's Request is asked to do, from a checked descriptor.
swiftkv::RequestSpec request_spec(const swiftkv_request_desc &d, int32_t shape,
                                  const swiftkv::capi::RegisteredPool &rp,
                                  const swiftkv::capi::RegisteredModel &m) {
  const uint64_t block = m.geometry.block_tokens;
  std::vector<int32_t> pages = request_pages(d, block, rp.pool->layout().num_pages);
  if (d.load_from_tokens % block != 0 || d.load_from_tokens > d.n_tokens) {
    swiftkv::fail_invalid("desc->load_from_tokens (" + std::to_string(d.load_from_tokens) +
                          ") is not a block boundary within the " + std::to_string(d.n_tokens) +
                          " tokens");
  }
  swiftkv::RequestSpec spec;
  spec.model = rp.fingerprint;
  if (d.names == nullptr) {
    if (d.names_bytes != 0 || d.name_bytes != 0) {
      swiftkv::fail_invalid("desc->names is NULL but desc->names_bytes or name_bytes is not 0");
    }
    spec.keys = swiftkv::capi::keys_of(m, d.tokens, d.n_tokens, false);
  } else {
    // Named chunks: the tokens are not hashed (and may be NULL); the names say which chunks.
    spec.keys = swiftkv::capi::keys_of_names(m, d.names, d.names_bytes, d.name_bytes);
    const uint64_t full = d.n_tokens / m.geometry.chunk_tokens;
    if (spec.keys.size() != full) {
      swiftkv::fail_invalid("desc names " + std::to_string(spec.keys.size()) + " chunks, but the " +
                            std::to_string(d.n_tokens) + " tokens hold " + std::to_string(full) +
                            " full chunks of " + std::to_string(m.geometry.chunk_tokens));
    }
  }
  spec.pages = std::move(pages);
  spec.n_tokens = d.n_tokens;
  spec.load_from = d.load_from_tokens;
  spec.load = shape != SWIFTKV_REQUEST_SAVE_ONLY;
  spec.save = shape != SWIFTKV_REQUEST_LOAD_ONLY;
  return spec;
}

// A place among the context's open requests, taken while one is built and given back however
// the building ends; EBUSY at max_open_requests.
class BeginningRequest {
 public:
  explicit BeginningRequest(swiftkv_ctx *ctx) : ctx_(ctx) {
    std::lock_guard lock(ctx->io_mu);
    if (ctx->requests.size() + ctx->requests_beginning >= ctx->max_open_requests) {
      swiftkv::fail(SWIFTKV_EBUSY, std::to_string(ctx->max_open_requests) +
                                       " requests are open (config->max_open_requests); "
                                       "finish one first");
    }
    ++ctx->requests_beginning;
  }
  ~BeginningRequest() {
    std::lock_guard lock(ctx_->io_mu);
    --ctx_->requests_beginning;
  }
  BeginningRequest(const BeginningRequest &) = delete;
  BeginningRequest &operator=(const BeginningRequest &) = delete;

 private:
  swiftkv_ctx *ctx_;
};

}  // namespace

}  // namespace swiftkv::capi

using swiftkv::capi::require;

extern "C" {

SWIFTKV_API swiftkv_status swiftkv_pool_register(uint32_t *pool_out, swiftkv_ctx *ctx,
                                                 uint32_t model, const swiftkv_pool_desc *desc) {
  try {
    require(pool_out, "pool_out");
    require(ctx, "ctx");
    const swiftkv_pool_desc defaults = SWIFTKV_POOL_DESC_INIT;
    const swiftkv_pool_desc d = swiftkv::capi::read_versioned(
        desc, defaults, SWIFTKV_POOL_DESC_VERSION, swiftkv::capi::kPoolDescV1Size, "desc",
        "SWIFTKV_POOL_DESC_INIT");
    if (d.reserved0 != 0) swiftkv::fail_invalid("desc->reserved0 is not 0");
    require(d.layer_base, "desc->layer_base");
    std::shared_lock models(ctx->models_mu);  // the model stays registered until the pool is in
    const swiftkv::capi::RegisteredModel m = swiftkv::capi::borrower_locked(ctx, model);
    swiftkv::capi::require_usable_device(ctx, m);
    swiftkv::PageLayout l;
    l.layer_base.resize(m.geometry.num_layers);
    for (uint32_t i = 0; i < m.geometry.num_layers; ++i) {
      l.layer_base[i] = static_cast<std::byte *>(d.layer_base[i]);
    }
    l.device = m.geometry.device;
    l.layer_span_bytes = d.layer_span_bytes;
    l.num_pages = d.num_pages;
    l.page_tokens = m.geometry.block_tokens;
    l.heads = m.geometry.num_kv_heads;
    l.head_dim = m.geometry.head_dim;
    l.dtype_bytes = static_cast<uint32_t>(m.sizes.dtype_bytes);
    l.stream_first = d.stream_first;
    l.stream_pages = d.stream_pages;
    l.page_stride = d.page_stride;
    l.kv_stride = d.kv_stride;
    l.token_stride = d.token_stride;
    l.head_stride = d.head_stride;
    auto pool = std::make_unique<swiftkv::KvPool>(m.geometry, std::move(l));
    *pool_out = swiftkv::capi::add_pool(ctx, model, m, std::move(pool));
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

SWIFTKV_API swiftkv_status swiftkv_pool_create(uint32_t *pool_out, swiftkv_ctx *ctx, uint32_t model,
                                               uint32_t regular_pages, uint32_t stream_pages) {
  try {
    require(pool_out, "pool_out");
    require(ctx, "ctx");
    std::shared_lock models(ctx->models_mu);
    const swiftkv::capi::RegisteredModel m = swiftkv::capi::borrower_locked(ctx, model);
    swiftkv::capi::require_usable_device(ctx, m);
    auto pool = m.geometry.device == SWIFTKV_DEVICE_HOST
                    ? swiftkv::KvPool::create_host(m.geometry, regular_pages, stream_pages)
                    : swiftkv::KvPool::create_device(m.geometry, regular_pages, stream_pages);
    *pool_out = swiftkv::capi::add_pool(ctx, model, m, std::move(pool));
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

SWIFTKV_API swiftkv_status swiftkv_pool_get(swiftkv_pool_desc *out, uint32_t *model_out,
                                            const swiftkv_ctx *ctx, uint32_t pool) {
  try {
    require(out, "out");
    require(ctx, "ctx");
    swiftkv::capi::check_struct_header<swiftkv_pool_desc>(
        out->size, out->version, SWIFTKV_POOL_DESC_VERSION, swiftkv::capi::kPoolDescV1Size, "out",
        "SWIFTKV_POOL_DESC_INIT");
    std::lock_guard lock(ctx->io_mu);
    const auto it = swiftkv::capi::find_pool_locked(ctx, pool, "pool");
    const swiftkv::PageLayout &l = it->second.pool->layout();
    swiftkv_pool_desc v = SWIFTKV_POOL_DESC_INIT;
    v.num_pages = l.num_pages;
    v.stream_first = l.stream_first;
    v.stream_pages = l.stream_pages;
    // The pool's own array of bases: std::byte* and void* have the same representation.
    v.layer_base = reinterpret_cast<void *const *>(l.layer_base.data());
    v.layer_span_bytes = l.layer_span_bytes;
    v.page_stride = l.page_stride;
    v.kv_stride = l.kv_stride;
    v.token_stride = l.token_stride;
    v.head_stride = l.head_stride;
    swiftkv::capi::write_versioned(out, v, SWIFTKV_POOL_DESC_VERSION,
                                   swiftkv::capi::kPoolDescV1Size, "out", "SWIFTKV_POOL_DESC_INIT");
    if (model_out != nullptr) *model_out = it->second.model;
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

SWIFTKV_API swiftkv_status swiftkv_pool_destroy(swiftkv_ctx *ctx, uint32_t pool) {
  try {
    require(ctx, "ctx");
    std::shared_ptr<const swiftkv::KvPool> doomed;
    std::lock_guard lock(ctx->io_mu);
    const auto it = swiftkv::capi::find_pool_locked(ctx, pool, "pool");
    for (const auto &[id, r] : ctx->requests) {
      if (&r->pool() == it->second.pool.get()) {
        swiftkv::fail(SWIFTKV_EBUSY,
                      "pool " + std::to_string(pool) + " is used by request " + std::to_string(id));
      }
    }
    ctx->pools.erase(it);
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

SWIFTKV_API swiftkv_status swiftkv_request_begin(uint64_t *request_out, swiftkv_ctx *ctx,
                                                 const swiftkv_request_desc *desc) {
  try {
    require(request_out, "request_out");
    require(ctx, "ctx");
    const swiftkv_request_desc defaults = SWIFTKV_REQUEST_DESC_INIT;
    const swiftkv_request_desc d = swiftkv::capi::read_versioned(
        desc, defaults, SWIFTKV_REQUEST_DESC_VERSION, swiftkv::capi::kRequestDescV1Size, "desc",
        "SWIFTKV_REQUEST_DESC_INIT");
    if (d.reserved0 != 0) swiftkv::fail_invalid("desc->reserved0 is not 0");
    if (d.reserved1 != 0) swiftkv::fail_invalid("desc->reserved1 is not 0");
    if (d.reserved2 != 0) swiftkv::fail_invalid("desc->reserved2 is not 0");
    const int32_t shape = swiftkv::capi::raw_enum_value(d.shape);
    if (shape < SWIFTKV_REQUEST_LOAD_AND_SAVE || shape > SWIFTKV_REQUEST_SAVE_ONLY) {
      swiftkv::fail_invalid("desc->shape (" + std::to_string(shape) +
                            ") is not a swiftkv_request_shape");
    }
    swiftkv::capi::RegisteredPool rp;
    {
      std::lock_guard lock(ctx->io_mu);
      rp = swiftkv::capi::find_pool_locked(ctx, d.pool, "desc->pool")->second;
    }
    const swiftkv::capi::RegisteredModel m = swiftkv::capi::borrower(ctx, rp.model);
    swiftkv::RequestSpec spec = swiftkv::capi::request_spec(d, shape, rp, m);
    const swiftkv::capi::BeginningRequest place(ctx);
    auto r =
        std::make_shared<swiftkv::Request>(ctx->cache, ctx->executor, rp.pool, std::move(spec));
    std::lock_guard lock(ctx->io_mu);
    const uint64_t id = ctx->next_request++;
    ctx->requests.emplace(id, std::move(r));
    *request_out = id;
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

SWIFTKV_API swiftkv_status swiftkv_start_load(swiftkv_ctx *ctx, uint64_t request, void *stream) {
  try {
    require(ctx, "ctx");
    swiftkv::capi::request_on(ctx, request, stream)->start_load(stream);
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

SWIFTKV_API swiftkv_status swiftkv_wait_layer_load(uint64_t *valid_end_tokens_out, swiftkv_ctx *ctx,
                                                   uint64_t request, uint32_t layer, void *stream) {
  try {
    require(valid_end_tokens_out, "valid_end_tokens_out");
    require(ctx, "ctx");
    *valid_end_tokens_out =
        swiftkv::capi::request_on(ctx, request, stream)->wait_layer_load(layer, stream);
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

SWIFTKV_API swiftkv_status swiftkv_save_layer(swiftkv_ctx *ctx, uint64_t request, uint32_t layer,
                                              void *stream) {
  try {
    require(ctx, "ctx");
    swiftkv::capi::request_on(ctx, request, stream)->save_layer(layer, stream);
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

SWIFTKV_API swiftkv_status swiftkv_wait_layer_load_batch(uint64_t *valid_ends_out, swiftkv_ctx *ctx,
                                                         const uint64_t *requests,
                                                         size_t n_requests, uint32_t layer,
                                                         void *stream) {
  try {
    require(ctx, "ctx");
    if (n_requests == 0) return SWIFTKV_OK;
    require(valid_ends_out, "valid_ends_out");
    require(requests, "requests");
    bool any_device = false;
    const std::vector<std::shared_ptr<swiftkv::Request>> rs =
        swiftkv::capi::batch_on(ctx, requests, n_requests, stream, &any_device);
    for (const auto &r : rs) r->check_wait_layer_load(layer);
    if (any_device) swiftkv::refuse_capture(stream, "swiftkv_wait_layer_load_batch");
    for (size_t i = 0; i < rs.size(); ++i) {
      valid_ends_out[i] = rs[i]->wait_layer_load(layer, stream, false);
    }
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

SWIFTKV_API swiftkv_status swiftkv_save_layer_batch(swiftkv_ctx *ctx, const uint64_t *requests,
                                                    size_t n_requests, uint32_t layer,
                                                    void *stream) {
  try {
    require(ctx, "ctx");
    if (n_requests == 0) return SWIFTKV_OK;
    require(requests, "requests");
    bool any_device = false;
    const std::vector<std::shared_ptr<swiftkv::Request>> rs =
        swiftkv::capi::batch_on(ctx, requests, n_requests, stream, &any_device);
    for (const auto &r : rs) r->check_save_layer(layer);
    if (any_device) swiftkv::refuse_capture(stream, "swiftkv_save_layer_batch");
    for (const auto &r : rs) r->save_layer(layer, stream, false);
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

SWIFTKV_API swiftkv_status swiftkv_wait_save(uint64_t *saved_tokens_out, swiftkv_ctx *ctx,
                                             uint64_t request, void *stream) {
  try {
    require(saved_tokens_out, "saved_tokens_out");
    require(ctx, "ctx");
    *saved_tokens_out = swiftkv::capi::request_on(ctx, request, stream)->wait_save(stream);
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

SWIFTKV_API swiftkv_status swiftkv_request_info_get(swiftkv_request_info *out,
                                                    const swiftkv_ctx *ctx, uint64_t request) {
  try {
    require(out, "out");
    require(ctx, "ctx");
    swiftkv::capi::check_struct_header<swiftkv_request_info>(
        out->size, out->version, SWIFTKV_REQUEST_INFO_VERSION, swiftkv::capi::kRequestInfoV1Size,
        "out", "SWIFTKV_REQUEST_INFO_INIT");
    const swiftkv_request_info v =
        swiftkv::capi::to_c(swiftkv::capi::open_request(ctx, request)->info());
    swiftkv::capi::write_versioned(out, v, SWIFTKV_REQUEST_INFO_VERSION,
                                   swiftkv::capi::kRequestInfoV1Size, "out",
                                   "SWIFTKV_REQUEST_INFO_INIT");
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

SWIFTKV_API swiftkv_status swiftkv_request_finish(swiftkv_request_info *out, swiftkv_ctx *ctx,
                                                  uint64_t request) {
  try {
    require(ctx, "ctx");
    if (out != nullptr) {
      swiftkv::capi::check_struct_header<swiftkv_request_info>(
          out->size, out->version, SWIFTKV_REQUEST_INFO_VERSION, swiftkv::capi::kRequestInfoV1Size,
          "out", "SWIFTKV_REQUEST_INFO_INIT");
    }
    std::shared_ptr<swiftkv::Request> r = swiftkv::capi::take_request(ctx, request);
    const swiftkv_request_info v = swiftkv::capi::to_c(r->info());
    r.reset();  // waits for the request's copies in flight, then gives back what it held
    if (out != nullptr) {
      swiftkv::capi::write_versioned(out, v, SWIFTKV_REQUEST_INFO_VERSION,
                                     swiftkv::capi::kRequestInfoV1Size, "out",
                                     "SWIFTKV_REQUEST_INFO_INIT");
    }
    return SWIFTKV_OK;
  }
  SWIFTKV_CATCH_ALL
}

}  // extern "C"
