/* The per-layer data path through the C API on the host backend: a fake engine writes a known
 * value for every (layer, token, K/V, head, dim) into its pages, saves them through the
 * connector, the chunks are moved to host and disk, and a later request loads them back layer by
 * layer into other pages, every byte compared: for vLLM's, FlashInfer's NHD and HND and
 * cross-layer page layouts, and for a library-made pool with stream pages. Then failures (a
 * corrupt disk chunk, lent memory lost, a clear during the request), lossy chunks and a model
 * that asks for exact bytes, and bad input. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "test_support.h"

/* 3 layers, 2 KV heads of 6 (an odd head dim), F16, 4-token pages, 8-token chunks. */
#define LAYERS 3u
#define HEADS 2u
#define DIM 6u
#define BLOCK 4u
#define CHUNK 8u
#define PAGES 40u
#define CHUNK_BYTES (LAYERS * 2u * CHUNK * HEADS * DIM * 2u)

static swiftkv_model_desc model_desc(void) {
  swiftkv_model_desc d = SWIFTKV_MODEL_DESC_INIT;
  d.name = "connector-model";
  d.num_layers = LAYERS;
  d.num_kv_heads = HEADS;
  d.head_dim = DIM;
  d.block_tokens = BLOCK;
  d.chunk_tokens = CHUNK;
  return d;
}

/* The value the engine computes for one element of a sequence. */
static uint16_t value(uint32_t seq, uint32_t layer, uint64_t token, uint32_t c, uint32_t head,
                      uint32_t dim) {
  uint64_t x = seq * 1000003u + layer * 7919u + token * 131u + c * 17u + head * 5u + dim;
  x *= 0x9E3779B97F4A7C15ull;
  return (uint16_t)(x >> 48);
}

struct engine {
  swiftkv_ctx *ctx;
  uint32_t model, pool;
  swiftkv_pool_desc d; /* as swiftkv_pool_get says */
  void *mem[LAYERS];   /* what the test allocated for a registered pool */
  char dir[64];
};

static uint16_t *element(const struct engine *e, uint32_t layer, int32_t page, uint32_t c,
                         uint32_t t, uint32_t h) {
  uint16_t *base = (uint16_t *)e->d.layer_base[layer];
  return base + page * e->d.page_stride + c * e->d.kv_stride + t * e->d.token_stride +
         h * e->d.head_stride;
}

/* The engine computing layer `layer` of tokens [from, to). */
static void engine_write(const struct engine *e, const int32_t *pages, uint32_t seq, uint32_t layer,
                         uint64_t from, uint64_t to) {
  for (uint64_t t = from; t < to; ++t) {
    for (uint32_t c = 0; c < 2; ++c) {
      for (uint32_t h = 0; h < HEADS; ++h) {
        uint16_t *p = element(e, layer, pages[t / BLOCK], c, (uint32_t)(t % BLOCK), h);
        for (uint32_t d = 0; d < DIM; ++d) p[d] = value(seq, layer, t, c, h, d);
      }
    }
  }
}

/* Elements of tokens [from, to) of one layer that differ from what the engine would compute. */
static uint64_t engine_wrong(const struct engine *e, const int32_t *pages, uint32_t seq,
                             uint32_t layer, uint64_t from, uint64_t to) {
  uint64_t wrong = 0;
  for (uint64_t t = from; t < to; ++t) {
    for (uint32_t c = 0; c < 2; ++c) {
      for (uint32_t h = 0; h < HEADS; ++h) {
        const uint16_t *p = element(e, layer, pages[t / BLOCK], c, (uint32_t)(t % BLOCK), h);
        for (uint32_t d = 0; d < DIM; ++d) wrong += p[d] != value(seq, layer, t, c, h, d);
      }
    }
  }
  return wrong;
}

/* Fills every byte of every page of every layer with garbage. */
static void engine_scramble(const struct engine *e) {
  for (uint32_t l = 0; l < LAYERS; ++l) {
    for (uint32_t p = 0; p < e->d.num_pages; ++p) {
      for (uint32_t c = 0; c < 2; ++c) {
        for (uint32_t t = 0; t < BLOCK; ++t) {
          for (uint32_t h = 0; h < HEADS; ++h) {
            uint16_t *x = element(e, l, (int32_t)p, c, t, h);
            for (uint32_t d = 0; d < DIM; ++d) x[d] = 0xEEEE;
          }
        }
      }
    }
  }
}

enum layout { VLLM, NHD, HND, CROSS, CREATED_STREAM };

static void engine_up_bounded(struct engine *e, enum layout layout, uint64_t host_bytes, int disk,
                              uint32_t max_open_requests) {
  memset(e, 0, sizeof *e);
  swiftkv_ctx_config c = SWIFTKV_CTX_CONFIG_INIT;
  c.host_budget_bytes = host_bytes;
  c.max_open_requests = max_open_requests;
  c.eviction_policy = SWIFTKV_EVICT_LRU;
  c.demote_free_percent = 0;
  if (disk) {
    strcpy(e->dir, "/tmp/swiftkv-conn-XXXXXX");
    assert_non_null(mkdtemp(e->dir));
    c.disk_path = e->dir;
    c.disk_budget_bytes = 64 * (CHUNK_BYTES + 96);
  }
  assert_ok(swiftkv_ctx_create(&e->ctx, &c));
  swiftkv_model_desc md = model_desc();
  swiftkv_model_config mc = SWIFTKV_MODEL_CONFIG_INIT;
  mc.desc = &md;
  assert_ok(swiftkv_model_register(&e->model, e->ctx, &mc));
  if (layout == CREATED_STREAM) {
    assert_ok(swiftkv_pool_create(&e->pool, e->ctx, e->model, 5, 16));
  } else {
    const int64_t hd = DIM, bhd = (int64_t)BLOCK * HEADS * DIM;
    swiftkv_pool_desc d = SWIFTKV_POOL_DESC_INIT;
    d.num_pages = PAGES;
    void *bases[LAYERS];
    if (layout == CROSS) {
      const size_t bytes = (size_t)PAGES * LAYERS * 2 * bhd * 2;
      e->mem[0] = calloc(1, bytes);
      for (uint32_t l = 0; l < LAYERS; ++l) bases[l] = (char *)e->mem[0] + l * 2 * bhd * 2;
      d.layer_span_bytes = bytes - (LAYERS - 1) * 2 * bhd * 2;
      d.page_stride = LAYERS * 2 * bhd;
      d.kv_stride = bhd;
      d.token_stride = HEADS * hd;
      d.head_stride = hd;
    } else {
      const size_t bytes = (size_t)PAGES * 2 * bhd * 2;
      for (uint32_t l = 0; l < LAYERS; ++l) bases[l] = e->mem[l] = calloc(1, bytes);
      d.layer_span_bytes = bytes;
      if (layout == VLLM) { /* [2, pages, B, H, D] */
        d.kv_stride = PAGES * bhd;
        d.page_stride = bhd;
        d.token_stride = HEADS * hd;
        d.head_stride = hd;
      } else if (layout == NHD) { /* [pages, 2, B, H, D] */
        d.page_stride = 2 * bhd;
        d.kv_stride = bhd;
        d.token_stride = HEADS * hd;
        d.head_stride = hd;
      } else { /* HND: [pages, 2, H, B, D] */
        d.page_stride = 2 * bhd;
        d.kv_stride = bhd;
        d.head_stride = BLOCK * hd;
        d.token_stride = hd;
      }
    }
    d.layer_base = bases;
    assert_ok(swiftkv_pool_register(&e->pool, e->ctx, e->model, &d));
  }
  e->d = (swiftkv_pool_desc)SWIFTKV_POOL_DESC_INIT;
  uint32_t owner = 99;
  assert_ok(swiftkv_pool_get(&e->d, &owner, e->ctx, e->pool));
  assert_int_equal(owner, e->model);
}

static void engine_up(struct engine *e, enum layout layout, uint64_t host_bytes, int disk) {
  engine_up_bounded(e, layout, host_bytes, disk, 4096);
}

static void engine_down(struct engine *e) {
  assert_ok(swiftkv_pool_destroy(e->ctx, e->pool));
  swiftkv_ctx_destroy(e->ctx);
  for (uint32_t l = 0; l < LAYERS; ++l) free(e->mem[l]);
  if (e->dir[0] != '\0') {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", e->dir);
    assert_int_equal(system(cmd), 0);
  }
}

static void fill_tokens(uint32_t *t, size_t n, uint32_t seq) {
  for (size_t i = 0; i < n; ++i) t[i] = seq * 100000u + (uint32_t)i;
}

/* `n` distinct pages in a scrambled order, from [first, first + span). */
static void pick_pages(int32_t *pages, size_t n, uint32_t first, uint32_t span, uint32_t seed) {
  assert_true(n <= span);
  int32_t all[64];
  for (uint32_t i = 0; i < span; ++i) all[i] = (int32_t)(first + i);
  for (uint32_t i = span - 1; i > 0; --i) {
    seed = seed * 1103515245u + 12345u;
    const uint32_t j = (seed >> 8) % (i + 1);
    const int32_t x = all[i];
    all[i] = all[j];
    all[j] = x;
  }
  memcpy(pages, all, n * sizeof *pages);
}

struct turn_result {
  swiftkv_request_info info;
  uint64_t wrong_loaded; /* loaded elements that differ, over all layers */
  uint64_t valid_end[LAYERS];
};

/* Begins a request of `shape` over tokens[0, n) in `pages`, loading from load_from. */
static uint64_t begin_shaped(const struct engine *e, const uint32_t *tokens, size_t n,
                             const int32_t *pages, uint64_t load_from,
                             swiftkv_request_shape shape) {
  swiftkv_request_desc d = SWIFTKV_REQUEST_DESC_INIT;
  d.pool = e->pool;
  d.tokens = tokens;
  d.n_tokens = n;
  d.pages = pages;
  d.n_pages = (n + BLOCK - 1) / BLOCK;
  d.load_from_tokens = load_from;
  d.shape = shape;
  uint64_t req = 0;
  assert_ok(swiftkv_request_begin(&req, e->ctx, &d));
  return req;
}

/* One engine step over tokens[0, n): loads what is cached from load_from, checks the loaded
 * tokens of each layer at its wait_layer_load, computes (writes) the rest, saves. */
