/* A context in a memory cgroup (containers are where engines run): a child process moved into a
 * cgroup of its own with a 512 MiB limit asks for a host budget of 2 GiB and is refused with
 * SWIFTKV_ENOMEM naming the limit (it used to be accepted, and the kernel's OOM killer ended the
 * process once the chunks passed the limit, no status returned); a budget that fits is accepted,
 * and filling it twice over (evicting) leaves the process alive with its bytes right. Needs root
 * and a memory cgroup it may make (v1's memory controller, or v2 with memory.max): else 77. The
 * cgroup is removed at the end. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <swiftkv/swiftkv.h>

#define MIB (UINT64_C(1) << 20)

static int write_file(const char *path, const char *text) {
  const int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  const ssize_t n = write(fd, text, strlen(text));
  close(fd);
  return n == (ssize_t)strlen(text) ? 0 : -1;
}

/* This process's cgroup path in the hierarchy of `kind` ("memory": v1's memory controller; "":
 * v2's unified hierarchy, the line "0::path"). */
static int own_cgroup(const char *kind, char *out, size_t n) {
  FILE *f = fopen("/proc/self/cgroup", "r");
  if (f == NULL) return -1;
  char line[512];
  int found = -1;
  while (found != 0 && fgets(line, sizeof line, f) != NULL) {
    line[strcspn(line, "\n")] = '\0';
    char *controllers = strchr(line, ':');
    char *path = controllers != NULL ? strchr(controllers + 1, ':') : NULL;
    if (path == NULL) continue;
    *controllers++ = '\0';
    *path++ = '\0';
    int match;
    if (kind[0] == '\0') {
      match = strcmp(line, "0") == 0 && controllers[0] == '\0';
    } else {
      char list[256];
      snprintf(list, sizeof list, ",%s,", controllers);
      char want[64];
      snprintf(want, sizeof want, ",%s,", kind);
      match = strstr(list, want) != NULL;
    }
    if (match) {
      snprintf(out, n, "%s", path);
      found = 0;
    }
  }
  fclose(f);
  return found;
}

/* Makes a child cgroup with a limit of `limit` bytes: its directory and the file that takes the
 * processes. 0 on success. */
static int make_cgroup(uint64_t limit, char *dir, size_t n) {
  char path[512], file[700], text[32];
  snprintf(text, sizeof text, "%llu", (unsigned long long)limit);
  if (own_cgroup("memory", path, sizeof path) == 0 && access("/sys/fs/cgroup/memory", F_OK) == 0) {
    snprintf(dir, n, "/sys/fs/cgroup/memory%s/swiftkv-test-%d", strcmp(path, "/") == 0 ? "" : path,
             (int)getpid());
    if (mkdir(dir, 0755) != 0) return -1;
    snprintf(file, sizeof file, "%s/memory.limit_in_bytes", dir);
    if (write_file(file, text) == 0) return 0;
    rmdir(dir);
    return -1;
  }
  if (own_cgroup("", path, sizeof path) == 0 &&
      access("/sys/fs/cgroup/cgroup.controllers", F_OK) == 0) {
    snprintf(dir, n, "/sys/fs/cgroup%s/swiftkv-test-%d", strcmp(path, "/") == 0 ? "" : path,
             (int)getpid());
    if (mkdir(dir, 0755) != 0) return -1;
    snprintf(file, sizeof file, "%s/memory.max", dir);
    if (write_file(file, text) == 0) return 0;
    rmdir(dir);
  }
  return -1;
}

#define CHUNK_TOKENS 256u

static swiftkv_ctx *create(uint64_t budget, swiftkv_status *st) {
  swiftkv_ctx_config c = SWIFTKV_CTX_CONFIG_INIT;
  c.host_budget_bytes = budget;
  swiftkv_ctx *ctx = NULL;
  *st = swiftkv_ctx_create(&ctx, &c);
  return ctx;
}

/* In the cgroup. Exit codes: 0 right, 10 the large budget accepted, 11 its message, 12 the small
 * one refused, 13 a store failed, 14 wrong bytes. */
