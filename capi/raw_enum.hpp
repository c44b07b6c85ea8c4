// Reading a C enum argument as the int the caller stored. A C caller or a binding may pass any
// number in an enum field; loading it through the C++ enum type would be undefined behaviour.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace swiftkv::capi {

template <class E>
int32_t raw_enum_value(const E &e) noexcept {
  static_assert(std::is_enum_v<E> && sizeof(E) == sizeof(int32_t));
  int32_t raw;
  std::memcpy(&raw, &e, sizeof raw);
  return raw;
}

}  // namespace swiftkv::capi
