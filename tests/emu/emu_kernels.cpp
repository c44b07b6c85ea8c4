// The kernels' sources compiled for the CPU emulation: the stand-in CUDA headers in
// tests/emu/include and cuda_emu.hpp turn them into functions each fiber runs. Everything of
// theirs lives in an unnamed namespace (see emu_kernels.hpp), so the standard headers they use
// come first, outside it.
// The fibers switch stacks with _longjmp, which the fortified longjmp would take for a jump into
// a frame that does not exist.
#undef _FORTIFY_SOURCE
#include "emu_kernels.hpp"

#include <setjmp.h>
#include <sys/mman.h>
#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <type_traits>
#include <vector>
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

// The host functions these headers declare beside the kernels are never defined in here.
#pragma GCC diagnostic ignored "-Wunused-function"
namespace {
#include "cuda_emu.hpp"
#include "kernels/attention.cuh"
#include "kernels/attention_fa2.cuh"
#include "kernels/segment_copy.cuh"

// The kernels' `extern __shared__` arrays: one per namespace that declares one.
namespace swiftkv::kernels {
__attribute__((aligned(128))) unsigned char smem[swiftkv_emu::kMaxSharedBytes];
namespace fa2 {
__attribute__((aligned(128))) unsigned char smem[swiftkv_emu::kMaxSharedBytes];
}  // namespace fa2
}  // namespace swiftkv::kernels

namespace k = swiftkv::kernels;
using kernel_emulation::AttentionKernel;
using kernel_emulation::RunCounts;
using kernel_emulation::Schedule;

// launch(), adding up what every launch of a run did.
struct Counted {
  RunCounts total;
  void run(unsigned grid, unsigned block, size_t smem_bytes, unsigned char *smem,
           unsigned max_threads, const Schedule &schedule, std::function<void()> body) {
    const swiftkv_emu::Schedule how{schedule.seed, schedule.greedy_warps,
                                    schedule.copies_land_at_issue};
    const swiftkv_emu::LaunchCounts c =
        swiftkv_emu::launch(grid, block, smem_bytes, smem, max_threads, how, std::move(body));
    total.blocks += grid;
    total.barriers += c.barriers;
    total.collectives += c.collectives;
  }
};

// attention_run_cuda's launch<T, D, TILE>, kernel for kernel.
template <class T, int D, int TILE>
RunCounts launch_attention(AttentionKernel which, const swiftkv::AttentionParams &p,
                           bool vectorised, const Schedule &schedule) {
  Counted c;
  if (which == AttentionKernel::fa2 && vectorised) {
    constexpr int KV_TILE = k::fa2::kv_tile<D, TILE>();
    using Config = k::fa2::Config<D, TILE, KV_TILE>;
    if (p.n_work > 0) {
      c.run(static_cast<unsigned>(p.n_work), k::fa2::kThreads, Config::kBytes, k::fa2::smem,
            k::fa2::kThreads, schedule,
            [&] { k::fa2::fa2_attention_kernel<T, D, TILE, KV_TILE>(p); });
    }
  } else {
    constexpr int KV_TILE = k::wmma_kv_tile<D>();
    using Smem = k::AttentionSmem<D, TILE, KV_TILE>;
    const int vec = vectorised ? 1 : 0;
    if (p.n_work > 0) {
      c.run(static_cast<unsigned>(p.n_work), TILE * 2, Smem::kBytes, k::smem, TILE * 2, schedule,
            [&] { k::paged_attention_kernel<T, D, TILE, KV_TILE>(p, vec); });
    }
  }
  if (p.n_merge > 0) {
    c.run(static_cast<unsigned>(p.n_merge), 128, 0, k::smem, 128, schedule,
          [&] { k::merge_pieces_kernel<T, D>(p); });
  }
  return c.total;
}

template <class T, int D>
RunCounts by_tile(AttentionKernel which, const swiftkv::AttentionParams &p, bool vectorised,
                  const Schedule &schedule) {
  switch (p.tile_rows) {
    case 16: return launch_attention<T, D, 16>(which, p, vectorised, schedule);
    case 64: return launch_attention<T, D, 64>(which, p, vectorised, schedule);
    default: swiftkv_emu::fatal("a tile with no kernel");
  }
}

template <class T>
RunCounts by_head_dim(AttentionKernel which, int head_dim, const swiftkv::AttentionParams &p,
                      bool vectorised, const Schedule &schedule) {
  switch (head_dim) {
    case 64: return by_tile<T, 64>(which, p, vectorised, schedule);
    case 128: return by_tile<T, 128>(which, p, vectorised, schedule);
    case 256: return by_tile<T, 256>(which, p, vectorised, schedule);
    default: swiftkv_emu::fatal("a head dim with no kernel");
  }
}

}  // namespace

namespace kernel_emulation {

size_t attention_params_size() { return sizeof(swiftkv::AttentionParams); }
size_t copy_item_size() { return sizeof(swiftkv::CopyItem); }
size_t chunk_source_size() { return sizeof(swiftkv::ChunkSource); }

RunCounts run_attention(AttentionKernel kernel, bool bf16, int head_dim, const void *params,
                        size_t params_size, bool vectorised, const Schedule &schedule) {
  swiftkv::AttentionParams p;
  if (params_size != sizeof p) swiftkv_emu::fatal("AttentionParams of another size");
  std::memcpy(&p, params, sizeof p);
  return bf16 ? by_head_dim<__nv_bfloat16>(kernel, head_dim, p, vectorised, schedule)
              : by_head_dim<half>(kernel, head_dim, p, vectorised, schedule);
}

RunCounts run_copy_items(unsigned grid, const void *items, uint32_t n, const void *chunks,
                         uint64_t layer_offset, unsigned char *staging, unsigned char *pages,
                         bool scatter, const Schedule &schedule) {
  Counted c;
  const auto *it = static_cast<const swiftkv::CopyItem *>(items);
  const auto *ch = static_cast<const swiftkv::ChunkSource *>(chunks);
  c.run(grid, k::kCopyThreads, 0, k::smem, k::kCopyThreads, schedule,
        [&] { k::copy_items(it, n, ch, layer_offset, staging, pages, scatter ? 1 : 0); });
  return c.total;
}

RunCounts run_decode_items(unsigned grid, const void *items, uint32_t n, const void *chunks,
                           const unsigned char *staging, unsigned char *pages, const void *shape,
                           size_t shape_size, const Schedule &schedule) {
  swiftkv::codec::LayerShape s;
  if (shape_size != sizeof s) swiftkv_emu::fatal("LayerShape of another size");
  std::memcpy(&s, shape, sizeof s);
  Counted c;
  const auto *it = static_cast<const swiftkv::CopyItem *>(items);
  const auto *ch = static_cast<const swiftkv::ChunkSource *>(chunks);
  c.run(grid, k::kCopyThreads, 0, k::smem, k::kCopyThreads, schedule,
        [&] { k::decode_items(it, n, ch, staging, pages, s); });
  return c.total;
}

}  // namespace kernel_emulation
