/* The elastic region through the public API on the host backend: lending-unit sizes, block-major
 * and borrower addresses, Algorithm 1 applied with an injected clock, the reclaim protocol,
 * lease expiry, bad input leaving everything unchanged, and concurrent lenders and borrowers. */
#define _POSIX_C_SOURCE 200809L /* nanosleep */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "test_support.h"

/* A clock the tests move by hand, in nanoseconds. */
static uint64_t fake_now(void *user_data) { return *(const uint64_t *)user_data; }
#define MS UINT64_C(1000000)

/* Small geometries so regions stay a few MiB: the lender's full block is 2*4*16*2*8*2 = 4 KiB;
 * the borrower's chunk (3 layers, 32 tokens, 1 head, 16 dims) is 3*2*32*16*2 = 6 KiB; their
 * lending unit is lcm(4096, 6144) = 12 KiB = 3 lender blocks = 2 borrower chunks. */
static swiftkv_model_desc small_lender(void) {
  swiftkv_model_desc m = model(4, 2, 8, 16);
  m.chunk_tokens = 32;
  return m;
}
static swiftkv_model_desc small_borrower(void) {
  swiftkv_model_desc m = model(3, 1, 16, 16);
  m.chunk_tokens = 32;
  return m;
}

typedef struct fixture {
  swiftkv_ctx *ctx;
  swiftkv_elastic *e;
  swiftkv_model_desc lender, borrower;
  uint64_t now;
} fixture;

static swiftkv_ctx *host_ctx(uint64_t budget) {
  swiftkv_ctx_config c = SWIFTKV_CTX_CONFIG_INIT;
  c.host_budget_bytes = budget;
  swiftkv_ctx *ctx = NULL;
  assert_ok(swiftkv_ctx_create(&ctx, &c));
  return ctx;
}

static swiftkv_elastic_config small_config(fixture *f, uint64_t capacity, uint64_t owned) {
  swiftkv_elastic_config c = SWIFTKV_ELASTIC_CONFIG_INIT;
  c.lender = &f->lender;
  c.borrower = &f->borrower;
  c.capacity_blocks = capacity;
  c.owned_blocks = owned;
  c.window_ms = 1000;
  c.lease_ms = 500;
  c.clock = fake_now;
  c.clock_user_data = &f->now;
  return c;
}

static int setup(void **state) {
  fixture *f = calloc(1, sizeof *f);
  f->lender = small_lender();
  f->borrower = small_borrower();
  f->now = 1000 * MS;
  f->ctx = host_ctx(UINT64_C(64) << 20);
  swiftkv_elastic_config c = small_config(f, 30, 6); /* 10 units, 2 owned */
  assert_ok(swiftkv_elastic_create(&f->e, f->ctx, &c));
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  swiftkv_elastic_destroy(f->e);
  swiftkv_ctx_destroy(f->ctx);
  free(f);
  return 0;
}

static swiftkv_elastic_stats stats(const swiftkv_elastic *e) {
  swiftkv_elastic_stats s = SWIFTKV_ELASTIC_STATS_INIT;
  assert_ok(swiftkv_elastic_stats_get(&s, e));
  assert_int_equal(s.owned_blocks + s.lent_blocks + s.free_blocks, s.capacity_blocks);
  return s;
}

static void assert_same_stats(const swiftkv_elastic_stats *a, const swiftkv_elastic_stats *b) {
  assert_memory_equal(a, b, sizeof *a);
}

/* SwiftCache Table 2 pairs in the chunk form of Eq. 6-9. A Qwen3-8B block is 36 * 64 KiB =
 * 2^18 * 9 bytes and a Qwen3-32B chunk 64 * 1 MiB = 2^26: 256 lender blocks = 9 chunks. An LWM
 * block is 2^23 and a Qwen3-8B chunk 36 MiB = 2^22 * 9: 9 LWM blocks = 2 Qwen3-8B chunks. */
static void test_lend_unit_table2(void **state) {
  (void)state;
  swiftkv_model_desc q8 = qwen3_8b(), q32 = qwen3_32b(), lwm = lwm_1m_text();
  uint64_t chunks = SENTINEL, blocks = SENTINEL;
  assert_ok(swiftkv_geometry_lend_unit(&chunks, &blocks, &q32, &q8));
  assert_int_equal(chunks, 9);
  assert_int_equal(blocks, 256);
  assert_ok(swiftkv_geometry_lend_unit(&chunks, &blocks, &q8, &lwm));
  assert_int_equal(chunks, 2);
  assert_int_equal(blocks, 9);
  swiftkv_model_desc bad = q8;
  bad.chunk_tokens = 24;
  chunks = blocks = SENTINEL;
  assert_status(swiftkv_geometry_lend_unit(&chunks, &blocks, &bad, &q8), SWIFTKV_EINVAL);
  assert_message_contains("borrower->chunk_tokens");
  assert_true(chunks == SENTINEL && blocks == SENTINEL);
  assert_status(swiftkv_geometry_lend_unit(NULL, &blocks, &q32, &q8), SWIFTKV_EINVAL);
}

