/* The chunk cache through the C API: models, lookup/store/retrieve, borrowing from an elastic
 * region, the controller calls and their statuses on bad input (with nothing changed), and the
 * chunk event callback. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <dirent.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "test_support.h"

/* A small borrower: 2 layers, 2 KV heads of 8, F16, 4-token blocks, 8-token chunks (1 KiB). */
#define CHUNK_TOKENS 8u
#define CHUNK_BYTES 1024u

static swiftkv_model_desc borrower_desc(void) {
  swiftkv_model_desc d = SWIFTKV_MODEL_DESC_INIT;
  d.name = "tiny-borrower";
  d.num_layers = 2;
  d.num_kv_heads = 2;
  d.head_dim = 8;
  d.block_tokens = 4;
  d.chunk_tokens = CHUNK_TOKENS;
  return d;
}

struct rig {
  swiftkv_ctx *ctx;
  uint32_t model;
  char dir[64];
};

static void rig_up(struct rig *r, uint64_t host_bytes, int with_disk) {
  swiftkv_ctx_config c = SWIFTKV_CTX_CONFIG_INIT;
  c.host_budget_bytes = host_bytes;
  c.eviction_policy = SWIFTKV_EVICT_LRU;
  c.demote_free_percent = 0; /* only on demand: the tests see exact placements */
  r->dir[0] = '\0';
  if (with_disk) {
    strcpy(r->dir, "/tmp/swiftkv-capi-XXXXXX");
    assert_non_null(mkdtemp(r->dir));
    c.disk_path = r->dir;
    c.disk_budget_bytes = 64 * (CHUNK_BYTES + 96);
  }
  assert_ok(swiftkv_ctx_create(&r->ctx, &c));
  swiftkv_model_desc d = borrower_desc();
  swiftkv_model_config mc = SWIFTKV_MODEL_CONFIG_INIT;
  mc.desc = &d;
  assert_ok(swiftkv_model_register(&r->model, r->ctx, &mc));
}

static void rig_down(struct rig *r) {
  swiftkv_ctx_destroy(r->ctx);
  if (r->dir[0] != '\0') {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", r->dir);
    assert_int_equal(system(cmd), 0);
  }
}

static void fill_tokens(uint32_t *t, size_t n, uint32_t seq) {
  for (size_t i = 0; i < n; ++i) t[i] = seq * 1000u + (uint32_t)i;
}

static void fill_kv(unsigned char *kv, size_t bytes, uint32_t seq) {
  for (size_t i = 0; i < bytes; ++i) kv[i] = (unsigned char)(seq * 31u + i * 7u + (i >> 8));
}

static swiftkv_stats stats(const struct rig *r) {
  swiftkv_stats s = SWIFTKV_STATS_INIT;
  assert_ok(swiftkv_stats_get(&s, r->ctx));
  return s;
}

static void store_retrieve_lookup(void **state) {
  (void)state;
  struct rig r;
  rig_up(&r, 1 << 20, 0);
  uint32_t tokens[4 * CHUNK_TOKENS + 3]; /* 4 full chunks and 3 tokens more */
  fill_tokens(tokens, 4 * CHUNK_TOKENS + 3, 1);
  static unsigned char kv[4 * CHUNK_BYTES], out[4 * CHUNK_BYTES];
  fill_kv(kv, sizeof kv, 1);

  swiftkv_lookup_result l = SWIFTKV_LOOKUP_RESULT_INIT;
  uint8_t res[8];
  memset(res, 0xee, sizeof res);
  assert_ok(swiftkv_lookup(&l, res, 8, r.ctx, r.model, tokens, 4 * CHUNK_TOKENS + 3));
  assert_int_equal(l.chunks, 4);
  assert_int_equal(l.prefix_tokens, 0);
  assert_int_equal(res[0], SWIFTKV_TIER_DROPPED);
  assert_int_equal(res[4], 0xee); /* only the full chunks are written */

  uint64_t cached = SENTINEL;
  assert_ok(swiftkv_store(&cached, r.ctx, r.model, tokens, 4 * CHUNK_TOKENS, kv, sizeof kv));
  assert_int_equal(cached, 4 * CHUNK_TOKENS);
  assert_ok(swiftkv_lookup(&l, res, 8, r.ctx, r.model, tokens, 4 * CHUNK_TOKENS + 3));
  assert_int_equal(l.prefix_tokens, 4 * CHUNK_TOKENS);
  assert_int_equal(l.chunks_per_tier[SWIFTKV_TIER_HOST], 4);
  assert_int_equal(res[3], SWIFTKV_TIER_HOST);

  uint64_t loaded = SENTINEL;
  assert_ok(
      swiftkv_retrieve(&loaded, r.ctx, r.model, tokens, 4 * CHUNK_TOKENS + 3, 0, out, sizeof out));
  assert_int_equal(loaded, 4 * CHUNK_TOKENS);
  assert_memory_equal(out, kv, sizeof kv);
  /* From chunk 2 on, into a buffer of one chunk. */
  memset(out, 0, sizeof out);
  assert_ok(swiftkv_retrieve(&loaded, r.ctx, r.model, tokens, 4 * CHUNK_TOKENS, 2 * CHUNK_TOKENS,
                             out, CHUNK_BYTES));
  assert_int_equal(loaded, CHUNK_TOKENS);
  assert_memory_equal(out, kv + 2 * CHUNK_BYTES, CHUNK_BYTES);

  /* A dropped head: clearing the first chunk leaves 3 loadable after it. */
  uint64_t cleared = 0;
  assert_ok(swiftkv_clear(&cleared, r.ctx, r.model, SWIFTKV_TIERS_ALL, tokens, CHUNK_TOKENS));
  assert_int_equal(cleared, 1);
  assert_ok(swiftkv_lookup(&l, NULL, 0, r.ctx, r.model, tokens, 4 * CHUNK_TOKENS));
  assert_int_equal(l.prefix_tokens, 0);
  assert_int_equal(l.dropped_head_tokens, CHUNK_TOKENS);
  assert_int_equal(l.loadable_tokens, 3 * CHUNK_TOKENS);

  const swiftkv_stats s = stats(&r);
  assert_int_equal(s.stores, 4);
  assert_int_equal(s.chunks[SWIFTKV_TIER_HOST], 3);
  assert_int_equal(s.bytes[SWIFTKV_TIER_HOST], 3 * CHUNK_BYTES);
  assert_int_equal(s.capacity_bytes[SWIFTKV_TIER_HOST], 1 << 20);
  rig_down(&r);
}

/* Bad input: a clear status, the message names the problem, and nothing changed. */
static void bad_input_changes_nothing(void **state) {
  (void)state;
  struct rig r;
  rig_up(&r, 1 << 20, 0);
  uint32_t tokens[2 * CHUNK_TOKENS];
  fill_tokens(tokens, 2 * CHUNK_TOKENS, 2);
  static unsigned char kv[2 * CHUNK_BYTES];
  fill_kv(kv, sizeof kv, 2);
  uint64_t out = SENTINEL;
  assert_ok(swiftkv_store(&out, r.ctx, r.model, tokens, CHUNK_TOKENS, kv, CHUNK_BYTES));
  const swiftkv_stats before = stats(&r);

  /* An unknown model, and a lender where a borrower is needed. */
  out = SENTINEL;
  assert_status(swiftkv_store(&out, r.ctx, 77, tokens, CHUNK_TOKENS, kv, CHUNK_BYTES),
                SWIFTKV_ENOTFOUND);
  assert_message_contains("model 77 is not registered");
  assert_true(out == SENTINEL);
  swiftkv_model_desc d = borrower_desc();
  d.name = "a-lender";
  swiftkv_model_config mc = SWIFTKV_MODEL_CONFIG_INIT;
  mc.desc = &d;
  mc.role = SWIFTKV_ROLE_LENDER;
  uint32_t lender = 0;
  assert_ok(swiftkv_model_register(&lender, r.ctx, &mc));
  assert_status(swiftkv_pin(r.ctx, lender, tokens, CHUNK_TOKENS), SWIFTKV_ESTATE);
  assert_message_contains("is a lender");
  /* The same model twice. */
  d = borrower_desc();
  mc.role = SWIFTKV_ROLE_BORROWER;
  uint32_t again = 99;
  assert_status(swiftkv_model_register(&again, r.ctx, &mc), SWIFTKV_EBUSY);
  assert_int_equal(again, 99);
  d.name = NULL;
  assert_status(swiftkv_model_register(&again, r.ctx, &mc), SWIFTKV_EINVAL);
  assert_message_contains("name is required");

  /* Tokens that are not whole chunks. */
  assert_status(swiftkv_store(&out, r.ctx, r.model, tokens, CHUNK_TOKENS + 1, kv, CHUNK_BYTES),
                SWIFTKV_EINVAL);
  assert_message_contains("not a multiple of tiny-borrower's chunk_tokens (8)");
  assert_status(swiftkv_pin(r.ctx, r.model, tokens, 3), SWIFTKV_EINVAL);
  assert_status(swiftkv_store(&out, r.ctx, r.model, tokens, CHUNK_TOKENS, kv, CHUNK_BYTES - 1),
                SWIFTKV_EINVAL);
  assert_message_contains("kv_bytes (1023)");
  assert_status(
      swiftkv_retrieve(&out, r.ctx, r.model, tokens, 2 * CHUNK_TOKENS, 3, kv, CHUNK_BYTES),
      SWIFTKV_EINVAL);
  assert_message_contains("start_token (3)");
  assert_true(out == SENTINEL);

  /* A tier that is not configured: no disk path, no lent memory. */
  assert_status(swiftkv_move(&out, r.ctx, r.model, tokens, CHUNK_TOKENS, SWIFTKV_TIER_DISK),
                SWIFTKV_EINVAL);
  assert_message_contains("tier disk is not configured");
  assert_status(swiftkv_move(&out, r.ctx, r.model, tokens, CHUNK_TOKENS, SWIFTKV_TIER_PEER),
                SWIFTKV_EINVAL);
  assert_status(swiftkv_move(&out, r.ctx, r.model, tokens, CHUNK_TOKENS, (swiftkv_tier)3),
                SWIFTKV_EINVAL);
  assert_true(out == SENTINEL);

  /* Pins of chunks that are not cached: chunk 1 is not, so chunk 0 is not pinned either. */
  assert_status(swiftkv_pin(r.ctx, r.model, tokens, 2 * CHUNK_TOKENS), SWIFTKV_ENOTFOUND);
  assert_message_contains("chunk 1");
  assert_status(swiftkv_unpin(r.ctx, r.model, tokens, CHUNK_TOKENS), SWIFTKV_ENOTFOUND);
  assert_message_contains("not pinned");
  uint64_t cleared = 0;
  assert_ok(swiftkv_clear(&cleared, r.ctx, r.model, SWIFTKV_TIERS_ALL, tokens, CHUNK_TOKENS));
  assert_int_equal(cleared, 1); /* it was not pinned */
  assert_ok(swiftkv_store(&out, r.ctx, r.model, tokens, CHUNK_TOKENS, kv, CHUNK_BYTES));
  /* Moving a chunk that is not cached moves none. */
  assert_status(swiftkv_move(&out, r.ctx, r.model, tokens, 2 * CHUNK_TOKENS, SWIFTKV_TIER_HOST),
                SWIFTKV_ENOTFOUND);

  /* Clear: bad masks, tokens with every model. */
  assert_status(swiftkv_clear(&out, r.ctx, r.model, 0, NULL, 0), SWIFTKV_EINVAL);
  assert_status(swiftkv_clear(&out, r.ctx, r.model, 8, NULL, 0), SWIFTKV_EINVAL);
  assert_status(swiftkv_clear(&out, r.ctx, SWIFTKV_MODEL_ALL, 1, tokens, CHUNK_TOKENS),
                SWIFTKV_EINVAL);
  /* Lookup with a NULL residency array but a capacity, and an uninitialised result. */
  swiftkv_lookup_result l = SWIFTKV_LOOKUP_RESULT_INIT;
  assert_status(swiftkv_lookup(&l, NULL, 4, r.ctx, r.model, tokens, CHUNK_TOKENS), SWIFTKV_EINVAL);
  swiftkv_lookup_result z;
  memset(&z, 0, sizeof z);
  assert_status(swiftkv_lookup(&z, NULL, 0, r.ctx, r.model, tokens, CHUNK_TOKENS),
                SWIFTKV_EVERSION);

  /* None of it changed the cache: the same chunk, same counters (the one store and clear
   * above aside). */
  const swiftkv_stats after = stats(&r);
  assert_int_equal(after.chunks[SWIFTKV_TIER_HOST], before.chunks[SWIFTKV_TIER_HOST]);
  assert_int_equal(after.hits[SWIFTKV_TIER_HOST], before.hits[SWIFTKV_TIER_HOST]);
  assert_int_equal(after.misses, before.misses);
  assert_int_equal(after.stores, before.stores + 1);
  assert_int_equal(after.evictions, 0);
  uint64_t unknown = 0;
  assert_status(swiftkv_model_unregister(r.ctx, 77), SWIFTKV_ENOTFOUND);
  (void)unknown;
  rig_down(&r);
}

