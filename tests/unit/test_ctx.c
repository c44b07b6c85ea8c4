/* The context: defaults, the versioned config (copy, defaults, refusal of unknown versions),
 * validation of devices, NUMA node and disk tier with nothing created on failure, one owner of
 * a disk path at a time (in this process, in another, and after that one is killed), and
 * concurrent creation. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test_support.h"

#define CTX_SENTINEL ((swiftkv_ctx *)(uintptr_t)0x5EED)

static swiftkv_ctx *create_ok(const swiftkv_ctx_config *c) {
  swiftkv_ctx *ctx = NULL;
  assert_ok(swiftkv_ctx_create(&ctx, c));
  assert_non_null(ctx);
  return ctx;
}

static void create_refused(const swiftkv_ctx_config *c, swiftkv_status want, const char *needle) {
  swiftkv_ctx *ctx = CTX_SENTINEL;
  assert_status(swiftkv_ctx_create(&ctx, c), want);
  assert_message_contains(needle);
  assert_ptr_equal(ctx, CTX_SENTINEL);
}

static swiftkv_ctx_config effective(const swiftkv_ctx *ctx) {
  swiftkv_ctx_config c = SWIFTKV_CTX_CONFIG_INIT;
  assert_ok(swiftkv_ctx_get_config(&c, ctx));
  return c;
}

static void defaults_are_host_only(void **state) {
  (void)state;
  swiftkv_ctx *ctx = create_ok(NULL);
  swiftkv_ctx_config c = effective(ctx);
  assert_int_equal(c.size, sizeof c);
  assert_int_equal(c.version, SWIFTKV_CTX_CONFIG_VERSION);
  assert_int_equal(c.device_mask, 0);
  assert_int_equal(c.host_budget_bytes, 0);
  assert_int_equal(c.host_numa_node, SWIFTKV_NUMA_NODE_AUTO);
  assert_null(c.disk_path);
  assert_int_equal(c.disk_budget_bytes, 0);
  uint32_t n = 99;
  assert_ok(swiftkv_ctx_device_count(&n, ctx));
  assert_int_equal(n, 0);
  swiftkv_ctx_destroy(ctx);
  /* An explicit default config is the same as NULL. */
  swiftkv_ctx_config init = SWIFTKV_CTX_CONFIG_INIT;
  ctx = create_ok(&init);
  c = effective(ctx);
  assert_int_equal(c.device_mask, 0);
  swiftkv_ctx_destroy(ctx);
  swiftkv_ctx_destroy(NULL);
}

static void all_devices_means_the_usable_ones(void **state) {
  (void)state;
  uint32_t usable = 99;
  assert_ok(swiftkv_device_count(&usable));
  swiftkv_ctx_config c = SWIFTKV_CTX_CONFIG_INIT;
  c.device_mask = SWIFTKV_DEVICE_MASK_ALL;
  swiftkv_ctx *ctx = create_ok(&c);
  uint32_t n = 99;
  assert_ok(swiftkv_ctx_device_count(&n, ctx));
  assert_int_equal(n, usable);
  swiftkv_ctx_destroy(ctx);
}

static void a_device_that_is_not_there(void **state) {
  (void)state;
  uint32_t usable = 0;
  assert_ok(swiftkv_device_count(&usable));
  if (usable >= 64) skip();
  swiftkv_ctx_config c = SWIFTKV_CTX_CONFIG_INIT;
  c.device_mask = UINT64_C(1) << usable;
  create_refused(&c, SWIFTKV_ENODEV, "config->device_mask names device");
}

static void host_budget_is_kept(void **state) {
  (void)state;
  swiftkv_ctx_config c = SWIFTKV_CTX_CONFIG_INIT;
  c.host_budget_bytes = UINT64_C(3) << 30;
  swiftkv_ctx *ctx = create_ok(&c);
  assert_int_equal(effective(ctx).host_budget_bytes, UINT64_C(3) << 30);
  swiftkv_ctx_destroy(ctx);
}

