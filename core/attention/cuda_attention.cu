// The CUDA launcher of paged attention: device checks, the plan's copy into the workspace, and
// the dispatch of dtype, head dim and tile size onto the fa2 kernel templates and FlashInfer's
// instantiations.
#include <cuda_runtime_api.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "core/attention/cuda_attention.hpp"
#include "core/common/error.hpp"
#include "core/memory/cuda_check.hpp"
#include "kernels/attention_fa2.cuh"
#include "kernels/attention_merge.cuh"

namespace swiftkv {

#if defined(SWIFTKV_HAVE_FLASHINFER)
// Instantiated, one dtype and head dim per translation unit, in the files generated from
// flashinfer_instance.cu.in (flashinfer_prefill.cuh).
template <class T, uint32_t HEAD_DIM>
cudaError_t flashinfer_prefill(const FlashInferLaunch &l, uint32_t num_qo_heads,
                               uint32_t num_kv_heads, uint32_t page_tokens, float sm_scale,
                               cudaStream_t stream, std::string *error);
#endif

namespace {

cudaStream_t as_stream(void *stream) { return static_cast<cudaStream_t>(stream); }

// The kernels are instantiated for exactly these values; anything else is a library bug
// (check_attention_shape refused it before).
#define SWIFTKV_DISPATCH_HEAD_DIM(value, NAME, ...)                                               \
  switch (value) {                                                                                \
    case 64: {                                                                                    \
      constexpr int NAME = 64;                                                                    \
      __VA_ARGS__ break;                                                                          \
    }                                                                                             \
    case 128: {                                                                                   \
      constexpr int NAME = 128;                                                                   \
      __VA_ARGS__ break;                                                                          \
    }                                                                                             \
    case 256: {                                                                                   \
      constexpr int NAME = 256;                                                                   \
      __VA_ARGS__ break;                                                                          \
    }                                                                                             \
    default:                                                                                      \
      fail(SWIFTKV_EINTERNAL, "attention: head_dim " + std::to_string(value) + " has no kernel"); \
  }

#define SWIFTKV_DISPATCH_TILE(value, NAME, ...)                                                 \
  switch (value) {                                                                              \
    case 16: {                                                                                  \
      constexpr int NAME = 16;                                                                  \
      __VA_ARGS__ break;                                                                        \
    }                                                                                           \
    case 64: {                                                                                  \
      constexpr int NAME = 64;                                                                  \
      __VA_ARGS__ break;                                                                        \
    }                                                                                           \
    default:                                                                                    \
        fail(SWIFTKV_EINTERNAL, "attention: tile " + std::to_string(value) + " has no kernel"); \
  }

// The dynamic shared memory a kernel needs, allowed once per call (not a stream operation:
// allowed while a graph is being captured).
template <class Kernel>
void allow_shared_memory(Kernel *kernel, size_t bytes) {
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(bytes)),
             "cudaFuncSetAttribute(attention shared memory)");
}

template <class T, int D, int TILE>
void launch(const AttentionParams &p, cudaStream_t stream) {
  constexpr int KV_TILE = kernels::fa2::kv_tile<D, TILE>();
  using Config = kernels::fa2::Config<D, TILE, KV_TILE>;
  auto *kernel = &kernels::fa2::fa2_attention_kernel<T, D, TILE, KV_TILE>;
  allow_shared_memory(kernel, Config::kBytes);
  if (p.n_work > 0) {
    kernel<<<static_cast<unsigned>(p.n_work), kernels::fa2::kThreads, Config::kBytes, stream>>>(p);
    check_cuda(cudaGetLastError(), "launching the paged attention kernel (fa2)");
  }
  if (p.n_merge > 0) {
    kernels::merge_pieces_kernel<T, D><<<static_cast<unsigned>(p.n_merge), 128, 0, stream>>>(p);
    check_cuda(cudaGetLastError(), "launching the attention merge kernel");
  }
}

template <class T>
void launch_typed(const AttentionShape &s, const AttentionParams &p,
                  cudaStream_t stream){SWIFTKV_DISPATCH_HEAD_DIM(
    s.head_dim, D, {SWIFTKV_DISPATCH_TILE(p.tile_rows, TILE, { launch<T, D, TILE>(p, stream); })})}