static void pins_clear_and_move(void **state) {
  (void)state;
  struct rig r;
  rig_up(&r, 1 << 20, 1);
  uint32_t tokens[3 * CHUNK_TOKENS];
  fill_tokens(tokens, 3 * CHUNK_TOKENS, 3);
  static unsigned char kv[3 * CHUNK_BYTES], out[3 * CHUNK_BYTES];
  fill_kv(kv, sizeof kv, 3);
  uint64_t n = 0;
  assert_ok(swiftkv_store(&n, r.ctx, r.model, tokens, 3 * CHUNK_TOKENS, kv, sizeof kv));
  /* Pins are counted: two pins need two unpins before a clear may drop the chunk. */
  assert_ok(swiftkv_pin(r.ctx, r.model, tokens, CHUNK_TOKENS));
  assert_ok(swiftkv_pin(r.ctx, r.model, tokens, CHUNK_TOKENS));
  assert_ok(swiftkv_unpin(r.ctx, r.model, tokens, CHUNK_TOKENS));
  assert_ok(swiftkv_clear(&n, r.ctx, r.model, SWIFTKV_TIERS_ALL, NULL, 0));
  assert_int_equal(n, 2);
  assert_ok(swiftkv_unpin(r.ctx, r.model, tokens, CHUNK_TOKENS));
  assert_ok(swiftkv_store(&n, r.ctx, r.model, tokens, 3 * CHUNK_TOKENS, kv, sizeof kv));
  /* Down to disk and back: the bytes survive and the counters say which way. */
  assert_ok(swiftkv_move(&n, r.ctx, r.model, tokens, 3 * CHUNK_TOKENS, SWIFTKV_TIER_DISK));
  assert_int_equal(n, 3);
  swiftkv_stats s = stats(&r);
  assert_int_equal(s.chunks[SWIFTKV_TIER_DISK], 3);
  assert_int_equal(s.demotions, 3);
  assert_ok(swiftkv_retrieve(&n, r.ctx, r.model, tokens, 3 * CHUNK_TOKENS, 0, out, sizeof out));
  assert_int_equal(n, 3 * CHUNK_TOKENS);
  assert_memory_equal(out, kv, sizeof kv);
  assert_ok(swiftkv_move(&n, r.ctx, r.model, tokens, 2 * CHUNK_TOKENS, SWIFTKV_TIER_HOST));
  s = stats(&r);
  assert_int_equal(s.promotions, 2);
  /* Clear by tier: only the disk chunk goes. */
  assert_ok(
      swiftkv_clear(&n, r.ctx, SWIFTKV_MODEL_ALL, SWIFTKV_TIER_BIT(SWIFTKV_TIER_DISK), NULL, 0));
  assert_int_equal(n, 1);
  swiftkv_lookup_result l = SWIFTKV_LOOKUP_RESULT_INIT;
  assert_ok(swiftkv_lookup(&l, NULL, 0, r.ctx, r.model, tokens, 3 * CHUNK_TOKENS));
  assert_int_equal(l.prefix_tokens, 2 * CHUNK_TOKENS);
  rig_down(&r);
}

struct seen {
  int count;
  swiftkv_chunk_event last;
};

static void on_event(const swiftkv_chunk_event *e, void *user_data) {
  struct seen *s = (struct seen *)user_data;
  ++s->count;
  s->last = *e;
}

/* A borrower takes lent memory from an elastic region, the lender asks it back, and the
 * context's background thread moves the chunks to host and releases the lease. */
static void borrow_and_give_back(void **state) {
  (void)state;
  struct rig r;
  rig_up(&r, 1 << 20, 0);
  struct seen seen = {0, {0, 0, 0, 0, 0, 0}};
  assert_ok(swiftkv_set_chunk_event_callback(r.ctx, on_event, &seen));
  swiftkv_model_desc d = borrower_desc();
  swiftkv_elastic_config ec = SWIFTKV_ELASTIC_CONFIG_INIT;
  ec.lender = &d;
  ec.borrower = &d;
  ec.capacity_blocks = 8; /* 4 chunks of the borrower */
  swiftkv_elastic *e = NULL;
  assert_ok(swiftkv_elastic_create(&e, r.ctx, &ec));
  uint64_t lease = 0;
  assert_status(swiftkv_borrow(&lease, r.ctx, r.model, e, 0), SWIFTKV_EINVAL);
  assert_ok(swiftkv_borrow(&lease, r.ctx, r.model, e, 100));
  assert_true(lease != 0);
  uint32_t tokens[2 * CHUNK_TOKENS];
  fill_tokens(tokens, 2 * CHUNK_TOKENS, 4);
  static unsigned char kv[2 * CHUNK_BYTES], out[2 * CHUNK_BYTES];
  fill_kv(kv, sizeof kv, 4);
  uint64_t n = 0;
  assert_ok(swiftkv_store(&n, r.ctx, r.model, tokens, 2 * CHUNK_TOKENS, kv, sizeof kv));
  swiftkv_lookup_result l = SWIFTKV_LOOKUP_RESULT_INIT;
  assert_ok(swiftkv_lookup(&l, NULL, 0, r.ctx, r.model, tokens, 2 * CHUNK_TOKENS));
  assert_int_equal(l.chunks_per_tier[SWIFTKV_TIER_PEER], 2);
  assert_int_equal(stats(&r).capacity_bytes[SWIFTKV_TIER_PEER], 4 * CHUNK_BYTES);

  assert_ok(swiftkv_elastic_reclaim(e, SWIFTKV_LEASE_ALL));
  /* The background thread answers within a few of its 10 ms passes. */
  size_t pending = 1;
  for (int i = 0; i < 2000 && pending != 0; ++i) {
    const struct timespec ms = {0, 1000000};
    nanosleep(&ms, NULL);
    assert_ok(swiftkv_elastic_pending_reclaims(NULL, 0, &pending, e));
  }
  assert_int_equal(pending, 0);
  assert_ok(swiftkv_lookup(&l, NULL, 0, r.ctx, r.model, tokens, 2 * CHUNK_TOKENS));
  assert_int_equal(l.chunks_per_tier[SWIFTKV_TIER_HOST], 2);
  assert_ok(swiftkv_retrieve(&n, r.ctx, r.model, tokens, 2 * CHUNK_TOKENS, 0, out, sizeof out));
  assert_memory_equal(out, kv, sizeof kv);
  assert_int_equal(seen.count, 2);
  assert_int_equal(seen.last.model, r.model);
  assert_int_equal(seen.last.from, SWIFTKV_TIER_PEER);
  assert_int_equal(seen.last.to, SWIFTKV_TIER_HOST);
  assert_int_equal(seen.last.reason, SWIFTKV_CHUNK_REVOKED);
  assert_int_equal(stats(&r).revocations, 2);
  /* A lender whose borrower geometry is another model's cannot lend to this one. */
  swiftkv_model_desc other = borrower_desc();
  other.head_dim = 16;
  ec.borrower = &other;
  swiftkv_elastic *e2 = NULL;
  assert_ok(swiftkv_elastic_create(&e2, r.ctx, &ec));
  assert_status(swiftkv_borrow(&lease, r.ctx, r.model, e2, 1), SWIFTKV_EINVAL);
  assert_message_contains("borrower geometry");
  swiftkv_elastic_destroy(e2);
  /* Unregistering gives back what is left; the model id is then unknown. */
  assert_ok(swiftkv_borrow(&lease, r.ctx, r.model, e, 1));
  assert_ok(swiftkv_model_unregister(r.ctx, r.model));
  swiftkv_elastic_stats es = SWIFTKV_ELASTIC_STATS_INIT;
  assert_ok(swiftkv_elastic_stats_get(&es, e));
  assert_int_equal(es.lent_blocks, 0);
  assert_status(swiftkv_lookup(&l, NULL, 0, r.ctx, r.model, tokens, 0), SWIFTKV_ENOTFOUND);
  assert_ok(swiftkv_set_chunk_event_callback(r.ctx, NULL, NULL));
  swiftkv_elastic_destroy(e);
  rig_down(&r);
}

/* A host elastic region and the host tier share host_budget_bytes. The tier's empty slabs (made
 * ahead of its saves, or emptied by a clear) give their budget to a region that needs it; a slab
 * holding chunks does not, and the chunks stay exact. The budget: 64 KiB, slabs of 8 chunks. */