static void test_created_state_and_view(void **state) {
  fixture *f = *state;
  swiftkv_elastic_stats s = stats(f->e);
  assert_int_equal(s.capacity_blocks, 30);
  assert_int_equal(s.owned_blocks, 6);
  assert_int_equal(s.ready_blocks, 6);
  assert_int_equal(s.free_blocks, 24);
  assert_int_equal(s.unit_lender_blocks, 3);
  assert_int_equal(s.unit_borrower_chunks, 2);
  assert_int_equal(s.region_bytes, 30 * 4096);
  assert_int_equal(s.committed_bytes, 6 * 4096); /* only the owned part holds memory */
  assert_int_equal(s.memory_kind, SWIFTKV_MEMORY_HOST_MEMFD);
  assert_int_equal(s.device, SWIFTKV_DEVICE_HOST);

  /* Layer 2 of (n_blocks, 4 layers, 2, 16 tokens, 2 heads, 8 dims) in f16: a layer block is
   * 1 KiB, K and V 512 bytes each, a token 32 bytes, a head 16. */
  swiftkv_layer_view v0 = SWIFTKV_LAYER_VIEW_INIT, v = SWIFTKV_LAYER_VIEW_INIT;
  assert_ok(swiftkv_elastic_layer_view(&v0, f->e, 0));
  assert_ok(swiftkv_elastic_layer_view(&v, f->e, 2));
  assert_ptr_equal((char *)v.base, (char *)v0.base + 2 * 1024);
  assert_int_equal(v.page_stride, 4096);
  assert_int_equal(v.k_offset, 0);
  assert_int_equal(v.v_offset, 512);
  assert_int_equal(v.token_stride, 32);
  assert_int_equal(v.head_stride, 16);
  assert_int_equal(v.num_pages, 30);
  assert_int_equal(v.device, SWIFTKV_DEVICE_HOST);

  /* V of block 5, layer 2, token 7, head 1 is byte 5*4096 + 2*1024 + 512 + 7*32 + 16. */
  char *p = (char *)v.base + 5 * v.page_stride + v.v_offset + 7 * v.token_stride + v.head_stride;
  assert_ptr_equal(p, (char *)v0.base + 5 * 4096 + 2 * 1024 + 512 + 7 * 32 + 16);
  *p = 42;

  swiftkv_layer_view keep = v;
  assert_status(swiftkv_elastic_layer_view(&v, f->e, 4), SWIFTKV_EINVAL);
  assert_message_contains("layer 4");
  assert_memory_equal(&keep, &v, sizeof v);
}

/* The borrower sees a lease as its own chunks: chunk c, layer l at offset + c * chunk_stride +
 * l * layer_stride, one contiguous piece. */
static void test_lease_in_borrower_geometry(void **state) {
  fixture *f = *state;
  swiftkv_lease l = SWIFTKV_LEASE_INIT;
  assert_ok(swiftkv_elastic_lend(&l, f->e, 2));
  /* The highest free units go first: units 8 and 9, blocks 24..29. */
  assert_int_equal(l.first_block, 24);
  assert_int_equal(l.blocks, 6);
  assert_int_equal(l.chunks, 4);
  assert_int_equal(l.offset, 24 * 4096);
  assert_int_equal(l.bytes, 6 * 4096);
  assert_int_equal(l.chunk_stride, 6144);
  assert_int_equal(l.layer_stride, 2048);
  assert_int_equal(l.expires_ns, f->now + 500 * MS);
  assert_int_equal(l.reclaim_requested, 0);
  assert_true(l.id != 0);
  swiftkv_layer_view v0 = SWIFTKV_LAYER_VIEW_INIT;
  assert_ok(swiftkv_elastic_layer_view(&v0, f->e, 0));
  assert_ptr_equal(l.data, (char *)v0.base + l.offset);
  /* Write every layer of every chunk with its own byte and read the region back as a whole. */
  for (uint64_t c = 0; c < l.chunks; ++c) {
    for (uint64_t layer = 0; layer < 3; ++layer) {
      memset((char *)l.data + c * l.chunk_stride + layer * l.layer_stride, (int)(c * 3 + layer + 1),
             l.layer_stride);
    }
  }
  const unsigned char *bytes = l.data;
  for (uint64_t i = 0; i < l.bytes; ++i) {
    assert_int_equal(bytes[i], i / 2048 + 1); /* contiguous: piece k is byte k + 1 */
  }
  swiftkv_elastic_stats s = stats(f->e);
  assert_int_equal(s.lent_blocks, 6);
  assert_int_equal(s.free_blocks, 18);
  assert_int_equal(s.leases, 1);
  assert_int_equal(s.committed_bytes, 12 * 4096);

  swiftkv_lease got = SWIFTKV_LEASE_INIT;
  assert_ok(swiftkv_elastic_lease_get(&got, f->e, l.id));
  assert_memory_equal(&got, &l, sizeof l);
  assert_ok(swiftkv_elastic_release(f->e, l.id));
  s = stats(f->e);
  assert_int_equal(s.lent_blocks, 0);
  assert_int_equal(s.committed_bytes, 6 * 4096); /* released memory goes back */
  assert_status(swiftkv_elastic_release(f->e, l.id), SWIFTKV_ENOTFOUND);
  assert_message_contains("not held");
  assert_status(swiftkv_elastic_lease_get(&got, f->e, l.id), SWIFTKV_ENOTFOUND);
}

/* The §3.4 mixed pair at real size: a Qwen3-8B lender lending to a Qwen3-32B borrower. One unit
 * is 256 lender blocks (576 MiB) holding 9 borrower chunks of 64 MiB, each layer 1 MiB. */
