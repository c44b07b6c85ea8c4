/* fork() with a live context. A context and its regions belong to the process that made them:
 * the child of a fork shares the parent's lent memory and disk segments but has none of its
 * threads (nor, now, the host tier's slabs, which are private memory). Before, a child that
 * stored two chunks through the inherited context wrote them over the parent's newest chunks in
 * the then shared slabs (the parent's retrieve then returned wrong bytes with success, and a
 * reopen found them on disk), and a child that only destroyed the context hung for ever in the
 * destructor, waiting on conditions the parent's threads held.
 *
 * Here the child's every call on the parent's context and region returns SWIFTKV_ESTATE naming
 * the fork; its destroy calls return at once and release nothing (the parent then serves, lends
 * and writes back as before, byte for byte); and a context the child makes itself works. A hang
 * would be caught by the test's ctest timeout, not by a timed assertion. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <swiftkv/swiftkv.h>

#define CHUNK_TOKENS 256u
/* 4 layers x (K, V) x 256 tokens x 2 heads x 64 dims x 2 bytes. */
#define CHUNK_BYTES ((size_t)4 * 2 * CHUNK_TOKENS * 2 * 64 * 2)
#define PARENT_CHUNKS 8u

#define CHECK(cond, code, ...)      \
  do {                              \
    if (!(cond)) {                  \
      fprintf(stderr, __VA_ARGS__); \
      fprintf(stderr, "\n");        \
      return (code);                \
    }                               \
  } while (0)

static swiftkv_model_desc small_model(uint32_t layers, uint32_t heads, uint32_t dims,
                                      uint32_t chunk_tokens) {
  swiftkv_model_desc d = SWIFTKV_MODEL_DESC_INIT;
  d.num_layers = layers;
  d.num_kv_heads = heads;
  d.head_dim = dims;
  d.block_tokens = 16;
  d.chunk_tokens = chunk_tokens;
  d.dtype = SWIFTKV_DTYPE_F16;
  return d;
}

static const swiftkv_model_desc *kv_model(void) {
  static swiftkv_model_desc d;
  d = small_model(4, 2, 64, CHUNK_TOKENS);
  d.name = "fork-model";
  return &d;
}

/* Conversation `seq`: one chunk of tokens, filled with bytes that say whose it is. */
static void conversation(uint32_t seq, uint32_t *tokens, unsigned char *kv) {
  for (uint32_t i = 0; i < CHUNK_TOKENS; ++i) tokens[i] = seq * 1000u + i;
  for (size_t i = 0; i < CHUNK_BYTES; ++i) kv[i] = (unsigned char)(seq * 37u + i % 251u);
}

static swiftkv_ctx *open_ctx(const char *dir) {
  swiftkv_ctx_config c = SWIFTKV_CTX_CONFIG_INIT;
  c.host_budget_bytes = 64u << 20;
  c.disk_path = dir;
  c.disk_budget_bytes = 64u << 20;
  c.write_back_on_close = 1;
  swiftkv_ctx *ctx = NULL;
  if (swiftkv_ctx_create(&ctx, &c) != SWIFTKV_OK) {
    fprintf(stderr, "create: %s\n", swiftkv_last_error_message());
    return NULL;
  }
  return ctx;
}

static uint32_t register_model(swiftkv_ctx *ctx) {
  swiftkv_model_config mc = SWIFTKV_MODEL_CONFIG_INIT;
  mc.desc = kv_model();
  uint32_t model = UINT32_MAX;
  if (swiftkv_model_register(&model, ctx, &mc) != SWIFTKV_OK) {
    fprintf(stderr, "register: %s\n", swiftkv_last_error_message());
  }
  return model;
}

