// nontemporal_copy (core/common/nontemporal_copy.hpp) with each kind of store this CPU has: every
// size from 0 to past the memcpy threshold by several lines, at every destination offset in a
// line and source offsets across one, and megabytes at odd offsets. The destination must hold the
// source's bytes, and nothing around it or in the source may change.
#include <algorithm>
#include <csetjmp>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include <stdlib.h>
#include <unistd.h>

#include "core/common/error.hpp"
#include "core/common/nontemporal_copy.hpp"

// After the core headers: CMocka defines a macro named fail.
extern "C" {
#include <cmocka.h>
}

namespace {

using swiftkv::NontemporalStores;

std::vector<NontemporalStores> available_stores() {
  std::vector<NontemporalStores> all;
  for (const NontemporalStores s :
       {NontemporalStores::none, NontemporalStores::sse2, NontemporalStores::avx2}) {
    if (swiftkv::nontemporal_stores_available(s)) all.push_back(s);
  }
  return all;
}

// Copies n bytes from src + src_at to dst_base + dst_at (dst_base 64-byte aligned inside dst_buf,
// so dst_at is the offset in a line) and checks every byte of dst_buf: the copy, and the 0xa5
// it was filled with around it.
void check_copy(NontemporalStores stores, const std::vector<std::byte> &src, size_t src_at,
                size_t dst_at, size_t n, std::vector<std::byte> &dst_buf, std::byte *dst_base,
                const std::vector<std::byte> &pattern) {
  std::memcpy(dst_buf.data(), pattern.data(), dst_buf.size());
  std::byte *at = dst_base + dst_at;
  swiftkv::nontemporal_copy_with(stores, at, src.data() + src_at, n);
  swiftkv::nontemporal_fence();
  const size_t before = static_cast<size_t>(at - dst_buf.data()), after = before + n;
  if (std::memcmp(dst_buf.data(), pattern.data(), before) != 0 ||
      std::memcmp(at + n, pattern.data(), dst_buf.size() - after) != 0) {
    fail_msg("stores %d, n=%zu, src_at=%zu, dst_at=%zu: a byte outside the copy changed",
             static_cast<int>(stores), n, src_at, dst_at);
  }
  if (std::memcmp(at, src.data() + src_at, n) != 0) {
    fail_msg("stores %d, n=%zu, src_at=%zu, dst_at=%zu: the copy differs", static_cast<int>(stores),
             n, src_at, dst_at);
  }
}

void every_size_and_offset_copies_exactly(void **) {
  std::mt19937_64 rng(256);
  std::vector<std::byte> src(1200);
  for (std::byte &b : src) b = static_cast<std::byte>(rng());
  const std::vector<std::byte> src_before = src;
  std::vector<std::byte> dst_buf(1200 + 192);
  const std::vector<std::byte> pattern(dst_buf.size(), std::byte{0xa5});
  // A 64-byte aligned base inside dst_buf with a line of room before it.
  auto *base = dst_buf.data() + 64;
  base += (64 - reinterpret_cast<uintptr_t>(base) % 64) % 64;
  std::vector<size_t> sizes;
  for (size_t n = 0; n <= 2 * swiftkv::kNontemporalMin; ++n) sizes.push_back(n);
  for (const size_t n : {575u, 576u, 577u, 640u, 1000u, 1024u, 1088u}) sizes.push_back(n);
  uint64_t copies = 0;
  for (const NontemporalStores stores : available_stores()) {
    for (size_t dst_at = 0; dst_at < 64; ++dst_at) {
      for (const size_t src_at : {0u, 1u, 8u, 17u, 32u, 63u}) {
        for (const size_t n : sizes) {
          check_copy(stores, src, src_at, dst_at, n, dst_buf, base, pattern);
          ++copies;
        }
      }
    }
  }
  assert_true(copies >= 64 * 6 * sizes.size());
  assert_true(src == src_before);
}

void megabytes_at_odd_offsets_copy_exactly(void **) {
  std::mt19937_64 rng(8);
  const size_t n = (size_t{8} << 20) + 77;
  std::vector<std::byte> src(n + 16), dst(n + 16);
  for (std::byte &b : src) b = static_cast<std::byte>(rng());
  for (const NontemporalStores stores : available_stores()) {
    std::fill(dst.begin(), dst.end(), std::byte{0});
    swiftkv::nontemporal_copy_with(stores, dst.data() + 3, src.data() + 5, n);
    swiftkv::nontemporal_fence();
    assert_memory_equal(dst.data() + 3, src.data() + 5, n);
    for (size_t i = 0; i < 3; ++i) assert_int_equal(static_cast<int>(dst[i]), 0);
    for (size_t i = n + 3; i < dst.size(); ++i) assert_int_equal(static_cast<int>(dst[i]), 0);
  }
}

// The copy the library uses takes the best stores the CPU has: SSE2 at least on x86-64 (every
// x86-64 CPU has it), memcpy elsewhere.
void the_best_stores_are_taken(void **) {
  const NontemporalStores best = swiftkv::nontemporal_stores();
  assert_true(swiftkv::nontemporal_stores_available(best));
  assert_true(swiftkv::nontemporal_stores_available(NontemporalStores::none));
#if defined(__x86_64__)
  assert_true(best != NontemporalStores::none);
  assert_int_equal(best == NontemporalStores::avx2, __builtin_cpu_supports("avx2") != 0);
#else
  assert_true(best == NontemporalStores::none);
#endif
  std::vector<std::byte> a(4096, std::byte{7}), b(4096);
  swiftkv::nontemporal_copy(b.data(), a.data(), a.size());
  swiftkv::nontemporal_fence();
  assert_true(a == b);
}

// Copies go around the cache above the core's L2 size (2 MiB where the system does not say).
void copies_past_the_l2_go_around_the_cache(void **) {
  const long said = sysconf(_SC_LEVEL2_CACHE_SIZE);
  const size_t l2 = said > 0 ? static_cast<size_t>(said) : size_t{2} << 20;
  assert_false(swiftkv::nontemporal_pays(0));
  assert_false(swiftkv::nontemporal_pays(l2));
  assert_true(swiftkv::nontemporal_pays(l2 + 1));
  assert_true(swiftkv::nontemporal_pays(SIZE_MAX));
}

// SWIFTKV_HOST_STORES names the host copy engine's stores; anything else is EINVAL, naming it.
void host_stores_are_chosen_by_name(void **) {
  using swiftkv::HostStores;
  assert_int_equal(unsetenv("SWIFTKV_HOST_STORES"), 0);
  assert_true(swiftkv::host_stores_choice() == HostStores::automatic);
  const std::pair<const char *, HostStores> named[] = {{"", HostStores::automatic},
                                                       {"auto", HostStores::automatic},
                                                       {"cached", HostStores::cached},
                                                       {"nontemporal", HostStores::nontemporal}};
  for (const auto &[value, stores] : named) {
    assert_int_equal(setenv("SWIFTKV_HOST_STORES", value, 1), 0);
    assert_true(swiftkv::host_stores_choice() == stores);
  }
  for (const char *bad : {"Cached", "fast", "auto "}) {
    assert_int_equal(setenv("SWIFTKV_HOST_STORES", bad, 1), 0);
    try {
      (void)swiftkv::host_stores_choice();
      fail_msg("SWIFTKV_HOST_STORES=%s was taken", bad);
    } catch (const swiftkv::Error &e) {
      assert_int_equal(e.status(), SWIFTKV_EINVAL);
      assert_non_null(std::strstr(e.what(), bad));
    }
  }
  assert_int_equal(unsetenv("SWIFTKV_HOST_STORES"), 0);
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(every_size_and_offset_copies_exactly),
      cmocka_unit_test(megabytes_at_odd_offsets_copy_exactly),
      cmocka_unit_test(the_best_stores_are_taken),
      cmocka_unit_test(copies_past_the_l2_go_around_the_cache),
      cmocka_unit_test(host_stores_are_chosen_by_name),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