static void test_qwen_pair_addresses(void **state) {
  (void)state;
  swiftkv_model_desc q8 = qwen3_8b(), q32 = qwen3_32b();
  const uint64_t block = UINT64_C(2359296), unit = 256 * block;
  swiftkv_ctx *ctx = host_ctx(2 * unit);
  swiftkv_elastic_config c = SWIFTKV_ELASTIC_CONFIG_INIT;
  c.lender = &q8;
  c.borrower = &q32;
  c.capacity_blocks = 512;
  swiftkv_elastic *e = NULL;
  assert_ok(swiftkv_elastic_create(&e, ctx, &c));
  swiftkv_lease l = SWIFTKV_LEASE_INIT;
  assert_ok(swiftkv_elastic_lend(&l, e, 1));
  assert_int_equal(l.first_block, 256);
  assert_int_equal(l.blocks, 256);
  assert_int_equal(l.chunks, 9);
  assert_int_equal(l.offset, unit);
  assert_int_equal(l.bytes, unit);
  assert_int_equal(l.chunk_stride, UINT64_C(64) << 20);
  assert_int_equal(l.layer_stride, UINT64_C(1) << 20);
  /* The last layer of the last chunk ends exactly at the lease's end. */
  assert_int_equal(8 * l.chunk_stride + 63 * l.layer_stride + l.layer_stride, l.bytes);
  /* Lender block 300, layer 35, V, token 15, head 7 lies inside the lease, at chunk 0's
   * byte (300 - 256) * block + 35 * 65536 + 32768 + 15 * 2048 + 7 * 256. */
  swiftkv_layer_view v = SWIFTKV_LAYER_VIEW_INIT;
  assert_ok(swiftkv_elastic_layer_view(&v, e, 35));
  char *lender_byte =
      (char *)v.base + 300 * v.page_stride + v.v_offset + 15 * v.token_stride + 7 * v.head_stride;
  const uint64_t in_lease = 44 * block + 35 * 65536 + 32768 + 15 * 2048 + 7 * 256;
  assert_ptr_equal(lender_byte, (char *)l.data + in_lease);
  /* ... which is borrower chunk 1, layer 37 (in_lease is 101.25 MiB: 64 layers of chunk 0, then
   * 37 whole layers of chunk 1). */
  assert_int_equal(in_lease / l.chunk_stride, 1);
  assert_int_equal(in_lease % l.chunk_stride / l.layer_stride, 37);
  ((char *)l.data)[in_lease] = 7;
  assert_int_equal(*lender_byte, 7);
  swiftkv_elastic_destroy(e);
  swiftkv_ctx_destroy(ctx);
}

/* Algorithm 1 applied: growth by whole units for a request, shrink after the window. */
static void test_scale_up_and_down(void **state) {
  fixture *f = *state;
  uint64_t blocks = SENTINEL, chunks = SENTINEL;
  /* 96 tokens need 6 blocks: owned already. */
  assert_ok(swiftkv_elastic_scale_for_request(&blocks, &chunks, f->e, 96));
  assert_int_equal(blocks, 0);
  assert_int_equal(chunks, 0);
  /* 97 tokens need 7 blocks: one more unit (3 blocks = 2 borrower chunks). */
  assert_ok(swiftkv_elastic_scale_for_request(&blocks, &chunks, f->e, 97));
  assert_int_equal(blocks, 3);
  assert_int_equal(chunks, 2);
  /* 300 tokens need 19 blocks: ceil((19 - 9) / 3) = 4 units. */
  assert_ok(swiftkv_elastic_scale_for_request(&blocks, &chunks, f->e, 300));
  assert_int_equal(blocks, 12);
  assert_int_equal(chunks, 8);
  assert_int_equal(stats(f->e).owned_blocks, 21);
  /* Within the window the 300-token request keeps 19 blocks needed: shrink 21 -> 21 - 0. */
  f->now += 900 * MS;
  assert_ok(swiftkv_elastic_tick(&blocks, &chunks, f->e, 0));
  assert_int_equal(blocks, 0);
  /* Later a 40-token request alone remains in the window (3 blocks): floor((21 - 3) / 3) = 6
   * units, but the engine still uses 10 blocks, so only down to 12 (3 units). */
  f->now += 200 * MS;
  assert_ok(swiftkv_elastic_scale_for_request(&blocks, &chunks, f->e, 40));
  f->now += 900 * MS;
  assert_ok(swiftkv_elastic_tick(&blocks, &chunks, f->e, 10));
  assert_int_equal(blocks, 9);
  assert_int_equal(chunks, 6);
  swiftkv_elastic_stats s = stats(f->e);
  assert_int_equal(s.owned_blocks, 12);
  assert_int_equal(s.scale_ups, 2);
  assert_int_equal(s.scale_downs, 1);
  assert_int_equal(s.committed_bytes, 12 * 4096);
  /* Once the window is empty and the engine idle, everything goes. */
  f->now += 2000 * MS;
  assert_ok(swiftkv_elastic_tick(&blocks, &chunks, f->e, 0));
  assert_int_equal(blocks, 12);
  assert_int_equal(stats(f->e).owned_blocks, 0);
  assert_int_equal(stats(f->e).committed_bytes, 0);
}

/* swiftkv_elastic_resize sets the owned part itself: growing over free units commits them,
 * growing over a lease asks it back (IN_PROGRESS until released), shrinking gives the memory up,
 * no request is remembered for ScaleDown, and a bad count changes nothing. */
