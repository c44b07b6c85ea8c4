// The CUDA launcher of paged attention: device checks, the plan's copy into the workspace, and
// the dispatch of kernel, dtype, head dim and tile size onto the kernel templates.
#include <cuda_runtime_api.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "core/attention/cuda_attention.hpp"
#include "core/common/error.hpp"
#include "core/memory/cuda_check.hpp"
#include "kernels/attention.cuh"
#include "kernels/attention_fa2.cuh"

namespace swiftkv {

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

// Which kernel runs the work items: the WMMA kernel (kernels/attention.cuh, the default until
// the FlashAttention-2 style one is validated on a GPU) or that one (kernels/attention_fa2.cuh),
// chosen by SWIFTKV_ATTENTION_KERNEL=wmma|fa2. fa2 needs 16-byte aligned tensors; a run that is
// not gets the WMMA kernel.
enum class AttentionKernel { wmma, fa2 };

AttentionKernel selected_kernel() {
  const char *e = std::getenv("SWIFTKV_ATTENTION_KERNEL");
  if (e == nullptr || *e == '\0' || std::strcmp(e, "wmma") == 0) return AttentionKernel::wmma;
  if (std::strcmp(e, "fa2") == 0) return AttentionKernel::fa2;
  fail_invalid(std::string("SWIFTKV_ATTENTION_KERNEL is '") + e +
               "': it names the attention kernel, wmma (the default) or fa2");
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
void launch(const AttentionParams &p, bool vectorised, AttentionKernel which, cudaStream_t stream) {
  if (which == AttentionKernel::fa2 && vectorised) {
    constexpr int KV_TILE = kernels::fa2::kv_tile<D, TILE>();
    using Config = kernels::fa2::Config<D, TILE, KV_TILE>;
    auto *kernel = &kernels::fa2::fa2_attention_kernel<T, D, TILE, KV_TILE>;
    allow_shared_memory(kernel, Config::kBytes);
    if (p.n_work > 0) {
      kernel<<<static_cast<unsigned>(p.n_work), kernels::fa2::kThreads, Config::kBytes, stream>>>(
          p);
      check_cuda(cudaGetLastError(), "launching the paged attention kernel (fa2)");
    }
  } else {
    constexpr int KV_TILE = kernels::wmma_kv_tile<D>();
    using Smem = kernels::AttentionSmem<D, TILE, KV_TILE>;
    auto *kernel = &kernels::paged_attention_kernel<T, D, TILE, KV_TILE>;
    allow_shared_memory(kernel, Smem::kBytes);
    if (p.n_work > 0) {
      kernel<<<static_cast<unsigned>(p.n_work), TILE * 2, Smem::kBytes, stream>>>(
          p, vectorised ? 1 : 0);
      check_cuda(cudaGetLastError(), "launching the paged attention kernel");
    }
  }
  if (p.n_merge > 0) {
    kernels::merge_pieces_kernel<T, D><<<static_cast<unsigned>(p.n_merge), 128, 0, stream>>>(p);
    check_cuda(cudaGetLastError(), "launching the attention merge kernel");
  }
}

template <class T>
void launch_typed(const AttentionShape &s, const AttentionParams &p, bool vectorised,
                  AttentionKernel which, cudaStream_t stream) {
  SWIFTKV_DISPATCH_HEAD_DIM(s.head_dim, D, {SWIFTKV_DISPATCH_TILE(p.tile_rows, TILE, {
                              launch<T, D, TILE>(p, vectorised, which, stream);
                            })})
}

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

void attention_run_cuda(const AttentionShape &s, const AttentionParams &p, bool vectorised,
                        void *stream) {
  const AttentionKernel which = selected_kernel();
  DeviceGuard guard(s.device);
  switch (s.dtype) {
    case SWIFTKV_DTYPE_F16: return launch_typed<half>(s, p, vectorised, which, as_stream(stream));
    case SWIFTKV_DTYPE_BF16:
      return launch_typed<__nv_bfloat16>(s, p, vectorised, which, as_stream(stream));
    default: fail(SWIFTKV_EINTERNAL, "attention: unchecked dtype reached the CUDA launcher");
  }
}

}  // namespace swiftkv