static void numa_node(void **state) {
  (void)state;
  swiftkv_ctx_config c = SWIFTKV_CTX_CONFIG_INIT;
  c.host_numa_node = 0; /* every machine has node 0 */
  swiftkv_ctx *ctx = create_ok(&c);
  assert_int_equal(effective(ctx).host_numa_node, 0);
  swiftkv_ctx_destroy(ctx);
  c.host_numa_node = -2;
  create_refused(&c, SWIFTKV_EINVAL, "config->host_numa_node (-2)");
  /* Node 4095 exists nowhere: refused as invalid with libnuma, as unsupported without NUMA. */
  c.host_numa_node = 4095;
  swiftkv_ctx *out = CTX_SENTINEL;
  swiftkv_status st = swiftkv_ctx_create(&out, &c);
  assert_true(st == SWIFTKV_EINVAL || st == SWIFTKV_EUNSUPPORTED);
  assert_message_contains("config->host_numa_node is 4095");
  assert_ptr_equal(out, CTX_SENTINEL);
}

/* Removes a disk directory a context used: its segment files and the lock file it leaves (a
 * lock file is never removed by its owner, or a late opener could lock a name no longer there). */
static void remove_disk_dir(const char *dir) {
  char cmd[160];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  assert_int_equal(system(cmd), 0);
}

static void disk_tier(void **state) {
  (void)state;
  char dir[] = "/tmp/swiftkv-ctx-XXXXXX";
  assert_non_null(mkdtemp(dir));
  char path[64];
  snprintf(path, sizeof path, "%s", dir);

  swiftkv_ctx_config c = SWIFTKV_CTX_CONFIG_INIT;
  c.disk_path = path;
  c.disk_budget_bytes = UINT64_C(1) << 30;
  swiftkv_ctx *ctx = create_ok(&c);
  /* The context keeps its own copy: the caller's buffer may change or go. */
  memset(path, 'x', sizeof path - 1);
  swiftkv_ctx_config e = effective(ctx);
  assert_string_equal(e.disk_path, dir);
  assert_ptr_not_equal(e.disk_path, path);
  assert_int_equal(e.disk_budget_bytes, UINT64_C(1) << 30);
  swiftkv_ctx_destroy(ctx);

  c.disk_path = dir;
  c.disk_budget_bytes = 0;
  create_refused(&c, SWIFTKV_EINVAL, "disk_budget_bytes is 0 but config->disk_path is set");
  c.disk_path = NULL;
  c.disk_budget_bytes = 4096;
  create_refused(&c, SWIFTKV_EINVAL, "config->disk_path is NULL");
  c.disk_path = "";
  create_refused(&c, SWIFTKV_EINVAL, "config->disk_path is empty");
  char missing[96];
  snprintf(missing, sizeof missing, "%s/missing", dir);
  c.disk_path = missing;
  create_refused(&c, SWIFTKV_EINVAL, "No such file or directory");
  char file[96];
  snprintf(file, sizeof file, "%s/file", dir);
  FILE *f = fopen(file, "w");
  assert_non_null(f);
  fclose(f);
  c.disk_path = file;
  create_refused(&c, SWIFTKV_EINVAL, "is not a directory");
  assert_int_equal(unlink(file), 0);
  remove_disk_dir(dir);
}

/* A disk path has one owner at a time: a second context on it, in this process or another, is
 * refused with EBUSY naming the holder's pid and nothing made; the owner's close, or its death,
 * lets the next one in. */
static void a_disk_path_has_one_owner(void **state) {
  (void)state;
  char dir[] = "/tmp/swiftkv-ctx-XXXXXX";
  assert_non_null(mkdtemp(dir));
  swiftkv_ctx_config c = SWIFTKV_CTX_CONFIG_INIT;
  c.disk_path = dir;
  c.disk_budget_bytes = UINT64_C(16) << 20;
  swiftkv_ctx *first = create_ok(&c);
  char holder[64];
  snprintf(holder, sizeof holder, "in use by another context (pid %d holds", (int)getpid());
  create_refused(&c, SWIFTKV_EBUSY, holder);
  swiftkv_ctx_destroy(first);
  swiftkv_ctx_destroy(create_ok(&c)); /* closed: free again */

  /* Another process holds it, then is killed: the kernel lets go of its lock. */
  int ready[2];
  assert_int_equal(pipe(ready), 0);
  const pid_t child = fork();
  assert_true(child >= 0);
  if (child == 0) {
    swiftkv_ctx *mine = NULL;
    const char ok = swiftkv_ctx_create(&mine, &c) == SWIFTKV_OK ? 'y' : 'n';
    if (write(ready[1], &ok, 1) != 1) _exit(2);
    for (;;) pause();
  }
  char ok = 0;
  assert_int_equal(read(ready[0], &ok, 1), 1);
  assert_int_equal(ok, 'y');
  snprintf(holder, sizeof holder, "(pid %d holds", (int)child);
  create_refused(&c, SWIFTKV_EBUSY, holder);
  assert_int_equal(kill(child, SIGKILL), 0);
  int status = 0;
  assert_int_equal(waitpid(child, &status, 0), child);
  close(ready[0]);
  close(ready[1]);
  swiftkv_ctx_destroy(create_ok(&c));
  remove_disk_dir(dir);
}