static struct turn_result run_turn(const struct engine *e, const uint32_t *tokens, size_t n,
                                   const int32_t *pages, uint32_t seq, uint64_t load_from,
                                   void (*during)(const struct engine *, uint64_t)) {
  struct turn_result r;
  memset(&r, 0, sizeof r);
  const uint64_t req = begin_shaped(e, tokens, n, pages, load_from, SWIFTKV_REQUEST_LOAD_AND_SAVE);
  if (during != NULL) during(e, req);
  assert_ok(swiftkv_start_load(e->ctx, req, NULL));
  r.info = (swiftkv_request_info)SWIFTKV_REQUEST_INFO_INIT;
  assert_ok(swiftkv_request_info_get(&r.info, e->ctx, req));
  for (uint32_t l = 0; l < LAYERS; ++l) {
    assert_ok(swiftkv_wait_layer_load(&r.valid_end[l], e->ctx, req, l, NULL));
    r.wrong_loaded += engine_wrong(e, pages, seq, l, r.info.load_begin_tokens, r.valid_end[l]);
    /* The engine computes everything it did not load. */
    engine_write(e, pages, seq, l, 0, r.info.load_begin_tokens);
    engine_write(e, pages, seq, l, r.valid_end[l], n);
    assert_ok(swiftkv_save_layer(e->ctx, req, l, NULL));
  }
  uint64_t saved = 0;
  assert_ok(swiftkv_wait_save(&saved, e->ctx, req, NULL));
  assert_ok(swiftkv_request_finish(&r.info, e->ctx, req));
  assert_int_equal(r.info.saved_tokens, saved);
  return r;
}

/* Chunk i of seq as the cache keeps it, (L, 2, CHUNK, H, D), compared with swiftkv_retrieve. */
static void assert_chunk_bytes(const struct engine *e, const uint32_t *tokens, size_t n,
                               uint32_t seq, size_t i) {
  static uint16_t got[CHUNK_BYTES / 2];
  uint64_t loaded = 0;
  assert_ok(swiftkv_retrieve(&loaded, e->ctx, e->model, tokens, n, i * CHUNK, got, CHUNK_BYTES));
  assert_int_equal(loaded, CHUNK);
  size_t k = 0;
  for (uint32_t l = 0; l < LAYERS; ++l)
    for (uint32_t c = 0; c < 2; ++c)
      for (uint32_t t = 0; t < CHUNK; ++t)
        for (uint32_t h = 0; h < HEADS; ++h)
          for (uint32_t d = 0; d < DIM; ++d, ++k)
            assert_int_equal(got[k], value(seq, l, i * CHUNK + t, c, h, d));
}

/* Keys chain over the prefix, so a move names chunks [0, count). */
static void move_prefix(const struct engine *e, const uint32_t *tokens, size_t count,
                        swiftkv_tier to) {
  uint64_t there = 0;
  assert_ok(swiftkv_move(&there, e->ctx, e->model, tokens, count * CHUNK, to));
  assert_int_equal(there, count);
}

/* Chunk 1 to disk, the others where they are (host). */
static void chunk_1_to_disk(const struct engine *e, const uint32_t *tokens) {
  move_prefix(e, tokens, 2, SWIFTKV_TIER_DISK);
  move_prefix(e, tokens, 1, SWIFTKV_TIER_HOST);
}

/* Two turns of one conversation for one layout: the first saves 4 chunks, which then live on
 * host (0, 2, 3) and disk (1); the second loads them into other pages and saves 2 more. */
static void round_trip(enum layout layout) {
  struct engine e;
  engine_up(&e, layout, 1 << 20, 1);
  const int stream = layout == CREATED_STREAM;
  const uint32_t first = stream ? e.d.stream_first : 0;
  const uint32_t span = stream ? e.d.stream_pages : PAGES;
  uint32_t tokens[6 * CHUNK + 1];
  fill_tokens(tokens, 6 * CHUNK + 1, 1);
  int32_t pages[13];

  pick_pages(pages, 9, first, span, 1);
  struct turn_result t1 = run_turn(&e, tokens, 4 * CHUNK + 3, pages, 1, 0, NULL);
  assert_int_equal(t1.info.load_end_tokens, 0);
  assert_int_equal(t1.info.save_tokens, 4 * CHUNK);
  assert_int_equal(t1.info.saved_tokens, 4 * CHUNK);
  assert_int_equal(t1.info.stream_ordered, stream); /* saves out of stream pages */
  for (size_t i = 0; i < 4; ++i) assert_chunk_bytes(&e, tokens, 4 * CHUNK, 1, i);
  chunk_1_to_disk(&e, tokens);

  engine_scramble(&e);
  pick_pages(pages, 13, first, span, 2);
  struct turn_result t2 = run_turn(&e, tokens, 6 * CHUNK + 1, pages, 1, 0, NULL);
  assert_int_equal(t2.info.load_begin_tokens, 0);
  assert_int_equal(t2.info.load_end_tokens, 4 * CHUNK);
  for (uint32_t l = 0; l < LAYERS; ++l) assert_int_equal(t2.valid_end[l], 4 * CHUNK);
  assert_int_equal(t2.wrong_loaded, 0);
  assert_int_equal(t2.info.stream_ordered, stream);
  assert_int_equal(t2.info.saved_tokens, 2 * CHUNK);
  assert_int_equal(t2.info.layers_loaded, LAYERS);
  assert_int_equal(t2.info.layers_saved, LAYERS);
  for (size_t i = 0; i < 6; ++i) assert_chunk_bytes(&e, tokens, 6 * CHUNK, 1, i);
  engine_down(&e);
}

static uint64_t requests_open(const struct engine *e);

/* A request whose chunks are named by the caller (an engine's own block keys): no tokens, the
 * first turn saves 4 named chunks, a second request with the same names (and other tokens:
 * they are not read) loads them byte for byte into other pages; the same tokens under other
 * names (another tenant, adapter or image) load nothing and save their own; names that do not
 * match the full chunks of the tokens are EINVAL with nothing begun. */
static void named_requests(void **state) {
  (void)state;
  struct engine e;
  engine_up(&e, NHD, 1 << 20, 0);
  unsigned char names[6 * 16], other[6 * 16];
  for (size_t i = 0; i < sizeof names; ++i) {
    names[i] = (unsigned char)(i * 29u + 3u);
    other[i] = (unsigned char)(i * 29u + 4u);
  }
  int32_t pages[13];
  pick_pages(pages, 9, 0, PAGES, 3);
  swiftkv_request_desc d = SWIFTKV_REQUEST_DESC_INIT;
  d.pool = e.pool;
  d.tokens = NULL;
  d.n_tokens = 4 * CHUNK + 3;
  d.pages = pages;
  d.n_pages = 9;
  d.names = names;
  d.names_bytes = 4 * 16;
  d.name_bytes = 16;
  uint64_t req = 0;
  assert_ok(swiftkv_request_begin(&req, e.ctx, &d));
  assert_ok(swiftkv_start_load(e.ctx, req, NULL));
  for (uint32_t l = 0; l < LAYERS; ++l) {
    uint64_t valid = 0;
    assert_ok(swiftkv_wait_layer_load(&valid, e.ctx, req, l, NULL));
    engine_write(&e, pages, 7, l, 0, 4 * CHUNK + 3);
    assert_ok(swiftkv_save_layer(e.ctx, req, l, NULL));
  }
  uint64_t saved = 0;
  assert_ok(swiftkv_wait_save(&saved, e.ctx, req, NULL));
  assert_int_equal(saved, 4 * CHUNK);
  assert_ok(swiftkv_request_finish(NULL, e.ctx, req));
  uint64_t n = 0;
  static uint16_t got[4 * CHUNK_BYTES / 2];
  assert_ok(swiftkv_retrieve_named(&n, e.ctx, e.model, names, 4 * 16, 16, got, sizeof got));
  assert_int_equal(n, 4);

  /* The same names, tokens given this time (not read): loads all 4 into other pages. */
  engine_scramble(&e);
  uint32_t tokens[6 * CHUNK];
  fill_tokens(tokens, 6 * CHUNK, 99);
  pick_pages(pages, 12, 0, PAGES, 4);
  d.tokens = tokens;
  d.n_tokens = 6 * CHUNK;
  d.n_pages = 12;
  d.names_bytes = 6 * 16;
  d.shape = SWIFTKV_REQUEST_LOAD_ONLY;
  assert_ok(swiftkv_request_begin(&req, e.ctx, &d));
  swiftkv_request_info info = SWIFTKV_REQUEST_INFO_INIT;
  assert_ok(swiftkv_request_info_get(&info, e.ctx, req));
  assert_int_equal(info.load_end_tokens, 4 * CHUNK);
  assert_ok(swiftkv_start_load(e.ctx, req, NULL));
  for (uint32_t l = 0; l < LAYERS; ++l) {
    uint64_t valid = 0;
    assert_ok(swiftkv_wait_layer_load(&valid, e.ctx, req, l, NULL));
    assert_int_equal(valid, 4 * CHUNK);
    assert_int_equal(engine_wrong(&e, pages, 7, l, 0, 4 * CHUNK), 0);
  }
  assert_ok(swiftkv_request_finish(NULL, e.ctx, req));

  /* The same tokens under other names: nothing to load, all 6 chunks to save. */
  d.names = other;
  d.shape = SWIFTKV_REQUEST_LOAD_AND_SAVE;
  assert_ok(swiftkv_request_begin(&req, e.ctx, &d));
  assert_ok(swiftkv_request_info_get(&info, e.ctx, req));
  assert_int_equal(info.load_end_tokens, 0);
  assert_int_equal(info.save_tokens, 6 * CHUNK);
  assert_ok(swiftkv_request_finish(NULL, e.ctx, req));

  /* Names for 5 chunks of 6, names with no name_bytes, and a name size without names. */
  d.names_bytes = 5 * 16;
  assert_int_equal(swiftkv_request_begin(&req, e.ctx, &d), SWIFTKV_EINVAL);
  assert_message_contains("desc names 5 chunks, but the 48 tokens hold 6 full chunks of 8");
  d.names_bytes = 6 * 16;
  d.name_bytes = 0;
  assert_int_equal(swiftkv_request_begin(&req, e.ctx, &d), SWIFTKV_EINVAL);
  d.names = NULL;
  d.name_bytes = 16;
  assert_int_equal(swiftkv_request_begin(&req, e.ctx, &d), SWIFTKV_EINVAL);
  assert_message_contains("desc->names is NULL but");
  d.names = names;
  d.reserved2 = 1;
  assert_int_equal(swiftkv_request_begin(&req, e.ctx, &d), SWIFTKV_EINVAL);
  assert_int_equal(requests_open(&e), 0);
  engine_down(&e);
}

