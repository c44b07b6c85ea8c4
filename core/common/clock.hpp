// CLOCK_MONOTONIC in nanoseconds: the library's time wherever the caller gave no clock.
#pragma once

#include <time.h>

#include <cstdint>

namespace swiftkv {

inline uint64_t monotonic_ns() noexcept {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<uint64_t>(ts.tv_nsec);
}

}  // namespace swiftkv