static void config_size_and_version(void **state) {
  (void)state;
  swiftkv_ctx_config c;
  memset(&c, 0, sizeof c);
  create_refused(&c, SWIFTKV_EVERSION, "initialise it with SWIFTKV_CTX_CONFIG_INIT");
  swiftkv_ctx_config n = SWIFTKV_CTX_CONFIG_INIT;
  n.version = SWIFTKV_CTX_CONFIG_VERSION + 1;
  create_refused(&n, SWIFTKV_EVERSION, "config->version is 10");
  n = (swiftkv_ctx_config)SWIFTKV_CTX_CONFIG_INIT;
  n.size = 8;
  create_refused(&n, SWIFTKV_EVERSION, "config->size is 8");
  n = (swiftkv_ctx_config)SWIFTKV_CTX_CONFIG_INIT;
  n.reserved0 = 1;
  create_refused(&n, SWIFTKV_EINVAL, "config->reserved0");
  swiftkv_ctx *out = CTX_SENTINEL;
  assert_status(swiftkv_ctx_create(NULL, NULL), SWIFTKV_EINVAL);
  assert_message_contains("out is NULL");
  assert_ptr_equal(out, CTX_SENTINEL);
}

/* The tier order is read, checked and given back; a version 8 caller gets the default. */
static void tier_order_is_kept_and_checked(void **state) {
  (void)state;
  swiftkv_ctx_config c = SWIFTKV_CTX_CONFIG_INIT;
  c.tier_order = SWIFTKV_TIER_ORDER_HOST_FIRST;
  swiftkv_ctx *ctx = create_ok(&c);
  assert_int_equal(effective(ctx).tier_order, SWIFTKV_TIER_ORDER_HOST_FIRST);
  swiftkv_ctx_destroy(ctx);

  swiftkv_ctx_config v8 = SWIFTKV_CTX_CONFIG_INIT;
  v8.tier_order = (swiftkv_tier_order)7; /* past a version 8 caller's size: never read */
  v8.size = (uint32_t)offsetof(swiftkv_ctx_config, tier_order);
  v8.version = 8;
  ctx = create_ok(&v8);
  assert_int_equal(effective(ctx).tier_order, SWIFTKV_TIER_ORDER_REMOTE_FIRST);
  swiftkv_ctx_destroy(ctx);

  swiftkv_ctx_config bad = SWIFTKV_CTX_CONFIG_INIT;
  bad.tier_order = (swiftkv_tier_order)2;
  create_refused(&bad, SWIFTKV_EINVAL, "config->tier_order (2) is not a swiftkv_tier_order");
  bad = (swiftkv_ctx_config)SWIFTKV_CTX_CONFIG_INIT;
  bad.reserved3 = 1;
  create_refused(&bad, SWIFTKV_EINVAL, "config->reserved3 is not 0");
}

/* A program built against version 3 (no coordinator fields) gets no endpoint and the default
 * heartbeat and timeout; get_config writes nothing past its size. The fields are checked. */
