// Memory for the library's own large tables (the chunk index's slots, the eviction order's
// nodes), asked on transparent huge pages. At a million chunks they span 200 MB read at random: on
// 4 KiB pages nearly every cold slot a store or an eviction reads misses the TLB as well as the
// cache, and the page walk (a nested one in a virtual machine) stalls even a prefetch of it.
#pragma once

#include <cstddef>
#include <new>

namespace swiftkv {

// Below this, memory comes from operator new: a smaller range holds no whole huge page.
inline constexpr size_t kLargePageBytes = size_t{2} << 20;

// Memory for `bytes` bytes (not 0), aligned to 64 bytes, not initialised. From `kLargePageBytes`
// on: a private anonymous mapping that starts on a 2 MiB boundary, advised MADV_HUGEPAGE (the
// kernel backs its whole 2 MiB pages with huge pages where transparent huge pages are enabled,
// "always" or "madvise", and with 4 KiB pages otherwise). Throws std::bad_alloc.
void *allocate_large(size_t bytes);
// Frees what allocate_large(bytes) returned, given the same `bytes`.
void free_large(void *p, size_t bytes) noexcept;
// Gives the whole pages inside [p, p + bytes) back to the kernel, where that range lies in
// memory allocate_large mapped (from kLargePageBytes on): they read as zeros afterwards. Nothing
// for smaller allocations. Returns the bytes given back.
size_t discard_large(void *p, size_t bytes, size_t allocation_bytes) noexcept;
// The bytes of memory that allocate_large(bytes) takes: `bytes` in whole pages (4 KiB on x86)
// from kLargePageBytes on, else `bytes`.
size_t large_bytes(size_t bytes) noexcept;

// A standard allocator on allocate_large, for the vectors that hold such tables.
template <class T>
struct LargePageAllocator {
  using value_type = T;
  static_assert(alignof(T) <= 64);
  LargePageAllocator() noexcept = default;
  template <class U>
  LargePageAllocator(const LargePageAllocator<U> &) noexcept {}  // NOLINT: as the standard's
  T *allocate(size_t n) {
    if (n > static_cast<size_t>(-1) / sizeof(T)) throw std::bad_array_new_length();
    return static_cast<T *>(allocate_large(n * sizeof(T)));
  }
  void deallocate(T *p, size_t n) noexcept { free_large(p, n * sizeof(T)); }
  template <class U>
  bool operator==(const LargePageAllocator<U> &) const noexcept {
    return true;
  }
};

}  // namespace swiftkv
