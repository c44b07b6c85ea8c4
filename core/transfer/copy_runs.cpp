// Staged copies grouped into 2D runs (see copy_runs.hpp).
#include "core/transfer/copy_runs.hpp"

#include <algorithm>
#include <numeric>

namespace swiftkv {

namespace {

// Addresses as numbers: the pieces are in unrelated allocations.
uint64_t addr(const std::byte *p) { return reinterpret_cast<uintptr_t>(p); }

// b - a as a pitch when a row of `width` fits in it: positive, at least the width, at most the
// largest pitch; 0 otherwise.
uint64_t pitch(const std::byte *a, const std::byte *b, uint64_t width) {
  if (addr(b) <= addr(a)) return 0;
  const uint64_t d = addr(b) - addr(a);
  return d >= width && d <= kMaxCopyPitch ? d : 0;
}

}  // namespace

void copy_runs(const PieceCopy *copies, size_t n, std::vector<CopyRun> &out,
               std::vector<uint32_t> &order) {
  out.clear();
  order.resize(n);
  std::iota(order.begin(), order.end(), 0u);
  std::sort(order.begin(), order.end(),
            [&](uint32_t a, uint32_t b) { return addr(copies[a].src) < addr(copies[b].src); });
  for (size_t i = 0; i < order.size();) {
    const PieceCopy &first = copies[order[i]];
    CopyRun run{first.dst, first.src, first.bytes, 1, first.bytes, first.bytes};
    if (i + 1 < order.size()) {
      const PieceCopy &next = copies[order[i + 1]];
      const uint64_t sp = pitch(first.src, next.src, first.bytes);
      const uint64_t dp = pitch(first.dst, next.dst, first.bytes);
      if (next.bytes == first.bytes && sp != 0 && dp != 0) {
        run.src_pitch = sp;
        run.dst_pitch = dp;
        run.rows = 2;
        for (size_t j = i + 2; j < order.size(); ++j) {
          const PieceCopy &c = copies[order[j]];
          const PieceCopy &prev = copies[order[j - 1]];
          if (c.bytes != first.bytes || addr(c.src) - addr(prev.src) != sp ||
              addr(c.dst) - addr(prev.dst) != dp) {
            break;
          }
          ++run.rows;
        }
      }
    }
    out.push_back(run);
    i += run.rows;
  }
}

uint64_t staging_by_address(const std::byte *const *addresses, const uint64_t *sizes, size_t n,
                            uint64_t *offsets) {
  std::vector<uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    const std::byte *x = addresses[a], *y = addresses[b];
    if ((x == nullptr) != (y == nullptr)) return y == nullptr;
    return x != nullptr && addr(x) < addr(y);
  });
  uint64_t at = 0;
  for (uint32_t i : order) {
    offsets[i] = at;
    at += (sizes[i] + 15) / 16 * 16;
  }
  return at;
}

}  // namespace swiftkv