static void version_3_callers_get_coord_defaults(void **state) {
  (void)state;
  swiftkv_ctx_config v3 = SWIFTKV_CTX_CONFIG_INIT;
  memset(&v3.coord_endpoint, 0x7f, sizeof v3 - offsetof(swiftkv_ctx_config, coord_endpoint));
  v3.size = (uint32_t)offsetof(swiftkv_ctx_config, coord_endpoint);
  v3.version = 3;
  swiftkv_ctx *ctx = NULL;
  assert_status(swiftkv_ctx_create(&ctx, &v3), SWIFTKV_OK);
  swiftkv_ctx_config got = SWIFTKV_CTX_CONFIG_INIT;
  assert_status(swiftkv_ctx_get_config(&got, ctx), SWIFTKV_OK);
  assert_null(got.coord_endpoint);
  assert_int_equal(got.coord_heartbeat_ms, 100);
  assert_int_equal(got.coord_timeout_ms, 5000);
  swiftkv_ctx_config small = v3;
  assert_status(swiftkv_ctx_get_config(&small, ctx), SWIFTKV_OK);
  assert_int_equal(small.coord_heartbeat_ms, 0x7f7f7f7f); /* past the caller's size */
  swiftkv_ctx_destroy(ctx);

  swiftkv_ctx_config bad = SWIFTKV_CTX_CONFIG_INIT;
  bad.coord_heartbeat_ms = 0;
  create_refused(&bad, SWIFTKV_EINVAL, "config->coord_heartbeat_ms is 0");
  bad = (swiftkv_ctx_config)SWIFTKV_CTX_CONFIG_INIT;
  bad.coord_timeout_ms = 0;
  create_refused(&bad, SWIFTKV_EINVAL, "config->coord_timeout_ms is 0");
  bad = (swiftkv_ctx_config)SWIFTKV_CTX_CONFIG_INIT;
  bad.coord_endpoint = "udp://nowhere";
  create_refused(&bad, SWIFTKV_EINVAL, "neither ipc:// nor tcp://");
}

/* A program built against version 4 (no disk log fields) gets the default segment size, group
 * commit and transfer threads; get_config writes nothing past its size. At most 64 threads. */
static void version_4_callers_get_disk_log_defaults(void **state) {
  (void)state;
  char dir[] = "/tmp/swiftkv-ctx-XXXXXX";
  assert_non_null(mkdtemp(dir));
  swiftkv_ctx_config v4 = SWIFTKV_CTX_CONFIG_INIT;
  memset(&v4.disk_segment_bytes, 0x7f,
         sizeof v4 - offsetof(swiftkv_ctx_config, disk_segment_bytes));
  v4.size = (uint32_t)offsetof(swiftkv_ctx_config, disk_segment_bytes);
  v4.version = 4;
  v4.disk_path = dir;
  v4.disk_budget_bytes = UINT64_C(1) << 33;
  swiftkv_ctx *ctx = NULL;
  assert_status(swiftkv_ctx_create(&ctx, &v4), SWIFTKV_OK);
  swiftkv_ctx_config got = SWIFTKV_CTX_CONFIG_INIT;
  assert_status(swiftkv_ctx_get_config(&got, ctx), SWIFTKV_OK);
  /* 1 GiB is at most a quarter of the budget: the segment size in effect. */
  assert_int_equal(got.disk_segment_bytes, UINT64_C(1) << 30);
  assert_int_equal(got.disk_sync_ms, 1000);
  /* The default: one less than the cores, 1 or 2. */
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  assert_int_equal(got.transfer_threads, cores <= 2 ? 1 : 2);
  swiftkv_ctx_config small = v4;
  assert_status(swiftkv_ctx_get_config(&small, ctx), SWIFTKV_OK);
  assert_int_equal(small.disk_sync_ms, 0x7f7f7f7f); /* past the caller's size */
  swiftkv_ctx_destroy(ctx);

  /* A small budget: segments of a quarter of it. A given size: at most half, whole 64 bytes. */
  swiftkv_ctx_config c = SWIFTKV_CTX_CONFIG_INIT;
  c.disk_path = dir;
  c.disk_budget_bytes = UINT64_C(1) << 20;
  ctx = create_ok(&c);
  assert_int_equal(effective(ctx).disk_segment_bytes, UINT64_C(1) << 18);
  swiftkv_ctx_destroy(ctx);
  c.disk_segment_bytes = (UINT64_C(1) << 19) + 100;
  c.disk_sync_ms = 0;
  ctx = create_ok(&c);
  assert_int_equal(effective(ctx).disk_segment_bytes, UINT64_C(1) << 19);
  assert_int_equal(effective(ctx).disk_sync_ms, 0);
  swiftkv_ctx_destroy(ctx);
  c.disk_segment_bytes = 1000;
  ctx = create_ok(&c);
  assert_int_equal(effective(ctx).disk_segment_bytes, 960);
  swiftkv_ctx_destroy(ctx);

  swiftkv_ctx_config t = SWIFTKV_CTX_CONFIG_INIT;
  t.transfer_threads = 3;
  ctx = create_ok(&t);
  assert_int_equal(effective(ctx).transfer_threads, 3);
  swiftkv_ctx_destroy(ctx);
  swiftkv_ctx_config bad = SWIFTKV_CTX_CONFIG_INIT;
  bad.transfer_threads = 65;
  create_refused(&bad, SWIFTKV_EINVAL, "config->transfer_threads (65) is above 64");
  remove_disk_dir(dir);
}