// FlashInfer writes lse in base 2; the API's is the natural log.
__global__ void lse_to_natural_log(float *lse, uint32_t n) {
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) lse[i] *= 0.693147180559945309f;
}

#if defined(SWIFTKV_HAVE_FLASHINFER)
template <class T>
cudaError_t flashinfer_typed(const AttentionShape &s, const FlashInferLaunch &l,
                             cudaStream_t stream, std::string *error) {
  cudaError_t status = cudaSuccess;
  SWIFTKV_DISPATCH_HEAD_DIM(s.head_dim, D, {
    status = flashinfer_prefill<T, D>(l, s.num_qo_heads, s.num_kv_heads, s.page_tokens, s.sm_scale,
                                      stream, error);
  })
  return status;
}
#endif

}  // namespace

uint32_t attention_device_parallelism(int32_t device) {
  check_device(device);
  // Attributes rather than cudaGetDeviceProperties, which is slow: this runs on every plan.
  int major = 0, minor = 0, sms = 0;
  check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device),
             "cudaDeviceGetAttribute(compute capability)");
  check_cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device),
             "cudaDeviceGetAttribute(compute capability)");
  check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
             "cudaDeviceGetAttribute(multiprocessors)");
  if (major < 8) {
    fail(SWIFTKV_EUNSUPPORTED, "attention needs compute capability 8.0 or newer; device " +
                                   std::to_string(device) + " has " + std::to_string(major) + "." +
                                   std::to_string(minor));
  }
  return static_cast<uint32_t>(sms) * 2;
}

void attention_copy_plan(int32_t device, void *workspace, const void *plan, uint64_t bytes,
                         void *stream) {
  DeviceGuard guard(device);
  // Pageable source: the call returns once the bytes are staged (a host synchronisation).
  check_cuda(cudaMemcpyAsync(workspace, plan, bytes, cudaMemcpyHostToDevice, as_stream(stream)),
             "copying the attention plan into the workspace");
}

void attention_run_cuda(const AttentionShape &s, const AttentionParams &p, void *stream) {
  DeviceGuard guard(s.device);
  switch (s.dtype) {
    case SWIFTKV_DTYPE_F16: return launch_typed<half>(s, p, as_stream(stream));
    case SWIFTKV_DTYPE_BF16: return launch_typed<__nv_bfloat16>(s, p, as_stream(stream));
    default: fail(SWIFTKV_EINTERNAL, "attention: unchecked dtype reached the CUDA launcher");
  }
}

#if defined(SWIFTKV_HAVE_FLASHINFER)
bool flashinfer_built() { return true; }

void attention_run_flashinfer(const AttentionShape &s, const FlashInferLaunch &l, void *stream) {
  DeviceGuard guard(s.device);
  std::string error;
  cudaError_t status = cudaSuccess;
  switch (s.dtype) {
    case SWIFTKV_DTYPE_F16: status = flashinfer_typed<half>(s, l, as_stream(stream), &error); break;
    case SWIFTKV_DTYPE_BF16:
      status = flashinfer_typed<__nv_bfloat16>(s, l, as_stream(stream), &error);
      break;
    default: fail(SWIFTKV_EINTERNAL, "attention: unchecked dtype reached FlashInfer's launcher");
  }
  if (!error.empty()) fail(SWIFTKV_EINTERNAL, "FlashInfer's batch prefill: " + error);
  check_cuda(status, "launching FlashInfer's batch prefill");
  const uint32_t n = l.q_tokens * s.num_qo_heads;
  if (l.lse != nullptr && n > 0) {
    lse_to_natural_log<<<(n + 255) / 256, 256, 0, as_stream(stream)>>>(l.lse, n);
    check_cuda(cudaGetLastError(), "launching the lse conversion");
  }
}
#else
bool flashinfer_built() { return false; }

void attention_run_flashinfer(const AttentionShape &, const FlashInferLaunch &, void *) {
  fail(SWIFTKV_EINTERNAL, "attention: FlashInfer's kernel asked of a build without it");
}
#endif

}  // namespace swiftkv
