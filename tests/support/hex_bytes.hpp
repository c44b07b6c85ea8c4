// Byte strings as hex text, for the multi-process tests and benchmarks that pass UCX addresses
// and keys to a child on its command line or read them from its output.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

inline std::string hex_of(const std::vector<std::byte> &b) {
  static const char *d = "0123456789abcdef";
  std::string s;
  for (std::byte x : b) {
    s += d[static_cast<unsigned>(x) >> 4];
    s += d[static_cast<unsigned>(x) & 15];
  }
  return s;
}

inline std::vector<std::byte> bytes_of_hex(const std::string &s) {
  std::vector<std::byte> b(s.size() / 2);
  for (size_t i = 0; i < b.size(); ++i) {
    b[i] = static_cast<std::byte>(std::stoul(s.substr(2 * i, 2), nullptr, 16));
  }
  return b;
}