/* A program built against version 5 (no request bound) gets 4096 open requests; get_config
 * writes nothing past its size. The bound and the reserved word are checked. */
/* A program built against version 7 (no cross-node fields) gets UCX's own transports, the
 * automatic path and the default batch timeout; the new fields are checked. */
static void version_7_callers_get_remote_defaults(void **state) {
  (void)state;
  swiftkv_ctx_config v7 = SWIFTKV_CTX_CONFIG_INIT;
  memset(&v7.coord_ucx_transports, 0x7f,
         sizeof v7 - offsetof(swiftkv_ctx_config, coord_ucx_transports));
  v7.size = (uint32_t)offsetof(swiftkv_ctx_config, coord_ucx_transports);
  v7.version = 7;
  swiftkv_ctx *ctx = create_ok(&v7);
  swiftkv_ctx_config got = SWIFTKV_CTX_CONFIG_INIT;
  assert_ok(swiftkv_ctx_get_config(&got, ctx));
  assert_null(got.coord_ucx_transports);
  assert_int_equal(got.coord_remote_path, SWIFTKV_REMOTE_PATH_AUTO);
  assert_int_equal(got.coord_rma_timeout_ms, 2000);
  swiftkv_ctx_destroy(ctx);

  swiftkv_ctx_config c = SWIFTKV_CTX_CONFIG_INIT;
  c.coord_ucx_transports = "tcp";
  c.coord_remote_path = SWIFTKV_REMOTE_PATH_UCX;
  c.coord_rma_timeout_ms = 750;
  ctx = create_ok(&c);
  got = effective(ctx);
  assert_string_equal(got.coord_ucx_transports, "tcp");
  assert_int_equal(got.coord_remote_path, SWIFTKV_REMOTE_PATH_UCX);
  assert_int_equal(got.coord_rma_timeout_ms, 750);
  swiftkv_ctx_destroy(ctx);
  c.coord_rma_timeout_ms = 0;
  create_refused(&c, SWIFTKV_EINVAL, "config->coord_rma_timeout_ms is 0");
  c = (swiftkv_ctx_config)SWIFTKV_CTX_CONFIG_INIT;
  c.coord_remote_path = (swiftkv_remote_path)3;
  create_refused(&c, SWIFTKV_EINVAL, "config->coord_remote_path (3) is not a swiftkv_remote_path");
}

static void version_5_callers_get_the_request_bound(void **state) {
  (void)state;
  swiftkv_ctx_config v5 = SWIFTKV_CTX_CONFIG_INIT;
  memset(&v5.max_open_requests, 0x7f, sizeof v5 - offsetof(swiftkv_ctx_config, max_open_requests));
  v5.size = (uint32_t)offsetof(swiftkv_ctx_config, max_open_requests);
  v5.version = 5;
  swiftkv_ctx *ctx = create_ok(&v5);
  swiftkv_ctx_config got = SWIFTKV_CTX_CONFIG_INIT;
  assert_ok(swiftkv_ctx_get_config(&got, ctx));
  assert_int_equal(got.max_open_requests, 4096);
  assert_int_equal(got.reserved1, 0);
  swiftkv_ctx_config small = v5;
  assert_ok(swiftkv_ctx_get_config(&small, ctx));
  assert_int_equal(small.max_open_requests, 0x7f7f7f7f); /* past the caller's size */
  swiftkv_ctx_destroy(ctx);

  swiftkv_ctx_config c = SWIFTKV_CTX_CONFIG_INIT;
  c.max_open_requests = 1u << 20;
  ctx = create_ok(&c);
  assert_int_equal(effective(ctx).max_open_requests, 1u << 20);
  swiftkv_ctx_destroy(ctx);
  c.max_open_requests = 0;
  create_refused(&c, SWIFTKV_EINVAL, "config->max_open_requests (0) is not in 1..1048576");
  c.max_open_requests = (1u << 20) + 1;
  create_refused(&c, SWIFTKV_EINVAL, "config->max_open_requests (1048577)");
  c = (swiftkv_ctx_config)SWIFTKV_CTX_CONFIG_INIT;
  c.reserved1 = 1;
  create_refused(&c, SWIFTKV_EINVAL, "config->reserved1 is not 0");
}

