// Reading and writing the versioned structs of the ABI: check size and version, copy
// min(size, sizeof) bytes, and keep the library's defaults for the fields a caller lacks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "core/common/error.hpp"

namespace swiftkv::capi {

// `first_size` is the struct's size in its version 1 (offset of the end of its last v1 field):
// anything smaller cannot be a real swiftkv struct.
template <class T>
void check_struct_header(uint32_t size, uint32_t version, uint32_t max_version, size_t first_size,
                         const char *arg, const char *init_macro) {
  if (size == 0 && version == 0) {
    fail(SWIFTKV_EVERSION,
         std::string(arg) + " has size 0 and version 0; initialise it with " + init_macro);
  }
  if (version == 0 || version > max_version) {
    fail(SWIFTKV_EVERSION, std::string(arg) + "->version is " + std::to_string(version) +
                               "; this library knows versions 1 to " + std::to_string(max_version));
  }
  if (size < first_size) {
    fail(SWIFTKV_EVERSION, std::string(arg) + "->size is " + std::to_string(size) +
                               "; the smallest valid size is " + std::to_string(first_size));
  }
}

// Returns the library's view of *in: defaults overlaid by the caller's first min(size, sizeof)
// bytes, with size and version set to the library's own.
template <class T>
T read_versioned(const T *in, const T &defaults, uint32_t max_version, size_t first_size,
                 const char *arg, const char *init_macro) {
  static_assert(std::is_trivially_copyable_v<T>);
  if (in == nullptr) fail_invalid(std::string(arg) + " is NULL");
  check_struct_header<T>(in->size, in->version, max_version, first_size, arg, init_macro);
  T out = defaults;
  std::memcpy(&out, in, in->size < sizeof(T) ? in->size : sizeof(T));
  out.size = static_cast<uint32_t>(sizeof(T));
  out.version = max_version;
  return out;
}

// Writes `value` into the caller's *out, which declares its own size and version: only
// min(out->size, sizeof) bytes are written and the caller's size and version are kept.
template <class T>
void write_versioned(T *out, const T &value, uint32_t max_version, size_t first_size,
                     const char *arg, const char *init_macro) {
  static_assert(std::is_trivially_copyable_v<T>);
  if (out == nullptr) fail_invalid(std::string(arg) + " is NULL");
  const uint32_t size = out->size;
  const uint32_t version = out->version;
  // A newer version is refused as for inputs: fields this library cannot fill would keep the
  // caller's initial zeros and read as real answers.
  check_struct_header<T>(size, version, max_version, first_size, arg, init_macro);
  T v = value;
  v.size = size;
  v.version = version;
  std::memcpy(out, &v, size < sizeof(T) ? size : sizeof(T));
}

}  // namespace swiftkv::capi
