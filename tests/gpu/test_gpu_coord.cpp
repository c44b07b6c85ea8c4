// On a GPU machine: two processes share an elastic region in device memory through the CUDA
// export path of the coordinator: a lender process offers a region on device 0 (VMM granules
// passed as fds, then cudaMalloc with an IPC handle), this process borrows it, stores chunks into
// it and reads them back bit-exact, then the lender takes the memory back and the chunks come
// back from host. Public API only. Exits 77 without a usable device.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gpu_check.h"
#include "gpu_skip.h"
#include "swiftkv/swiftkv.h"

extern char **environ;

namespace {

const char *g_self = nullptr;

// 4 layers, 8 KV heads of 128 dims, 64-token chunks in f16: 1 MiB a chunk; the lender's blocks
// are 16 tokens of the same geometry, so a lending unit is 4 blocks = 1 chunk.
constexpr uint32_t kChunkTokens = 64;
constexpr size_t kChunkBytes = size_t{2} * 4 * 8 * 128 * kChunkTokens * 2;
constexpr uint64_t kUnits = 32;

swiftkv_model_desc desc(uint32_t block_tokens, int32_t device) {
  swiftkv_model_desc m = SWIFTKV_MODEL_DESC_INIT;
  m.name = "gpu-coord";
  m.num_layers = 4;
  m.num_kv_heads = 8;
  m.head_dim = 128;
  m.block_tokens = block_tokens;
  m.chunk_tokens = kChunkTokens;
  m.device = device;
  return m;
}

// The lender: a region on device 0 offered as "gpu"; answers "scale" and "settle" on stdin.
int lender_main(const char *endpoint, int alloc) {
  swiftkv_ctx_config c = SWIFTKV_CTX_CONFIG_INIT;
  c.device_mask = 1;
  c.host_budget_bytes = 64 << 20;
  c.coord_endpoint = endpoint;
  swiftkv_ctx *ctx = nullptr;
  swiftkv_elastic *e = nullptr;
  swiftkv_model_desc ld = desc(16, 0);
  swiftkv_model_desc bd = desc(kChunkTokens, SWIFTKV_DEVICE_HOST);
  swiftkv_elastic_config ec = SWIFTKV_ELASTIC_CONFIG_INIT;
  ec.lender = &ld;
  ec.borrower = &bd;
  ec.capacity_blocks = (kUnits + 4) * 4;
  ec.owned_blocks = 4 * 4;
  ec.cuda_alloc = static_cast<swiftkv_cuda_alloc>(alloc);
  if (swiftkv_ctx_create(&ctx, &c) != SWIFTKV_OK) return 2;
  const swiftkv_status st = swiftkv_elastic_create(&e, ctx, &ec);
  if (st == SWIFTKV_EUNSUPPORTED) {
    std::printf("unsupported\n");
    std::fflush(stdout);
    swiftkv_ctx_destroy(ctx);
    return 0;
  }
  if (st != SWIFTKV_OK || swiftkv_elastic_offer(e, "gpu") != SWIFTKV_OK) {
    std::fprintf(stderr, "lender: %s\n", swiftkv_last_error_message());
    return 2;
  }
  std::printf("ready\n");
  std::fflush(stdout);
  char line[128];
  while (std::fgets(line, sizeof line, stdin) != nullptr) {
    if (std::strncmp(line, "scale", 5) == 0) {
      uint64_t b = 0, ch = 0;
      std::printf("%d\n", swiftkv_elastic_scale_for_request(&b, &ch, e, ec.capacity_blocks * 16));
    } else if (std::strncmp(line, "settle", 6) == 0) {
      swiftkv_elastic_stats s = SWIFTKV_ELASTIC_STATS_INIT;
      for (int i = 0; i < 10000; ++i) {
        swiftkv_elastic_stats_get(&s, e);
        if (s.reclaiming_blocks == 0) break;
        usleep(1000);
      }
      std::printf("%llu\n", static_cast<unsigned long long>(s.reclaiming_blocks));
    } else {
      break;
    }
    std::fflush(stdout);
  }
  swiftkv_elastic_destroy(e);
  swiftkv_ctx_destroy(ctx);
  return 0;
}

struct Child {
  pid_t pid = -1;
  FILE *in = nullptr;
  FILE *out = nullptr;
};

Child spawn_lender(const std::string &endpoint, int alloc) {
  int to[2], from[2];
  Child c;
  if (pipe2(to, O_CLOEXEC) != 0 || pipe2(from, O_CLOEXEC) != 0) return c;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, to[0], 0);
  posix_spawn_file_actions_adddup2(&fa, from[1], 1);
  std::string a = std::to_string(alloc);
  char *argv[] = {const_cast<char *>(g_self), const_cast<char *>("--lender"),
                  const_cast<char *>(endpoint.c_str()), a.data(), nullptr};
  if (posix_spawn(&c.pid, g_self, &fa, nullptr, argv, environ) != 0) c.pid = -1;
  posix_spawn_file_actions_destroy(&fa);
  close(to[0]);
  close(from[1]);
  c.in = fdopen(to[1], "w");
  c.out = fdopen(from[0], "r");
  return c;
}