/* Version 7's write-back flag: 1 by default (also for a version 6 caller, which get_config
 * does not write past), 0 or 1 only, and the reserved word checked. */
static void write_back_on_close_is_checked(void **state) {
  (void)state;
  swiftkv_ctx_config v6 = SWIFTKV_CTX_CONFIG_INIT;
  v6.size = (uint32_t)offsetof(swiftkv_ctx_config, write_back_on_close);
  v6.version = 6;
  swiftkv_ctx *ctx = create_ok(&v6);
  assert_int_equal(effective(ctx).write_back_on_close, 1);
  swiftkv_ctx_config small = v6;
  small.write_back_on_close = 7;
  assert_ok(swiftkv_ctx_get_config(&small, ctx));
  assert_int_equal(small.write_back_on_close, 7); /* past the caller's size */
  swiftkv_ctx_destroy(ctx);
  swiftkv_ctx_config c = SWIFTKV_CTX_CONFIG_INIT;
  c.write_back_on_close = 0;
  ctx = create_ok(&c);
  assert_int_equal(effective(ctx).write_back_on_close, 0);
  swiftkv_ctx_destroy(ctx);
  c.write_back_on_close = 2;
  create_refused(&c, SWIFTKV_EINVAL, "config->write_back_on_close (2) is not 0 or 1");
  c = (swiftkv_ctx_config)SWIFTKV_CTX_CONFIG_INIT;
  c.reserved2 = 1;
  create_refused(&c, SWIFTKV_EINVAL, "config->reserved2 is not 0");
}

/* A program built against version 1 of the struct (48 bytes, no cache fields) gets the cache
 * defaults; the fields it lacks are never read from its memory. */
static void version_1_callers_get_cache_defaults(void **state) {
  (void)state;
  struct {
    swiftkv_ctx_config c;
  } v1;
  memset(&v1, 0x7f, sizeof v1); /* garbage where the v2 fields would be */
  v1.c.size = (uint32_t)offsetof(swiftkv_ctx_config, eviction_policy);
  v1.c.version = 1;
  v1.c.device_mask = 0;
  v1.c.host_budget_bytes = 4096;
  v1.c.host_numa_node = SWIFTKV_NUMA_NODE_AUTO;
  v1.c.reserved0 = 0;
  v1.c.disk_path = NULL;
  v1.c.disk_budget_bytes = 0;
  swiftkv_ctx *ctx = create_ok(&v1.c);
  const swiftkv_ctx_config e = effective(ctx);
  assert_int_equal(e.host_budget_bytes, 4096);
  assert_int_equal(e.eviction_policy, SWIFTKV_EVICT_RETENTION);
  assert_int_equal(e.demote_free_percent, 25);
  assert_true(e.recompute_token_cost == 1.0 && e.recompute_attention_cost == 1.0);
  assert_null(e.attention_cost_table);
  assert_int_equal(e.maintenance_interval_ms, 10);
  swiftkv_ctx_destroy(ctx);
}