/* The save-only shape stores what the engine computed (no loads, chunks cached at begin not
 * saved again); the load-only shape loads the cached run into other pages and saves nothing;
 * calls of the half a shape lacks are refused with the order in the message, changing
 * nothing; neither shape takes stream pages. */
static void load_only_and_save_only(void **state) {
  (void)state;
  struct engine e;
  engine_up(&e, NHD, 1 << 20, 0);
  uint32_t tokens[5 * CHUNK];
  fill_tokens(tokens, 5 * CHUNK, 4);
  int32_t pages[10];
  pick_pages(pages, 10, 0, PAGES, 4);
  /* Chunk 0 is cached beforehand: a save-only request leaves it as it is. */
  struct turn_result t0 = run_turn(&e, tokens, CHUNK, pages, 4, 0, NULL);
  assert_int_equal(t0.info.saved_tokens, CHUNK);

  for (uint32_t l = 0; l < LAYERS; ++l) engine_write(&e, pages, 4, l, 0, 5 * CHUNK);
  uint64_t req = begin_shaped(&e, tokens, 5 * CHUNK, pages, 0, SWIFTKV_REQUEST_SAVE_ONLY);
  swiftkv_request_info info = SWIFTKV_REQUEST_INFO_INIT;
  assert_ok(swiftkv_request_info_get(&info, e.ctx, req));
  assert_int_equal(info.load_end_tokens, 0);
  assert_int_equal(info.save_tokens, 4 * CHUNK);
  uint64_t v = 0;
  assert_status(swiftkv_start_load(e.ctx, req, NULL), SWIFTKV_ESTATE);
  assert_message_contains("a save-only request loads nothing");
  assert_status(swiftkv_wait_layer_load(&v, e.ctx, req, LAYERS, NULL), SWIFTKV_EINVAL);
  assert_status(swiftkv_wait_layer_load(&v, e.ctx, req, 0, NULL), SWIFTKV_ESTATE);
  assert_status(swiftkv_save_layer(e.ctx, req, 1, NULL), SWIFTKV_ESTATE);
  assert_message_contains("next is save_layer(0)");
  assert_status(swiftkv_wait_save(&v, e.ctx, req, NULL), SWIFTKV_ESTATE);
  for (uint32_t l = 0; l < LAYERS; ++l) assert_ok(swiftkv_save_layer(e.ctx, req, l, NULL));
  assert_ok(swiftkv_wait_save(&v, e.ctx, req, NULL));
  assert_int_equal(v, 4 * CHUNK);
  assert_ok(swiftkv_request_finish(&info, e.ctx, req));
  assert_int_equal(info.layers_loaded, 0);
  for (size_t i = 0; i < 5; ++i) assert_chunk_bytes(&e, tokens, 5 * CHUNK, 4, i);

  /* Load-only into other pages: every byte where the engine reads it, nothing saved. */
  engine_scramble(&e);
  int32_t other[10];
  pick_pages(other, 10, 0, PAGES, 5);
  swiftkv_stats before = SWIFTKV_STATS_INIT, after = SWIFTKV_STATS_INIT;
  assert_ok(swiftkv_stats_get(&before, e.ctx));
  req = begin_shaped(&e, tokens, 5 * CHUNK, other, 0, SWIFTKV_REQUEST_LOAD_ONLY);
  assert_ok(swiftkv_request_info_get(&info, e.ctx, req));
  assert_int_equal(info.load_end_tokens, 5 * CHUNK);
  assert_int_equal(info.save_tokens, 0);
  assert_status(swiftkv_save_layer(e.ctx, req, 0, NULL), SWIFTKV_ESTATE);
  assert_message_contains("a load-only request");
  assert_status(swiftkv_save_layer(e.ctx, req, LAYERS, NULL), SWIFTKV_EINVAL);
  assert_ok(swiftkv_start_load(e.ctx, req, NULL));
  for (uint32_t l = 0; l < LAYERS; ++l) {
    assert_ok(swiftkv_wait_layer_load(&v, e.ctx, req, l, NULL));
    assert_int_equal(v, 5 * CHUNK);
    assert_int_equal(engine_wrong(&e, other, 4, l, 0, 5 * CHUNK), 0);
  }
  assert_status(swiftkv_wait_save(&v, e.ctx, req, NULL), SWIFTKV_ESTATE);
  assert_message_contains("next is request_finish");
  assert_ok(swiftkv_request_finish(&info, e.ctx, req));
  assert_int_equal(info.layers_loaded, LAYERS);
  assert_int_equal(info.saved_tokens, 0);
  assert_ok(swiftkv_stats_get(&after, e.ctx));
  assert_int_equal(after.stores, before.stores);

  /* Bad shapes: nothing begun. */
  swiftkv_request_desc d = SWIFTKV_REQUEST_DESC_INIT;
  d.pool = e.pool;
  d.tokens = tokens;
  d.n_tokens = CHUNK;
  d.pages = pages;
  d.n_pages = 2;
  d.shape = (swiftkv_request_shape)3;
  assert_status(swiftkv_request_begin(&req, e.ctx, &d), SWIFTKV_EINVAL);
  assert_message_contains("desc->shape (3)");
  d.shape = SWIFTKV_REQUEST_LOAD_AND_SAVE;
  d.reserved1 = 1;
  assert_status(swiftkv_request_begin(&req, e.ctx, &d), SWIFTKV_EINVAL);
  assert_int_equal(requests_open(&e), 0);
  engine_down(&e);

  /* Stream pages hold one layer at a time: only the interleaved shape may use them. */
  engine_up(&e, CREATED_STREAM, 1 << 20, 0);
  pick_pages(pages, 2, e.d.stream_first, e.d.stream_pages, 6);
  d = (swiftkv_request_desc)SWIFTKV_REQUEST_DESC_INIT;
  d.pool = e.pool;
  d.tokens = tokens;
  d.n_tokens = CHUNK;
  d.pages = pages;
  d.n_pages = 2;
  d.shape = SWIFTKV_REQUEST_SAVE_ONLY;
  assert_status(swiftkv_request_begin(&req, e.ctx, &d), SWIFTKV_EINVAL);
  assert_message_contains("cannot use stream pages");
  d.shape = SWIFTKV_REQUEST_LOAD_ONLY;
  assert_status(swiftkv_request_begin(&req, e.ctx, &d), SWIFTKV_EINVAL);
  assert_int_equal(requests_open(&e), 0);
  engine_down(&e);
}

/* The elements of tokens [from, to) in `pages` that differ from `chunks` (each chunk's bytes as
 * (L, 2, CHUNK, H, D), chunk after chunk). */
static uint64_t pages_differ(const struct engine *e, const int32_t *pages, const uint16_t *chunks,
                             uint64_t from, uint64_t to) {
  uint64_t wrong = 0;
  for (uint32_t l = 0; l < LAYERS; ++l)
    for (uint64_t t = from; t < to; ++t)
      for (uint32_t c = 0; c < 2; ++c)
        for (uint32_t h = 0; h < HEADS; ++h) {
          const uint16_t *got = element(e, l, pages[t / BLOCK], c, (uint32_t)(t % BLOCK), h);
          const uint16_t *want = chunks + (t / CHUNK) * (CHUNK_BYTES / 2) +
                                 (((l * 2 + c) * CHUNK + t % CHUNK) * HEADS + h) * DIM;
          for (uint32_t d = 0; d < DIM; ++d) wrong += got[d] != want[d];
        }
  return wrong;
}

/* A load-only request over `tokens` in `pages`: its cached run, every layer's valid end checked
 * against it. */
static uint64_t load_run(const struct engine *e, const uint32_t *tokens, size_t n,
                         const int32_t *pages) {
  const uint64_t req = begin_shaped(e, tokens, n, pages, 0, SWIFTKV_REQUEST_LOAD_ONLY);
  swiftkv_request_info info = SWIFTKV_REQUEST_INFO_INIT;
  assert_ok(swiftkv_request_info_get(&info, e->ctx, req));
  assert_ok(swiftkv_start_load(e->ctx, req, NULL));
  for (uint32_t l = 0; l < LAYERS; ++l) {
    uint64_t v = 0;
    assert_ok(swiftkv_wait_layer_load(&v, e->ctx, req, l, NULL));
    assert_int_equal(v, info.load_end_tokens);
  }
  assert_ok(swiftkv_request_finish(&info, e->ctx, req));
  return info.load_end_tokens;
}

/* Compression through the connector: a lossy chunk is loaded only into a model that accepts
 * lossy chunks, and then as the codec decodes it (what swiftkv_retrieve gives); for a model that
 * asks for exact bytes the load ends at it, as at a chunk that is not cached, counted in
 * lossy_refused, and the chunks before it load as they were stored. */