static swiftkv_status host_region(swiftkv_elastic **e, swiftkv_ctx *ctx, uint64_t blocks) {
  swiftkv_model_desc d = borrower_desc(); /* 512-byte blocks */
  swiftkv_elastic_config ec = SWIFTKV_ELASTIC_CONFIG_INIT;
  ec.lender = &d;
  ec.borrower = &d;
  ec.capacity_blocks = blocks;
  *e = NULL;
  return swiftkv_elastic_create(e, ctx, &ec);
}

static void regions_take_the_budget_of_empty_slabs(void **state) {
  (void)state;
  struct rig r;
  rig_up(&r, 64 << 10, 0);
  uint32_t tokens[16 * CHUNK_TOKENS];
  fill_tokens(tokens, 16 * CHUNK_TOKENS, 6);
  static unsigned char kv[16 * CHUNK_BYTES], out[16 * CHUNK_BYTES];
  fill_kv(kv, sizeof kv, 6);
  uint64_t n = 0, cleared = 0;
  /* Two slabs filled (and a third made ahead), then emptied: the tier keeps them. */
  assert_ok(swiftkv_store(&n, r.ctx, r.model, tokens, 16 * CHUNK_TOKENS, kv, sizeof kv));
  assert_int_equal(n, 16 * CHUNK_TOKENS);
  assert_ok(swiftkv_clear(&cleared, r.ctx, r.model, SWIFTKV_TIERS_ALL, NULL, 0));
  assert_int_equal(cleared, 16);
  swiftkv_elastic *e = NULL;
  assert_ok(host_region(&e, r.ctx, 128)); /* the whole budget */
  /* With the budget taken the tier has no room: a store keeps nothing, and says so. */
  assert_ok(swiftkv_store(&n, r.ctx, r.model, tokens, CHUNK_TOKENS, kv, CHUNK_BYTES));
  assert_int_equal(n, 0);
  swiftkv_elastic_destroy(e);
  /* The tier makes its slabs again. 8 chunks take one or two (the next is made ahead as the
   * first fills, and may take the last stores): a region cannot take their budget. */
  assert_ok(swiftkv_store(&n, r.ctx, r.model, tokens, 8 * CHUNK_TOKENS, kv, 8 * CHUNK_BYTES));
  assert_int_equal(n, 8 * CHUNK_TOKENS);
  assert_status(host_region(&e, r.ctx, 128), SWIFTKV_ENOMEM);
  assert_message_contains("host_budget_bytes");
  assert_null(e);
  assert_ok(host_region(&e, r.ctx, 128 - 32)); /* all but two slabs' 16 KiB */
  assert_ok(swiftkv_retrieve(&n, r.ctx, r.model, tokens, 8 * CHUNK_TOKENS, 0, out, sizeof out));
  assert_int_equal(n, 8 * CHUNK_TOKENS);
  assert_memory_equal(out, kv, 8 * CHUNK_BYTES);
  swiftkv_elastic_destroy(e);
  rig_down(&r);
}

/* What a chunk event callback does with the library: every call the header allows, from the
 * thread that moved the chunk, and the two refusals instead of a hang. */
struct reentry {
  swiftkv_ctx *ctx;
  uint32_t model;
  int events, nested, depth, stored;
  swiftkv_status set_self, unregister, stats, lookup, store, unset;
  int remove_self;
  char destroy_message[160];
};

static void reentrant_event(const swiftkv_chunk_event *e, void *user_data) {
  (void)e;
  struct reentry *s = user_data;
  ++s->events;
  if (s->depth > 0) ++s->nested;
  if (s->remove_self) {
    s->unset = swiftkv_set_chunk_event_callback(s->ctx, NULL, NULL);
    return;
  }
  /* Replacing itself must not wait for this very call to end. */
  s->set_self = swiftkv_set_chunk_event_callback(s->ctx, reentrant_event, s);
  s->unregister = swiftkv_model_unregister(s->ctx, s->model);
  swiftkv_ctx_destroy(s->ctx); /* refused: the context stays */
  snprintf(s->destroy_message, sizeof s->destroy_message, "%s", swiftkv_last_error_message());
  swiftkv_stats st = SWIFTKV_STATS_INIT;
  s->stats = swiftkv_stats_get(&st, s->ctx);
  uint32_t tokens[2 * CHUNK_TOKENS];
  fill_tokens(tokens, 2 * CHUNK_TOKENS, 900u + (uint32_t)s->events);
  swiftkv_lookup_result l = SWIFTKV_LOOKUP_RESULT_INIT;
  s->lookup = swiftkv_lookup(&l, NULL, 0, s->ctx, s->model, tokens, CHUNK_TOKENS);
  if (s->depth == 0 && !s->stored) {
    /* Two chunks stored from inside the callback: one takes the room just made, the other
     * evicts, and so calls the callback again on this thread. (Once: a callback that stores on
     * every eviction refills the room its caller is making.) */
    s->stored = 1;
    static unsigned char kv[2 * CHUNK_BYTES];
    fill_kv(kv, sizeof kv, 900u);
    uint64_t n = 0;
    ++s->depth;
    s->store = swiftkv_store(&n, s->ctx, s->model, tokens, 2 * CHUNK_TOKENS, kv, sizeof kv);
    --s->depth;
  }
}

static void callback_calls_the_library(void **state) {
  (void)state;
  struct rig r;
  rig_up(&r, 16 * 1024, 0);
  const uint64_t capacity = stats(&r).capacity_bytes[SWIFTKV_TIER_HOST] / CHUNK_BYTES;
  assert_true(capacity >= 2 && capacity <= 16);
  struct reentry s;
  memset(&s, 0, sizeof s);
  s.ctx = r.ctx;
  s.model = r.model;
  s.set_self = s.unregister = s.stats = s.lookup = s.store = s.unset = SWIFTKV_EINTERNAL;
  assert_ok(swiftkv_set_chunk_event_callback(r.ctx, reentrant_event, &s));
  static unsigned char kv[CHUNK_BYTES];
  uint32_t tokens[CHUNK_TOKENS];
  uint64_t n = 0;
  /* Fill the host tier; the next store evicts, on this thread. */
  for (uint32_t i = 0; i <= capacity; ++i) {
    fill_tokens(tokens, CHUNK_TOKENS, 100u + i);
    fill_kv(kv, sizeof kv, 100u + i);
    assert_ok(swiftkv_store(&n, r.ctx, r.model, tokens, CHUNK_TOKENS, kv, sizeof kv));
    assert_int_equal(n, CHUNK_TOKENS);
  }
  assert_true(s.events >= 2);
  assert_true(s.nested >= 1);
  assert_int_equal(s.set_self, SWIFTKV_OK);
  assert_int_equal(s.unregister, SWIFTKV_ESTATE);
  assert_non_null(strstr(s.destroy_message, "not destroyed"));
  assert_int_equal(s.stats, SWIFTKV_OK);
  assert_int_equal(s.lookup, SWIFTKV_OK);
  assert_int_equal(s.store, SWIFTKV_OK);
  /* The model and the context are whole: the last store is there, byte for byte. */
  static unsigned char out[CHUNK_BYTES];
  fill_tokens(tokens, CHUNK_TOKENS, 100u + (uint32_t)capacity);
  fill_kv(kv, sizeof kv, 100u + (uint32_t)capacity);
  assert_ok(swiftkv_retrieve(&n, r.ctx, r.model, tokens, CHUNK_TOKENS, 0, out, sizeof out));
  assert_int_equal(n, CHUNK_TOKENS);
  assert_memory_equal(out, kv, sizeof kv);
  /* A callback that removes itself is not called again. */
  s.remove_self = 1;
  const int before = s.events;
  for (uint32_t i = 0; i < 3; ++i) {
    fill_tokens(tokens, CHUNK_TOKENS, 200u + i);
    assert_ok(swiftkv_store(&n, r.ctx, r.model, tokens, CHUNK_TOKENS, kv, sizeof kv));
  }
  assert_int_equal(s.events, before + 1);
  assert_int_equal(s.unset, SWIFTKV_OK);
  assert_ok(swiftkv_model_unregister(r.ctx, r.model));
  rig_down(&r);
}

/* The same from the context's background thread, which answers a lender's reclaim. */
static void callback_on_the_background_thread(void **state) {
  (void)state;
  struct rig r;
  rig_up(&r, 1 << 20, 0);
  struct reentry s;
  memset(&s, 0, sizeof s);
  s.ctx = r.ctx;
  s.model = r.model;
  s.depth = 1; /* no store from this thread */
  s.set_self = s.unregister = s.stats = s.lookup = SWIFTKV_EINTERNAL;
  assert_ok(swiftkv_set_chunk_event_callback(r.ctx, reentrant_event, &s));
  swiftkv_model_desc d = borrower_desc();
  swiftkv_elastic_config ec = SWIFTKV_ELASTIC_CONFIG_INIT;
  ec.lender = &d;
  ec.borrower = &d;
  ec.capacity_blocks = 8;
  swiftkv_elastic *e = NULL;
  assert_ok(swiftkv_elastic_create(&e, r.ctx, &ec));
  uint64_t lease = 0, n = 0;
  assert_ok(swiftkv_borrow(&lease, r.ctx, r.model, e, 100));
  uint32_t tokens[2 * CHUNK_TOKENS];
  fill_tokens(tokens, 2 * CHUNK_TOKENS, 4);
  static unsigned char kv[2 * CHUNK_BYTES];
  fill_kv(kv, sizeof kv, 4);
  assert_ok(swiftkv_store(&n, r.ctx, r.model, tokens, 2 * CHUNK_TOKENS, kv, sizeof kv));
  assert_ok(swiftkv_elastic_reclaim(e, SWIFTKV_LEASE_ALL));
  assert_ok(swiftkv_elastic_wait_reclaims(e, 60000));
  assert_int_equal(s.events, 2);
  assert_int_equal(s.set_self, SWIFTKV_OK);
  assert_int_equal(s.unregister, SWIFTKV_ESTATE);
  assert_int_equal(s.stats, SWIFTKV_OK);
  assert_int_equal(s.lookup, SWIFTKV_OK);
  /* From another thread the setter waits for nothing: no callback is running. */
  assert_ok(swiftkv_set_chunk_event_callback(r.ctx, NULL, NULL));
  assert_ok(swiftkv_model_unregister(r.ctx, r.model));
  swiftkv_elastic_destroy(e);
  rig_down(&r);
}

/* A disk that fails mid-store: the call says EIO and how many leading tokens it did cache, and
 * those are there, byte for byte. (In a child: the failure is a file size limit, which fails
 * every write past it as a full or broken disk would.) */
