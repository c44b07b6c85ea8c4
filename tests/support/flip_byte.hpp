// Corrupts one byte of a file in place (flips bit 4), as a torn or rotted disk would: for the
// tests of what reads a file back and must notice.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>

inline void flip_byte(const std::string &path, uint64_t at) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(at));
  char b = 0;
  f.read(&b, 1);
  b = static_cast<char>(b ^ 0x10);
  f.seekp(static_cast<std::streamoff>(at));
  f.write(&b, 1);
}