static void cache_fields_are_checked(void **state) {
  (void)state;
  swiftkv_ctx_config c = SWIFTKV_CTX_CONFIG_INIT;
  c.eviction_policy = (swiftkv_eviction_policy)7;
  create_refused(&c, SWIFTKV_EINVAL, "config->eviction_policy (7)");
  c = (swiftkv_ctx_config)SWIFTKV_CTX_CONFIG_INIT;
  c.demote_free_percent = 101;
  create_refused(&c, SWIFTKV_EINVAL, "demote_free_percent (101)");
  c = (swiftkv_ctx_config)SWIFTKV_CTX_CONFIG_INIT;
  c.recompute_token_cost = -1.0;
  create_refused(&c, SWIFTKV_EINVAL, "token cost");
  c = (swiftkv_ctx_config)SWIFTKV_CTX_CONFIG_INIT;
  c.attention_cost_entries = 2;
  create_refused(&c, SWIFTKV_EINVAL, "attention_cost_table is NULL");
  const double falling[3] = {1.0, 4.0, 2.0};
  c.attention_cost_table = falling;
  c.attention_cost_entries = 3;
  create_refused(&c, SWIFTKV_EINVAL, "table entry 2");
  c = (swiftkv_ctx_config)SWIFTKV_CTX_CONFIG_INIT;
  c.maintenance_interval_ms = 0;
  create_refused(&c, SWIFTKV_EINVAL, "maintenance_interval_ms is 0");

  /* A good table is copied: the caller's array may go, get_config shows the context's copy. */
  double table[4] = {0.5, 1.0, 2.0, 4.0};
  c = (swiftkv_ctx_config)SWIFTKV_CTX_CONFIG_INIT;
  c.eviction_policy = SWIFTKV_EVICT_LRU;
  c.attention_cost_table = table;
  c.attention_cost_entries = 4;
  swiftkv_ctx *ctx = create_ok(&c);
  table[3] = 99.0;
  const swiftkv_ctx_config e = effective(ctx);
  assert_int_equal(e.eviction_policy, SWIFTKV_EVICT_LRU);
  assert_int_equal(e.attention_cost_entries, 4);
  assert_true(e.attention_cost_table != table && e.attention_cost_table[3] == 4.0);
  swiftkv_ctx_destroy(ctx);
}

static void get_config_respects_the_callers_size(void **state) {
  (void)state;
  swiftkv_ctx *ctx = create_ok(NULL);
  struct {
    swiftkv_ctx_config c;
    uint64_t canary;
  } big;
  big.c = (swiftkv_ctx_config)SWIFTKV_CTX_CONFIG_INIT;
  big.c.size = sizeof big;
  big.canary = SENTINEL;
  assert_ok(swiftkv_ctx_get_config(&big.c, ctx));
  assert_int_equal(big.c.size, sizeof big); /* the caller's size is kept */
  assert_true(big.canary == SENTINEL);
  swiftkv_ctx_config bad;
  memset(&bad, 0xab, sizeof bad);
  bad.size = 0;
  bad.version = 0;
  swiftkv_ctx_config before = bad;
  assert_status(swiftkv_ctx_get_config(&bad, ctx), SWIFTKV_EVERSION);
  assert_memory_equal(&bad, &before, sizeof bad);
  assert_status(swiftkv_ctx_get_config(NULL, ctx), SWIFTKV_EINVAL);
  swiftkv_ctx_config c = SWIFTKV_CTX_CONFIG_INIT;
  assert_status(swiftkv_ctx_get_config(&c, NULL), SWIFTKV_EINVAL);
  assert_message_contains("ctx is NULL");
  uint32_t n = 7;
  assert_status(swiftkv_ctx_device_count(&n, NULL), SWIFTKV_EINVAL);
  assert_int_equal(n, 7);
  assert_status(swiftkv_ctx_device_count(NULL, ctx), SWIFTKV_EINVAL);
  assert_status(swiftkv_device_count(NULL), SWIFTKV_EINVAL);
  swiftkv_ctx_destroy(ctx);
}

static uint64_t counting_clock(void *user) {
  uint64_t *calls = (uint64_t *)user;
  return 1000u * __atomic_add_fetch(calls, 1, __ATOMIC_RELAXED);
}

/* Version 3's clock is the chunk cache's time: store and lookup read it, get_config hands it
 * back, and a version-2 caller (without the field) gets CLOCK_MONOTONIC. */
