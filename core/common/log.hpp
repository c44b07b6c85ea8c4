// The library's diagnostics: one line per event on stderr, for what a caller cannot see through a
// status (a peer's malformed message, a lease lost in the background). SWIFTKV_LOG selects how
// much: "off", "warn" (the default) or "info". Thread-safe; lines never interleave.
#pragma once

#include <string>

namespace swiftkv {

enum class LogLevel : int { off = 0, warn = 1, info = 2 };

// Whether lines of `level` are written; read from SWIFTKV_LOG once per process.
bool log_enabled(LogLevel level) noexcept;
// Writes "swiftkv[<pid>] <level>: <what>" when the level is enabled; never throws.
void log_line(LogLevel level, const std::string &what) noexcept;

inline void log_warn(const std::string &what) noexcept { log_line(LogLevel::warn, what); }
inline void log_info(const std::string &what) noexcept { log_line(LogLevel::info, what); }

}  // namespace swiftkv