static int store_fails_midway_child(void) {
  setenv("SWIFTKV_LOG", "off", 1);
  signal(SIGXFSZ, SIG_IGN);
  struct rig r;
  rig_up(&r, 0, 1);
  uint32_t tokens[8 * CHUNK_TOKENS];
  fill_tokens(tokens, 8 * CHUNK_TOKENS, 11);
  static unsigned char kv[8 * CHUNK_BYTES], out[8 * CHUNK_BYTES];
  fill_kv(kv, sizeof kv, 11);
  uint64_t n = 0;
  /* One chunk first, so that the segment the others go to exists. */
  uint32_t first[CHUNK_TOKENS];
  fill_tokens(first, CHUNK_TOKENS, 12);
  if (swiftkv_store(&n, r.ctx, r.model, first, CHUNK_TOKENS, kv, CHUNK_BYTES) != SWIFTKV_OK)
    return 2;
  const struct rlimit lim = {4096, 4096};
  if (setrlimit(RLIMIT_FSIZE, &lim) != 0) return 3;
  n = SENTINEL;
  if (swiftkv_store(&n, r.ctx, r.model, tokens, 8 * CHUNK_TOKENS, kv, sizeof kv) != SWIFTKV_EIO)
    return 4;
  if (n == SENTINEL || n % CHUNK_TOKENS != 0 || n == 0 || n >= 8 * CHUNK_TOKENS) return 5;
  swiftkv_lookup_result l = SWIFTKV_LOOKUP_RESULT_INIT;
  if (swiftkv_lookup(&l, NULL, 0, r.ctx, r.model, tokens, 8 * CHUNK_TOKENS) != SWIFTKV_OK) return 6;
  if (l.prefix_tokens != n || l.chunks_per_tier[SWIFTKV_TIER_DISK] != n / CHUNK_TOKENS) return 7;
  uint64_t loaded = 0;
  if (swiftkv_retrieve(&loaded, r.ctx, r.model, tokens, 8 * CHUNK_TOKENS, 0, out, sizeof out) !=
      SWIFTKV_OK)
    return 8;
  if (loaded != n || memcmp(out, kv, (size_t)(n / CHUNK_TOKENS) * CHUNK_BYTES) != 0) return 9;
  if (stats(&r).stores != 1 + n / CHUNK_TOKENS) return 10;
  /* Bad arguments leave the count untouched. */
  n = SENTINEL;
  if (swiftkv_store(&n, r.ctx, r.model, tokens, 3, kv, sizeof kv) != SWIFTKV_EINVAL ||
      n != SENTINEL)
    return 11;
  const struct rlimit none = {RLIM_INFINITY, RLIM_INFINITY};
  setrlimit(RLIMIT_FSIZE, &none);
  rig_down(&r);
  return 0;
}

static void a_failed_store_reports_what_it_kept(void **state) {
  (void)state;
  fflush(NULL);
  const pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) _exit(store_fails_midway_child());
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
}

/* Resident memory of this process in bytes (VmRSS). */
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
static uint64_t rss_bytes(void) {
  FILE *f = fopen("/proc/self/status", "r");
  assert_non_null(f);
  char line[256];
  uint64_t kib = 0;
  while (fgets(line, sizeof line, f) != NULL) {
    if (sscanf(line, "VmRSS: %lu kB", &kib) == 1) break;
  }
  fclose(f);
  assert_true(kib > 0);
  return kib * 1024;
}
#endif

/* The index is memory beside the budgets: swiftkv_stats counts it, and registering a model of
 * tiny chunks (4 bytes: 16M of them fit a 64 MiB host budget) reserves at most 16 MiB of it up
 * front (a quarter of the budget, or 16 MiB), not an index for every chunk that fits. It grows
 * as chunks arrive, at under 400 bytes per chunk. */
static void the_index_is_counted_and_bounded(void **state) {
  (void)state;
  const uint64_t fixed = UINT64_C(1) << 20; /* shards, first tables, order domains */
  struct rig r;
  rig_up(&r, 1 << 20, 1);
  swiftkv_stats s = stats(&r);
  /* 1 MiB of 1 KiB chunks on host, and the disk's records: the index holds them all. */
  assert_true(s.index_capacity_chunks >= 1024 + 32);
  assert_true(s.index_bytes <= 200 * s.index_capacity_chunks + fixed);
  assert_int_equal(s.requests_open, 0);
  rig_down(&r);

  swiftkv_model_desc d = SWIFTKV_MODEL_DESC_INIT;
  d.name = "tiny-chunks";
  d.num_layers = d.num_kv_heads = d.head_dim = d.block_tokens = d.chunk_tokens = 1;
  swiftkv_model_config mc = SWIFTKV_MODEL_CONFIG_INIT;
  mc.desc = &d;
  uint32_t model = 0;
  swiftkv_ctx *ctx = NULL;
  swiftkv_ctx_config c = SWIFTKV_CTX_CONFIG_INIT;
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  /* Resident memory too (a sanitizer's shadow memory would count in it), on a disk tier alone
   * (millions of records fit its 1 GiB): with a host budget the host tier makes its first slab on
   * a thread of its own as the model registers, budget memory that lands in the measurement or
   * not as that thread runs (25-28 MiB where it did, 13 MiB where not). */
  char dir[] = "/tmp/swiftkv-capi-XXXXXX";
  assert_non_null(mkdtemp(dir));
  c.host_budget_bytes = 0;
  c.disk_path = dir;
  c.disk_budget_bytes = UINT64_C(1) << 30;
  assert_ok(swiftkv_ctx_create(&ctx, &c));
  const uint64_t rss_before = rss_bytes();
  assert_ok(swiftkv_model_register(&model, ctx, &mc));
  const uint64_t rss_after = rss_bytes();
  s = (swiftkv_stats)SWIFTKV_STATS_INIT;
  assert_ok(swiftkv_stats_get(&s, ctx));
  assert_true(s.index_bytes <= (UINT64_C(16) << 20) + fixed);
  assert_true(s.index_capacity_chunks >= 80000);
  assert_true(rss_after - rss_before <= (UINT64_C(16) << 20) + fixed);
  swiftkv_ctx_destroy(ctx);
  char cmd[64];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  assert_int_equal(system(cmd), 0);
  c = (swiftkv_ctx_config)SWIFTKV_CTX_CONFIG_INIT;
#endif

  c.host_budget_bytes = UINT64_C(64) << 20;
  assert_ok(swiftkv_ctx_create(&ctx, &c));
  assert_ok(swiftkv_model_register(&model, ctx, &mc));
  s = (swiftkv_stats)SWIFTKV_STATS_INIT;
  assert_ok(swiftkv_stats_get(&s, ctx));
  assert_true(s.index_bytes <= (UINT64_C(16) << 20) + fixed);
  assert_true(s.index_capacity_chunks >= 80000); /* 16 MiB, counted to half-full tables */

  /* 200,000 chunks of 4 bytes: past the reservation, the index grows with them. */
  enum { N = 200000 };
  uint32_t *tokens = malloc(N * sizeof *tokens);
  unsigned char *kv = malloc(N * 4);
  assert_non_null(tokens);
  assert_non_null(kv);
  fill_tokens(tokens, N, 7);
  fill_kv(kv, N * 4, 7);
  uint64_t cached = 0;
  assert_ok(swiftkv_store(&cached, ctx, model, tokens, N, kv, N * 4));
  assert_int_equal(cached, N);
  assert_ok(swiftkv_stats_get(&s, ctx));
  assert_int_equal(s.chunks[SWIFTKV_TIER_HOST], N);
  assert_true(s.index_capacity_chunks >= N);
  assert_true(s.index_bytes <= 400 * (uint64_t)N + fixed);
  free(tokens);
  free(kv);
  swiftkv_ctx_destroy(ctx);
}

/* Chunks on disk are found again by a new context that registers the same model. */
static void a_new_context_finds_disk_chunks(void **state) {
  (void)state;
  struct rig r;
  rig_up(&r, 0, 1);
  uint32_t tokens[2 * CHUNK_TOKENS];
  fill_tokens(tokens, 2 * CHUNK_TOKENS, 5);
  static unsigned char kv[2 * CHUNK_BYTES], out[2 * CHUNK_BYTES];
  fill_kv(kv, sizeof kv, 5);
  uint64_t n = 0;
  assert_ok(swiftkv_store(&n, r.ctx, r.model, tokens, 2 * CHUNK_TOKENS, kv, sizeof kv));
  swiftkv_ctx_destroy(r.ctx);

  swiftkv_ctx_config c = SWIFTKV_CTX_CONFIG_INIT;
  c.disk_path = r.dir;
  c.disk_budget_bytes = 64 * (CHUNK_BYTES + 96);
  assert_ok(swiftkv_ctx_create(&r.ctx, &c));
  swiftkv_model_desc d = borrower_desc();
  swiftkv_model_config mc = SWIFTKV_MODEL_CONFIG_INIT;
  mc.desc = &d;
  assert_ok(swiftkv_model_register(&r.model, r.ctx, &mc));
  swiftkv_lookup_result l = SWIFTKV_LOOKUP_RESULT_INIT;
  assert_ok(swiftkv_lookup(&l, NULL, 0, r.ctx, r.model, tokens, 2 * CHUNK_TOKENS));
  assert_int_equal(l.prefix_tokens, 2 * CHUNK_TOKENS);
  assert_int_equal(l.chunks_per_tier[SWIFTKV_TIER_DISK], 2);
  assert_ok(swiftkv_retrieve(&n, r.ctx, r.model, tokens, 2 * CHUNK_TOKENS, 0, out, sizeof out));
  assert_memory_equal(out, kv, sizeof kv);
  /* Another model with the same tokens sees nothing. */
  d.name = "another";
  uint32_t other = 0;
  assert_ok(swiftkv_model_register(&other, r.ctx, &mc));
  assert_ok(swiftkv_lookup(&l, NULL, 0, r.ctx, other, tokens, 2 * CHUNK_TOKENS));
  assert_int_equal(l.chunks_per_tier[SWIFTKV_TIER_DISK], 0);
  rig_down(&r);
}

static uint32_t register_as(swiftkv_ctx *ctx, const char *identity, swiftkv_status want) {
  swiftkv_model_desc d = borrower_desc();
  d.identity = identity;
  swiftkv_model_config mc = SWIFTKV_MODEL_CONFIG_INIT;
  mc.desc = &d;
  uint32_t id = 0;
  assert_int_equal(swiftkv_model_register(&id, ctx, &mc), want);
  return id;
}

static uint64_t prefix_of(swiftkv_ctx *ctx, uint32_t model, const uint32_t *tokens, size_t n) {
  swiftkv_lookup_result l = SWIFTKV_LOOKUP_RESULT_INIT;
  assert_ok(swiftkv_lookup(&l, NULL, 0, ctx, model, tokens, n));
  return l.prefix_tokens;
}

/* Model identity: registrations differing only in it never share chunks, in memory or on disk
 * through a later context; NULL, "" and a version 1 descriptor are the same (no identity). */