static void lossy_chunks_load_only_where_accepted(void **state) {
  (void)state;
  struct engine e;
  engine_up(&e, NHD, 1 << 20, 0);
  uint32_t tokens[3 * CHUNK];
  fill_tokens(tokens, 3 * CHUNK, 7);
  static uint16_t kv[3 * CHUNK_BYTES / 2], decoded[3 * CHUNK_BYTES / 2];
  for (size_t i = 0; i < 3 * CHUNK_BYTES / 2; ++i) { /* finite f16 values in [0.5, 1) */
    kv[i] = (uint16_t)(0x3800u + ((i * 37u) & 0x3ffu));
  }
  uint64_t cached = 0;
  assert_ok(swiftkv_store(&cached, e.ctx, e.model, tokens, CHUNK, kv, CHUNK_BYTES));
  swiftkv_compression_config lossy = SWIFTKV_COMPRESSION_CONFIG_INIT;
  lossy.host.codec = SWIFTKV_CODEC_FP8;
  lossy.accept_lossy = 1;
  assert_ok(swiftkv_compression_set(e.ctx, e.model, &lossy));
  assert_ok(swiftkv_store(&cached, e.ctx, e.model, tokens, 3 * CHUNK, kv, sizeof kv));
  swiftkv_chunk_info info[3];
  size_t n = 0;
  assert_ok(swiftkv_chunk_info_get(info, 3, &n, e.ctx, e.model, tokens, 3 * CHUNK));
  assert_int_equal(n, 3);
  assert_int_equal(info[0].lossy, 0); /* stored before: exact */
  assert_int_equal(info[1].lossy, 1);
  assert_int_equal(info[2].lossy, 1);
  uint64_t got = 0;
  assert_ok(swiftkv_retrieve(&got, e.ctx, e.model, tokens, 3 * CHUNK, 0, decoded, sizeof decoded));
  assert_int_equal(got, 3 * CHUNK);
  assert_memory_equal(decoded, kv, CHUNK_BYTES);
  assert_memory_not_equal(decoded + CHUNK_BYTES / 2, kv + CHUNK_BYTES / 2, CHUNK_BYTES);

  int32_t pages[3 * CHUNK / BLOCK];
  pick_pages(pages, 3 * CHUNK / BLOCK, 0, PAGES, 8);
  swiftkv_compression_config exact = SWIFTKV_COMPRESSION_CONFIG_INIT;
  assert_ok(swiftkv_compression_set(e.ctx, e.model, &exact));
  swiftkv_codec_stats cs = SWIFTKV_CODEC_STATS_INIT;
  assert_ok(swiftkv_codec_stats_get(&cs, e.ctx));
  const uint64_t refused = cs.lossy_refused;
  engine_scramble(&e);
  assert_int_equal(load_run(&e, tokens, 3 * CHUNK, pages), CHUNK);
  assert_int_equal(pages_differ(&e, pages, kv, 0, CHUNK), 0);
  for (uint32_t l = 0; l < LAYERS; ++l) { /* nothing of the lossy chunks reached the pages */
    for (uint64_t t = CHUNK; t < 3 * CHUNK; ++t) {
      assert_int_equal(*element(&e, l, pages[t / BLOCK], 1, (uint32_t)(t % BLOCK), 1), 0xEEEE);
    }
  }
  assert_ok(swiftkv_codec_stats_get(&cs, e.ctx));
  assert_int_equal(cs.lossy_refused, refused + 1);

  assert_ok(swiftkv_compression_set(e.ctx, e.model, &lossy));
  engine_scramble(&e);
  assert_int_equal(load_run(&e, tokens, 3 * CHUNK, pages), 3 * CHUNK);
  assert_int_equal(pages_differ(&e, pages, decoded, 0, 3 * CHUNK), 0);
  assert_ok(swiftkv_codec_stats_get(&cs, e.ctx));
  assert_int_equal(cs.lossy_refused, refused + 1);
  engine_down(&e);
}

static void round_trip_vllm(void **state) {
  (void)state;
  round_trip(VLLM);
}
static void round_trip_nhd(void **state) {
  (void)state;
  round_trip(NHD);
}
static void round_trip_hnd(void **state) {
  (void)state;
  round_trip(HND);
}
static void round_trip_cross_layer(void **state) {
  (void)state;
  round_trip(CROSS);
}
static void round_trip_stream_pages(void **state) {
  (void)state;
  round_trip(CREATED_STREAM);
}

/* SWIFTKV_HOST_STORES: the two turns move the same bytes with every page and chunk written by
 * non-temporal stores and with every one by memcpy (this test's layers are small, so under the
 * default they are memcpy); another value fails request_begin with EINVAL, naming it, and
 * leaves no request open. */
static void host_stores_move_the_same_bytes(void **state) {
  (void)state;
  const char *ways[] = {"nontemporal", "cached"};
  for (size_t w = 0; w < 2; ++w) {
    assert_int_equal(setenv("SWIFTKV_HOST_STORES", ways[w], 1), 0);
    round_trip(NHD);
    round_trip(HND);
  }
  assert_int_equal(setenv("SWIFTKV_HOST_STORES", "fast", 1), 0);
  struct engine e;
  engine_up(&e, NHD, 1 << 20, 0);
  uint32_t tokens[2 * CHUNK];
  fill_tokens(tokens, 2 * CHUNK, 1);
  int32_t pages[2 * CHUNK / BLOCK];
  pick_pages(pages, 2 * CHUNK / BLOCK, 0, PAGES, 1);
  swiftkv_request_desc d = SWIFTKV_REQUEST_DESC_INIT;
  d.pool = e.pool;
  d.tokens = tokens;
  d.n_tokens = 2 * CHUNK;
  d.pages = pages;
  d.n_pages = 2 * CHUNK / BLOCK;
  uint64_t req = 0;
  assert_int_equal(swiftkv_request_begin(&req, e.ctx, &d), SWIFTKV_EINVAL);
  assert_non_null(strstr(swiftkv_last_error_message(), "SWIFTKV_HOST_STORES is 'fast'"));
  assert_int_equal(requests_open(&e), 0);
  assert_int_equal(unsetenv("SWIFTKV_HOST_STORES"), 0);
  engine_down(&e);
}

/* A library-made pool: stream pages share one memory across layers, regular pages do not. */
static void created_pool_aliases_stream_pages(void **state) {
  (void)state;
  struct engine e;
  engine_up(&e, CREATED_STREAM, 0, 0);
  assert_int_equal(e.d.stream_pages, 16);
  assert_true(e.d.stream_first >= 5);
  assert_int_equal(e.d.num_pages, e.d.stream_first + 16);
  uint16_t *s0 = element(&e, 0, (int32_t)e.d.stream_first + 3, 1, 2, 1);
  uint16_t *s2 = element(&e, 2, (int32_t)e.d.stream_first + 3, 1, 2, 1);
  uint16_t *r0 = element(&e, 0, 4, 1, 2, 1);
  uint16_t *r2 = element(&e, 2, 4, 1, 2, 1);
  assert_ptr_not_equal(s0, s2);
  *s0 = 0x1234;
  assert_int_equal(*s2, 0x1234);
  *r0 = 0x1111;
  *r2 = 0x2222;
  assert_int_equal(*r0, 0x1111);
  engine_down(&e);
}

/* The disk copy of chunk 1 has a flipped byte: it is never loaded, the valid prefix ends at it,
 * and the failure is counted. */
/* Flips a bit in the payload of chunk 1 on disk, after chunk_1_to_disk. */
static void corrupt_disk_chunk_1(const struct engine *e) {
  DIR *dir = opendir(e->dir);
  struct dirent *de;
  char path[512] = "";
  while ((de = readdir(dir)) != NULL) {
    if (strstr(de->d_name, ".kvlog") != NULL) {
      snprintf(path, sizeof path, "%s/%s", e->dir, de->d_name);
    }
  }
  closedir(dir);
  assert_true(path[0] != '\0');
  /* The segment: a 128-byte header, chunk 0's record (moved back to host since: dead), then
   * chunk 1's, each a 128-byte header and the payload, rounded up to 64 bytes
   * (docs/disk-format.md). */
  const long record = (128 + (long)CHUNK_BYTES + 63) / 64 * 64;
  const long at = 128 + record + 128 + 100;
  FILE *f = fopen(path, "r+b");
  fseek(f, at, SEEK_SET);
  const int byte = fgetc(f);
  fseek(f, at, SEEK_SET);
  fputc(byte ^ 0x40, f);
  fclose(f);
}

static void corrupt_disk_chunk_ends_the_valid_prefix(void **state) {
  (void)state;
  struct engine e;
  engine_up(&e, NHD, 1 << 20, 1);
  uint32_t tokens[3 * CHUNK];
  fill_tokens(tokens, 3 * CHUNK, 2);
  int32_t pages[6];
  pick_pages(pages, 6, 0, PAGES, 3);
  run_turn(&e, tokens, 3 * CHUNK, pages, 2, 0, NULL);
  chunk_1_to_disk(&e, tokens);
  corrupt_disk_chunk_1(&e);

  engine_scramble(&e);
  pick_pages(pages, 6, 0, PAGES, 4);
  swiftkv_stats before = SWIFTKV_STATS_INIT;
  assert_ok(swiftkv_stats_get(&before, e.ctx));
  struct turn_result t = run_turn(&e, tokens, 3 * CHUNK, pages, 2, 0, NULL);
  assert_int_equal(t.info.load_end_tokens, 3 * CHUNK);
  for (uint32_t l = 0; l < LAYERS; ++l) assert_int_equal(t.valid_end[l], CHUNK);
  assert_int_equal(t.info.valid_end_tokens, CHUNK);
  assert_int_equal(t.wrong_loaded, 0);
  swiftkv_stats after = SWIFTKV_STATS_INIT;
  assert_ok(swiftkv_stats_get(&after, e.ctx));
  assert_int_equal(after.load_failures, before.load_failures + 1);
  /* The corrupt chunk is gone; the engine recomputed it, and a later turn finds 0 and 2 only. */
  swiftkv_lookup_result lr = SWIFTKV_LOOKUP_RESULT_INIT;
  uint8_t res[3];
  assert_ok(swiftkv_lookup(&lr, res, 3, e.ctx, e.model, tokens, 3 * CHUNK));
  assert_int_equal(res[1], SWIFTKV_TIER_DROPPED);
  assert_int_equal(lr.prefix_tokens, CHUNK);
  engine_down(&e);
}

/* An engine with the first blocks of a prompt in its own prefix cache loads from the end of them,
 * inside a chunk: that chunk's later tokens are loaded, the engine's blocks before them are not
 * touched (other requests may be reading them), and a failure of that chunk leaves nothing valid
 * past load_from. */