static void test_resize(void **state) {
  fixture *f = *state;
  uint64_t blocks = SENTINEL, chunks = SENTINEL;
  assert_ok(swiftkv_elastic_resize(&blocks, &chunks, f->e, 12));
  assert_int_equal(blocks, 6);
  assert_int_equal(chunks, 4);
  swiftkv_elastic_stats s = stats(f->e);
  assert_int_equal(s.owned_blocks, 12);
  assert_int_equal(s.ready_blocks, 12);
  assert_int_equal(s.committed_bytes, 12 * 4096);
  assert_int_equal(s.scale_ups, 1);
  assert_ok(swiftkv_elastic_resize(&blocks, &chunks, f->e, 12)); /* already: nothing */
  assert_int_equal(blocks, 0);
  assert_int_equal(stats(f->e).scale_ups, 1);
  /* Units 4..9 lent (blocks 12..29); growing to 21 blocks takes 3 of them back. */
  swiftkv_lease l = SWIFTKV_LEASE_INIT;
  assert_ok(swiftkv_elastic_lend(&l, f->e, 6));
  assert_int_equal(l.first_block, 12);
  assert_status(swiftkv_elastic_resize(&blocks, &chunks, f->e, 21), SWIFTKV_IN_PROGRESS);
  assert_int_equal(blocks, 9);
  assert_int_equal(chunks, 6);
  s = stats(f->e);
  assert_int_equal(s.owned_blocks, 21);
  assert_int_equal(s.ready_blocks, 12);
  assert_int_equal(s.reclaiming_blocks, 9);
  swiftkv_lease got = SWIFTKV_LEASE_INIT;
  assert_ok(swiftkv_elastic_lease_get(&got, f->e, l.id));
  assert_int_equal(got.reclaim_requested, 1);
  assert_ok(swiftkv_elastic_release(f->e, l.id));
  s = stats(f->e);
  assert_int_equal(s.ready_blocks, 21);
  assert_int_equal(s.lent_blocks, 0);
  assert_int_equal(s.free_blocks, 9);
  /* Back down to 3 blocks: 18 given up, their memory with them. */
  assert_ok(swiftkv_elastic_resize(&blocks, &chunks, f->e, 3));
  assert_int_equal(blocks, 18);
  assert_int_equal(chunks, 12);
  s = stats(f->e);
  assert_int_equal(s.owned_blocks, 3);
  assert_int_equal(s.committed_bytes, 3 * 4096);
  assert_int_equal(s.scale_downs, 1);
  /* No request was remembered: within the window, tick takes the rest (scale_for_request of
   * as many tokens would have kept them). */
  assert_ok(swiftkv_elastic_resize(&blocks, &chunks, f->e, 12));
  f->now += 10 * MS;
  assert_ok(swiftkv_elastic_tick(&blocks, &chunks, f->e, 0));
  assert_int_equal(blocks, 12);
  assert_int_equal(stats(f->e).owned_blocks, 0);
  /* Bad counts change nothing. */
  assert_ok(swiftkv_elastic_resize(&blocks, &chunks, f->e, 6));
  const swiftkv_elastic_stats before = stats(f->e);
  blocks = chunks = SENTINEL;
  assert_status(swiftkv_elastic_resize(&blocks, &chunks, f->e, 7), SWIFTKV_EINVAL);
  assert_message_contains("whole number of lending units of 3 blocks");
  assert_status(swiftkv_elastic_resize(&blocks, &chunks, f->e, 33), SWIFTKV_EINVAL);
  assert_message_contains("capacity of 30");
  assert_true(blocks == SENTINEL && chunks == SENTINEL);
  assert_status(swiftkv_elastic_resize(NULL, &chunks, f->e, 3), SWIFTKV_EINVAL);
  assert_status(swiftkv_elastic_resize(&blocks, &chunks, NULL, 3), SWIFTKV_EINVAL);
  const swiftkv_elastic_stats after = stats(f->e);
  assert_same_stats(&before, &after);
}

/* Lender bytes in kept blocks survive every resize, lend and release. */
static void test_lender_bytes_untouched(void **state) {
  fixture *f = *state;
  uint64_t blocks, chunks;
  assert_ok(swiftkv_elastic_scale_for_request(&blocks, &chunks, f->e, 15 * 16));
  swiftkv_layer_view v = SWIFTKV_LAYER_VIEW_INIT;
  assert_ok(swiftkv_elastic_layer_view(&v, f->e, 0));
  unsigned char *base = v.base;
  for (uint64_t i = 0; i < 15 * 4096; ++i) base[i] = (unsigned char)(i * 7 + 3);
  swiftkv_lease l = SWIFTKV_LEASE_INIT;
  assert_ok(swiftkv_elastic_lend(&l, f->e, 3));
  memset(l.data, 0xEE, l.bytes);
  assert_ok(swiftkv_elastic_scale_for_request(&blocks, &chunks, f->e, 18 * 16));
  f->now += 5000 * MS; /* lease and window both expire */
  assert_ok(swiftkv_elastic_tick(&blocks, &chunks, f->e, 15));
  assert_int_equal(stats(f->e).owned_blocks, 15);
  for (uint64_t i = 0; i < 15 * 4096; ++i) assert_int_equal(base[i], (unsigned char)(i * 7 + 3));
}

/* Growing into lent memory asks the lease back; the blocks become ready only on release. */
static void test_reclaim_protocol(void **state) {
  fixture *f = *state;
  swiftkv_lease a = SWIFTKV_LEASE_INIT, b = SWIFTKV_LEASE_INIT;
  assert_ok(swiftkv_elastic_lend(&a, f->e, 5)); /* units 5..9 */
  assert_ok(swiftkv_elastic_lend(&b, f->e, 5)); /* units 2..4 */
  assert_int_equal(a.first_block, 15);
  assert_int_equal(b.first_block, 6);
  assert_int_equal(b.blocks, 9);
  swiftkv_lease none = SWIFTKV_LEASE_INIT;
  assert_status(swiftkv_elastic_lend(&none, f->e, 1), SWIFTKV_ENOMEM);
  assert_message_contains("no free lending unit");
  size_t n = 99;
  assert_ok(swiftkv_elastic_pending_reclaims(NULL, 0, &n, f->e));
  assert_int_equal(n, 0);
  /* 150 tokens need 10 blocks: 2 units, inside lease b. */
  uint64_t blocks, chunks;
  assert_status(swiftkv_elastic_scale_for_request(&blocks, &chunks, f->e, 150),
                SWIFTKV_IN_PROGRESS);
  assert_int_equal(blocks, 6);
  swiftkv_elastic_stats s = stats(f->e);
  assert_int_equal(s.owned_blocks, 12);
  assert_int_equal(s.ready_blocks, 6);
  assert_int_equal(s.reclaiming_blocks, 6);
  assert_int_equal(s.lent_blocks, 18); /* b's third unit and all of a */
  assert_int_equal(s.reclaims_requested, 1);
  uint64_t ids[4] = {0};
  assert_ok(swiftkv_elastic_pending_reclaims(ids, 4, &n, f->e));
  assert_int_equal(n, 1);
  assert_int_equal(ids[0], b.id);
  swiftkv_lease got = SWIFTKV_LEASE_INIT;
  assert_ok(swiftkv_elastic_lease_get(&got, f->e, b.id));
  assert_int_equal(got.reclaim_requested, 1);
  /* The lender explicitly asks a back too. */
  assert_ok(swiftkv_elastic_reclaim(f->e, a.id));
  assert_ok(swiftkv_elastic_pending_reclaims(ids, 1, &n, f->e));
  assert_int_equal(n, 2); /* only one id fits; the count says two */
  assert_int_equal(ids[0], a.id < b.id ? a.id : b.id);
  /* The borrower answers: b's units below the boundary become the lender's, the rest free. */
  assert_ok(swiftkv_elastic_release(f->e, b.id));
  s = stats(f->e);
  assert_int_equal(s.ready_blocks, 12);
  assert_int_equal(s.reclaiming_blocks, 0);
  assert_int_equal(s.lent_blocks, 15);
  assert_int_equal(s.free_blocks, 3);
  assert_ok(swiftkv_elastic_scale_for_request(&blocks, &chunks, f->e, 150));
  assert_int_equal(blocks, 0);
  assert_status(swiftkv_elastic_reclaim(f->e, 12345), SWIFTKV_ENOTFOUND);
  assert_ok(swiftkv_elastic_reclaim(f->e, SWIFTKV_LEASE_ALL));
}

