// Pieces the fuzz targets share: a failed oracle check (an abort that libFuzzer reports as a
// crash, with the library's last error), and a reader that turns input bytes into fields.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "swiftkv/swiftkv.h"

namespace swiftkv::fuzz {

// Aborts with `target: what: <the library's last error>` unless ok.
inline void check(bool ok, const char *target, const char *what) {
  if (!ok) {
    std::fprintf(stderr, "%s: %s: %s\n", target, what, swiftkv_last_error_message());
    std::abort();
  }
}

// Fields from the input, in order; a field past the input's end takes its fallback, so that
// every input, however short, is a whole case.
struct Reader {
  const uint8_t *p;
  size_t n;
  template <class T>
  T take(T fallback) {
    if (n < sizeof(T)) return fallback;
    T v;
    std::memcpy(&v, p, sizeof v);
    p += sizeof v;
    n -= sizeof v;
    return v;
  }
};

}  // namespace swiftkv::fuzz