static void load_from_inside_a_chunk(enum layout layout) {
  struct engine e;
  engine_up(&e, layout, 1 << 20, 1);
  uint32_t tokens[6 * CHUNK];
  fill_tokens(tokens, 6 * CHUNK, 5);
  int32_t pages[12];
  pick_pages(pages, 12, 0, PAGES, 5);
  run_turn(&e, tokens, 4 * CHUNK, pages, 5, 0, NULL);
  chunk_1_to_disk(&e, tokens);

  for (int corrupt = 0; corrupt < 2; ++corrupt) {
    if (corrupt) corrupt_disk_chunk_1(&e);
    engine_scramble(&e); /* 0xEEEE everywhere: the engine's own blocks, as far as we know */
    pick_pages(pages, 12, 0, PAGES, 6 + (uint32_t)corrupt);
    const uint64_t from = CHUNK + BLOCK; /* the engine holds tokens [0, 12) */
    const uint64_t req =
        begin_shaped(&e, tokens, 6 * CHUNK, pages, from, SWIFTKV_REQUEST_LOAD_AND_SAVE);
    assert_ok(swiftkv_start_load(e.ctx, req, NULL));
    swiftkv_request_info info = SWIFTKV_REQUEST_INFO_INIT;
    assert_ok(swiftkv_request_info_get(&info, e.ctx, req));
    assert_int_equal(info.load_begin_tokens, from);
    /* The first pass saves chunks 4 and 5, so the second finds all six. */
    assert_int_equal(info.load_end_tokens, corrupt ? 6 * CHUNK : 4 * CHUNK);
    assert_int_equal(info.save_tokens, corrupt ? 0 : 2 * CHUNK);
    for (uint32_t l = 0; l < LAYERS; ++l) {
      uint64_t valid_end = 0;
      assert_ok(swiftkv_wait_layer_load(&valid_end, e.ctx, req, l, NULL));
      assert_int_equal(valid_end, corrupt ? from : 4 * CHUNK);
      assert_int_equal(engine_wrong(&e, pages, 5, l, from, valid_end), 0);
      for (uint64_t t = 0; t < from; ++t) {
        for (uint32_t c = 0; c < 2; ++c) {
          for (uint32_t h = 0; h < HEADS; ++h) {
            const uint16_t *x = element(&e, l, pages[t / BLOCK], c, (uint32_t)(t % BLOCK), h);
            for (uint32_t d = 0; d < DIM; ++d) assert_int_equal(x[d], 0xEEEE);
          }
        }
      }
      engine_write(&e, pages, 5, l, 0, from);
      engine_write(&e, pages, 5, l, valid_end, 6 * CHUNK);
      assert_ok(swiftkv_save_layer(e.ctx, req, l, NULL));
    }
    uint64_t saved = 0;
    assert_ok(swiftkv_wait_save(&saved, e.ctx, req, NULL));
    assert_int_equal(saved, corrupt ? 0 : 2 * CHUNK);
    assert_ok(swiftkv_request_finish(&info, e.ctx, req));
    assert_int_equal(info.valid_end_tokens, corrupt ? from : 4 * CHUNK);
  }
  for (size_t i = 4; i < 6; ++i) assert_chunk_bytes(&e, tokens, 6 * CHUNK, 5, i);
  engine_down(&e);
}

static void load_from_inside_a_chunk_nhd(void **state) {
  (void)state;
  load_from_inside_a_chunk(NHD);
}

static void load_from_inside_a_chunk_vllm(void **state) {
  (void)state;
  load_from_inside_a_chunk(VLLM);
}

static swiftkv_elastic *g_lender;
static void destroy_lender(const struct engine *e, uint64_t req) {
  (void)e;
  (void)req;
  swiftkv_elastic_destroy(g_lender); /* ends its leases: the lent bytes are no longer ours */
  g_lender = NULL;
}

/* Chunks in lent memory whose lender goes away after request_begin: nothing is loaded as good
 * data; the valid prefix is empty. */
static void lost_lent_memory_loads_nothing(void **state) {
  (void)state;
  struct engine e;
  engine_up(&e, NHD, 1 << 20, 0);
  swiftkv_model_desc md = model_desc();
  swiftkv_elastic_config ec = SWIFTKV_ELASTIC_CONFIG_INIT;
  ec.lender = &md;
  ec.borrower = &md;
  ec.capacity_blocks = 16;
  assert_ok(swiftkv_elastic_create(&g_lender, e.ctx, &ec));
  uint64_t lease = 0;
  assert_ok(swiftkv_borrow(&lease, e.ctx, e.model, g_lender, 100));
  uint32_t tokens[2 * CHUNK];
  fill_tokens(tokens, 2 * CHUNK, 3);
  int32_t pages[4];
  pick_pages(pages, 4, 0, PAGES, 5);
  run_turn(&e, tokens, 2 * CHUNK, pages, 3, 0, NULL);
  swiftkv_lookup_result lr = SWIFTKV_LOOKUP_RESULT_INIT;
  assert_ok(swiftkv_lookup(&lr, NULL, 0, e.ctx, e.model, tokens, 2 * CHUNK));
  assert_int_equal(lr.chunks_per_tier[SWIFTKV_TIER_PEER], 2);

  engine_scramble(&e);
  struct turn_result t = run_turn(&e, tokens, 2 * CHUNK, pages, 3, 0, destroy_lender);
  assert_int_equal(t.info.load_end_tokens, 2 * CHUNK);
  assert_int_equal(t.valid_end[0], 0);
  assert_int_equal(t.wrong_loaded, 0);
  engine_down(&e);
}

static void clear_everything(const struct engine *e, uint64_t req) {
  (void)req;
  uint64_t n = 0;
  assert_ok(swiftkv_clear(&n, e->ctx, e->model, SWIFTKV_TIERS_ALL, NULL, 0));
  assert_int_equal(n, 2);
}

/* A clear while the request holds its chunks: the loads still get the right bytes. */
static void clear_during_a_request_loses_nothing(void **state) {
  (void)state;
  struct engine e;
  engine_up(&e, HND, 1 << 20, 0);
  uint32_t tokens[3 * CHUNK];
  fill_tokens(tokens, 3 * CHUNK, 4);
  int32_t pages[6];
  pick_pages(pages, 4, 0, PAGES, 6);
  run_turn(&e, tokens, 2 * CHUNK, pages, 4, 0, NULL);
  engine_scramble(&e);
  pick_pages(pages, 6, 0, PAGES, 7);
  struct turn_result t = run_turn(&e, tokens, 3 * CHUNK, pages, 4, 0, clear_everything);
  assert_int_equal(t.info.valid_end_tokens, 2 * CHUNK);
  assert_int_equal(t.wrong_loaded, 0);
  assert_int_equal(t.info.saved_tokens, CHUNK);
  swiftkv_lookup_result lr = SWIFTKV_LOOKUP_RESULT_INIT;
  assert_ok(swiftkv_lookup(&lr, NULL, 0, e.ctx, e.model, tokens, 3 * CHUNK));
  assert_int_equal(lr.dropped_head_tokens, 2 * CHUNK); /* chunk 2 was saved after the clear */
  assert_int_equal(lr.loadable_tokens, CHUNK);
  engine_down(&e);
}

static void assert_info_equal(const swiftkv_request_info *a, const swiftkv_request_info *b) {
  assert_memory_equal(a, b, sizeof *a);
}

static void bad_input_changes_nothing(void **state) {
  (void)state;
  struct engine e;
  engine_up(&e, NHD, 1 << 20, 0);
  uint32_t tokens[2 * CHUNK];
  fill_tokens(tokens, 2 * CHUNK, 5);
  int32_t pages[4] = {0, 1, 2, 3};
  swiftkv_request_desc d = SWIFTKV_REQUEST_DESC_INIT;
  d.pool = e.pool;
  d.tokens = tokens;
  d.n_tokens = 2 * CHUNK;
  d.pages = pages;
  d.n_pages = 4;
  uint64_t req = 77;

  pages[2] = PAGES;
  assert_status(swiftkv_request_begin(&req, e.ctx, &d), SWIFTKV_EINVAL);
  assert_message_contains("desc->pages[2] (40) is not a page of pool");
  pages[2] = -1;
  assert_status(swiftkv_request_begin(&req, e.ctx, &d), SWIFTKV_EINVAL);
  pages[2] = 1;
  assert_status(swiftkv_request_begin(&req, e.ctx, &d), SWIFTKV_EINVAL);
  assert_message_contains("names page 1 twice");
  pages[2] = 2;
  d.n_pages = 3;
  assert_status(swiftkv_request_begin(&req, e.ctx, &d), SWIFTKV_EINVAL);
  d.n_pages = 4;
  d.load_from_tokens = 3;
  assert_status(swiftkv_request_begin(&req, e.ctx, &d), SWIFTKV_EINVAL);
  assert_message_contains("not a block boundary");
  d.load_from_tokens = 0;
  d.pool = e.pool + 1;
  assert_status(swiftkv_request_begin(&req, e.ctx, &d), SWIFTKV_ENOTFOUND);
  d.pool = e.pool;
  assert_int_equal(req, 77); /* untouched */
  swiftkv_stats st = SWIFTKV_STATS_INIT;
  assert_ok(swiftkv_stats_get(&st, e.ctx));
  assert_int_equal(st.stores_rejected, 0);

  assert_ok(swiftkv_request_begin(&req, e.ctx, &d));
  swiftkv_request_info before = SWIFTKV_REQUEST_INFO_INIT, now = SWIFTKV_REQUEST_INFO_INIT;
  assert_ok(swiftkv_request_info_get(&before, e.ctx, req));
  uint64_t v = 0;
  /* Arguments before state: a layer past the model's is EINVAL whatever the state. */
  assert_status(swiftkv_wait_layer_load(&v, e.ctx, req, LAYERS, NULL), SWIFTKV_EINVAL);
  assert_message_contains("is not below the model's");
  assert_status(swiftkv_wait_layer_load(&v, e.ctx, req, 0, NULL), SWIFTKV_ESTATE);
  assert_message_contains("before start_load");
  int fake_stream = 0;
  assert_status(swiftkv_start_load(e.ctx, req, &fake_stream), SWIFTKV_EINVAL);
  assert_ok(swiftkv_start_load(e.ctx, req, NULL));
  assert_status(swiftkv_start_load(e.ctx, req, NULL), SWIFTKV_ESTATE);
  assert_status(swiftkv_save_layer(e.ctx, req, 0, NULL), SWIFTKV_ESTATE);
  assert_status(swiftkv_wait_layer_load(&v, e.ctx, req, 1, NULL), SWIFTKV_ESTATE);
  assert_message_contains("out of order");
  assert_status(swiftkv_wait_layer_load(&v, e.ctx, req, LAYERS, NULL), SWIFTKV_EINVAL);
  assert_status(swiftkv_wait_save(&v, e.ctx, req, NULL), SWIFTKV_ESTATE);
  assert_ok(swiftkv_request_info_get(&now, e.ctx, req));
  before.layers_loaded = now.layers_loaded; /* start_load itself changes nothing visible */
  assert_info_equal(&before, &now);
  /* A pool in use cannot go, nor can its model. */
  assert_status(swiftkv_pool_destroy(e.ctx, e.pool), SWIFTKV_EBUSY);
  assert_status(swiftkv_model_unregister(e.ctx, e.model), SWIFTKV_EBUSY);
  /* Finishing early aborts: the reserved room is given back, nothing becomes visible. */
  assert_ok(swiftkv_request_finish(NULL, e.ctx, req));
  assert_status(swiftkv_start_load(e.ctx, req, NULL), SWIFTKV_ENOTFOUND);
  assert_status(swiftkv_request_finish(NULL, e.ctx, req), SWIFTKV_ENOTFOUND);
  assert_status(swiftkv_request_info_get(&now, e.ctx, req), SWIFTKV_ENOTFOUND);
  swiftkv_lookup_result lr = SWIFTKV_LOOKUP_RESULT_INIT;
  assert_ok(swiftkv_lookup(&lr, NULL, 0, e.ctx, e.model, tokens, 2 * CHUNK));
  assert_int_equal(lr.loadable_tokens, 0);
  assert_ok(swiftkv_stats_get(&st, e.ctx));
  assert_int_equal(st.chunks[SWIFTKV_TIER_HOST], 0);
  engine_down(&e);
}

