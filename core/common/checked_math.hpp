// Overflow-checked 64-bit arithmetic for sizes computed from caller input. A result that does
// not fit is SWIFTKV_EINVAL naming what was being computed, never a wrapped value.
#pragma once

#include <cstdint>
#include <string_view>

#include "core/common/error.hpp"

namespace swiftkv {

// `what` names the quantity for the message, e.g. "borrower: bytes of one full chunk".
inline uint64_t checked_mul(uint64_t a, uint64_t b, std::string_view what) {
  uint64_t r;
  if (__builtin_mul_overflow(a, b, &r)) {
    fail_invalid(std::string(what) + " does not fit in 64 bits (" + std::to_string(a) + " * " +
                 std::to_string(b) + ")");
  }
  return r;
}

inline uint64_t checked_add(uint64_t a, uint64_t b, std::string_view what) {
  uint64_t r;
  if (__builtin_add_overflow(a, b, &r)) {
    fail_invalid(std::string(what) + " does not fit in 64 bits (" + std::to_string(a) + " + " +
                 std::to_string(b) + ")");
  }
  return r;
}

// ceil(a / b) for b > 0, without the overflow of (a + b - 1) / b.
constexpr uint64_t ceil_div(uint64_t a, uint64_t b) { return a / b + (a % b != 0); }

// a rounded up to a multiple of b > 0 (a caller that can overflow checks a first).
constexpr uint64_t round_up(uint64_t a, uint64_t b) { return ceil_div(a, b) * b; }

}  // namespace swiftkv
