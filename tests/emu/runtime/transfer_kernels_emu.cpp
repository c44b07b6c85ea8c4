// The emulated launches of transfer_kernels_emu.hpp. Under TSan, which cannot follow the kernels'
// emulation (its fibers switch stacks), the kernels' CPU twins run instead: the streams' order
// is what this emulation checks, and TSan then watches the library's host side under it.
#include "transfer_kernels_emu.hpp"

#include <cstdio>
#include <cstdlib>
#include <mutex>

#if !defined(__SANITIZE_THREAD__)
#include "emu_kernels.hpp"
#endif

namespace swiftkv::transfer_emulation {

namespace {

// The emulation runs one launch at a time (its fibers share one scheduler).
std::mutex g_launch_mu;

// A kernel of `device` takes chunks in place only from memory that device reaches: its own, or a
// peer's with peer access. Anything else is what a GPU would fault on (or read wrong): abort.
void check_in_place(int device, const CopyItem *items, uint32_t n, const ChunkSource *chunks) {
  for (uint32_t i = 0; i < n; ++i) {
    const uint64_t direct = chunks[items[i].chunk].direct;
    if (direct != 0 && !swiftkv_emu_rt::reachable(device, reinterpret_cast<const void *>(direct))) {
      std::fprintf(stderr,
                   "a kernel of device %d takes chunk %u in place from memory it cannot reach\n",
                   device, items[i].chunk);
      std::abort();
    }
  }
}

int current_device() {
  int d = 0;
  (void)cudaGetDevice(&d);
  return d;
}

}  // namespace

void launch_copy(bool ahead, unsigned grid, const CopyItem *items, uint32_t n,
                 const ChunkSource *chunks, uint64_t layer_offset, unsigned char *staging,
                 unsigned char *pages, bool scatter, cudaStream_t s) {
  swiftkv_emu_rt::enqueue(s, [=, device = current_device()] {
    std::lock_guard lock(g_launch_mu);
    check_in_place(device, items, n, chunks);
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
  swiftkv_emu_rt::enqueue(s, [=, device = current_device()] {
    std::lock_guard lock(g_launch_mu);
    check_in_place(device, items, n, chunks);
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