/* One step of a batch: requests[i] over tokens[i][0, n[i]) in pages[i] of engines[i] (their
 * pools may differ), each layer waited for and saved for all of them in one call, the loaded
 * tokens checked as the batch's wait returns and the rest computed. Returns the wrong elements. */
#define BATCH_MAX 4
static uint64_t run_batch(const struct engine *const *engines, uint32_t count,
                          uint32_t tokens[][6 * CHUNK], const size_t *n, int32_t pages[][12],
                          const uint32_t *seqs, swiftkv_request_info *infos) {
  uint64_t reqs[BATCH_MAX];
  for (uint32_t i = 0; i < count; ++i) {
    reqs[i] = begin_shaped(engines[i], tokens[i], n[i], pages[i], 0, SWIFTKV_REQUEST_LOAD_AND_SAVE);
    assert_ok(swiftkv_start_load(engines[i]->ctx, reqs[i], NULL));
    infos[i] = (swiftkv_request_info)SWIFTKV_REQUEST_INFO_INIT;
    assert_ok(swiftkv_request_info_get(&infos[i], engines[i]->ctx, reqs[i]));
  }
  swiftkv_ctx *ctx = engines[0]->ctx;
  uint64_t wrong = 0;
  for (uint32_t l = 0; l < LAYERS; ++l) {
    uint64_t valid[BATCH_MAX];
    assert_ok(swiftkv_wait_layer_load_batch(valid, ctx, reqs, count, l, NULL));
    for (uint32_t i = 0; i < count; ++i) {
      assert_int_equal(valid[i], infos[i].load_end_tokens); /* nothing failed */
      wrong += engine_wrong(engines[i], pages[i], seqs[i], l, 0, valid[i]);
      engine_write(engines[i], pages[i], seqs[i], l, valid[i], n[i]);
    }
    assert_ok(swiftkv_save_layer_batch(ctx, reqs, count, l, NULL));
  }
  for (uint32_t i = 0; i < count; ++i) {
    uint64_t saved = 0;
    assert_ok(swiftkv_wait_save(&saved, ctx, reqs[i], NULL));
    assert_ok(swiftkv_request_finish(&infos[i], ctx, reqs[i]));
    assert_int_equal(infos[i].saved_tokens, saved);
    assert_int_equal(infos[i].layers_loaded, LAYERS);
    assert_int_equal(infos[i].layers_saved, LAYERS);
  }
  return wrong;
}

/* The batch hooks do what the per-request calls do, for requests of two pools at once (one of
 * them a library-made pool whose stream pages order each layer's load after the last save):
 * a first step saves every conversation's chunks, a second one loads them into other pages,
 * every byte checked, and saves the new ones. */
static void a_batch_does_what_its_requests_do(void **state) {
  (void)state;
  struct engine e, s;
  engine_up(&e, NHD, 1 << 20, 0);
  s = e;
  assert_ok(swiftkv_pool_create(&s.pool, e.ctx, e.model, 5, 16));
  s.d = (swiftkv_pool_desc)SWIFTKV_POOL_DESC_INIT;
  uint32_t owner = 99;
  assert_ok(swiftkv_pool_get(&s.d, &owner, e.ctx, s.pool));
  const struct engine *engines[BATCH_MAX] = {&e, &e, &e, &s};
  const uint32_t seqs[BATCH_MAX] = {21, 22, 23, 24};
  uint32_t tokens[BATCH_MAX][6 * CHUNK];
  int32_t pages[BATCH_MAX][12];
  swiftkv_request_info infos[BATCH_MAX];
  for (uint32_t i = 0; i < BATCH_MAX; ++i) fill_tokens(tokens[i], 6 * CHUNK, seqs[i]);

  /* Step 1: 2, 3, 1 and 2 chunks (and a few more tokens) each, nothing cached. */
  size_t n[BATCH_MAX] = {2 * CHUNK + 3, 3 * CHUNK, CHUNK + 1, 2 * CHUNK + 2};
  for (uint32_t i = 0; i < 3; ++i) pick_pages(pages[i], 12, 12 * i, 12, 30 + i);
  pick_pages(pages[3], 12, s.d.stream_first, s.d.stream_pages, 33);
  assert_int_equal(run_batch(engines, BATCH_MAX, tokens, n, pages, seqs, infos), 0);
  const uint64_t saved1[BATCH_MAX] = {2 * CHUNK, 3 * CHUNK, CHUNK, 2 * CHUNK};
  for (uint32_t i = 0; i < BATCH_MAX; ++i) {
    assert_int_equal(infos[i].load_end_tokens, 0);
    assert_int_equal(infos[i].saved_tokens, saved1[i]);
    assert_int_equal(infos[i].stream_ordered, i == 3);
    for (size_t c = 0; c < saved1[i] / CHUNK; ++c) {
      assert_chunk_bytes(&e, tokens[i], saved1[i], seqs[i], c);
    }
  }

  /* Step 2: each conversation goes on; its cached chunks load into other pages. */
  engine_scramble(&e);
  const size_t n2[BATCH_MAX] = {4 * CHUNK, 4 * CHUNK + 5, 2 * CHUNK, 3 * CHUNK + 1};
  for (uint32_t i = 0; i < 3; ++i) pick_pages(pages[i], 12, 12 * ((i + 1) % 3), 12, 40 + i);
  pick_pages(pages[3], 12, s.d.stream_first, s.d.stream_pages, 43);
  assert_int_equal(run_batch(engines, BATCH_MAX, tokens, n2, pages, seqs, infos), 0);
  for (uint32_t i = 0; i < BATCH_MAX; ++i) {
    assert_int_equal(infos[i].load_end_tokens, saved1[i]);
    assert_int_equal(infos[i].valid_end_tokens, saved1[i]);
    assert_int_equal(infos[i].saved_tokens, n2[i] / CHUNK * CHUNK - saved1[i]);
    for (size_t c = 0; c < n2[i] / CHUNK; ++c) {
      assert_chunk_bytes(&e, tokens[i], n2[i] / CHUNK * CHUNK, seqs[i], c);
    }
  }
  assert_ok(swiftkv_pool_destroy(e.ctx, s.pool));
  engine_down(&e);
}

/* A batch with one bad request changes none of them: each request's state, the output array and
 * the cache stay as they were, whichever request is bad and however. */
