// The library's diagnostics: one line per event on stderr, for what a caller cannot see through a
// status (a peer's malformed message, a lease lost in the background). SWIFTKV_LOG selects how
// much: "off", "warn" (the default) or "info". Thread-safe; lines never interleave.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>

namespace swiftkv {

enum class LogLevel : int { off = 0, warn = 1, info = 2 };

// Whether lines of `level` are written; read from SWIFTKV_LOG once per process.
bool log_enabled(LogLevel level) noexcept;
// Writes "swiftkv[<pid>] <level>: <what>" when the level is enabled; never throws.
void log_line(LogLevel level, const std::string &what) noexcept;

inline void log_warn(const std::string &what) noexcept { log_line(LogLevel::warn, what); }
inline void log_info(const std::string &what) noexcept { log_line(LogLevel::info, what); }

// At most one line per interval for a condition that can repeat without end (a peer's flood, a
// full disk): the lines in between are left out and counted, and the next line written says
// how many. Thread-safe.
class LogLimiter {
 public:
  explicit LogLimiter(uint64_t interval_ns = 10'000'000'000ull) noexcept
      : interval_ns_(interval_ns) {}
  // Writes `what` at `level` unless a line went out less than the interval ago. True when
  // written.
  bool line(LogLevel level, const std::string &what) noexcept;
  bool warn(const std::string &what) noexcept { return line(LogLevel::warn, what); }
  uint64_t left_out() const noexcept;  // lines left out, in all

 private:
  mutable std::mutex mu_;
  const uint64_t interval_ns_;
  bool any_ = false;
  uint64_t last_ns_ = 0;
  uint64_t pending_ = 0;  // left out since the last line written
  uint64_t left_out_ = 0;
};

}  // namespace swiftkv