static void the_cache_reads_the_given_clock(void **state) {
  (void)state;
  uint64_t calls = 0;
  swiftkv_ctx_config c = SWIFTKV_CTX_CONFIG_INIT;
  c.host_budget_bytes = 1 << 20;
  c.clock = counting_clock;
  c.clock_user_data = &calls;
  swiftkv_ctx *ctx = create_ok(&c);
  swiftkv_ctx_config e = effective(ctx);
  assert_ptr_equal(e.clock, counting_clock);
  assert_ptr_equal(e.clock_user_data, &calls);
  swiftkv_model_desc d = SWIFTKV_MODEL_DESC_INIT;
  d.name = "clocked";
  d.num_layers = 1;
  d.num_kv_heads = 1;
  d.head_dim = 8;
  d.block_tokens = 16;
  d.chunk_tokens = 16;
  d.dtype = SWIFTKV_DTYPE_F16;
  swiftkv_model_config mc = SWIFTKV_MODEL_CONFIG_INIT;
  mc.desc = &d;
  uint32_t model = 0;
  assert_ok(swiftkv_model_register(&model, ctx, &mc));
  uint32_t tokens[16];
  for (uint32_t i = 0; i < 16; ++i) tokens[i] = i;
  unsigned char kv[2 * 16 * 8 * 2] = {0};
  uint64_t cached = 0;
  const uint64_t before = __atomic_load_n(&calls, __ATOMIC_RELAXED);
  assert_ok(swiftkv_store(&cached, ctx, model, tokens, 16, kv, sizeof kv));
  assert_int_equal(cached, 16);
  swiftkv_lookup_result r = SWIFTKV_LOOKUP_RESULT_INIT;
  assert_ok(swiftkv_lookup(&r, NULL, 0, ctx, model, tokens, 16));
  assert_int_equal(r.prefix_tokens, 16);
  assert_true(__atomic_load_n(&calls, __ATOMIC_RELAXED) >= before + 2);
  swiftkv_ctx_destroy(ctx);

  struct {
    swiftkv_ctx_config c;
  } v2;
  memset(&v2, 0xab, sizeof v2);
  v2.c = (swiftkv_ctx_config)SWIFTKV_CTX_CONFIG_INIT;
  v2.c.size = (uint32_t)offsetof(swiftkv_ctx_config, clock);
  v2.c.version = 2;
  v2.c.clock = counting_clock; /* past a version-2 caller's struct: never read */
  ctx = create_ok(&v2.c);
  e = effective(ctx);
  assert_null(e.clock);
  assert_null(e.clock_user_data);
  swiftkv_ctx_destroy(ctx);
}

static void *create_many(void *arg) {
  (void)arg;
  for (int i = 0; i < 200; ++i) {
    swiftkv_ctx_config c = SWIFTKV_CTX_CONFIG_INIT;
    c.host_budget_bytes = (uint64_t)i;
    c.disk_budget_bytes = (i % 2) ? 1 : 0; /* every other one fails: budget without a path */
    swiftkv_ctx *ctx = NULL;
    swiftkv_status st = swiftkv_ctx_create(&ctx, &c);
    if ((i % 2) != 0) {
      if (st != SWIFTKV_EINVAL || ctx != NULL) return (void *)1;
      if (strstr(swiftkv_last_error_message(), "disk_budget_bytes is 1") == NULL) return (void *)1;
    } else {
      if (st != SWIFTKV_OK) return (void *)1;
      swiftkv_ctx_config e = SWIFTKV_CTX_CONFIG_INIT;
      if (swiftkv_ctx_get_config(&e, ctx) != SWIFTKV_OK || e.host_budget_bytes != (uint64_t)i)
        return (void *)1;
      swiftkv_ctx_destroy(ctx);
    }
  }
  return NULL;
}

static void concurrent_create_and_destroy(void **state) {
  (void)state;
  pthread_t t[4];
  for (int i = 0; i < 4; ++i) assert_int_equal(pthread_create(&t[i], NULL, create_many, NULL), 0);
  for (int i = 0; i < 4; ++i) {
    void *r = (void *)1;
    assert_int_equal(pthread_join(t[i], &r), 0);
    assert_null(r);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(defaults_are_host_only),
      cmocka_unit_test(all_devices_means_the_usable_ones),
      cmocka_unit_test(a_device_that_is_not_there),
      cmocka_unit_test(host_budget_is_kept),
      cmocka_unit_test(numa_node),
      cmocka_unit_test(disk_tier),
      cmocka_unit_test(a_disk_path_has_one_owner),
      cmocka_unit_test(config_size_and_version),
      cmocka_unit_test(version_1_callers_get_cache_defaults),
      cmocka_unit_test(version_3_callers_get_coord_defaults),
      cmocka_unit_test(version_4_callers_get_disk_log_defaults),
      cmocka_unit_test(tier_order_is_kept_and_checked),
      cmocka_unit_test(version_5_callers_get_the_request_bound),
      cmocka_unit_test(version_7_callers_get_remote_defaults),
      cmocka_unit_test(write_back_on_close_is_checked),
      cmocka_unit_test(cache_fields_are_checked),
      cmocka_unit_test(get_config_respects_the_callers_size),
      cmocka_unit_test(the_cache_reads_the_given_clock),
      cmocka_unit_test(concurrent_create_and_destroy),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