static void a_bad_batch_changes_nothing(void **state) {
  (void)state;
  struct engine e;
  engine_up(&e, NHD, 1 << 20, 0);
  uint32_t tokens[3][2 * CHUNK];
  int32_t pages[3][4];
  uint64_t reqs[3];
  for (uint32_t i = 0; i < 3; ++i) {
    fill_tokens(tokens[i], 2 * CHUNK, 50 + i);
    pick_pages(pages[i], 4, 4 * i, 4, i);
    reqs[i] = begin_shaped(&e, tokens[i], 2 * CHUNK, pages[i], 0, SWIFTKV_REQUEST_LOAD_AND_SAVE);
  }
  swiftkv_request_info before[3];
  for (uint32_t i = 0; i < 3; ++i) {
    before[i] = (swiftkv_request_info)SWIFTKV_REQUEST_INFO_INIT;
    assert_ok(swiftkv_request_info_get(&before[i], e.ctx, reqs[i]));
  }
  uint64_t valid[3] = {7, 7, 7};
  /* Not started: ESTATE for the last one only, nothing done for the first two. */
  assert_ok(swiftkv_start_load(e.ctx, reqs[0], NULL));
  assert_ok(swiftkv_start_load(e.ctx, reqs[1], NULL));
  assert_status(swiftkv_wait_layer_load_batch(valid, e.ctx, reqs, 3, 0, NULL), SWIFTKV_ESTATE);
  assert_message_contains("before start_load");
  assert_ok(swiftkv_start_load(e.ctx, reqs[2], NULL));
  /* One request ahead of the others: wait_layer_load(0) again is out of order for it. */
  uint64_t v = 0;
  assert_ok(swiftkv_wait_layer_load(&v, e.ctx, reqs[1], 0, NULL));
  assert_status(swiftkv_wait_layer_load_batch(valid, e.ctx, reqs, 3, 0, NULL), SWIFTKV_ESTATE);
  assert_message_contains("out of order");
  const uint64_t twice[3] = {reqs[0], reqs[2], reqs[0]};
  assert_status(swiftkv_wait_layer_load_batch(valid, e.ctx, twice, 3, 0, NULL), SWIFTKV_EINVAL);
  assert_message_contains("named twice");
  const uint64_t unknown[2] = {reqs[0], 999};
  assert_status(swiftkv_wait_layer_load_batch(valid, e.ctx, unknown, 2, 0, NULL),
                SWIFTKV_ENOTFOUND);
  const uint64_t two[2] = {reqs[0], reqs[2]};
  assert_status(swiftkv_wait_layer_load_batch(valid, e.ctx, two, 2, LAYERS, NULL), SWIFTKV_EINVAL);
  assert_message_contains("is not below the model's");
  int fake_stream = 0;
  assert_status(swiftkv_wait_layer_load_batch(valid, e.ctx, two, 2, 0, &fake_stream),
                SWIFTKV_EINVAL);
  assert_message_contains("host pools take no stream");
  assert_status(swiftkv_wait_layer_load_batch(NULL, e.ctx, two, 2, 0, NULL), SWIFTKV_EINVAL);
  assert_status(swiftkv_wait_layer_load_batch(valid, e.ctx, NULL, 2, 0, NULL), SWIFTKV_EINVAL);
  /* Request 1 has waited for layer 0 and may save it; the others may not yet. */
  assert_status(swiftkv_save_layer_batch(e.ctx, reqs, 3, 0, NULL), SWIFTKV_ESTATE);
  assert_status(swiftkv_save_layer_batch(e.ctx, twice, 3, 0, NULL), SWIFTKV_EINVAL);
  assert_status(swiftkv_save_layer_batch(e.ctx, NULL, 1, 0, NULL), SWIFTKV_EINVAL);
  assert_int_equal(valid[0], 7);
  assert_int_equal(valid[1], 7);
  assert_int_equal(valid[2], 7);
  before[1].layers_loaded = 1;
  for (uint32_t i = 0; i < 3; ++i) {
    swiftkv_request_info now = SWIFTKV_REQUEST_INFO_INIT;
    assert_ok(swiftkv_request_info_get(&now, e.ctx, reqs[i]));
    assert_info_equal(&before[i], &now);
  }
  /* An empty batch does nothing, and its arrays may be NULL. */
  assert_ok(swiftkv_wait_layer_load_batch(NULL, e.ctx, NULL, 0, 0, NULL));
  assert_ok(swiftkv_save_layer_batch(e.ctx, NULL, 0, 0, NULL));

  /* The batch calls and the per-request ones mix: the requests go on and save everything. */
  assert_ok(swiftkv_wait_layer_load_batch(valid, e.ctx, two, 2, 0, NULL));
  for (uint32_t l = 0; l < LAYERS; ++l) {
    if (l > 0) assert_ok(swiftkv_wait_layer_load_batch(valid, e.ctx, reqs, 3, l, NULL));
    for (uint32_t i = 0; i < 3; ++i) engine_write(&e, pages[i], 50 + i, l, 0, 2 * CHUNK);
    if (l == 1) {
      assert_ok(swiftkv_save_layer(e.ctx, reqs[2], l, NULL));
      assert_ok(swiftkv_save_layer_batch(e.ctx, reqs, 2, l, NULL));
    } else {
      assert_ok(swiftkv_save_layer_batch(e.ctx, reqs, 3, l, NULL));
    }
  }
  for (uint32_t i = 0; i < 3; ++i) {
    uint64_t saved = 0;
    assert_ok(swiftkv_wait_save(&saved, e.ctx, reqs[i], NULL));
    assert_int_equal(saved, 2 * CHUNK);
    assert_ok(swiftkv_request_finish(NULL, e.ctx, reqs[i]));
    for (size_t c = 0; c < 2; ++c) assert_chunk_bytes(&e, tokens[i], 2 * CHUNK, 50 + i, c);
  }
  engine_down(&e);
}

static uint64_t requests_open(const struct engine *e) {
  swiftkv_stats s = SWIFTKV_STATS_INIT;
  assert_ok(swiftkv_stats_get(&s, e->ctx));
  return s.requests_open;
}

/* Requests begun and never finished hold the room reserved for their chunks: at most
 * max_open_requests of them, and a begin beyond is EBUSY with nothing reserved, so later stores
 * still find room. Finishing one makes room for the next. The host tier holds 6 chunks (8192
 * bytes in slabs of whole pages: 3 chunks of 1152 bytes per page); each request asks for 2, and
 * reservations take at most half the tier's 8192 bytes: 3 chunks, so the second request gets 1. */
static void open_requests_are_bounded(void **state) {
  (void)state;
  struct engine e;
  engine_up_bounded(&e, VLLM, 8192, 0, 2);
  uint32_t tokens[3][2 * CHUNK];
  int32_t pages[3][4];
  uint64_t req[3] = {0, 0, 0};
  for (uint32_t i = 0; i < 3; ++i) {
    fill_tokens(tokens[i], 2 * CHUNK, 10 + i);
    for (uint32_t p = 0; p < 4; ++p) pages[i][p] = (int32_t)(4 * i + p);
  }
  swiftkv_request_desc d = SWIFTKV_REQUEST_DESC_INIT;
  d.pool = e.pool;
  d.n_tokens = 2 * CHUNK;
  d.n_pages = 4;
  for (uint32_t i = 0; i < 2; ++i) {
    d.tokens = tokens[i];
    d.pages = pages[i];
    assert_ok(swiftkv_request_begin(&req[i], e.ctx, &d));
  }
  assert_int_equal(requests_open(&e), 2);
  /* The third is refused and reserves nothing: 2 chunks of room stay free. */
  d.tokens = tokens[2];
  d.pages = pages[2];
  uint64_t refused = 777;
  assert_status(swiftkv_request_begin(&refused, e.ctx, &d), SWIFTKV_EBUSY);
  assert_message_contains("2 requests are open (config->max_open_requests)");
  assert_int_equal(refused, 777);
  assert_int_equal(requests_open(&e), 2);
  uint32_t kv_tokens[2 * CHUNK];
  fill_tokens(kv_tokens, 2 * CHUNK, 99);
  static unsigned char kv[2 * CHUNK_BYTES];
  memset(kv, 0x5a, sizeof kv);
  uint64_t cached = 0;
  assert_ok(swiftkv_store(&cached, e.ctx, e.model, kv_tokens, 2 * CHUNK, kv, sizeof kv));
  assert_int_equal(cached, 2 * CHUNK);
  swiftkv_stats s = SWIFTKV_STATS_INIT;
  assert_ok(swiftkv_stats_get(&s, e.ctx));
  assert_int_equal(s.chunks[SWIFTKV_TIER_HOST], 2);
  assert_int_equal(s.stores_rejected, 1); /* the second request's second chunk */
  swiftkv_request_info ri = SWIFTKV_REQUEST_INFO_INIT;
  assert_ok(swiftkv_request_info_get(&ri, e.ctx, req[0]));
  assert_int_equal(ri.save_tokens, 2 * CHUNK);
  assert_ok(swiftkv_request_info_get(&ri, e.ctx, req[1]));
  assert_int_equal(ri.save_tokens, CHUNK);
  /* A finished request makes room for the next. */
  assert_ok(swiftkv_request_finish(NULL, e.ctx, req[1]));
  assert_int_equal(requests_open(&e), 1);
  assert_ok(swiftkv_request_begin(&req[2], e.ctx, &d));
  assert_int_equal(requests_open(&e), 2);
  assert_ok(swiftkv_request_finish(NULL, e.ctx, req[0]));
  assert_ok(swiftkv_request_finish(NULL, e.ctx, req[2]));
  assert_int_equal(requests_open(&e), 0);
  engine_down(&e);
}

/* Requests begun and never finished keep at most half of a tier for their reservations: the
 * cache keeps its chunks (issue 44: 200 abandoned requests under the default bound of 4096 used
 * to leave 0 of 400 cached chunks). The host holds 402 chunks (134 pages of 3); 400 are cached,
 * then 200 requests ask for 2 new chunks each. Reservations stop at half the tier's bytes,
 * floor(548864 / 2 / 1152) = 238 chunks, and the rest of the cache stays: at least 402 - 238.
 * Finishing the requests gives their room back; nothing of theirs was saved. */
static void abandoned_requests_leave_the_cache_its_chunks(void **state) {
  (void)state;
  struct engine e;
  engine_up_bounded(&e, VLLM, 134 * 4096, 0, 4096);
  static uint32_t conv[200][2 * CHUNK];
  static unsigned char kv[2 * CHUNK_BYTES];
  for (uint32_t i = 0; i < 200; ++i) {
    fill_tokens(conv[i], 2 * CHUNK, 1000 + i);
    memset(kv, (int)(i & 0xff), sizeof kv);
    uint64_t cached = 0;
    assert_ok(swiftkv_store(&cached, e.ctx, e.model, conv[i], 2 * CHUNK, kv, sizeof kv));
    assert_int_equal(cached, 2 * CHUNK);
  }
  swiftkv_stats s = SWIFTKV_STATS_INIT;
  assert_ok(swiftkv_stats_get(&s, e.ctx));
  assert_int_equal(s.chunks[SWIFTKV_TIER_HOST], 400);

  static uint32_t fresh[200][2 * CHUNK];
  static uint64_t req[200];
  uint64_t asked = 0;
  for (uint32_t i = 0; i < 200; ++i) {
    fill_tokens(fresh[i], 2 * CHUNK, 5000 + i);
    const int32_t pages[4] = {(int32_t)(i % 10) * 4, (int32_t)(i % 10) * 4 + 1,
                              (int32_t)(i % 10) * 4 + 2, (int32_t)(i % 10) * 4 + 3};
    req[i] = begin_shaped(&e, fresh[i], 2 * CHUNK, pages, 0, SWIFTKV_REQUEST_LOAD_AND_SAVE);
    swiftkv_request_info ri = SWIFTKV_REQUEST_INFO_INIT;
    assert_ok(swiftkv_request_info_get(&ri, e.ctx, req[i]));
    asked += ri.save_tokens / CHUNK;
  }
  const uint64_t share = 134u * 4096u / 2u / CHUNK_BYTES;
  assert_int_equal(asked, share);
  assert_ok(swiftkv_stats_get(&s, e.ctx));
  assert_int_equal(s.requests_open, 200);
  assert_true(s.chunks[SWIFTKV_TIER_HOST] >= 402 - share);
  const uint64_t kept = s.chunks[SWIFTKV_TIER_HOST];
  /* What stays is the newest conversations, whole and exact (LRU). */
  swiftkv_lookup_result lr = SWIFTKV_LOOKUP_RESULT_INIT;
  assert_ok(swiftkv_lookup(&lr, NULL, 0, e.ctx, e.model, conv[199], 2 * CHUNK));
  assert_int_equal(lr.prefix_tokens, 2 * CHUNK);

  for (uint32_t i = 0; i < 200; ++i) assert_ok(swiftkv_request_finish(NULL, e.ctx, req[i]));
  assert_ok(swiftkv_stats_get(&s, e.ctx));
  assert_int_equal(s.requests_open, 0);
  assert_int_equal(s.chunks[SWIFTKV_TIER_HOST], kept);
  /* The room is back: a new request reserves both its chunks. */
  const int32_t pages[4] = {0, 1, 2, 3};
  const uint64_t r = begin_shaped(&e, fresh[0], 2 * CHUNK, pages, 0, SWIFTKV_REQUEST_LOAD_AND_SAVE);
  swiftkv_request_info ri = SWIFTKV_REQUEST_INFO_INIT;
  assert_ok(swiftkv_request_info_get(&ri, e.ctx, r));
  assert_int_equal(ri.save_tokens, 2 * CHUNK);
  assert_ok(swiftkv_request_finish(NULL, e.ctx, r));
  engine_down(&e);
}

