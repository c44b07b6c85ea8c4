// The staged copies of a layer between host memory and a device, grouped into runs that one 2D
// copy makes. A copy engine pays a fixed cost per copy whatever its size (about 2.5 us on the
// H200 of the 2026-11-26 run: 512 KiB copies ran at 0.79 of one large copy, 32 KiB ones at
// 0.19), so a layer of 16 chunks' 1 MiB pieces copied one by one, batched or not, ran at 0.87
// of one large copy. Pieces a chunk apart in host memory (the host tier's slots, one chunk's
// layers after another's) and side by side in staging are one 2D copy: one cost per run.
// Staging is laid out in the order of the pieces' host addresses so that runs form whichever
// way the tier handed out the slots.
// C++17, so that nvcc compiles its callers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace swiftkv {

// `bytes` from src to dst.
struct PieceCopy {
  std::byte *dst;
  const std::byte *src;
  uint64_t bytes;
};

// `rows` copies of `width` bytes, row r from src + r * src_pitch to dst + r * dst_pitch. A run
// of one row is a plain copy (its pitches are its width).
struct CopyRun {
  std::byte *dst;
  const std::byte *src;
  uint64_t width, rows, dst_pitch, src_pitch;
};

// The largest pitch a 2D copy takes (the CUDA runtime's limit, cudaDevAttrMaxPitch on every
// device so far).
constexpr uint64_t kMaxCopyPitch = (uint64_t{1} << 31) - 1;

// The `n` copies as runs, into `out` (cleared first): in the order of their sources' addresses,
// each run the longest stretch of copies of one size whose sources and destinations each step by
// one distance, at least that size and at most kMaxCopyPitch (rows never overlap); every copy is in
// exactly one run. `order` is scratch.
void copy_runs(const PieceCopy *copies, size_t n, std::vector<CopyRun> &out,
               std::vector<uint32_t> &order);

// Where each of `n` staged pieces goes in a staging buffer: offsets[i] for piece i of sizes[i]
// bytes (each slot rounded up to 16), in the order of `addresses` (the pieces' host memory; the
// null ones after, in their order), so that copy_runs finds pieces a chunk apart in host memory
// side by side in staging. Returns the buffer's size.
uint64_t staging_by_address(const std::byte *const *addresses, const uint64_t *sizes, size_t n,
                            uint64_t *offsets);

}  // namespace swiftkv
