// Large tables on huge pages: an anonymous mapping aligned to 2 MiB by mapping 2 MiB more than
// asked and unmapping what lies before the boundary and after the end.
#include "core/memory/large_pages.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>

namespace swiftkv {

namespace {
size_t page() noexcept {
  static const auto p = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return p;
}
size_t whole_pages(size_t bytes) noexcept { return (bytes + page() - 1) / page() * page(); }
}  // namespace

size_t large_bytes(size_t bytes) noexcept {
  return bytes < kLargePageBytes ? bytes : whole_pages(bytes);
}

void *allocate_large(size_t bytes) {
  if (bytes < kLargePageBytes) return ::operator new (bytes, std::align_val_t{64});
  const size_t size = whole_pages(bytes);
  if (size > SIZE_MAX - kLargePageBytes) throw std::bad_alloc();
  const size_t span = size + kLargePageBytes;
  void *m = ::mmap(nullptr, span, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) throw std::bad_alloc();
  const auto base = reinterpret_cast<uintptr_t>(m);
  const uintptr_t at = (base + kLargePageBytes - 1) & ~uintptr_t{kLargePageBytes - 1};
  if (at != base) ::munmap(m, at - base);
  const uintptr_t end = base + span;
  if (end != at + size) ::munmap(reinterpret_cast<void *>(at + size), end - (at + size));
  // Advice only: a kernel without transparent huge pages, or with them off, says EINVAL, and
  // the table works the same on 4 KiB pages.
  (void)::madvise(reinterpret_cast<void *>(at), size, MADV_HUGEPAGE);
  return reinterpret_cast<void *>(at);
}

size_t discard_large(void *p, size_t bytes, size_t allocation_bytes) noexcept {
  if (allocation_bytes < kLargePageBytes) return 0;
  const uintptr_t mask = page() - 1;
  const auto from = (reinterpret_cast<uintptr_t>(p) + mask) & ~mask;
  const auto to = (reinterpret_cast<uintptr_t>(p) + bytes) & ~mask;
  if (to <= from) return 0;
  // A huge page partly discarded is split by the kernel; the rest of it stays.
  if (::madvise(reinterpret_cast<void *>(from), to - from, MADV_DONTNEED) != 0) return 0;
  return to - from;
}

void free_large(void *p, size_t bytes) noexcept {
  if (p == nullptr) return;
  if (bytes < kLargePageBytes) {
    ::operator delete (p, std::align_val_t{64});
    return;
  }
  ::munmap(p, whole_pages(bytes));
}

}  // namespace swiftkv
