#include "core/common/nontemporal_copy.hpp"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include <unistd.h>

#include "core/common/error.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace swiftkv {

namespace {

#if defined(__x86_64__)
// n bytes, a multiple of 64, to a 64-byte aligned d, from s at any alignment.
__attribute__((target("avx2"))) void lines_avx2(std::byte *d, const std::byte *s, size_t n) {
  for (size_t i = 0; i < n; i += 64) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(s + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(s + i + 32));
    _mm256_stream_si256(reinterpret_cast<__m256i *>(d + i), a);
    _mm256_stream_si256(reinterpret_cast<__m256i *>(d + i + 32), b);
  }
}

void lines_sse2(std::byte *d, const std::byte *s, size_t n) {
  for (size_t i = 0; i < n; i += 64) {
    const auto *from = reinterpret_cast<const __m128i *>(s + i);
    auto *to = reinterpret_cast<__m128i *>(d + i);
    const __m128i a = _mm_loadu_si128(from), b = _mm_loadu_si128(from + 1);
    const __m128i c = _mm_loadu_si128(from + 2), e = _mm_loadu_si128(from + 3);
    _mm_stream_si128(to, a);
    _mm_stream_si128(to + 1, b);
    _mm_stream_si128(to + 2, c);
    _mm_stream_si128(to + 3, e);
  }
}
#endif

}  // namespace

void nontemporal_copy_with(NontemporalStores stores, void *dst, const void *src,
                           size_t n) noexcept {
  auto *d = static_cast<std::byte *>(dst);
  const auto *s = static_cast<const std::byte *>(src);
  if (stores == NontemporalStores::none || n < kNontemporalMin) {
    std::memcpy(d, s, n);
    return;
  }
#if defined(__x86_64__)
  const size_t head = (64 - reinterpret_cast<uintptr_t>(d) % 64) % 64;
  std::memcpy(d, s, head);
  d += head;
  s += head;
  n -= head;
  const size_t whole = n / 64 * 64;
  if (stores == NontemporalStores::avx2) {
    lines_avx2(d, s, whole);
  } else {
    lines_sse2(d, s, whole);
  }
  std::memcpy(d + whole, s + whole, n - whole);
#endif
}

NontemporalStores nontemporal_stores() noexcept {
  static const NontemporalStores best = [] {
#if defined(__x86_64__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") ? NontemporalStores::avx2 : NontemporalStores::sse2;
#else
    return NontemporalStores::none;
#endif
  }();
  return best;
}

bool nontemporal_stores_available(NontemporalStores stores) noexcept {
  return static_cast<int>(stores) <= static_cast<int>(nontemporal_stores());
}

void nontemporal_copy(void *dst, const void *src, size_t n) noexcept {
  nontemporal_copy_with(nontemporal_stores(), dst, src, n);
}

bool nontemporal_pays(size_t bytes_per_thread) noexcept {
  static const size_t l2 = [] {
    const long bytes = ::sysconf(_SC_LEVEL2_CACHE_SIZE);
    return bytes > 0 ? static_cast<size_t>(bytes) : size_t{2} << 20;
  }();
  return bytes_per_thread > l2;
}

HostStores host_stores_choice() {
  const char *e = std::getenv("SWIFTKV_HOST_STORES");
  if (e == nullptr || *e == '\0' || std::strcmp(e, "auto") == 0) return HostStores::automatic;
  if (std::strcmp(e, "cached") == 0) return HostStores::cached;
  if (std::strcmp(e, "nontemporal") == 0) return HostStores::nontemporal;
  fail_invalid(std::string("SWIFTKV_HOST_STORES is '") + e +
               "': it names how the host copy engine writes pages and chunks, auto, cached or "
               "nontemporal (unset: auto)");
}

void nontemporal_fence() noexcept {
#if defined(__x86_64__)
  _mm_sfence();
#endif
}

}  // namespace swiftkv
