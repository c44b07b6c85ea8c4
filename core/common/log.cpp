#include "core/common/log.hpp"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace swiftkv {

namespace {

LogLevel level_from_env() noexcept {
  const char *v = std::getenv("SWIFTKV_LOG");
  if (v == nullptr) return LogLevel::warn;
  if (std::strcmp(v, "off") == 0 || std::strcmp(v, "0") == 0) return LogLevel::off;
  if (std::strcmp(v, "info") == 0) return LogLevel::info;
  return LogLevel::warn;
}

}  // namespace

bool log_enabled(LogLevel level) noexcept {
  static const LogLevel configured = level_from_env();
  return level != LogLevel::off && static_cast<int>(level) <= static_cast<int>(configured);
}

void log_line(LogLevel level, const std::string &what) noexcept {
  if (!log_enabled(level)) return;
  static std::mutex mu;
  std::lock_guard lock(mu);
  std::fprintf(stderr, "swiftkv[%d] %s: %s\n", static_cast<int>(::getpid()),
               level == LogLevel::warn ? "warn" : "info", what.c_str());
}

}  // namespace swiftkv