/* A lease that is not renewed ends at its expiry; the borrower learns it on its next call. */
static void test_lease_expiry(void **state) {
  fixture *f = *state;
  swiftkv_lease l = SWIFTKV_LEASE_INIT;
  assert_ok(swiftkv_elastic_lend(&l, f->e, 1));
  f->now += 400 * MS;
  assert_ok(swiftkv_elastic_renew(f->e, l.id));
  swiftkv_lease got = SWIFTKV_LEASE_INIT;
  assert_ok(swiftkv_elastic_lease_get(&got, f->e, l.id));
  assert_int_equal(got.expires_ns, f->now + 500 * MS);
  f->now += 499 * MS;
  uint64_t blocks, chunks;
  assert_ok(swiftkv_elastic_tick(&blocks, &chunks, f->e, 6));
  assert_int_equal(stats(f->e).leases, 1);
  f->now += 1 * MS;
  assert_ok(swiftkv_elastic_tick(&blocks, &chunks, f->e, 6));
  swiftkv_elastic_stats s = stats(f->e);
  assert_int_equal(s.leases, 0);
  assert_int_equal(s.leases_expired, 1);
  assert_int_equal(s.lent_blocks, 0);
  assert_status(swiftkv_elastic_renew(f->e, l.id), SWIFTKV_ETIMEDOUT);
  assert_message_contains("expired");
  assert_status(swiftkv_elastic_release(f->e, l.id), SWIFTKV_ETIMEDOUT);
  assert_status(swiftkv_elastic_renew(f->e, 999), SWIFTKV_ENOTFOUND);
}

/* A borrower that keeps renewing a lease asked back and never releases it loses it at the
 * reclaim deadline; an expiry granted before the asking is never cut short. */
static void test_reclaim_deadline(void **state) {
  fixture *f = *state;
  swiftkv_elastic_config c = small_config(f, 30, 6);
  c.reclaim_deadline_ms = 1200;
  swiftkv_elastic *e = NULL;
  assert_ok(swiftkv_elastic_create(&e, f->ctx, &c));
  swiftkv_lease l = SWIFTKV_LEASE_INIT, got = SWIFTKV_LEASE_INIT;
  assert_ok(swiftkv_elastic_lend(&l, e, 1));
  const uint64_t start = f->now;
  f->now += 100 * MS;
  assert_ok(swiftkv_elastic_reclaim(e, l.id)); /* deadline: start + 1300 ms */
  for (int i = 0; i < 11; ++i) {
    f->now += 100 * MS; /* up to start + 1200 ms */
    assert_ok(swiftkv_elastic_renew(e, l.id));
    assert_ok(swiftkv_elastic_lease_get(&got, e, l.id));
    const uint64_t want =
        f->now + 500 * MS < start + 1300 * MS ? f->now + 500 * MS : start + 1300 * MS;
    assert_int_equal(got.expires_ns, want);
    assert_true(got.reclaim_requested);
  }
  f->now = start + 1300 * MS;
  assert_status(swiftkv_elastic_renew(e, l.id), SWIFTKV_ETIMEDOUT);
  size_t pending = 1;
  assert_ok(swiftkv_elastic_pending_reclaims(NULL, 0, &pending, e));
  assert_int_equal(pending, 0);
  assert_ok(swiftkv_elastic_wait_reclaims(e, 0));
  swiftkv_elastic_stats s = stats(e);
  assert_int_equal(s.leases, 0);
  assert_int_equal(s.lent_blocks, 0);
  assert_int_equal(s.leases_expired, 1);
  /* A deadline shorter than what was granted: the grant stands, renewals add nothing. */
  c.reclaim_deadline_ms = 100;
  swiftkv_elastic *short_e = NULL;
  assert_ok(swiftkv_elastic_create(&short_e, f->ctx, &c));
  assert_ok(swiftkv_elastic_lend(&l, short_e, 1));
  const uint64_t granted = l.expires_ns;
  f->now += 50 * MS;
  assert_ok(swiftkv_elastic_reclaim(short_e, l.id));
  f->now += 300 * MS;
  assert_ok(swiftkv_elastic_renew(short_e, l.id));
  assert_ok(swiftkv_elastic_lease_get(&got, short_e, l.id));
  assert_int_equal(got.expires_ns, granted);
  f->now = granted;
  assert_status(swiftkv_elastic_renew(short_e, l.id), SWIFTKV_ETIMEDOUT);
  swiftkv_elastic_destroy(short_e);
  swiftkv_elastic_destroy(e);
}

