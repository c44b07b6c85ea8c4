// On a GPU machine: two processes share an elastic region in device memory through the CUDA
// export path of the coordinator: a lender process offers a region on device 0 (VMM granules
// passed as fds, then cudaMalloc with an IPC handle), this process borrows it, stores chunks into
// it and reads them back bit-exact, then the lender takes the memory back and the chunks come
// back from host; and a borrower with a device pool loads lent chunks into its pages in place,
// then loses the lease mid-load (the lender killed) and gets none of them. Public API only.
// Exits 77 without a usable device.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#if defined(SWIFTKV_TEST_HAVE_CUDA)
#include <cuda_runtime_api.h>
#endif

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
constexpr uint32_t kLayers = 4, kHeads = 8, kDim = 128;

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

// A lender on `ep` answering "ready" (*ready); *ready false (and the child ended) when its device
// cannot export `alloc` memory, which the caller reports as skipped. A failed check leaves
// *ready false with the failure counted.
void start_lender(const std::string &ep, int alloc, Child *lender, bool *ready) {
  *ready = false;
  *lender = spawn_lender(ep, alloc);
  CHECK(lender->pid > 0);
  const std::string hello = ask(*lender, nullptr);
  if (hello == "unsupported\n") {
    end_child(*lender);
    return;
  }
  CHECK(hello == "ready\n");
  *ready = true;
}

// A borrower context whose model lives on `device`, with `tokens`' chunks (bytes `kv`) stored in
// kUnits units borrowed from the lender at `ep`: every chunk in the lender's memory. b->ctx is
// null after a failed check.
struct Borrower {
  swiftkv_ctx *ctx = nullptr;
  uint32_t model = 0;
};
void borrow_and_store(const std::string &ep, int32_t device, const std::vector<uint32_t> &tokens,
                      const std::vector<uint8_t> &kv, Borrower *b) {
  swiftkv_ctx_config c = SWIFTKV_CTX_CONFIG_INIT;
  c.device_mask = 1;
  c.host_budget_bytes = (kUnits + 8) * kChunkBytes;
  c.demote_free_percent = 0;
  c.coord_heartbeat_ms = 20;
  swiftkv_ctx *ctx = nullptr;
  CHECK(swiftkv_ctx_create(&ctx, &c) == SWIFTKV_OK);
  b->ctx = ctx;
  swiftkv_model_desc md = desc(kChunkTokens, device);
  swiftkv_model_config mc = SWIFTKV_MODEL_CONFIG_INIT;
  mc.desc = &md;
  uint64_t lease = 0, cached = 0;
  swiftkv_lookup_result l = SWIFTKV_LOOKUP_RESULT_INIT;
  const bool ok =
      swiftkv_model_register(&b->model, ctx, &mc) == SWIFTKV_OK &&
      swiftkv_borrow_remote(&lease, ctx, b->model, ep.c_str(), "gpu", kUnits) == SWIFTKV_OK &&
      swiftkv_store(&cached, ctx, b->model, tokens.data(), tokens.size(), kv.data(), kv.size()) ==
          SWIFTKV_OK &&
      cached == tokens.size() &&
      swiftkv_lookup(&l, nullptr, 0, ctx, b->model, tokens.data(), tokens.size()) == SWIFTKV_OK &&
      l.chunks_per_tier[SWIFTKV_TIER_PEER] == tokens.size() / kChunkTokens;
  if (!ok) {
    swiftkv_ctx_destroy(ctx);
    b->ctx = nullptr;
  }
  CHECK(ok);  // every chunk in the other process's GPU memory
}

