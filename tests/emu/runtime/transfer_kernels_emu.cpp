// The emulated launches of transfer_kernels_emu.hpp. Under TSan, which cannot follow the kernels'
// emulation (its fibers switch stacks), the kernels' CPU twins run instead: the streams' order
// is what this emulation checks, and TSan then watches the library's host side under it.
#include "transfer_kernels_emu.hpp"

#include <mutex>

#if !defined(__SANITIZE_THREAD__)
#include "emu_kernels.hpp"
#endif

namespace swiftkv::transfer_emulation {

namespace {

// The emulation runs one launch at a time (its fibers share one scheduler).
std::mutex g_launch_mu;

}  // namespace

void launch_copy(bool ahead, unsigned grid, const CopyItem *items, uint32_t n,
                 const ChunkSource *chunks, uint64_t layer_offset, unsigned char *staging,
                 unsigned char *pages, bool scatter, cudaStream_t s) {
  swiftkv_emu_rt::enqueue(s, [=] {
    std::lock_guard lock(g_launch_mu);
#if defined(__SANITIZE_THREAD__)
    (void)ahead;
    (void)grid;
    // Layer 1 of pieces of layer_offset bytes: a direct chunk's piece at its base + layer_offset.
    copy_items_cpu(items, n, chunks, 1, layer_offset, reinterpret_cast<std::byte *>(staging),
                   reinterpret_cast<std::byte *>(pages), scatter);
#else
    kernel_emulation::run_copy_items(grid, items, n, chunks, layer_offset, staging, pages, scatter,
                                     ahead, kernel_emulation::Schedule{});
#endif
  });
}

void launch_decode(bool ahead, unsigned grid, const CopyItem *items, uint32_t n,
                   const ChunkSource *chunks, const unsigned char *staging, unsigned char *pages,
                   const codec::LayerShape &shape, cudaStream_t s) {
  swiftkv_emu_rt::enqueue(s, [=] {
    std::lock_guard lock(g_launch_mu);
#if defined(__SANITIZE_THREAD__)
    (void)ahead;
    (void)grid;
    decode_items_cpu(items, n, chunks, shape, reinterpret_cast<const std::byte *>(staging),
                     reinterpret_cast<std::byte *>(pages));
#else
    kernel_emulation::run_decode_items(grid, items, n, chunks, staging, pages, &shape,
                                       sizeof shape, ahead, kernel_emulation::Schedule{});
#endif
  });
}

}  // namespace swiftkv::transfer_emulation