struct release_later {
  swiftkv_elastic *e;
  uint64_t id;
};

static void *release_after_30ms(void *arg) {
  struct release_later *r = arg;
  struct timespec ts = {0, 30 * 1000 * 1000};
  nanosleep(&ts, NULL);
  return (void *)(intptr_t)swiftkv_elastic_release(r->e, r->id);
}

/* wait_reclaims returns once every lease asked back has ended: at once with none, ETIMEDOUT
 * while a borrower holds on, OK when another thread releases, and OK when the lease expired. */
static void test_wait_reclaims(void **state) {
  fixture *f = *state;
  swiftkv_lease a = SWIFTKV_LEASE_INIT, b = SWIFTKV_LEASE_INIT;
  assert_ok(swiftkv_elastic_lend(&a, f->e, 1));
  assert_ok(swiftkv_elastic_lend(&b, f->e, 1));
  assert_ok(swiftkv_elastic_wait_reclaims(f->e, 0)); /* nothing asked back */
  assert_ok(swiftkv_elastic_reclaim(f->e, a.id));
  assert_status(swiftkv_elastic_wait_reclaims(f->e, 20), SWIFTKV_ETIMEDOUT);
  assert_message_contains("1 not released");
  assert_int_equal(stats(f->e).leases, 2); /* waiting changed nothing */
  struct release_later r = {f->e, a.id};
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, release_after_30ms, &r), 0);
  assert_ok(swiftkv_elastic_wait_reclaims(f->e, 10000));
  void *rc = NULL;
  assert_int_equal(pthread_join(t, &rc), 0);
  assert_int_equal((intptr_t)rc, SWIFTKV_OK);
  size_t n = 9;
  assert_ok(swiftkv_elastic_pending_reclaims(NULL, 0, &n, f->e));
  assert_int_equal(n, 0);
  /* A lease asked back that expires comes back too. */
  assert_ok(swiftkv_elastic_reclaim(f->e, b.id));
  f->now += 600 * MS;
  assert_ok(swiftkv_elastic_wait_reclaims(f->e, 10000));
  assert_int_equal(stats(f->e).leases, 0);
  assert_status(swiftkv_elastic_wait_reclaims(NULL, 1), SWIFTKV_EINVAL);
}

/* Every bad call returns its status, names the problem and changes nothing. */
static void test_bad_calls_change_nothing(void **state) {
  fixture *f = *state;
  swiftkv_lease l = SWIFTKV_LEASE_INIT;
  assert_ok(swiftkv_elastic_lend(&l, f->e, 1));
  const swiftkv_elastic_stats before = stats(f->e);
  uint64_t blocks = SENTINEL, chunks = SENTINEL;
  /* 481 tokens need 31 blocks; the capacity is 30. */
  assert_status(swiftkv_elastic_scale_for_request(&blocks, &chunks, f->e, 481), SWIFTKV_ENOMEM);
  assert_message_contains("capacity is 30");
  assert_true(blocks == SENTINEL && chunks == SENTINEL);
  swiftkv_elastic_stats after = stats(f->e);
  assert_same_stats(&before, &after);
  assert_status(swiftkv_elastic_tick(&blocks, &chunks, f->e, 31), SWIFTKV_EINVAL);
  assert_message_contains("in_use_blocks");
  assert_status(swiftkv_elastic_scale_for_request(NULL, &chunks, f->e, 1), SWIFTKV_EINVAL);
  assert_status(swiftkv_elastic_scale_for_request(&blocks, &chunks, NULL, 1), SWIFTKV_EINVAL);
  swiftkv_lease l2 = SWIFTKV_LEASE_INIT;
  assert_status(swiftkv_elastic_lend(&l2, f->e, 0), SWIFTKV_EINVAL);
  assert_message_contains("max_units");
  swiftkv_lease zero;
  memset(&zero, 0, sizeof zero);
  assert_status(swiftkv_elastic_lend(&zero, f->e, 1), SWIFTKV_EVERSION);
  assert_status(swiftkv_elastic_release(f->e, l.id + 100), SWIFTKV_ENOTFOUND);
  size_t n = 5;
  assert_status(swiftkv_elastic_pending_reclaims(NULL, 3, &n, f->e), SWIFTKV_EINVAL);
  assert_int_equal(n, 5);
  after = stats(f->e);
  assert_same_stats(&before, &after);
}

/* A region in host granules of 8 KiB (two pages; the fixture's unit is 12 KiB): physical memory
 * follows the granules that owned and lent units touch, a granule two units share stays while
 * either holds it, and bytes survive lending, a scale-up into the lent tail and back. */