static void identity_keeps_models_apart(void **state) {
  (void)state;
  struct rig r;
  rig_up(&r, 0, 1); /* r.model: "tiny-borrower", no identity */
  uint32_t tokens[2 * CHUNK_TOKENS];
  fill_tokens(tokens, 2 * CHUNK_TOKENS, 9);
  static unsigned char kv[2 * CHUNK_BYTES], out[2 * CHUNK_BYTES];
  fill_kv(kv, sizeof kv, 9);
  const uint32_t rev1 = register_as(r.ctx, "weights-rev-1", SWIFTKV_OK);
  uint64_t n = 0;
  assert_ok(swiftkv_store(&n, r.ctx, rev1, tokens, 2 * CHUNK_TOKENS, kv, sizeof kv));
  assert_int_equal(prefix_of(r.ctx, rev1, tokens, 2 * CHUNK_TOKENS), 2 * CHUNK_TOKENS);
  assert_int_equal(prefix_of(r.ctx, r.model, tokens, 2 * CHUNK_TOKENS), 0);
  const uint32_t rev2 = register_as(r.ctx, "weights-rev-2", SWIFTKV_OK);
  assert_int_equal(prefix_of(r.ctx, rev2, tokens, 2 * CHUNK_TOKENS), 0);
  register_as(r.ctx, "weights-rev-1", SWIFTKV_EBUSY);
  register_as(r.ctx, "", SWIFTKV_EBUSY); /* "" is no identity, like r.model's */
  assert_message_contains("with this geometry and identity");
  /* A caller built against version 1 (no identity field) is the model without identity. */
  swiftkv_model_desc v1 = borrower_desc();
  v1.identity = "never read";
  v1.size = (uint32_t)offsetof(swiftkv_model_desc, identity);
  v1.version = 1;
  swiftkv_model_config mc = SWIFTKV_MODEL_CONFIG_INIT;
  mc.desc = &v1;
  uint32_t id = 0;
  assert_int_equal(swiftkv_model_register(&id, r.ctx, &mc), SWIFTKV_EBUSY);
  /* Too long to be an identity: refused, nothing registered. */
  static char long_identity[5000];
  memset(long_identity, 'x', sizeof long_identity - 1);
  register_as(r.ctx, long_identity, SWIFTKV_EINVAL);
  assert_message_contains("identity is longer than 4096 bytes");
  swiftkv_ctx_destroy(r.ctx);

  /* On disk: a later context finds the chunks for the same identity only. */
  swiftkv_ctx_config c = SWIFTKV_CTX_CONFIG_INIT;
  c.disk_path = r.dir;
  c.disk_budget_bytes = 64 * (CHUNK_BYTES + 96);
  assert_ok(swiftkv_ctx_create(&r.ctx, &c));
  const uint32_t other = register_as(r.ctx, "weights-rev-2", SWIFTKV_OK);
  const uint32_t none = register_as(r.ctx, NULL, SWIFTKV_OK);
  const uint32_t same = register_as(r.ctx, "weights-rev-1", SWIFTKV_OK);
  assert_int_equal(prefix_of(r.ctx, other, tokens, 2 * CHUNK_TOKENS), 0);
  assert_int_equal(prefix_of(r.ctx, none, tokens, 2 * CHUNK_TOKENS), 0);
  assert_int_equal(prefix_of(r.ctx, same, tokens, 2 * CHUNK_TOKENS), 2 * CHUNK_TOKENS);
  assert_ok(swiftkv_retrieve(&n, r.ctx, same, tokens, 2 * CHUNK_TOKENS, 0, out, sizeof out));
  assert_memory_equal(out, kv, sizeof kv);
  rig_down(&r);
}

/* 32-byte names of a sequence's chunks, as an engine's chained block hashes would be. */
static void fill_names(unsigned char *names, size_t n, uint32_t seq) {
  for (size_t i = 0; i < n * 32; ++i) names[i] = (unsigned char)(seq * 131u + i * 17u + (i >> 5));
}

/* Chunks named by the caller: stored, found, loaded byte for byte, pinned, moved and cleared by
 * name, in host memory and on disk and by a later context; never found through the tokens or by
 * another model or identity; a name standing for another prefix (another first name) finds
 * nothing; bad names are EINVAL with nothing changed. */
static void named_chunks(void **state) {
  (void)state;
  struct rig r;
  rig_up(&r, 1 << 20, 1);
  unsigned char names[4 * 32];
  fill_names(names, 4, 1);
  static unsigned char kv[4 * CHUNK_BYTES], out[4 * CHUNK_BYTES];
  fill_kv(kv, sizeof kv, 3);
  uint64_t n = SENTINEL;
  assert_ok(swiftkv_store_named(&n, r.ctx, r.model, names, sizeof names, 32, 0, kv, sizeof kv));
  assert_int_equal(n, 4);
  swiftkv_lookup_result l = SWIFTKV_LOOKUP_RESULT_INIT;
  uint8_t res[4];
  assert_ok(swiftkv_lookup_named(&l, res, 4, r.ctx, r.model, names, sizeof names, 32));
  assert_int_equal(l.chunks, 4);
  assert_int_equal(l.prefix_tokens, 4 * CHUNK_TOKENS);
  assert_int_equal(res[3], SWIFTKV_TIER_HOST);
  assert_ok(swiftkv_retrieve_named(&n, r.ctx, r.model, names, sizeof names, 32, out, sizeof out));
  assert_int_equal(n, 4);
  assert_memory_equal(out, kv, sizeof kv);
  /* From the third name on: the chunks after it. */
  assert_ok(swiftkv_retrieve_named(&n, r.ctx, r.model, names + 64, 64, 32, out, CHUNK_BYTES));
  assert_int_equal(n, 1);
  assert_memory_equal(out, kv + 2 * CHUNK_BYTES, CHUNK_BYTES);

  /* The same bytes as tokens are not these chunks; nor are the names under another identity or
   * as 16-byte names (the first 16 bytes of each). */
  uint32_t tokens[4 * CHUNK_TOKENS];
  memcpy(tokens, names, sizeof names);
  assert_int_equal(prefix_of(r.ctx, r.model, tokens, 4 * CHUNK_TOKENS / 4), 0);
  const uint32_t other = register_as(r.ctx, "tenant-b", SWIFTKV_OK);
  assert_ok(swiftkv_lookup_named(&l, NULL, 0, r.ctx, other, names, sizeof names, 32));
  assert_int_equal(l.prefix_tokens, 0);
  assert_ok(swiftkv_lookup_named(&l, NULL, 0, r.ctx, r.model, names, 64, 16));
  assert_int_equal(l.chunks, 4);
  assert_int_equal(l.prefix_tokens, 0);
  /* A sequence whose first name differs finds nothing: the names of its later chunks differ
   * too in an engine's chain, and here they are the same bytes only by construction. */
  unsigned char changed[4 * 32];
  memcpy(changed, names, sizeof names);
  changed[0] ^= 1;
  assert_ok(swiftkv_lookup_named(&l, NULL, 0, r.ctx, r.model, changed, sizeof changed, 32));
  assert_int_equal(l.prefix_tokens, 0);
  assert_int_equal(l.loadable_tokens, 3 * CHUNK_TOKENS); /* names 1-3: the same chunks */

  /* Bad input: nothing stored, nothing found, the message says why. */
  const swiftkv_stats before = stats(&r);
  assert_int_equal(
      swiftkv_store_named(&n, r.ctx, r.model, changed, sizeof changed, 0, 0, kv, sizeof kv),
      SWIFTKV_EINVAL);
  assert_message_contains("name_bytes (0) must be 1 to 64");
  assert_int_equal(
      swiftkv_store_named(&n, r.ctx, r.model, changed, sizeof changed, 65, 0, kv, sizeof kv),
      SWIFTKV_EINVAL);
  assert_int_equal(swiftkv_store_named(&n, r.ctx, r.model, changed, 100, 32, 0, kv, sizeof kv),
                   SWIFTKV_EINVAL);
  assert_message_contains("not a whole number of 32-byte names");
  assert_int_equal(swiftkv_store_named(&n, r.ctx, r.model, NULL, 32, 32, 0, kv, CHUNK_BYTES),
                   SWIFTKV_EINVAL);
  assert_message_contains("names is NULL");
  assert_int_equal(
      swiftkv_store_named(&n, r.ctx, r.model, changed, sizeof changed, 32, 0, kv, CHUNK_BYTES),
      SWIFTKV_EINVAL);
  assert_message_contains("is not 4 chunks of 1024 bytes");
  assert_int_equal(
      swiftkv_store_named(&n, r.ctx, r.model, changed, 32, 32, UINT32_MAX, kv, CHUNK_BYTES),
      SWIFTKV_EINVAL);
  assert_int_equal(stats(&r).stores, before.stores);
  assert_int_equal(stats(&r).chunks[SWIFTKV_TIER_HOST], 4);

  /* Pinned by name: a clear leaves them; moved to disk by name; unpinned and cleared. */
  assert_ok(swiftkv_pin_named(r.ctx, r.model, names, 64, 32));
  uint64_t cleared = SENTINEL;
  assert_ok(
      swiftkv_clear_named(&cleared, r.ctx, r.model, SWIFTKV_TIERS_ALL, names, sizeof names, 32));
  assert_int_equal(cleared, 2);
  assert_int_equal(swiftkv_pin_named(r.ctx, r.model, names, sizeof names, 32),
                   SWIFTKV_ENOTFOUND); /* names 3 and 4 are gone */
  assert_ok(swiftkv_move_named(&n, r.ctx, r.model, names, 64, 32, SWIFTKV_TIER_DISK));
  assert_int_equal(n, 2);
  assert_ok(swiftkv_unpin_named(r.ctx, r.model, names, 64, 32));
  assert_int_equal(swiftkv_unpin_named(r.ctx, r.model, names, 64, 32), SWIFTKV_ENOTFOUND);
  assert_ok(swiftkv_store_named(&n, r.ctx, r.model, names + 64, 64, 32, 2, kv + 2 * CHUNK_BYTES,
                                2 * CHUNK_BYTES));
  assert_int_equal(n, 2);
  swiftkv_ctx_destroy(r.ctx);

  /* A later context on the same disk finds them under their names: the two moved there, and
   * the two in host memory that the first context wrote back as it closed. */
  swiftkv_ctx_config c = SWIFTKV_CTX_CONFIG_INIT;
  c.disk_path = r.dir;
  c.disk_budget_bytes = 64 * (CHUNK_BYTES + 96);
  assert_ok(swiftkv_ctx_create(&r.ctx, &c));
  r.model = register_as(r.ctx, NULL, SWIFTKV_OK);
  assert_ok(swiftkv_lookup_named(&l, res, 4, r.ctx, r.model, names, sizeof names, 32));
  assert_int_equal(l.prefix_tokens, 4 * CHUNK_TOKENS);
  assert_int_equal(l.chunks_per_tier[SWIFTKV_TIER_DISK], 4);
  memset(out, 0, sizeof out);
  assert_ok(swiftkv_retrieve_named(&n, r.ctx, r.model, names, sizeof names, 32, out, sizeof out));
  assert_int_equal(n, 4);
  assert_memory_equal(out, kv, sizeof kv);
  rig_down(&r);
}