void share_device_region(int alloc, const char *name) {
  const std::string ep =
      "ipc:///tmp/swiftkv-test-gpu-coord-" + std::to_string(::getpid()) + "-" + name;
  Child lender;
  bool ready = false;
  start_lender(ep, alloc, &lender, &ready);
  if (!ready) {
    std::printf("%s: not supported on this device, skipped\n", name);
    return;
  }
  const size_t chunks = kUnits;
  std::vector<uint32_t> tokens(chunks * kChunkTokens);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(i * 7 + 1);
  std::vector<uint8_t> kv(chunks * kChunkBytes);
  for (size_t i = 0; i < kv.size(); ++i) kv[i] = static_cast<uint8_t>((i * 131 + i / 4099) % 251);
  Borrower b;
  borrow_and_store(ep, SWIFTKV_DEVICE_HOST, tokens, kv, &b);
  CHECK(b.ctx != nullptr);
  swiftkv_ctx *ctx = b.ctx;
  const uint32_t model = b.model;
  swiftkv_lookup_result l = SWIFTKV_LOOKUP_RESULT_INIT;
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

#if defined(SWIFTKV_TEST_HAVE_CUDA)
// The engine's side of the same sharing: a borrower whose model lives on device 0 loads the
// chunks it stored into another process's device memory into its own device pool's pages, the
// kernel reading the mapping in place, bit-exact. Then a second load is held behind the engine's
// stream while the lender is killed: the lease is lost before the copy runs, and every chunk of
// the load is reported failed (valid_end 0); nothing the copy read counts.
void CUDART_CB hold_stream(void *) { ::usleep(300000); }

// Begins a load-only request of `tokens` into `pages` of `pool` and starts its loads on `stream`
// (behind a 300 ms hold of the stream when `hold`); 0 when a call fails.
uint64_t begin_load(swiftkv_ctx *ctx, uint32_t pool, const std::vector<uint32_t> &tokens,
                    const std::vector<int32_t> &pages, cudaStream_t stream, bool hold) {
  swiftkv_request_desc d = SWIFTKV_REQUEST_DESC_INIT;
  d.pool = pool;
  d.tokens = tokens.data();
  d.n_tokens = tokens.size();
  d.pages = pages.data();
  d.n_pages = pages.size();
  d.shape = SWIFTKV_REQUEST_LOAD_ONLY;
  uint64_t req = 0;
  if (swiftkv_request_begin(&req, ctx, &d) != SWIFTKV_OK) return 0;
  if (hold) cudaLaunchHostFunc(stream, hold_stream, nullptr);
  if (swiftkv_start_load(ctx, req, stream) != SWIFTKV_OK) return 0;
  return req;
}

// Waits for every layer and finishes: valid_end after each layer (empty after a failed call).
std::vector<uint64_t> wait_all(swiftkv_ctx *ctx, uint64_t req, cudaStream_t stream) {
  std::vector<uint64_t> valid;
  for (uint32_t l = 0; l < kLayers; ++l) {
    uint64_t v = 0;
    if (swiftkv_wait_layer_load(&v, ctx, req, l, stream) != SWIFTKV_OK) return {};
    valid.push_back(v);
  }
  swiftkv_request_info info = SWIFTKV_REQUEST_INFO_INIT;
  if (swiftkv_request_finish(&info, ctx, req) != SWIFTKV_OK) return {};
  return valid;
}

void device_pool_loads_lent_memory() {
  const std::string ep =
      "ipc:///tmp/swiftkv-test-gpu-coord-" + std::to_string(::getpid()) + "-pool";
  Child lender;
  bool ready = false;
  start_lender(ep, SWIFTKV_CUDA_ALLOC_VMM, &lender, &ready);
  if (!ready) {
    std::printf("device pool: VMM export not supported on this device, skipped\n");
    return;
  }
  const size_t chunks = kUnits;
  std::vector<uint32_t> tokens(chunks * kChunkTokens);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(i * 5 + 3);
  std::vector<uint8_t> kv(chunks * kChunkBytes);
  for (size_t i = 0; i < kv.size(); ++i) kv[i] = static_cast<uint8_t>((i * 167 + i / 8191) % 253);
  Borrower b;
  borrow_and_store(ep, 0, tokens, kv, &b);  // the engine's KV on device 0
  CHECK(b.ctx != nullptr);
  swiftkv_ctx *ctx = b.ctx;
  const uint32_t model = b.model;

  // The engine's NHD tensors, one per layer, [pages, 2, 64, 8, 128] f16: a page is a chunk.
  const uint32_t n_pages = static_cast<uint32_t>(chunks) + 4;
  const uint64_t block = uint64_t{kChunkTokens} * kHeads * kDim;  // elements of a page's K or V
  const uint64_t layer_bytes = uint64_t{n_pages} * 2 * block * 2;
  void *dmem = nullptr;
  CHECK(cudaMalloc(&dmem, layer_bytes * kLayers) == cudaSuccess);
  cudaMemset(dmem, 0, layer_bytes * kLayers);
  std::vector<void *> bases(kLayers);
  for (uint32_t l = 0; l < kLayers; ++l) bases[l] = static_cast<uint8_t *>(dmem) + l * layer_bytes;
  swiftkv_pool_desc pd = SWIFTKV_POOL_DESC_INIT;
  pd.num_pages = n_pages;
  pd.layer_base = bases.data();
  pd.layer_span_bytes = layer_bytes;
  pd.page_stride = static_cast<int64_t>(2 * block);
  pd.kv_stride = static_cast<int64_t>(block);
  pd.token_stride = kHeads * kDim;
  pd.head_stride = kDim;
  uint32_t pool = 0;
  CHECK(swiftkv_pool_register(&pool, ctx, model, &pd) == SWIFTKV_OK);
  std::vector<int32_t> pages(chunks);
  for (size_t i = 0; i < chunks; ++i) pages[i] = static_cast<int32_t>((i * 7 + 3) % n_pages);
  cudaStream_t s = nullptr;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);

  // Every layer of every chunk in its page, as stored: (layer, K/V) blocks of the chunk's bytes.
  const uint64_t req = begin_load(ctx, pool, tokens, pages, s, false);
  CHECK(req != 0);
  const std::vector<uint64_t> valid = wait_all(ctx, req, s);
  CHECK(valid.size() == kLayers);
  for (uint64_t v : valid) CHECK(v == tokens.size());
  cudaStreamSynchronize(s);
  std::vector<uint8_t> img(layer_bytes * kLayers);
  CHECK(cudaMemcpy(img.data(), dmem, img.size(), cudaMemcpyDeviceToHost) == cudaSuccess);
  bool exact = true;
  for (size_t c = 0; c < chunks; ++c) {
    for (uint32_t l = 0; l < kLayers; ++l) {
      for (uint32_t k = 0; k < 2; ++k) {
        const uint8_t *want = kv.data() + c * kChunkBytes + (uint64_t{l} * 2 + k) * block * 2;
        const uint8_t *got =
            img.data() + l * layer_bytes + (uint64_t(pages[c]) * 2 + k) * block * 2;
        if (std::memcmp(want, got, block * 2) != 0) exact = false;
      }
    }
  }
  CHECK(exact);

  // The lender dies while the next load waits behind the engine's stream.
  cudaMemset(dmem, 0, layer_bytes * kLayers);
  const uint64_t held = begin_load(ctx, pool, tokens, pages, s, true);
  CHECK(held != 0);
  ::kill(lender.pid, SIGKILL);
  int status = 0;
  waitpid(lender.pid, &status, 0);
  std::fclose(lender.in);
  std::fclose(lender.out);
  swiftkv_coord_stats cs = SWIFTKV_COORD_STATS_INIT;
  for (int i = 0; i < 5000; ++i) {
    swiftkv_coord_stats_get(&cs, ctx);
    if (cs.lenders_lost != 0) break;
    ::usleep(1000);
  }
  CHECK(cs.lenders_lost == 1);
  const std::vector<uint64_t> after = wait_all(ctx, held, s);
  CHECK(after.size() == kLayers);
  for (uint64_t v : after) CHECK(v == 0);  // every chunk was in the lost lease
  uint64_t n = 1;
  std::vector<uint8_t> got(kv.size());
  CHECK(swiftkv_retrieve(&n, ctx, model, tokens.data(), tokens.size(), 0, got.data(), got.size()) ==
        SWIFTKV_OK);
  CHECK(n == 0);
  cudaStreamDestroy(s);
  cudaFree(dmem);
  swiftkv_ctx_destroy(ctx);
  std::printf(
      "device pool: %zu lent chunks loaded in place bit-exact; none after the lease was "
      "lost mid-load\n",
      chunks);
}
#endif

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
#if defined(SWIFTKV_TEST_HAVE_CUDA)
    SWIFTKV_GPU_TEST(device_pool_loads_lent_memory),
#endif
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