static void test_host_granules(void **state) {
  fixture *f = *state;
  swiftkv_elastic_config c = small_config(f, 30, 6); /* 120 KiB: 15 granules */
  c.host_granule_bytes = 8192;
  swiftkv_elastic *e = NULL;
  assert_ok(swiftkv_elastic_create(&e, f->ctx, &c));
  swiftkv_elastic_stats s = stats(e);
  assert_int_equal(s.memory_kind, SWIFTKV_MEMORY_HOST_GRANULES);
  assert_int_equal(s.region_bytes, 30 * 4096);
  assert_int_equal(s.committed_bytes, 3 * 8192); /* blocks 0-5, 24 KiB: granules 0-2 */
  swiftkv_layer_view v0 = SWIFTKV_LAYER_VIEW_INIT;
  assert_ok(swiftkv_elastic_layer_view(&v0, e, 0));
  unsigned char *base = v0.base;
  memset(base, 0x5a, 6 * 4096); /* the lender's own blocks */

  /* Units 8-9 (blocks 24-29, bytes 96-120 KiB) are granules 12-14; unit 7 (blocks 21-23,
   * 84-96 KiB) shares granule 10 with unit 6 and has granule 11 alone. */
  swiftkv_lease a = SWIFTKV_LEASE_INIT, b = SWIFTKV_LEASE_INIT;
  assert_ok(swiftkv_elastic_lend(&a, e, 2));
  assert_int_equal(a.first_block, 24);
  assert_int_equal(stats(e).committed_bytes, 6 * 8192);
  assert_ok(swiftkv_elastic_lend(&b, e, 1));
  assert_int_equal(b.first_block, 21);
  assert_int_equal(stats(e).committed_bytes, 8 * 8192);
  for (uint64_t i = 0; i < a.bytes; ++i) ((unsigned char *)a.data)[i] = (unsigned char)(i * 7);
  memset(b.data, 0xb1, b.bytes);
  assert_ok(swiftkv_elastic_release(e, b.id));
  assert_int_equal(stats(e).committed_bytes, 6 * 8192); /* granules 10 and 11 went back */

  /* The owned part grows over units 2-7 (free) without touching a byte of its own blocks. */
  uint64_t blocks = 0, chunks = 0;
  assert_ok(swiftkv_elastic_scale_for_request(&blocks, &chunks, e, 16 * 24));
  assert_true(blocks > 0);
  s = stats(e);
  assert_true(s.owned_blocks > 6 && s.owned_blocks <= 24); /* units 8-9 stay lent */
  assert_int_equal(s.committed_bytes, (s.owned_blocks * 4096 + 8191) / 8192 * 8192 + 3 * 8192);
  for (uint64_t i = 0; i < 6 * 4096; ++i) assert_int_equal(base[i], 0x5a);
  for (uint64_t i = 0; i < a.bytes; ++i) {
    assert_int_equal(((unsigned char *)a.data)[i], (unsigned char)(i * 7));
  }
  assert_ok(swiftkv_elastic_release(e, a.id));
  swiftkv_elastic_destroy(e);
}

static void expect_create_fails(swiftkv_ctx *ctx, const swiftkv_elastic_config *c,
                                swiftkv_status status, const char *needle) {
  swiftkv_elastic *e = (swiftkv_elastic *)&e; /* any non-NULL value: it must stay */
  swiftkv_elastic *const keep = e;
  assert_status(swiftkv_elastic_create(&e, ctx, c), status);
  assert_message_contains(needle);
  assert_ptr_equal(e, keep);
}

static void test_create_rejects(void **state) {
  fixture *f = *state;
  swiftkv_elastic_config c = small_config(f, 30, 6);
  c.capacity_blocks = 31;
  expect_create_fails(f->ctx, &c, SWIFTKV_EINVAL, "30 or 33 would be");
  c = small_config(f, 30, 7);
  expect_create_fails(f->ctx, &c, SWIFTKV_EINVAL, "config->owned_blocks (7)");
  c = small_config(f, 30, 6);
  c.reclaim_deadline_ms = 0;
  expect_create_fails(f->ctx, &c, SWIFTKV_EINVAL, "reclaim_deadline_ms is 0");
  c = small_config(f, 30, 33);
  expect_create_fails(f->ctx, &c, SWIFTKV_EINVAL, "exceeds config->capacity_blocks");
  c = small_config(f, 0, 0);
  expect_create_fails(f->ctx, &c, SWIFTKV_EINVAL, "capacity_blocks is 0");
  c = small_config(f, 30, 6);
  c.window_ms = 0;
  expect_create_fails(f->ctx, &c, SWIFTKV_EINVAL, "window_ms");
  c = small_config(f, 30, 6);
  c.flags = 0x10;
  expect_create_fails(f->ctx, &c, SWIFTKV_EINVAL, "unknown bits 16");
  c = small_config(f, 30, 6);
  c.cuda_alloc = (swiftkv_cuda_alloc)7;
  expect_create_fails(f->ctx, &c, SWIFTKV_EINVAL, "cuda_alloc (7)");
  c = small_config(f, 30, 6);
  c.lender = NULL;
  expect_create_fails(f->ctx, &c, SWIFTKV_EINVAL, "config->lender is NULL");
  swiftkv_model_desc dev = small_lender();
  dev.device = 0;
  c = small_config(f, 30, 6);
  c.lender = &dev;
  expect_create_fails(f->ctx, &c, SWIFTKV_ENODEV, "device_mask");
  c = small_config(f, 30, 6);
  c.version = 4;
  expect_create_fails(f->ctx, &c, SWIFTKV_EVERSION, "config->version is 4");
  c = small_config(f, 30, 6);
  c.host_granule_bytes = 4096 + 512;
  expect_create_fails(f->ctx, &c, SWIFTKV_EINVAL, "host_granule_bytes (4608) is not a multiple");
  c = small_config(f, 30, 6);
  c.lender = &dev;
  c.host_granule_bytes = 4096;
  expect_create_fails(f->ctx, &c, SWIFTKV_EINVAL, "host regions only");
  /* A version 2 struct (no host_granule_bytes) is read as one memfd, whatever lies past it. */
  c = small_config(f, 30, 6);
  c.version = 2;
  c.size = (uint32_t)offsetof(swiftkv_elastic_config, host_granule_bytes);
  c.host_granule_bytes = 4096 + 1; /* past its size: not read */
  swiftkv_elastic *v2 = NULL;
  assert_ok(swiftkv_elastic_create(&v2, f->ctx, &c));
  assert_int_equal(stats(v2).memory_kind, SWIFTKV_MEMORY_HOST_MEMFD);
  swiftkv_elastic_destroy(v2);
  /* A version 1 struct (no reclaim_deadline_ms) is read with the default deadline. */
  c = small_config(f, 30, 6);
  c.version = 1;
  c.size = (uint32_t)offsetof(swiftkv_elastic_config, reclaim_deadline_ms);
  c.reclaim_deadline_ms = 0; /* past its size: not read */
  swiftkv_elastic *v1 = NULL;
  assert_ok(swiftkv_elastic_create(&v1, f->ctx, &c));
  swiftkv_elastic_destroy(v1);
  expect_create_fails(f->ctx, NULL, SWIFTKV_EINVAL, "config is NULL");
  /* The budget: 64 MiB minus this fixture's 120 KiB leaves room for 16383 more 4 KiB blocks
   * only if nothing leaked from the failures above. */
  c = small_config(f, 3 * 5462, 0);
  expect_create_fails(f->ctx, &c, SWIFTKV_ENOMEM, "host_budget_bytes");
  c = small_config(f, 3 * 5451, 0); /* 16353 blocks: exactly fits with the first region */
  swiftkv_elastic *e = NULL;
  assert_ok(swiftkv_elastic_create(&e, f->ctx, &c));
  swiftkv_elastic *e2 = NULL;
  c = small_config(f, 3, 0);
  assert_status(swiftkv_elastic_create(&e2, f->ctx, &c), SWIFTKV_ENOMEM);
  swiftkv_elastic_destroy(e);
  assert_ok(swiftkv_elastic_create(&e2, f->ctx, &c)); /* destroy gave the budget back */
  swiftkv_elastic_destroy(e2);
  swiftkv_elastic_destroy(NULL);
}