/* The keys of named chunks are the ones the chunk event callback reports: a named chunk evicted
 * from a full tier is known by them; only the first keys_capacity / 2 are written; bad input is
 * EINVAL with nothing written. */
static void named_chunk_keys_match_the_events(void **state) { /* and their info */
  (void)state;
  struct rig r;
  rig_up(&r, 4096, 0); /* a host tier of exactly 4 chunks (1 KiB each) */
  unsigned char names[5 * 32];
  fill_names(names, 5, 2);
  static unsigned char kv[5 * CHUNK_BYTES];
  fill_kv(kv, sizeof kv, 2);
  uint64_t keys[10];
  memset(keys, 0, sizeof keys);
  assert_ok(swiftkv_chunk_keys_named(keys, 10, r.ctx, r.model, names, sizeof names, 32));
  assert_true(keys[0] != 0 || keys[1] != 0);
  assert_true(keys[0] != keys[2] || keys[1] != keys[3]);
  uint64_t n = 0;
  assert_ok(swiftkv_store_named(&n, r.ctx, r.model, names, 4 * 32, 32, 0, kv, 4 * CHUNK_BYTES));
  struct seen seen;
  memset(&seen, 0, sizeof seen);
  assert_ok(swiftkv_set_chunk_event_callback(r.ctx, on_event, &seen));
  assert_ok(swiftkv_store_named(&n, r.ctx, r.model, names + 4 * 32, 32, 32, 4, kv + 4 * CHUNK_BYTES,
                                CHUNK_BYTES));
  assert_int_equal(seen.count, 1); /* the least recently used, the first, evicted */
  assert_int_equal(seen.last.reason, SWIFTKV_CHUNK_EVICTED);
  assert_int_equal(seen.last.key_lo, keys[0]);
  assert_int_equal(seen.last.key_hi, keys[1]);
  assert_int_equal(seen.last.model, r.model);
  assert_ok(swiftkv_set_chunk_event_callback(r.ctx, NULL, NULL));
  /* Where each is, recording nothing: the evicted first is not cached, the rest are in host
   * memory, and neither hits nor misses are counted. */
  const swiftkv_stats before = stats(&r);
  swiftkv_chunk_info info[5];
  size_t chunks = 0;
  assert_ok(
      swiftkv_chunk_info_get_named(info, 5, &chunks, r.ctx, r.model, names, sizeof names, 32));
  assert_int_equal(chunks, 5);
  assert_int_equal(info[0].tier, SWIFTKV_TIER_DROPPED);
  assert_int_equal(info[0].stored_bytes, 0);
  for (int i = 1; i < 5; ++i) {
    assert_int_equal(info[i].tier, SWIFTKV_TIER_HOST);
    assert_int_equal(info[i].stored_bytes, CHUNK_BYTES);
  }
  assert_int_equal(stats(&r).hits[SWIFTKV_TIER_HOST], before.hits[SWIFTKV_TIER_HOST]);
  assert_int_equal(stats(&r).misses, before.misses);
  assert_int_equal(
      swiftkv_chunk_info_get_named(NULL, 1, &chunks, r.ctx, r.model, names, sizeof names, 32),
      SWIFTKV_EINVAL);
  /* Room for 1.5 keys: one written, nothing past it. */
  uint64_t few[3] = {SENTINEL, SENTINEL, SENTINEL};
  assert_ok(swiftkv_chunk_keys_named(few, 3, r.ctx, r.model, names, sizeof names, 32));
  assert_int_equal(few[0], keys[0]);
  assert_int_equal(few[2], SENTINEL);
  assert_int_equal(swiftkv_chunk_keys_named(NULL, 2, r.ctx, r.model, names, 32, 32),
                   SWIFTKV_EINVAL);
  assert_int_equal(swiftkv_chunk_keys_named(few, 3, r.ctx, r.model, names, 33, 32), SWIFTKV_EINVAL);
  assert_int_equal(few[0], keys[0]);
  rig_down(&r);
}

static swiftkv_ctx *disk_ctx(const char *dir, uint64_t host_bytes, uint32_t write_back) {
  swiftkv_ctx_config c = SWIFTKV_CTX_CONFIG_INIT;
  c.host_budget_bytes = host_bytes;
  c.eviction_policy = SWIFTKV_EVICT_LRU;
  c.demote_free_percent = 0;
  c.disk_path = dir;
  c.disk_budget_bytes = 64 * (CHUNK_BYTES + 96);
  c.write_back_on_close = write_back;
  swiftkv_ctx *ctx = NULL;
  assert_ok(swiftkv_ctx_create(&ctx, &c));
  return ctx;
}

static uint32_t model_in(swiftkv_ctx *ctx) { return register_as(ctx, NULL, SWIFTKV_OK); }

/* Chunks of conversations seq first..first+n-1 (one chunk each) found on disk. */
static uint64_t on_disk(swiftkv_ctx *ctx, uint32_t model, uint32_t first, uint32_t n) {
  uint64_t found = 0;
  for (uint32_t i = 0; i < n; ++i) {
    uint32_t t[CHUNK_TOKENS];
    fill_tokens(t, CHUNK_TOKENS, first + i);
    swiftkv_lookup_result l = SWIFTKV_LOOKUP_RESULT_INIT;
    assert_ok(swiftkv_lookup(&l, NULL, 0, ctx, model, t, CHUNK_TOKENS));
    found += l.chunks_per_tier[SWIFTKV_TIER_DISK];
  }
  return found;
}

static void store_conversations(swiftkv_ctx *ctx, uint32_t model, uint32_t first, uint32_t n) {
  static unsigned char kv[CHUNK_BYTES];
  for (uint32_t i = 0; i < n; ++i) {
    uint32_t t[CHUNK_TOKENS];
    fill_tokens(t, CHUNK_TOKENS, first + i);
    fill_kv(kv, sizeof kv, first + i);
    uint64_t got = 0;
    assert_ok(swiftkv_store(&got, ctx, model, t, CHUNK_TOKENS, kv, sizeof kv));
  }
}

/* Write-back on close: host chunks reach disk for a later context, by default and for a
 * version 6 caller; not when turned off; into a full disk only as far as its free room goes,
 * evicting nothing that was there. */
static void host_chunks_are_written_back_on_close(void **state) {
  (void)state;
  char dir[] = "/tmp/swiftkv-writeback-XXXXXX";
  assert_non_null(mkdtemp(dir));
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s/*", dir);

  swiftkv_ctx *ctx = disk_ctx(dir, 1 << 20, 1);
  uint32_t m = model_in(ctx);
  store_conversations(ctx, m, 100, 4);
  assert_int_equal(on_disk(ctx, m, 100, 4), 0); /* in host memory */
  swiftkv_ctx_destroy(ctx);
  ctx = disk_ctx(dir, 0, 1);
  assert_int_equal(on_disk(ctx, model_in(ctx), 100, 4), 4);
  swiftkv_ctx_destroy(ctx);
  assert_int_equal(system(cmd), 0);

  /* Off: dropped. A version 6 caller (no such field) gets the default, on. */
  ctx = disk_ctx(dir, 1 << 20, 0);
  store_conversations(ctx, model_in(ctx), 200, 4);
  swiftkv_ctx_destroy(ctx);
  swiftkv_ctx_config v6 = SWIFTKV_CTX_CONFIG_INIT;
  v6.host_budget_bytes = 1 << 20;
  v6.disk_path = dir;
  v6.disk_budget_bytes = 64 * (CHUNK_BYTES + 96);
  v6.write_back_on_close = 0; /* past the caller's size: never read */
  v6.size = (uint32_t)offsetof(swiftkv_ctx_config, write_back_on_close);
  v6.version = 6;
  assert_ok(swiftkv_ctx_create(&ctx, &v6));
  store_conversations(ctx, model_in(ctx), 300, 4);
  swiftkv_ctx_destroy(ctx);
  ctx = disk_ctx(dir, 0, 1);
  m = model_in(ctx);
  assert_int_equal(on_disk(ctx, m, 200, 4), 0);
  assert_int_equal(on_disk(ctx, m, 300, 4), 4);
  swiftkv_ctx_destroy(ctx);
  assert_int_equal(system(cmd), 0);

  /* More than the disk holds (64 records of budget, less the segment kept for cleaning):
   * what was on disk stays, and the write-back fills the rest. */
  const uint32_t resident = 24, in_host = 60;
  ctx = disk_ctx(dir, 0, 1);
  m = model_in(ctx);
  store_conversations(ctx, m, 2000, resident);
  assert_int_equal(on_disk(ctx, m, 2000, resident), resident);
  swiftkv_ctx_destroy(ctx);
  ctx = disk_ctx(dir, 1 << 20, 1);
  store_conversations(ctx, model_in(ctx), 3000, in_host);
  swiftkv_ctx_destroy(ctx);
  ctx = disk_ctx(dir, 0, 1);
  m = model_in(ctx);
  assert_int_equal(on_disk(ctx, m, 2000, resident), resident); /* nothing evicted */
  const uint64_t written = on_disk(ctx, m, 3000, in_host);
  assert_true(written > 0 && written < in_host && resident + written <= 64);
  swiftkv_ctx_destroy(ctx);
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  assert_int_equal(system(cmd), 0);
}

/* Segment files ("seg-*.kvlog") in dir. */
static int segments_in(const char *dir) {
  DIR *d = opendir(dir);
  assert_non_null(d);
  int n = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    n += strncmp(e->d_name, "seg-", 4) == 0 && strstr(e->d_name, ".kvlog") != NULL;
  }
  closedir(d);
  return n;
}

/* A disk path's owner cannot be bypassed. Its lock file removed while it holds the path: a
 * second context on the path is still refused (it got in, and after a reopen both writers'
 * newest conversations were gone). The path a link that is swapped to another directory: the
 * owner keeps writing where it began (it wrote its later segments into the new directory,
 * splitting its conversations), and the other directory is free for another context. */