/* 1 when conversation `seq` comes back whole and byte for byte. */
static int holds(swiftkv_ctx *ctx, uint32_t model, uint32_t seq) {
  uint32_t tokens[CHUNK_TOKENS];
  unsigned char *want = malloc(CHUNK_BYTES), *got = malloc(CHUNK_BYTES);
  conversation(seq, tokens, want);
  uint64_t n = 0;
  const int ok =
      swiftkv_retrieve(&n, ctx, model, tokens, CHUNK_TOKENS, 0, got, CHUNK_BYTES) == SWIFTKV_OK &&
      n == CHUNK_TOKENS && memcmp(got, want, CHUNK_BYTES) == 0;
  free(want);
  free(got);
  return ok;
}

static int store(swiftkv_ctx *ctx, uint32_t model, uint32_t seq, swiftkv_status *st) {
  uint32_t tokens[CHUNK_TOKENS];
  unsigned char *kv = malloc(CHUNK_BYTES);
  conversation(seq, tokens, kv);
  uint64_t n = 0;
  *st = swiftkv_store(&n, ctx, model, tokens, CHUNK_TOKENS, kv, CHUNK_BYTES);
  free(kv);
  return *st == SWIFTKV_OK && n == CHUNK_TOKENS;
}

/* A call on a handle the parent made: ESTATE, a message that names the fork. */
static int refused_as_forked(swiftkv_status st, const char *what) {
  const char *msg = swiftkv_last_error_message();
  if (st == SWIFTKV_ESTATE && strstr(msg, "a fork of it") != NULL) return 1;
  fprintf(stderr, "child: %s returned %s: %s\n", what, swiftkv_status_string(st), msg);
  return 0;
}

/* The child's side. Exit codes name what went wrong. */
static int child(swiftkv_ctx *ctx, uint32_t model, swiftkv_elastic *e, const char *own_dir) {
  swiftkv_status st;
  for (uint32_t seq = 100; seq < 102; ++seq) { /* the two stores that overwrote the parent */
    store(ctx, model, seq, &st);
    CHECK(refused_as_forked(st, "store"), 10, "a store through the parent's context");
  }
  uint32_t tokens[CHUNK_TOKENS];
  unsigned char *kv = malloc(CHUNK_BYTES);
  conversation(0, tokens, kv);
  uint64_t n = 77;
  st = swiftkv_retrieve(&n, ctx, model, tokens, CHUNK_TOKENS, 0, kv, CHUNK_BYTES);
  CHECK(refused_as_forked(st, "retrieve") && n == 77, 11, "a retrieve, or its output touched");
  free(kv);
  swiftkv_ctx_config cfg;
  CHECK(refused_as_forked(swiftkv_ctx_get_config(&cfg, ctx), "get_config"), 12, "get_config");
  swiftkv_lease lease = SWIFTKV_LEASE_INIT;
  CHECK(refused_as_forked(swiftkv_elastic_lend(&lease, e, 1), "elastic_lend"), 13, "lend");
  /* Both return at once (the destructor used to hang here) and leave their refusal behind. */
  swiftkv_elastic_destroy(e);
  CHECK(strstr(swiftkv_last_error_message(), "a fork of it") != NULL, 14, "elastic destroy: %s",
        swiftkv_last_error_message());
  swiftkv_ctx_destroy(ctx);
  CHECK(strstr(swiftkv_last_error_message(), "a fork of it") != NULL, 15, "ctx destroy: %s",
        swiftkv_last_error_message());
  /* A context of the child's own serves it. (Not under TSan: its runtime cannot follow threads
   * started in the child of a multi-threaded process, which the new context's are.) */
#if defined(__SANITIZE_THREAD__)
  (void)own_dir;
  return 0;
#endif
  swiftkv_ctx *mine = open_ctx(own_dir);
  CHECK(mine != NULL, 16, "the child's own context");
  const uint32_t my_model = register_model(mine);
  CHECK(store(mine, my_model, 200, &st) && holds(mine, my_model, 200), 17, "the child's own %s",
        swiftkv_status_string(st));
  swiftkv_ctx_destroy(mine);
  return 0;
}