static void test_no_borrower(void **state) {
  fixture *f = *state;
  swiftkv_elastic_config c = small_config(f, 7, 5);
  c.borrower = NULL;
  swiftkv_elastic *e = NULL;
  assert_ok(swiftkv_elastic_create(&e, f->ctx, &c));
  swiftkv_elastic_stats s = stats(e);
  assert_int_equal(s.unit_lender_blocks, 1);
  assert_int_equal(s.unit_borrower_chunks, 0);
  swiftkv_lease l = SWIFTKV_LEASE_INIT;
  assert_status(swiftkv_elastic_lend(&l, e, 1), SWIFTKV_ESTATE);
  uint64_t blocks, chunks;
  assert_ok(swiftkv_elastic_scale_for_request(&blocks, &chunks, e, 6 * 16 + 1));
  assert_int_equal(blocks, 2);
  assert_int_equal(chunks, 0);
  swiftkv_elastic_destroy(e);
}

/* Borrower threads lend, renew and release while the lender scales; counts stay consistent. */
typedef struct shared {
  swiftkv_elastic *e;
  int rounds;
} shared;

static void *borrower_thread(void *arg) {
  shared *s = arg;
  for (int i = 0; i < s->rounds; ++i) {
    swiftkv_lease l = SWIFTKV_LEASE_INIT;
    if (swiftkv_elastic_lend(&l, s->e, 1 + (uint64_t)i % 2) != SWIFTKV_OK) continue;
    memset(l.data, i & 0xFF, l.bytes);
    (void)swiftkv_elastic_renew(s->e, l.id);
    if (swiftkv_elastic_release(s->e, l.id) != SWIFTKV_OK) return (void *)1;
  }
  return NULL;
}

static void test_concurrent_lend_and_scale(void **state) {
  fixture *f = *state;
  shared s = {f->e, 2000};
  pthread_t t[3];
  for (int i = 0; i < 3; ++i) assert_int_equal(pthread_create(&t[i], NULL, borrower_thread, &s), 0);
  uint64_t blocks, chunks;
  for (int i = 0; i < 2000; ++i) {
    swiftkv_status st =
        swiftkv_elastic_scale_for_request(&blocks, &chunks, f->e, (uint64_t)(i % 400));
    assert_true(st == SWIFTKV_OK || st == SWIFTKV_IN_PROGRESS);
    swiftkv_elastic_stats sn = stats(f->e);
    assert_true(sn.ready_blocks <= sn.owned_blocks);
  }
  for (int i = 0; i < 3; ++i) {
    void *r = NULL;
    assert_int_equal(pthread_join(t[i], &r), 0);
    assert_null(r);
  }
  swiftkv_elastic_stats sn = stats(f->e);
  assert_int_equal(sn.leases, 0);
  assert_int_equal(sn.lent_blocks, 0);
  assert_int_equal(sn.ready_blocks, sn.owned_blocks);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_lend_unit_table2),
      cmocka_unit_test_setup_teardown(test_created_state_and_view, setup, teardown),
      cmocka_unit_test_setup_teardown(test_lease_in_borrower_geometry, setup, teardown),
      cmocka_unit_test(test_qwen_pair_addresses),
      cmocka_unit_test_setup_teardown(test_scale_up_and_down, setup, teardown),
      cmocka_unit_test_setup_teardown(test_resize, setup, teardown),
      cmocka_unit_test_setup_teardown(test_lender_bytes_untouched, setup, teardown),
      cmocka_unit_test_setup_teardown(test_reclaim_protocol, setup, teardown),
      cmocka_unit_test_setup_teardown(test_lease_expiry, setup, teardown),
      cmocka_unit_test_setup_teardown(test_reclaim_deadline, setup, teardown),
      cmocka_unit_test_setup_teardown(test_wait_reclaims, setup, teardown),
      cmocka_unit_test_setup_teardown(test_bad_calls_change_nothing, setup, teardown),
      cmocka_unit_test_setup_teardown(test_create_rejects, setup, teardown),
      cmocka_unit_test_setup_teardown(test_host_granules, setup, teardown),
      cmocka_unit_test_setup_teardown(test_no_borrower, setup, teardown),
      cmocka_unit_test_setup_teardown(test_concurrent_lend_and_scale, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