static int child(const char *dir) {
  char procs[700];
  snprintf(procs, sizeof procs, "%s/cgroup.procs", dir);
  if (write_file(procs, "0") != 0) return 20;
  swiftkv_status st;
  swiftkv_ctx *big = create(2048 * MIB, &st);
  if (st != SWIFTKV_ENOMEM || big != NULL) {
    fprintf(stderr, "2 GiB in a 512 MiB cgroup: %s\n", swiftkv_status_string(st));
    return 10;
  }
  const char *msg = swiftkv_last_error_message();
  if (strstr(msg, "memory limit") == NULL || strstr(msg, "swiftkv-test-") == NULL) {
    fprintf(stderr, "message: %s\n", msg);
    return 11;
  }
  swiftkv_ctx *ctx = create(32 * MIB, &st);
  if (st != SWIFTKV_OK) {
    fprintf(stderr, "32 MiB: %s: %s\n", swiftkv_status_string(st), swiftkv_last_error_message());
    return 12;
  }
  swiftkv_model_desc d = SWIFTKV_MODEL_DESC_INIT;
  d.num_layers = 4;
  d.num_kv_heads = 8;
  d.head_dim = 128;
  d.block_tokens = 16;
  d.chunk_tokens = CHUNK_TOKENS;
  d.dtype = SWIFTKV_DTYPE_F16;
  d.name = "cgroup-model";
  swiftkv_model_config mc = SWIFTKV_MODEL_CONFIG_INIT;
  mc.desc = &d;
  uint32_t model = 0;
  if (swiftkv_model_register(&model, ctx, &mc) != SWIFTKV_OK) return 13;
  const size_t chunk = (size_t)4 * 2 * CHUNK_TOKENS * 8 * 128 * 2; /* 4 MiB */
  unsigned char *kv = malloc(chunk), *out = malloc(chunk);
  uint32_t tokens[CHUNK_TOKENS];
  for (uint32_t c = 0; c < 16; ++c) { /* 64 MiB through a 32 MiB budget: half evicted */
    for (uint32_t i = 0; i < CHUNK_TOKENS; ++i) tokens[i] = c * 1000 + i;
    memset(kv, (int)(c + 1), chunk);
    uint64_t got = 0;
    if (swiftkv_store(&got, ctx, model, tokens, CHUNK_TOKENS, kv, chunk) != SWIFTKV_OK) return 13;
  }
  uint64_t got = 0;
  if (swiftkv_retrieve(&got, ctx, model, tokens, CHUNK_TOKENS, 0, out, chunk) != SWIFTKV_OK ||
      got != CHUNK_TOKENS || memcmp(out, kv, chunk) != 0) {
    return 14;
  }
  free(kv);
  free(out);
  swiftkv_ctx_destroy(ctx);
  return 0;
}

int main(void) {
  if (geteuid() != 0) {
    fprintf(stderr, "skipped: needs root to make a cgroup\n");
    return 77;
  }
  char dir[600];
  if (make_cgroup(512 * MIB, dir, sizeof dir) != 0) {
    fprintf(stderr, "skipped: no memory cgroup to make here (%s)\n", strerror(errno));
    return 77;
  }
  const pid_t pid = fork();
  if (pid == 0) _exit(child(dir));
  int status = 0;
  const int waited = waitpid(pid, &status, 0) == pid;
  const int removed = rmdir(dir) == 0;
  if (!waited || !WIFEXITED(status)) {
    fprintf(stderr, "the child in the cgroup did not exit (signal %d)\n",
            WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    return 1;
  }
  if (WEXITSTATUS(status) != 0) {
    fprintf(stderr, "the child in the cgroup exited %d\n", WEXITSTATUS(status));
    return 1;
  }
  if (!removed) {
    fprintf(stderr, "could not remove %s: %s\n", dir, strerror(errno));
    return 1;
  }
  printf("refused 2 GiB and served 32 MiB under %s\n", dir);
  return 0;
}
