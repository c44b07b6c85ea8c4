// On a GPU machine: the paged attention kernels against the CPU twin over sweeps of dtype, head
// dim, GQA ratio, page size, layout, causal mode, soft cap and KV splits (explicit and chosen by
// the plan), and a run captured in a CUDA graph giving the same bits as a direct run; each case
// runs FlashInfer's kernel (SWIFTKV_ATTENTION_KERNEL=flashinfer: it must run exactly the cases
// the docs say it takes, and refuse the rest with SWIFTKV_EUNSUPPORTED) and the fa2 kernel
// (SWIFTKV_ATTENTION_KERNEL=fa2) against one CPU run.
// Exits 77 without a usable device or without CUDA.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "gpu_skip.h"

#if defined(SWIFTKV_TEST_HAVE_CUDA)
#include <cuda_runtime_api.h>

#include "attention_fixture.h"
#include "gpu_check.h"

namespace {

// Device copies of a problem's tensors, with args pointing at them.
struct DeviceProblem {
  void *q = nullptr, *kv = nullptr, *out = nullptr, *ws = nullptr;
  int32_t *indices = nullptr;
  float *lse = nullptr;
  swiftkv_attention_args args{};
  ~DeviceProblem() {
    cudaFree(q);
    cudaFree(kv);
    cudaFree(out);
    cudaFree(ws);
    cudaFree(indices);
    cudaFree(lse);
  }
};

bool upload(const att_problem &p, DeviceProblem &d) {
  const size_t lse_bytes = sizeof(float) * (size_t(p.q_tokens) * p.desc.num_qo_heads + 1);
  const size_t idx_bytes = sizeof(int32_t) * (size_t(p.kv_indptr[p.n_req]) + 1);
  if (cudaMalloc(&d.q, p.q_bytes) != cudaSuccess || cudaMalloc(&d.kv, p.kv_bytes) != cudaSuccess ||
      cudaMalloc(&d.out, p.out_bytes) != cudaSuccess ||
      cudaMalloc(reinterpret_cast<void **>(&d.indices), idx_bytes) != cudaSuccess ||
      cudaMalloc(reinterpret_cast<void **>(&d.lse), lse_bytes) != cudaSuccess) {
    return false;
  }
  cudaMemcpy(d.q, p.q, p.q_bytes, cudaMemcpyHostToDevice);
  cudaMemcpy(d.kv, p.kv, p.kv_bytes, cudaMemcpyHostToDevice);
  cudaMemcpy(d.indices, p.kv_indices, idx_bytes - sizeof(int32_t), cudaMemcpyHostToDevice);
  cudaMemset(d.out, 0, p.out_bytes);
  d.args = p.args;
  d.args.q = d.q;
  d.args.k_base = static_cast<const unsigned char *>(d.kv) +
                  (static_cast<const unsigned char *>(p.args.k_base) - p.kv);
  d.args.v_base = static_cast<const unsigned char *>(d.kv) +
                  (static_cast<const unsigned char *>(p.args.v_base) - p.kv);
  d.args.kv_indices = d.indices;
  d.args.out = d.out;
  d.args.lse = d.lse;
  return true;
}

// Whether FlashInfer's kernel takes p (docs/attention.md#flashinfer): causal or one query token a
// sub-request, no soft cap, no query without a key, forced splits of whole pages, dense output.
bool flashinfer_takes(const att_problem &p) {
  if (p.desc.logits_soft_cap > 0 || p.q_tokens == 0 || p.layout == ATT_PADDED) return false;
  if (p.desc.kv_chunk_tokens % p.desc.page_tokens != 0) return false;
  for (uint32_t r = 0; r < p.n_req; ++r) {
    if (p.q_len[r] == 0) continue;
    if (p.kv_len[r] == 0) return false;
    if (p.desc.causal ? p.kv_len[r] < p.q_len[r] : p.q_len[r] > 1) return false;
  }
  return true;
}

uint32_t g_flashinfer_runs = 0;

// Runs p on the host (the reference) and on device 0 with each kernel; compares out and lse.
void compare_case(att_problem &p, const char *name, uint32_t *splits_seen) {
  // The CPU twin.
  swiftkv_attention_desc host = p.desc;
  host.device = SWIFTKV_DEVICE_HOST;
  uint64_t bytes = 0;
  CHECK(swiftkv_attention_workspace_size(&bytes, &host, p.n_req, uint64_t(p.q_tokens)) ==
        SWIFTKV_OK);
  void *hws = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
  swiftkv_attention_plan hp = SWIFTKV_ATTENTION_PLAN_INIT;
  CHECK(swiftkv_attention_plan_make(&hp, &host, p.qo_indptr, p.kv_indptr, p.last_page_len, p.n_req,
                                    hws, bytes, nullptr) == SWIFTKV_OK);
  CHECK(swiftkv_attention_run(&hp, &p.args, hws, nullptr) == SWIFTKV_OK);
  std::free(hws);

  DeviceProblem d;
  CHECK(upload(p, d));
  swiftkv_attention_desc dev = p.desc;
  dev.device = 0;
  CHECK(swiftkv_attention_workspace_size(&bytes, &dev, p.n_req, uint64_t(p.q_tokens)) ==
        SWIFTKV_OK);
  // The bound covers the splits a plan chooses; forced ones (kv_chunk_tokens) split every
  // sub-request's KV whatever its length, so their partial rows get room of their own.
  if (p.desc.kv_chunk_tokens > 0) bytes += uint64_t{256} << 20;
  CHECK_CUDA(cudaMalloc(&d.ws, bytes));
  swiftkv_attention_plan plan = SWIFTKV_ATTENTION_PLAN_INIT;
  CHECK(swiftkv_attention_plan_make(&plan, &dev, p.qo_indptr, p.kv_indptr, p.last_page_len, p.n_req,
                                    d.ws, bytes, nullptr) == SWIFTKV_OK);
  if (splits_seen != nullptr) *splits_seen += plan.split_requests;
  // Both kernels against the one CPU run (the twin is the slow part).
  const bool flashinfer = flashinfer_takes(p);
  for (const char *kernel : {"flashinfer", "fa2"}) {
    CHECK(setenv("SWIFTKV_ATTENTION_KERNEL", kernel, 1) == 0);
    // NaN everywhere first (all-ones bits in f16, bf16 and f32): what a kernel leaves unwritten
    // fails the comparison.
    CHECK_CUDA(cudaMemset(d.out, 0xff, p.out_bytes));
    CHECK_CUDA(cudaMemset(d.lse, 0xff, sizeof(float) * size_t(p.q_tokens) * p.desc.num_qo_heads));
    const swiftkv_status st = swiftkv_attention_run(&plan, &d.args, d.ws, nullptr);
    CHECK(unsetenv("SWIFTKV_ATTENTION_KERNEL") == 0);
    if (std::strcmp(kernel, "flashinfer") == 0) {
      if (st != (flashinfer ? SWIFTKV_OK : SWIFTKV_EUNSUPPORTED)) {
        std::fprintf(stderr, "%s: FlashInfer %s (%s)\n", name,
                     flashinfer ? "refused a batch it takes" : "ran a batch it does not take",
                     swiftkv_last_error_message());
      }
      CHECK(st == (flashinfer ? SWIFTKV_OK : SWIFTKV_EUNSUPPORTED));
      if (!flashinfer) continue;
      ++g_flashinfer_runs;
    }
    CHECK(st == SWIFTKV_OK);
    CHECK_CUDA(cudaDeviceSynchronize());
    std::vector<unsigned char> out(p.out_bytes);
    std::vector<float> lse(size_t(p.q_tokens) * p.desc.num_qo_heads);
    CHECK_CUDA(cudaMemcpy(out.data(), d.out, p.out_bytes, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(lse.data(), d.lse, lse.size() * sizeof(float), cudaMemcpyDeviceToHost));
    char what[96];
    std::snprintf(what, sizeof what, "%s (%s)", name, kernel);
    const int bad = att_mismatches(&p, out.data(), lse.data(), p.out, p.lse, what);
    if (bad != 0) std::fprintf(stderr, "%s (%s): %d mismatches\n", name, kernel, bad);
    CHECK(bad == 0);
  }
}

void kernels_match_the_cpu_twin() {
  uint64_t s = 77;
  const uint32_t before = g_flashinfer_runs;
  for (int c = 0; c < 80; ++c) {
    att_problem p;
    att_sweep_case(&p, c, &s, 600, 150, 400);
    char name[64];
    std::snprintf(name, sizeof name, "case %d", c);
    compare_case(p, name, nullptr);
    att_free(&p);
  }
  std::printf("FlashInfer ran %u of the 80 cases\n", g_flashinfer_runs - before);
  CHECK(g_flashinfer_runs - before >= 10);
}

// Tensors a kernel cannot load 16 bytes at a time: FlashInfer's kernel refuses them and so does
// fa2 (SWIFTKV_EINVAL, nothing launched).
void unaligned_tensors_are_refused() {
  att_problem p;
  att_start(&p, 8, 2, 64, 16, ATT_NHD);
  p.n_req = 1;
  p.q_len[0] = 5;
  p.kv_len[0] = 40;
  att_build(&p, 12, 1);
  DeviceProblem d;
  CHECK(upload(p, d));
  d.args.q = static_cast<const unsigned char *>(d.args.q) + p.elem;  // one element in
  swiftkv_attention_desc dev = p.desc;
  dev.device = 0;
  uint64_t bytes = 0;
  CHECK(swiftkv_attention_workspace_size(&bytes, &dev, 1, 5) == SWIFTKV_OK);
  CHECK_CUDA(cudaMalloc(&d.ws, bytes));
  swiftkv_attention_plan plan = SWIFTKV_ATTENTION_PLAN_INIT;
  CHECK(swiftkv_attention_plan_make(&plan, &dev, p.qo_indptr, p.kv_indptr, p.last_page_len, 1, d.ws,
                                    bytes, nullptr) == SWIFTKV_OK);
  CHECK(swiftkv_attention_run(&plan, &d.args, d.ws, nullptr) == SWIFTKV_EINVAL);
  CHECK(std::strstr(swiftkv_last_error_message(), "16-byte aligned") != nullptr);
  CHECK(setenv("SWIFTKV_ATTENTION_KERNEL", "flashinfer", 1) == 0);
  CHECK(swiftkv_attention_run(&plan, &d.args, d.ws, nullptr) == SWIFTKV_EUNSUPPORTED);
  CHECK(std::strstr(swiftkv_last_error_message(), "q is not 16-byte aligned") != nullptr);
  CHECK(unsetenv("SWIFTKV_ATTENTION_KERNEL") == 0);
  att_free(&p);
}

// A decode batch too small to fill the device with one long KV: both plans split it (FlashInfer's
// partials in the dtype, merged by its merge kernel; fa2's in fp32, merged by the library's).
void automatic_splits_match() {
  att_problem p;
  att_start(&p, 32, 8, 128, 16, ATT_NHD);
  p.n_req = 2;
  p.q_len[0] = 1;
  p.kv_len[0] = 20000;
  p.q_len[1] = 1;
  p.kv_len[1] = 3000;
  att_build(&p, 9, 0);
  uint32_t splits = 0;
  compare_case(p, "automatic split", &splits);
  CHECK(splits == 2);
  att_free(&p);
}

// The run captured in a CUDA graph writes the same bits as a direct run (FlashInfer's kernel with
// its split into 4-page chunks, unless SWIFTKV_ATTENTION_KERNEL says fa2).
void graph_capture_replays_the_run() {
  att_problem p;
  att_start(&p, 8, 2, 128, 16, ATT_VLLM);
  p.desc.kv_chunk_tokens = 64;
  swiftkv_attention_desc desc = p.desc;
  desc.device = 0;
  p.n_req = 2;
  p.q_len[0] = 37;
  p.kv_len[0] = 300;
  p.q_len[1] = 1;
  p.kv_len[1] = 129;
  att_build(&p, 21, 1);
  DeviceProblem d;
  CHECK(upload(p, d));
  uint64_t bytes = 0;
  CHECK(swiftkv_attention_workspace_size(&bytes, &desc, 2, 38) == SWIFTKV_OK);
  CHECK_CUDA(cudaMalloc(&d.ws, bytes));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  swiftkv_attention_plan plan = SWIFTKV_ATTENTION_PLAN_INIT;
  CHECK(swiftkv_attention_plan_make(&plan, &desc, p.qo_indptr, p.kv_indptr, p.last_page_len, 2,
                                    d.ws, bytes, stream) == SWIFTKV_OK);
  CHECK(swiftkv_attention_run(&plan, &d.args, d.ws, stream) == SWIFTKV_OK);
  CHECK_CUDA(cudaStreamSynchronize(stream));
  std::vector<unsigned char> direct(p.out_bytes), replayed(p.out_bytes);
  CHECK_CUDA(cudaMemcpy(direct.data(), d.out, p.out_bytes, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemset(d.out, 0, p.out_bytes));

  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  const swiftkv_status st = swiftkv_attention_run(&plan, &d.args, d.ws, stream);
  CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  CHECK(st == SWIFTKV_OK);
  CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  CHECK_CUDA(cudaGraphLaunch(exec, stream));
  CHECK_CUDA(cudaGraphLaunch(exec, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  CHECK_CUDA(cudaMemcpy(replayed.data(), d.out, p.out_bytes, cudaMemcpyDeviceToHost));
  CHECK(std::memcmp(direct.data(), replayed.data(), p.out_bytes) == 0);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  att_free(&p);
}

// The FlashAttention-2 style kernel (SWIFTKV_ATTENTION_KERNEL=fa2; the sweeps and the automatic
// split above already compare it with the twin) captured in a graph; an unknown kernel name is
// refused.
void fa2_kernel_in_a_graph_and_a_bad_name() {
  CHECK(setenv("SWIFTKV_ATTENTION_KERNEL", "fa2", 1) == 0);
  graph_capture_replays_the_run();
  CHECK(setenv("SWIFTKV_ATTENTION_KERNEL", "nosuch", 1) == 0);
  {
    att_problem p;
    att_start(&p, 8, 2, 128, 16, ATT_NHD);
    p.n_req = 1;
    p.q_len[0] = 4;
    p.kv_len[0] = 40;
    att_build(&p, 5, 0);
    DeviceProblem d;
    CHECK(upload(p, d));
    swiftkv_attention_desc dev = p.desc;
    dev.device = 0;
    uint64_t bytes = 0;
    CHECK(swiftkv_attention_workspace_size(&bytes, &dev, 1, 4) == SWIFTKV_OK);
    CHECK_CUDA(cudaMalloc(&d.ws, bytes));
    swiftkv_attention_plan plan = SWIFTKV_ATTENTION_PLAN_INIT;
    CHECK(swiftkv_attention_plan_make(&plan, &dev, p.qo_indptr, p.kv_indptr, p.last_page_len, 1,
                                      d.ws, bytes, nullptr) == SWIFTKV_OK);
    CHECK(swiftkv_attention_run(&plan, &d.args, d.ws, nullptr) == SWIFTKV_EINVAL);
    att_free(&p);
  }
  CHECK(unsetenv("SWIFTKV_ATTENTION_KERNEL") == 0);
}

}  // namespace

int main() {
  if (const int rc = swiftkv_test_need_device(); rc != 0) return rc;
  const CMUnitTest tests[] = {
      SWIFTKV_GPU_TEST(kernels_match_the_cpu_twin),
      SWIFTKV_GPU_TEST(automatic_splits_match),
      SWIFTKV_GPU_TEST(graph_capture_replays_the_run),
      SWIFTKV_GPU_TEST(fa2_kernel_in_a_graph_and_a_bad_name),
      SWIFTKV_GPU_TEST(unaligned_tensors_are_refused),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}

#else
int main() { return swiftkv_test_no_gpu("libswiftkv built without CUDA"); }
#endif
