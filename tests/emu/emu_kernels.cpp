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
#include "kernels/attention_fa2.cuh"
#include "kernels/attention_merge.cuh"
#include "kernels/segment_copy.cuh"

// The kernels' `extern __shared__` arrays: one per namespace that declares one.
namespace swiftkv::kernels {
__attribute__((aligned(128))) unsigned char smem[swiftkv_emu::kMaxSharedBytes];
namespace fa2 {
__attribute__((aligned(128))) unsigned char smem[swiftkv_emu::kMaxSharedBytes];
}  // namespace fa2
}  // namespace swiftkv::kernels

namespace k = swiftkv::kernels;
using kernel_emulation::Schedule;

// attention_run_cuda's launch<T, D, TILE>: the fa2 kernel's work items, then the merges.
template <class T, int D, int TILE>
uint64_t launch_attention(const swiftkv::AttentionParams &p, const Schedule &schedule) {
  constexpr int KV_TILE = k::fa2::kv_tile<D, TILE>();
  using Config = k::fa2::Config<D, TILE, KV_TILE>;
  if (p.n_work > 0) {
    swiftkv_emu::launch(static_cast<unsigned>(p.n_work), k::fa2::kThreads, Config::kBytes,
                        k::fa2::smem, k::fa2::kThreads, schedule,
                        [&] { k::fa2::fa2_attention_kernel<T, D, TILE, KV_TILE>(p); });
  }
  if (p.n_merge > 0) {
    swiftkv_emu::launch(static_cast<unsigned>(p.n_merge), 128, 0, k::smem, 128, schedule,
                        [&] { k::merge_pieces_kernel<T, D>(p); });
  }
  return static_cast<uint64_t>(p.n_work) + static_cast<uint64_t>(p.n_merge);
}

template <class T, int D>
uint64_t by_tile(const swiftkv::AttentionParams &p, const Schedule &schedule) {
  switch (p.tile_rows) {
    case 16: return launch_attention<T, D, 16>(p, schedule);
    case 64: return launch_attention<T, D, 64>(p, schedule);
    default: swiftkv_emu::fatal("a tile with no kernel");
  }
}

template <class T>
uint64_t by_head_dim(int head_dim, const swiftkv::AttentionParams &p, const Schedule &schedule) {
  switch (head_dim) {
    case 64: return by_tile<T, 64>(p, schedule);
    case 128: return by_tile<T, 128>(p, schedule);
    case 256: return by_tile<T, 256>(p, schedule);
    default: swiftkv_emu::fatal("a head dim with no kernel");
  }
}

}  // namespace

namespace kernel_emulation {

size_t copy_item_size() { return sizeof(swiftkv::CopyItem); }
size_t chunk_source_size() { return sizeof(swiftkv::ChunkSource); }

uint64_t run_attention(bool bf16, int head_dim, const void *params, size_t params_size,
                       const Schedule &schedule) {
  swiftkv::AttentionParams p;
  if (params_size != sizeof p) swiftkv_emu::fatal("AttentionParams of another size");
  std::memcpy(&p, params, sizeof p);
  return bf16 ? by_head_dim<__nv_bfloat16>(head_dim, p, schedule)
              : by_head_dim<half>(head_dim, p, schedule);
}

void run_copy_items(unsigned grid, const void *items, uint32_t n, const void *chunks,
                    uint64_t layer_offset, unsigned char *staging, unsigned char *pages,
                    bool scatter, bool ahead, const Schedule &schedule) {
  const auto *it = static_cast<const swiftkv::CopyItem *>(items);
  const auto *ch = static_cast<const swiftkv::ChunkSource *>(chunks);
  swiftkv_emu::launch(grid, k::kCopyThreads, 0, k::smem, k::kCopyThreads, schedule, [&] {
    if (ahead) {
      k::copy_items_ahead(it, n, ch, layer_offset, staging, pages, scatter ? 1 : 0);
    } else {
      k::copy_items(it, n, ch, layer_offset, staging, pages, scatter ? 1 : 0);
    }
  });
}

void run_decode_items(unsigned grid, const void *items, uint32_t n, const void *chunks,
                      const unsigned char *staging, unsigned char *pages, const void *shape,
                      size_t shape_size, bool ahead, const Schedule &schedule) {
  swiftkv::codec::LayerShape s;
  if (shape_size != sizeof s) swiftkv_emu::fatal("LayerShape of another size");
  std::memcpy(&s, shape, sizeof s);
  const auto *it = static_cast<const swiftkv::CopyItem *>(items);
  const auto *ch = static_cast<const swiftkv::ChunkSource *>(chunks);
  swiftkv_emu::launch(grid, k::kCopyThreads, 0, k::smem, k::kCopyThreads, schedule, [&] {
    if (ahead) {
      k::decode_items_ahead(it, n, ch, staging, pages, s);
    } else {
      k::decode_items(it, n, ch, staging, pages, s);
    }
  });
}

}  // namespace kernel_emulation