static void a_disk_path_cannot_be_taken_from_its_owner(void **state) {
  (void)state;
  char top[] = "/tmp/swiftkv-owner-XXXXXX";
  assert_non_null(mkdtemp(top));
  char d1[64], d2[64], link[64], lock[80], cmd[96];
  snprintf(d1, sizeof d1, "%s/d1", top);
  snprintf(d2, sizeof d2, "%s/d2", top);
  snprintf(link, sizeof link, "%s/link", top);
  snprintf(lock, sizeof lock, "%s/.swiftkv.lock", d1);
  assert_int_equal(mkdir(d1, 0700), 0);
  assert_int_equal(mkdir(d2, 0700), 0);
  assert_int_equal(symlink(d1, link), 0);

  swiftkv_ctx *a = disk_ctx(link, 0, 1); /* no host memory: every chunk on disk at once */
  const uint32_t m = model_in(a);
  store_conversations(a, m, 10, 8);
  assert_int_equal(unlink(lock), 0);
  swiftkv_ctx_config c = SWIFTKV_CTX_CONFIG_INIT;
  c.disk_budget_bytes = 64 * (CHUNK_BYTES + 96);
  const char *paths[] = {d1, link};
  for (int i = 0; i < 2; ++i) {
    c.disk_path = paths[i];
    swiftkv_ctx *b = NULL;
    assert_int_equal(swiftkv_ctx_create(&b, &c), SWIFTKV_EBUSY);
    assert_message_contains("is in use by another context");
    assert_null(b);
  }

  assert_int_equal(unlink(link), 0);
  assert_int_equal(symlink(d2, link), 0);
  store_conversations(a, m, 20, 8);
  c.disk_path = link; /* d2 now: another directory, free */
  swiftkv_ctx *b = NULL;
  assert_ok(swiftkv_ctx_create(&b, &c));
  swiftkv_ctx_destroy(b);
  swiftkv_ctx_destroy(a);
  assert_int_equal(segments_in(d2), 0);
  swiftkv_ctx *again = disk_ctx(d1, 0, 1);
  const uint32_t m2 = model_in(again);
  assert_int_equal(on_disk(again, m2, 10, 8), 8);
  assert_int_equal(on_disk(again, m2, 20, 8), 8);
  swiftkv_ctx_destroy(again);
  snprintf(cmd, sizeof cmd, "rm -rf %s", top);
  assert_int_equal(system(cmd), 0);
}

/* The Prometheus text: exact values after known traffic; a buffer too small gets nothing and
 * learns the length; bad arguments are refused. */
static void metrics_text_exposes_the_counters(void **state) {
  (void)state;
  struct rig r;
  rig_up(&r, 1 << 20, 0);
  store_conversations(r.ctx, r.model, 1, 3);
  uint32_t t[CHUNK_TOKENS];
  fill_tokens(t, CHUNK_TOKENS, 99);
  swiftkv_lookup_result l = SWIFTKV_LOOKUP_RESULT_INIT;
  assert_ok(swiftkv_lookup(&l, NULL, 0, r.ctx, r.model, t, CHUNK_TOKENS)); /* a miss */
  size_t n = 0;
  assert_ok(swiftkv_metrics_text(NULL, 0, &n, r.ctx));
  assert_true(n > 1000);
  char small[16];
  memset(small, 'x', sizeof small);
  size_t m = 0;
  assert_ok(swiftkv_metrics_text(small, sizeof small, &m, r.ctx));
  assert_int_equal(m, n);
  assert_int_equal(small[0], 'x'); /* nothing written */
  char *text = malloc(n + 1);
  assert_non_null(text);
  assert_ok(swiftkv_metrics_text(text, n + 1, &m, r.ctx));
  assert_int_equal(m, n);
  assert_int_equal(strlen(text), n);
  assert_non_null(strstr(text,
                         "# TYPE swiftkv_chunks gauge\nswiftkv_chunks{tier=\"peer\"} 0\n"
                         "swiftkv_chunks{tier=\"host\"} 3\n"));
  assert_non_null(strstr(text, "\nswiftkv_stores_total 3\n"));
  assert_non_null(strstr(text, "\nswiftkv_lookup_misses_total 1\n"));
  assert_non_null(strstr(text, "\nswiftkv_requests_open 0\n"));
  assert_non_null(strstr(text, "\nswiftkv_coord_reclaim_seconds_total 0.000000000\n"));
  /* Every family has HELP then TYPE, and every sample line starts with swiftkv_. */
  size_t families = 0;
  for (char *line = strtok(text, "\n"); line != NULL; line = strtok(NULL, "\n")) {
    if (strncmp(line, "# HELP ", 7) == 0) {
      ++families;
    } else if (strncmp(line, "# TYPE ", 7) != 0) {
      assert_true(strncmp(line, "swiftkv_", 8) == 0);
    }
  }
  assert_true(families >= 30);
  free(text);
  assert_int_equal(swiftkv_metrics_text(NULL, 0, NULL, r.ctx), SWIFTKV_EINVAL);
  assert_int_equal(swiftkv_metrics_text(NULL, 8, &m, r.ctx), SWIFTKV_EINVAL);
  assert_int_equal(swiftkv_metrics_text(NULL, 0, &m, NULL), SWIFTKV_EINVAL);
  rig_down(&r);
}

/* f16 values in [0.5, 1): finite, as a codec's input must be. */
static void fill_halves(uint16_t *kv, size_t n, uint32_t seq) {
  for (size_t i = 0; i < n; ++i) kv[i] = (uint16_t)(0x3800u + ((i * 37u + seq * 101u) & 0x3ffu));
}

static swiftkv_codec_stats codec_stats(const struct rig *r) {
  swiftkv_codec_stats s = SWIFTKV_CODEC_STATS_INIT;
  assert_ok(swiftkv_codec_stats_get(&s, r->ctx));
  return s;
}

static void compression_through_the_api(void **state) {
  (void)state;
  struct rig r;
  rig_up(&r, 1 << 20, 0);
  uint32_t tokens[2 * CHUNK_TOKENS];
  fill_tokens(tokens, 2 * CHUNK_TOKENS, 9);
  static uint16_t kv[2 * CHUNK_BYTES / 2], out[2 * CHUNK_BYTES / 2];
  fill_halves(kv, 2 * CHUNK_BYTES / 2, 9);

  swiftkv_compression_config cc = SWIFTKV_COMPRESSION_CONFIG_INIT;
  cc.host.codec = SWIFTKV_CODEC_FP8;
  /* A lossy codec for a model that takes exact bytes only would make chunks it can never load:
   * refused, on either tier, and nothing changes (a store keeps its chunks exact). */
  assert_status(swiftkv_compression_set(r.ctx, r.model, &cc), SWIFTKV_EINVAL);
  swiftkv_compression_config lossy_disk = SWIFTKV_COMPRESSION_CONFIG_INIT;
  lossy_disk.disk.codec = SWIFTKV_CODEC_KIVI;
  lossy_disk.disk.bits = 4;
  lossy_disk.disk.group = 8;
  assert_status(swiftkv_compression_set(r.ctx, r.model, &lossy_disk), SWIFTKV_EINVAL);
  {
    uint32_t probe[CHUNK_TOKENS];
    fill_tokens(probe, CHUNK_TOKENS, 99);
    uint64_t n = 0;
    assert_ok(swiftkv_store(&n, r.ctx, r.model, probe, CHUNK_TOKENS, kv, CHUNK_BYTES));
    swiftkv_chunk_info pi[1];
    size_t pn = 0;
    assert_ok(swiftkv_chunk_info_get(pi, 1, &pn, r.ctx, r.model, probe, CHUNK_TOKENS));
    assert_int_equal(pn, 1);
    assert_int_equal(pi[0].codec, SWIFTKV_CODEC_RAW);
    assert_int_equal(pi[0].lossy, 0);
    swiftkv_codec_params fp8 = SWIFTKV_CODEC_PARAMS_INIT;
    fp8.codec = SWIFTKV_CODEC_FP8;
    uint64_t there = SENTINEL;
    assert_status(swiftkv_compress(&there, r.ctx, r.model, probe, CHUNK_TOKENS, &fp8),
                  SWIFTKV_EINVAL);
    assert_int_equal(there, SENTINEL);
    assert_ok(swiftkv_chunk_info_get(pi, 1, &pn, r.ctx, r.model, probe, CHUNK_TOKENS));
    assert_int_equal(pi[0].codec, SWIFTKV_CODEC_RAW);
  }
  cc.accept_lossy = 1;
  assert_ok(swiftkv_compression_set(r.ctx, r.model, &cc));
  /* Bad configs change nothing: kivi with 3 bits, fields another codec uses, no such codec. */
  swiftkv_compression_config bad = cc;
  bad.host.codec = SWIFTKV_CODEC_KIVI;
  bad.host.bits = 3;
  bad.host.group = 8;
  assert_status(swiftkv_compression_set(r.ctx, r.model, &bad), SWIFTKV_EINVAL);
  bad = cc;
  bad.disk.bits = 4;
  assert_status(swiftkv_compression_set(r.ctx, r.model, &bad), SWIFTKV_EINVAL);
  bad = cc;
  bad.host.codec = (swiftkv_codec)9;
  assert_status(swiftkv_compression_set(r.ctx, r.model, &bad), SWIFTKV_EINVAL);
  bad = cc;
  bad.host.reserved0 = 1;
  assert_status(swiftkv_compression_set(r.ctx, r.model, &bad), SWIFTKV_EINVAL);
  assert_status(swiftkv_compression_set(r.ctx, 99, &cc), SWIFTKV_ENOTFOUND);

  uint64_t cached = 0;
  assert_ok(swiftkv_store(&cached, r.ctx, r.model, tokens, 2 * CHUNK_TOKENS, kv, sizeof kv));
  assert_int_equal(cached, 2 * CHUNK_TOKENS);
  swiftkv_chunk_info info[3];
  size_t chunks = 0;
  assert_ok(swiftkv_chunk_info_get(info, 3, &chunks, r.ctx, r.model, tokens, 2 * CHUNK_TOKENS));
  assert_int_equal(chunks, 2);
  assert_int_equal(info[1].tier, SWIFTKV_TIER_HOST);
  assert_int_equal(info[1].codec, SWIFTKV_CODEC_FP8);
  assert_int_equal(info[1].lossy, 1);
  assert_true(info[1].stored_bytes < CHUNK_BYTES);
  swiftkv_codec_stats cs = codec_stats(&r);
  assert_int_equal(cs.chunks[SWIFTKV_CODEC_FP8][SWIFTKV_TIER_HOST], 2);
  assert_int_equal(cs.raw_bytes[SWIFTKV_CODEC_FP8][SWIFTKV_TIER_HOST], 2 * CHUNK_BYTES);
  assert_int_equal(cs.stored_bytes[SWIFTKV_CODEC_FP8][SWIFTKV_TIER_HOST], 2 * info[1].stored_bytes);
  /* and the probe chunk above, exact */
  assert_int_equal(stats(&r).bytes[SWIFTKV_TIER_HOST], 2 * info[1].stored_bytes + CHUNK_BYTES);

  /* The model goes back to exact bytes: the lossy chunks it made are not returned, and stay
   * cached until it accepts them again. */
  swiftkv_compression_config exact = SWIFTKV_COMPRESSION_CONFIG_INIT;
  assert_ok(swiftkv_compression_set(r.ctx, r.model, &exact));
  uint64_t loaded = SENTINEL;
  assert_ok(
      swiftkv_retrieve(&loaded, r.ctx, r.model, tokens, 2 * CHUNK_TOKENS, 0, out, sizeof out));
  assert_int_equal(loaded, 0);
  assert_int_equal(codec_stats(&r).lossy_refused, 1);
  assert_ok(swiftkv_compression_set(r.ctx, r.model, &cc));
  assert_ok(
      swiftkv_retrieve(&loaded, r.ctx, r.model, tokens, 2 * CHUNK_TOKENS, 0, out, sizeof out));
  assert_int_equal(loaded, 2 * CHUNK_TOKENS);
  /* FP8 E4M3 keeps 3 mantissa bits: each value moves by at most 2^-4 of itself, under 2^-4
   * here (all in [0.5, 1), where an f16 step is 2^-11): 128 steps and one for the rounding back
   * to f16. Some values must move, or the chunk was not encoded. */
  int moved = 0;
  for (size_t i = 0; i < 2 * CHUNK_BYTES / 2; ++i) {
    const int d = (int)out[i] - (int)kv[i];
    assert_true(d <= 129 && d >= -129);
    moved |= d != 0;
  }
  assert_true(moved);

  /* compress: raw decodes (lossy stays lossy); a chunk not cached is ENOTFOUND, nothing
   * changed; a bad params struct is EINVAL. */
  swiftkv_codec_params p = SWIFTKV_CODEC_PARAMS_INIT;
  uint64_t there = SENTINEL;
  uint32_t more[3 * CHUNK_TOKENS];
  memcpy(more, tokens, sizeof tokens);
  fill_tokens(more + 2 * CHUNK_TOKENS, CHUNK_TOKENS, 10);
  assert_status(swiftkv_compress(&there, r.ctx, r.model, more, 3 * CHUNK_TOKENS, &p),
                SWIFTKV_ENOTFOUND);
  assert_int_equal(there, SENTINEL);
  p.bits = 8;
  assert_status(swiftkv_compress(&there, r.ctx, r.model, tokens, 2 * CHUNK_TOKENS, &p),
                SWIFTKV_EINVAL);
  p.bits = 0;
  assert_ok(swiftkv_chunk_info_get(info, 3, &chunks, r.ctx, r.model, tokens, 2 * CHUNK_TOKENS));
  assert_int_equal(info[0].codec, SWIFTKV_CODEC_FP8);
  assert_ok(swiftkv_compress(&there, r.ctx, r.model, tokens, 2 * CHUNK_TOKENS, &p));
  assert_int_equal(there, 2);
  assert_ok(swiftkv_chunk_info_get(info, 3, &chunks, r.ctx, r.model, tokens, 2 * CHUNK_TOKENS));
  assert_int_equal(info[0].codec, SWIFTKV_CODEC_RAW);
  assert_int_equal(info[0].lossy, 1);
  assert_int_equal(info[0].stored_bytes, CHUNK_BYTES);

  /* KIVI 8-bit, groups of 8: the info names its parameters. */
  p.codec = SWIFTKV_CODEC_KIVI;
  p.bits = 8;
  p.group = 8;
  assert_ok(swiftkv_compress(&there, r.ctx, r.model, tokens, 2 * CHUNK_TOKENS, &p));
  assert_int_equal(there, 2);
  assert_ok(swiftkv_chunk_info_get(info, 3, &chunks, r.ctx, r.model, tokens, 2 * CHUNK_TOKENS));
  assert_int_equal(info[1].codec, SWIFTKV_CODEC_KIVI);
  assert_int_equal(info[1].bits, 8);
  assert_int_equal(info[1].group, 8);
  assert_int_equal(codec_stats(&r).chunks[SWIFTKV_CODEC_KIVI][SWIFTKV_TIER_HOST], 2);
  rig_down(&r);
}

