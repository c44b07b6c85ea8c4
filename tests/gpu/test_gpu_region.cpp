// On a GPU machine: the CUDA backend (VMM granules and the cudaMalloc + IPC fallback) holds
// bytes, returns granules, and is shared with a second process that writes into it; an elastic
// region on the device works through the C API. Exits 77 without a usable device or without CUDA.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gpu_skip.h"
#include "paper_models.h"

#if defined(SWIFTKV_TEST_HAVE_CUDA)
#include <cuda_runtime_api.h>

#include "core/common/error.hpp"
#include "core/memory/cuda_region.hpp"
#include "gpu_check.h"
#include "swiftkv/swiftkv.h"

extern char **environ;

namespace {

const char *g_self = nullptr;

uint8_t pattern(uint64_t i, uint8_t salt) { return static_cast<uint8_t>((i * 131 + salt) % 251); }

std::vector<uint8_t> expected(uint64_t n, uint8_t salt) {
  std::vector<uint8_t> v(n);
  for (uint64_t i = 0; i < n; ++i) v[i] = pattern(i, salt);
  return v;
}

std::string hex(const unsigned char *p, size_t n) {
  static const char digits[] = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    s += digits[p[i] >> 4];
    s += digits[p[i] & 15];
  }
  return s;
}

// Spawns this binary as a child with `args`, the given fds at 3, 4, ...; returns its exit code.
int spawn_child(const std::vector<std::string> &args, const std::vector<int> &fds) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  for (size_t i = 0; i < fds.size(); ++i)
    posix_spawn_file_actions_adddup2(&fa, fds[i], 3 + static_cast<int>(i));
  std::vector<char *> argv{const_cast<char *>(g_self)};
  for (const std::string &a : args) argv.push_back(const_cast<char *>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = 0;
  if (posix_spawn(&pid, g_self, &fa, nullptr, argv.data(), environ) != 0) return -1;
  posix_spawn_file_actions_destroy(&fa);
  int status = 0;
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

// Round trip through the region in this process, then a child reads salt 1 and writes salt 2.
void share_with_child(swiftkv::MemoryRegion &r, uint64_t bytes) {
  const std::vector<uint8_t> one = expected(bytes, 1);
  CHECK_CUDA(cudaMemcpy(r.data(), one.data(), bytes, cudaMemcpyHostToDevice));
  std::vector<uint8_t> back(bytes);
  CHECK_CUDA(cudaMemcpy(back.data(), r.data(), bytes, cudaMemcpyDeviceToHost));
  CHECK(back == one);
  swiftkv::RegionExport e = r.export_range(0, bytes);
  std::vector<std::string> args{"--child",
                                std::to_string(static_cast<int>(e.kind)),
                                std::to_string(e.size),
                                std::to_string(bytes),
                                e.identity,
                                hex(e.ipc_handle.data(), e.ipc_handle.size())};
  std::vector<int> fds;
  for (const swiftkv::ExportedPiece &p : e.pieces) {
    args.push_back(std::to_string(p.offset) + ":" + std::to_string(p.size) + ":" +
                   std::to_string(p.generation));
    fds.push_back(p.fd.get());
  }
  CHECK(spawn_child(args, fds) == 0);
  CHECK_CUDA(cudaMemcpy(back.data(), r.data(), bytes, cudaMemcpyDeviceToHost));
  CHECK(back == expected(bytes, 2));
}

int child_main(int argc, char **argv) {
  swiftkv::RegionExport e;
  e.kind = static_cast<swiftkv::MemoryKind>(std::atoi(argv[2]));
  e.size = std::strtoull(argv[3], nullptr, 10);
  const uint64_t bytes = std::strtoull(argv[4], nullptr, 10);
  e.identity = argv[5];
  for (size_t i = 0; i < e.ipc_handle.size(); ++i) {
    e.ipc_handle[i] =
        static_cast<unsigned char>(std::stoi(std::string(argv[6] + 2 * i, 2), nullptr, 16));
  }
  for (int a = 7; a < argc; ++a) {
    swiftkv::ExportedPiece p;
    unsigned long long off = 0, size = 0, gen = 0;
    if (std::sscanf(argv[a], "%llu:%llu:%llu", &off, &size, &gen) != 3) return 4;
    p.offset = off;
    p.size = size;
    p.generation = gen;
    p.fd.reset(3 + (a - 7));
    e.pieces.push_back(std::move(p));
  }
  try {
    if (cudaSetDevice(0) != cudaSuccess) return 5;
    auto m = swiftkv::open_region(e);
    auto again = swiftkv::open_region(e);
    if (again.get() != m.get()) return 6;  // one mapping per region per process
    std::vector<uint8_t> got(bytes);
    if (cudaMemcpy(got.data(), m->data(), bytes, cudaMemcpyDeviceToHost) != cudaSuccess) return 7;
    if (got != expected(bytes, 1)) return 8;
    const std::vector<uint8_t> two = expected(bytes, 2);
    if (cudaMemcpy(m->data(), two.data(), bytes, cudaMemcpyHostToDevice) != cudaSuccess) return 9;
    if (cudaDeviceSynchronize() != cudaSuccess) return 10;
  } catch (const swiftkv::Error &err) {
    std::fprintf(stderr, "child: %s\n", err.what());
    return 2;
  }
  return 0;
}

void test_vmm_region() {
  if (!swiftkv::cuda_vmm_supported(0)) {
    std::printf("VMM unsupported on device 0: VMM part skipped\n");
    return;
  }
  auto r = swiftkv::create_cuda_region({0, 64ull << 20, swiftkv::CudaAllocation::vmm});
  CHECK(r->kind() == swiftkv::MemoryKind::cuda_vmm);
  const uint64_t g = r->commit_granule();
  CHECK(g > 0 && r->size() % g == 0);
  CHECK(r->committed_bytes() == 0);
  r->commit(0, 4 * g);
  CHECK(r->committed_bytes() == 4 * g);
  share_with_child(*r, 4 * g);
  r->decommit(2 * g, 2 * g);
  CHECK(r->committed_bytes() == 2 * g);
  r->commit(2 * g, g);  // a new granule: a new generation in the next export
  swiftkv::RegionExport e = r->export_range(0, 3 * g);
  CHECK(e.pieces.size() == 3 && e.pieces[2].generation > e.pieces[1].generation);
  std::printf("VMM: granule %llu bytes\n", static_cast<unsigned long long>(g));
}

void test_ipc_region() {
  auto r = swiftkv::create_cuda_region({0, 8ull << 20, swiftkv::CudaAllocation::malloc});
  CHECK(r->kind() == swiftkv::MemoryKind::cuda_ipc);
  CHECK(r->commit_granule() == 0);
  CHECK(r->committed_bytes() == 8ull << 20);
  share_with_child(*r, 8ull << 20);
}

void test_elastic_on_device() {
  swiftkv_ctx_config cc = SWIFTKV_CTX_CONFIG_INIT;
  cc.device_mask = 1;
  swiftkv_ctx *ctx = nullptr;
  CHECK(swiftkv_ctx_create(&ctx, &cc) == SWIFTKV_OK);
  // Qwen3-8B lending to Qwen3-32B: a unit is 256 blocks, 576 MiB.
  swiftkv_model_desc lender = swiftkv_paper_desc(SWIFTKV_PAPER_QWEN3_8B, 16, 256);
  swiftkv_model_desc borrower = swiftkv_paper_desc(SWIFTKV_PAPER_QWEN3_32B, 16, 256);
  lender.device = 0;
  swiftkv_elastic_config c = SWIFTKV_ELASTIC_CONFIG_INIT;
  c.lender = &lender;
  c.borrower = &borrower;
  c.capacity_blocks = 4 * 256;
  c.owned_blocks = 256;
  swiftkv_elastic *e = nullptr;
  if (swiftkv_elastic_create(&e, ctx, &c) != SWIFTKV_OK) {
    std::fprintf(stderr, "elastic_create: %s\n", swiftkv_last_error_message());
    ++g_failures;
    swiftkv_ctx_destroy(ctx);
    return;
  }
  swiftkv_elastic_stats s = SWIFTKV_ELASTIC_STATS_INIT;
  CHECK(swiftkv_elastic_stats_get(&s, e) == SWIFTKV_OK);
  std::printf("elastic on device 0: %s, committed %llu of %llu bytes\n",
              s.memory_kind == SWIFTKV_MEMORY_CUDA_VMM ? "VMM" : "cudaMalloc",
              static_cast<unsigned long long>(s.committed_bytes),
              static_cast<unsigned long long>(s.region_bytes));
  CHECK(s.device == 0);
  swiftkv_lease l = SWIFTKV_LEASE_INIT;
  CHECK(swiftkv_elastic_lend(&l, e, 1) == SWIFTKV_OK);
  CHECK(l.chunks == 9 && l.layer_stride == (1u << 20));
  const std::vector<uint8_t> one = expected(l.layer_stride, 1);
  char *piece = static_cast<char *>(l.data) + 8 * l.chunk_stride + 63 * l.layer_stride;
  CHECK_CUDA(cudaMemcpy(piece, one.data(), one.size(), cudaMemcpyHostToDevice));
  std::vector<uint8_t> back(one.size());
  CHECK_CUDA(cudaMemcpy(back.data(), piece, back.size(), cudaMemcpyDeviceToHost));
  CHECK(back == one);
  uint64_t blocks = 0, chunks = 0;
  CHECK(swiftkv_elastic_scale_for_request(&blocks, &chunks, e, 256 * 16 + 1) == SWIFTKV_OK);
  CHECK(blocks == 256 && chunks == 9);
  swiftkv_layer_view v = SWIFTKV_LAYER_VIEW_INIT;
  CHECK(swiftkv_elastic_layer_view(&v, e, 35) == SWIFTKV_OK);
  CHECK(v.device == 0);
  char *last = static_cast<char *>(v.base) + 511 * v.page_stride + v.v_offset;
  CHECK_CUDA(cudaMemset(last, 0x5A, v.v_offset));
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK(swiftkv_elastic_release(e, l.id) == SWIFTKV_OK);
  swiftkv_elastic_destroy(e);
  swiftkv_ctx_destroy(ctx);
}

// The core's region classes throw; a throw is one failed check.
void device_regions_share() {
  try {
    test_vmm_region();
    test_ipc_region();
  } catch (const swiftkv::Error &err) {
    std::fprintf(stderr, "%s\n", err.what());
    ++g_failures;
  }
}

}  // namespace

int main(int argc, char **argv) {
  if (argc >= 7 && std::strcmp(argv[1], "--child") == 0) return child_main(argc, argv);
  g_self = argv[0];
  if (const int rc = swiftkv_test_need_device(); rc != 0) return rc;
  const CMUnitTest tests[] = {
      SWIFTKV_GPU_TEST(device_regions_share),
      SWIFTKV_GPU_TEST(test_elastic_on_device),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}

#else
int main() { return swiftkv_test_no_gpu("libswiftkv built without CUDA"); }
#endif