static void bad_pool_descriptors_are_rejected(void **state) {
  (void)state;
  struct engine e;
  engine_up(&e, NHD, 0, 0);
  void *bases[LAYERS] = {e.d.layer_base[0], e.d.layer_base[1], e.d.layer_base[2]};
  swiftkv_pool_desc good = e.d; /* the registered NHD pool, registered again is fine */
  good.layer_base = bases;
  uint32_t id = 1234;
  swiftkv_pool_desc d = good;
  d.token_stride = DIM; /* tokens on top of heads */
  assert_status(swiftkv_pool_register(&id, e.ctx, e.model, &d), SWIFTKV_EINVAL);
  assert_message_contains("overlap");
  d = good;
  d.layer_span_bytes -= 2;
  assert_status(swiftkv_pool_register(&id, e.ctx, e.model, &d), SWIFTKV_EINVAL);
  assert_message_contains("past layer_span_bytes");
  d = good;
  d.head_stride = 0;
  assert_status(swiftkv_pool_register(&id, e.ctx, e.model, &d), SWIFTKV_EINVAL);
  d = good;
  d.stream_first = PAGES - 2;
  d.stream_pages = 3;
  assert_status(swiftkv_pool_register(&id, e.ctx, e.model, &d), SWIFTKV_EINVAL);
  d = good;
  bases[2] = bases[1];
  assert_status(swiftkv_pool_register(&id, e.ctx, e.model, &d), SWIFTKV_EINVAL);
  bases[2] = (char *)e.d.layer_base[2] + 1;
  assert_status(swiftkv_pool_register(&id, e.ctx, e.model, &d), SWIFTKV_EINVAL);
  assert_message_contains("not aligned");
  /* Layers that share memory: layer 2 starting at layer 1's page 4 (the overlap of two slices
   * of one tensor), and at layer 1's V of page 0 (interleaved with it, not on a page). */
  const size_t page_bytes = (size_t)good.page_stride * 2;
  bases[2] = (char *)e.d.layer_base[1] + 4 * page_bytes;
  d.layer_span_bytes = good.layer_span_bytes - 4 * page_bytes;
  d.num_pages = PAGES - 4;
  assert_status(swiftkv_pool_register(&id, e.ctx, e.model, &d), SWIFTKV_EINVAL);
  assert_message_contains("layers 1 and 2 share memory");
  d = good;
  bases[2] = (char *)e.d.layer_base[1] + (size_t)good.kv_stride * 2;
  assert_status(swiftkv_pool_register(&id, e.ctx, e.model, &d), SWIFTKV_EINVAL);
  assert_message_contains("share memory");
  /* (Spans that interleave with no element in common, cross-layer pages, are accepted: the
   * CROSS engine of the round trips registers one.) */
  bases[2] = e.d.layer_base[2];
  assert_status(swiftkv_pool_register(&id, e.ctx, e.model + 5, &d), SWIFTKV_ENOTFOUND);
  d.reserved0 = 1;
  assert_status(swiftkv_pool_register(&id, e.ctx, e.model, &d), SWIFTKV_EINVAL);
  assert_int_equal(id, 1234);
  assert_ok(swiftkv_pool_register(&id, e.ctx, e.model, &good));
  assert_int_equal(id, e.pool + 1);
  assert_ok(swiftkv_pool_destroy(e.ctx, id));
  assert_status(swiftkv_pool_destroy(e.ctx, id), SWIFTKV_ENOTFOUND);
  engine_down(&e);
}

/* Minor page faults this process has taken so far. */
static long minor_faults(void) {
  struct rusage u;
  memset(&u, 0, sizeof u);
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

static int kernel_populates(void) { /* MADV_POPULATE_WRITE: Linux 5.14 */
  struct utsname u;
  int major = 0, minor = 0;
  if (uname(&u) != 0 || sscanf(u.release, "%d.%d", &major, &minor) != 2) return 0;
  return major > 5 || (major == 5 && minor >= 14);
}

/* Writes `value` at the start of every memory page of [p, p + bytes). Not instrumented, so that
 * a sanitizer's own shadow memory faulting in is not counted. */
__attribute__((no_sanitize("address", "thread"))) static void touch_pages(unsigned char *p,
                                                                          size_t bytes, size_t page,
                                                                          unsigned char value) {
  for (size_t at = 0; at < bytes; at += page) p[at] = value;
}

/* A library-made host pool is allocated and mapped by swiftkv_pool_create: the engine's first
 * write to each of its pages (or the first save reading them) takes no page fault. 3 layers of
 * 16384 pages of 192 bytes, 3 MiB a layer: 2304 memory pages, each a fault if left unmapped. */
static void created_pools_are_mapped_when_made(void **state) {
  (void)state;
  swiftkv_ctx *ctx = NULL;
  assert_ok(swiftkv_ctx_create(&ctx, NULL));
  swiftkv_model_desc md = model_desc();
  swiftkv_model_config mc = SWIFTKV_MODEL_CONFIG_INIT;
  mc.desc = &md;
  uint32_t model = 0, pool = 0;
  assert_ok(swiftkv_model_register(&model, ctx, &mc));
  assert_ok(swiftkv_pool_create(&pool, ctx, model, 16384, 64));
  swiftkv_pool_desc d = SWIFTKV_POOL_DESC_INIT;
  assert_ok(swiftkv_pool_get(&d, NULL, ctx, pool));
  const size_t page = (size_t)sysconf(_SC_PAGESIZE);
  const long before = minor_faults();
  for (uint32_t l = 0; l < LAYERS; ++l) {
    touch_pages((unsigned char *)d.layer_base[l], d.layer_span_bytes, page, (unsigned char)(l + 1));
  }
  const long faults = minor_faults() - before;
  if (kernel_populates()) assert_true(faults < 256);
  /* The regular pages are each layer's own; the stream pages (the span's tail) are one memory. */
  for (uint32_t l = 0; l < LAYERS; ++l) {
    const unsigned char *b = (const unsigned char *)d.layer_base[l];
    assert_int_equal(b[0], l + 1);
    assert_int_equal(b[(d.layer_span_bytes - 1) / page * page], LAYERS);
  }
  assert_ok(swiftkv_pool_destroy(ctx, pool));
  swiftkv_ctx_destroy(ctx);
}

/* A model on a device the context does not use gets no pool, made or registered: ENODEV, and
 * nothing is left behind (the model can still go). */
static void device_pools_need_their_device(void **state) {
  (void)state;
  swiftkv_ctx *ctx = NULL;
  assert_ok(swiftkv_ctx_create(&ctx, NULL));
  swiftkv_model_desc m = SWIFTKV_MODEL_DESC_INIT;
  m.name = "on-device";
  m.num_layers = 2;
  m.num_kv_heads = 2;
  m.head_dim = 16;
  m.chunk_tokens = 32;
  m.device = 0;
  swiftkv_model_config mc = SWIFTKV_MODEL_CONFIG_INIT;
  mc.desc = &m;
  uint32_t model = 0;
  assert_ok(swiftkv_model_register(&model, ctx, &mc));
  uint32_t pool = 77;
  assert_status(swiftkv_pool_create(&pool, ctx, model, 8, 2), SWIFTKV_ENODEV);
  assert_message_contains("which the context does not use");
  static uint16_t fake[2][4096];
  void *bases[2] = {fake[0], fake[1]};
  swiftkv_pool_desc d = SWIFTKV_POOL_DESC_INIT;
  d.num_pages = 4;
  d.layer_base = bases;
  d.layer_span_bytes = sizeof fake[0];
  d.head_stride = 16;
  d.token_stride = 32;
  d.kv_stride = 16 * 32;
  d.page_stride = 2 * 16 * 32;
  assert_status(swiftkv_pool_register(&pool, ctx, model, &d), SWIFTKV_ENODEV);
  assert_int_equal(pool, 77);
  assert_ok(swiftkv_model_unregister(ctx, model));
  swiftkv_ctx_destroy(ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(round_trip_vllm),
      cmocka_unit_test(load_only_and_save_only),
      cmocka_unit_test(named_requests),
      cmocka_unit_test(round_trip_nhd),
      cmocka_unit_test(round_trip_hnd),
      cmocka_unit_test(host_stores_move_the_same_bytes),
      cmocka_unit_test(round_trip_cross_layer),
      cmocka_unit_test(round_trip_stream_pages),
      cmocka_unit_test(created_pool_aliases_stream_pages),
      cmocka_unit_test(corrupt_disk_chunk_ends_the_valid_prefix),
      cmocka_unit_test(lossy_chunks_load_only_where_accepted),
      cmocka_unit_test(load_from_inside_a_chunk_nhd),
      cmocka_unit_test(load_from_inside_a_chunk_vllm),
      cmocka_unit_test(lost_lent_memory_loads_nothing),
      cmocka_unit_test(clear_during_a_request_loses_nothing),
      cmocka_unit_test(bad_input_changes_nothing),
      cmocka_unit_test(a_batch_does_what_its_requests_do),
      cmocka_unit_test(a_bad_batch_changes_nothing),
      cmocka_unit_test(bad_pool_descriptors_are_rejected),
      cmocka_unit_test(open_requests_are_bounded),
      cmocka_unit_test(abandoned_requests_leave_the_cache_its_chunks),
      cmocka_unit_test(device_pools_need_their_device),
      cmocka_unit_test(created_pools_are_mapped_when_made),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