/* Adaptive mode through the ABI: the policy's choices show in chunk_info; swiftkv_compress with
 * no params lets it choose; bad configs are EINVAL with nothing changed. */
static void adaptive_compression_through_the_api(void **state) {
  (void)state;
  struct rig r;
  rig_up(&r, 1 << 20, 0);
  uint32_t tokens[2 * CHUNK_TOKENS];
  fill_tokens(tokens, 2 * CHUNK_TOKENS, 11);
  static uint16_t kv[2 * CHUNK_BYTES / 2];
  fill_halves(kv, 2 * CHUNK_BYTES / 2, 11);

  swiftkv_compression_config cc;
  swiftkv_compression_config_init(&cc);
  assert_int_equal(cc.size, sizeof cc);
  assert_true(cc.alpha == 1.0 && cc.reuse_horizon_s == 60.0 && cc.host_gbps == 25.0);
  assert_true(cc.methods[7].quality == -1.0 &&
              cc.methods[7].params.size == sizeof cc.methods[7].params);
  cc.adaptive = 1;
  cc.accept_lossy = 1;
  cc.alpha = 1e6; /* quality first: the chunks stay exact */
  cc.n_methods = 1;
  cc.methods[0].params.codec = SWIFTKV_CODEC_KIVI;
  cc.methods[0].params.bits = 4;
  cc.methods[0].params.group = 8;
  cc.methods[0].decode_gbps = 1e6; /* decoded on a GPU: next to free */
  uint64_t there = SENTINEL;
  /* The policy chooses only in adaptive mode. */
  assert_status(swiftkv_compress(&there, r.ctx, r.model, tokens, 0, NULL), SWIFTKV_EINVAL);
  assert_int_equal(there, SENTINEL);

  swiftkv_compression_config bad = cc;
  bad.host.codec = SWIFTKV_CODEC_FP8;
  assert_status(swiftkv_compression_set(r.ctx, r.model, &bad), SWIFTKV_EINVAL);
  bad = cc;
  bad.n_methods = SWIFTKV_MAX_COMPRESSION_METHODS + 1;
  assert_status(swiftkv_compression_set(r.ctx, r.model, &bad), SWIFTKV_EINVAL);
  bad = cc;
  bad.accept_lossy = 0;
  assert_status(swiftkv_compression_set(r.ctx, r.model, &bad), SWIFTKV_EINVAL);
  bad = cc;
  bad.alpha = -1;
  assert_status(swiftkv_compression_set(r.ctx, r.model, &bad), SWIFTKV_EINVAL);
  bad = cc;
  bad.disk_gbps = 0;
  assert_status(swiftkv_compression_set(r.ctx, r.model, &bad), SWIFTKV_EINVAL);
  bad = cc;
  bad.methods[0].params.codec = SWIFTKV_CODEC_RAW;
  bad.methods[0].params.bits = 0;
  bad.methods[0].params.group = 0;
  assert_status(swiftkv_compression_set(r.ctx, r.model, &bad), SWIFTKV_EINVAL);
  bad = cc;
  bad.methods[0].quality = 2;
  assert_status(swiftkv_compression_set(r.ctx, r.model, &bad), SWIFTKV_EINVAL);
  bad = cc;
  bad.methods[0].decode_gbps = -1;
  assert_status(swiftkv_compression_set(r.ctx, r.model, &bad), SWIFTKV_EINVAL);
  bad = cc;
  bad.adaptive = 2;
  assert_status(swiftkv_compression_set(r.ctx, r.model, &bad), SWIFTKV_EINVAL);
  bad = cc;
  bad.reserved0 = 1;
  assert_status(swiftkv_compression_set(r.ctx, r.model, &bad), SWIFTKV_EINVAL);
  assert_status(swiftkv_compress(&there, r.ctx, r.model, tokens, 0, NULL), SWIFTKV_EINVAL);

  assert_ok(swiftkv_compression_set(r.ctx, r.model, &cc));
  uint64_t cached = 0;
  assert_ok(swiftkv_store(&cached, r.ctx, r.model, tokens, 2 * CHUNK_TOKENS, kv, sizeof kv));
  assert_int_equal(cached, 2 * CHUNK_TOKENS);
  swiftkv_chunk_info info[2];
  size_t chunks = 0;
  assert_ok(swiftkv_chunk_info_get(info, 2, &chunks, r.ctx, r.model, tokens, 2 * CHUNK_TOKENS));
  assert_int_equal(info[0].codec, SWIFTKV_CODEC_RAW);
  assert_int_equal(info[1].codec, SWIFTKV_CODEC_RAW);
  /* Quality worth nothing: the policy compresses what is there. */
  cc.alpha = 0;
  assert_ok(swiftkv_compression_set(r.ctx, r.model, &cc));
  assert_ok(swiftkv_compress(&there, r.ctx, r.model, tokens, 2 * CHUNK_TOKENS, NULL));
  assert_int_equal(there, 2);
  assert_ok(swiftkv_chunk_info_get(info, 2, &chunks, r.ctx, r.model, tokens, 2 * CHUNK_TOKENS));
  for (int i = 0; i < 2; ++i) {
    assert_int_equal(info[i].codec, SWIFTKV_CODEC_KIVI);
    assert_int_equal(info[i].bits, 4);
    assert_int_equal(info[i].group, 8);
    assert_int_equal(info[i].lossy, 1);
    assert_true(info[i].stored_bytes < CHUNK_BYTES);
  }
  swiftkv_compression_method m;
  swiftkv_compression_method_init(&m);
  assert_true(m.quality == -1.0 && m.decode_gbps == 0.0);
  assert_int_equal(m.params.codec, SWIFTKV_CODEC_RAW);
  rig_down(&r);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(store_retrieve_lookup),
      cmocka_unit_test(bad_input_changes_nothing),
      cmocka_unit_test(pins_clear_and_move),
      cmocka_unit_test(borrow_and_give_back),
      cmocka_unit_test(regions_take_the_budget_of_empty_slabs),
      cmocka_unit_test(callback_calls_the_library),
      cmocka_unit_test(callback_on_the_background_thread),
      cmocka_unit_test(a_new_context_finds_disk_chunks),
      cmocka_unit_test(identity_keeps_models_apart),
      cmocka_unit_test(named_chunks),
      cmocka_unit_test(named_chunk_keys_match_the_events),
      cmocka_unit_test(host_chunks_are_written_back_on_close),
      cmocka_unit_test(a_disk_path_cannot_be_taken_from_its_owner),
      cmocka_unit_test(metrics_text_exposes_the_counters),
      cmocka_unit_test(a_failed_store_reports_what_it_kept),
      cmocka_unit_test(the_index_is_counted_and_bounded),
      cmocka_unit_test(compression_through_the_api),
      cmocka_unit_test(adaptive_compression_through_the_api),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