int main(void) {
  char dir[] = "/tmp/swiftkv-fork-XXXXXX", child_dir[] = "/tmp/swiftkv-fork-child-XXXXXX";
  CHECK(mkdtemp(dir) != NULL && mkdtemp(child_dir) != NULL, 1, "mkdtemp");
  swiftkv_ctx *ctx = open_ctx(dir);
  CHECK(ctx != NULL, 1, "the parent's context");
  const uint32_t model = register_model(ctx);
  swiftkv_status st;
  for (uint32_t seq = 0; seq < PARENT_CHUNKS; ++seq) {
    CHECK(store(ctx, model, seq, &st), 1, "parent store %u: %s", seq, swiftkv_status_string(st));
  }
  /* A region too: the lender's side lives in shared memory the child inherits. */
  swiftkv_model_desc lender = small_model(4, 2, 8, 32), borrower = small_model(3, 1, 16, 32);
  swiftkv_elastic_config ec = SWIFTKV_ELASTIC_CONFIG_INIT;
  ec.lender = &lender;
  ec.borrower = &borrower;
  ec.capacity_blocks = 12;
  ec.owned_blocks = 6;
  swiftkv_elastic *e = NULL;
  CHECK(swiftkv_elastic_create(&e, ctx, &ec) == SWIFTKV_OK, 1, "elastic: %s",
        swiftkv_last_error_message());

  fflush(NULL);
  const pid_t pid = fork();
  if (pid == 0) exit(child(ctx, model, e, child_dir)); /* exit, not _exit: atexit runs too */
  int status = 0;
  CHECK(waitpid(pid, &status, 0) == pid, 1, "waitpid");
  CHECK(WIFEXITED(status), 1, "the child died of signal %d", WTERMSIG(status));
  CHECK(WEXITSTATUS(status) == 0, 1, "the child exited %d", WEXITSTATUS(status));

  /* The parent's context is as it was: every chunk byte for byte, none of the child's. */
  for (uint32_t seq = 0; seq < PARENT_CHUNKS; ++seq) {
    CHECK(holds(ctx, model, seq), 2, "the parent's conversation %u after the fork", seq);
  }
  uint32_t tokens[CHUNK_TOKENS];
  unsigned char *kv = malloc(CHUNK_BYTES);
  conversation(100, tokens, kv);
  uint64_t n = 0;
  CHECK(swiftkv_retrieve(&n, ctx, model, tokens, CHUNK_TOKENS, 0, kv, CHUNK_BYTES) == SWIFTKV_OK &&
            n == 0,
        2, "the child's refused store is in the parent's context (%llu tokens)",
        (unsigned long long)n);
  free(kv);
  CHECK(store(ctx, model, PARENT_CHUNKS, &st) && holds(ctx, model, PARENT_CHUNKS), 2,
        "a store after the fork: %s", swiftkv_status_string(st));
  /* Its region still lends and takes back. */
  swiftkv_lease lease = SWIFTKV_LEASE_INIT;
  CHECK(swiftkv_elastic_lend(&lease, e, 1) == SWIFTKV_OK && lease.blocks > 0, 3, "lend: %s",
        swiftkv_last_error_message());
  swiftkv_elastic_destroy(e);
  swiftkv_ctx_destroy(ctx); /* writes the host tier back */

  /* Reopened, the disk holds the parent's conversations, right. */
  ctx = open_ctx(dir);
  CHECK(ctx != NULL, 4, "reopen");
  const uint32_t again = register_model(ctx);
  for (uint32_t seq = 0; seq <= PARENT_CHUNKS; ++seq) {
    CHECK(holds(ctx, again, seq), 4, "conversation %u after the reopen", seq);
  }
  swiftkv_ctx_destroy(ctx);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s %s", dir, child_dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
  printf("the child was refused; the parent kept %u conversations through the fork\n",
         PARENT_CHUNKS + 1);
  return 0;
}