std::string ask(const Child &c, const char *cmd) {
  if (cmd != nullptr) {
    std::fprintf(c.in, "%s\n", cmd);
    std::fflush(c.in);
  }
  char line[128] = {0};
  if (std::fgets(line, sizeof line, c.out) == nullptr) return "";
  return line;
}

void end_child(Child &c) {
  std::fprintf(c.in, "quit\n");
  std::fflush(c.in);
  int status = 0;
  waitpid(c.pid, &status, 0);
  std::fclose(c.in);
  std::fclose(c.out);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++g_failures;
}

void share_device_region(int alloc, const char *name) {
  const std::string ep =
      "ipc:///tmp/swiftkv-test-gpu-coord-" + std::to_string(::getpid()) + "-" + name;
  Child lender = spawn_lender(ep, alloc);
  CHECK(lender.pid > 0);
  const std::string hello = ask(lender, nullptr);
  if (hello == "unsupported\n") {
    std::printf("%s: not supported on this device, skipped\n", name);
    end_child(lender);
    return;
  }
  CHECK(hello == "ready\n");

  swiftkv_ctx_config c = SWIFTKV_CTX_CONFIG_INIT;
  c.device_mask = 1;
  c.host_budget_bytes = (kUnits + 8) * kChunkBytes;
  c.demote_free_percent = 0;
  c.coord_heartbeat_ms = 20;
  swiftkv_ctx *ctx = nullptr;
  CHECK(swiftkv_ctx_create(&ctx, &c) == SWIFTKV_OK);
  swiftkv_model_desc bd = desc(kChunkTokens, SWIFTKV_DEVICE_HOST);
  swiftkv_model_config mc = SWIFTKV_MODEL_CONFIG_INIT;
  mc.desc = &bd;
  uint32_t model = 0;
  CHECK(swiftkv_model_register(&model, ctx, &mc) == SWIFTKV_OK);
  uint64_t lease = 0;
  CHECK(swiftkv_borrow_remote(&lease, ctx, model, ep.c_str(), "gpu", kUnits) == SWIFTKV_OK);

  const size_t chunks = kUnits;
  std::vector<uint32_t> tokens(chunks * kChunkTokens);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(i * 7 + 1);
  std::vector<uint8_t> kv(chunks * kChunkBytes);
  for (size_t i = 0; i < kv.size(); ++i) kv[i] = static_cast<uint8_t>((i * 131 + i / 4099) % 251);
  uint64_t cached = 0;
  CHECK(swiftkv_store(&cached, ctx, model, tokens.data(), tokens.size(), kv.data(), kv.size()) ==
        SWIFTKV_OK);
  CHECK(cached == tokens.size());
  swiftkv_lookup_result l = SWIFTKV_LOOKUP_RESULT_INIT;
  CHECK(swiftkv_lookup(&l, nullptr, 0, ctx, model, tokens.data(), tokens.size()) == SWIFTKV_OK);
  CHECK(l.chunks_per_tier[SWIFTKV_TIER_PEER] == chunks);  // in the other process's GPU memory
  std::vector<uint8_t> got(kv.size());
  uint64_t n = 0;
  CHECK(swiftkv_retrieve(&n, ctx, model, tokens.data(), tokens.size(), 0, got.data(), got.size()) ==
        SWIFTKV_OK);
  CHECK(n == tokens.size() && got == kv);

  // The lender takes its memory back: the chunks move to host and stay intact.
  CHECK(std::atoi(ask(lender, "scale").c_str()) == SWIFTKV_IN_PROGRESS);
  CHECK(ask(lender, "settle") == "0\n");
  CHECK(swiftkv_lookup(&l, nullptr, 0, ctx, model, tokens.data(), tokens.size()) == SWIFTKV_OK);
  CHECK(l.chunks_per_tier[SWIFTKV_TIER_HOST] == chunks);
  std::fill(got.begin(), got.end(), 0);
  CHECK(swiftkv_retrieve(&n, ctx, model, tokens.data(), tokens.size(), 0, got.data(), got.size()) ==
        SWIFTKV_OK);
  CHECK(n == tokens.size() && got == kv);
  swiftkv_ctx_destroy(ctx);
  end_child(lender);
  std::printf("%s: %zu chunks through another process's device memory and back\n", name, chunks);
}

void vmm_memory_is_borrowed() { share_device_region(SWIFTKV_CUDA_ALLOC_VMM, "vmm"); }
void cudamalloc_memory_is_borrowed() {
  share_device_region(SWIFTKV_CUDA_ALLOC_MALLOC, "cudamalloc");
}

}  // namespace

int main(int argc, char **argv) {
  if (argc == 4 && std::strcmp(argv[1], "--lender") == 0) {
    return lender_main(argv[2], std::atoi(argv[3]));
  }
  g_self = argv[0];
  uint32_t devices = 0;
  if (swiftkv_device_count(&devices) != SWIFTKV_OK || devices == 0) {
    return swiftkv_test_no_gpu("no usable CUDA device (swiftkv_device_count: 0)");
  }
  const CMUnitTest tests[] = {
      SWIFTKV_GPU_TEST(vmm_memory_is_borrowed),
      SWIFTKV_GPU_TEST(cudamalloc_memory_is_borrowed),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
