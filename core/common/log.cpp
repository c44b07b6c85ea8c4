#include "core/common/log.hpp"

#include <time.h>
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

bool LogLimiter::line(LogLevel level, const std::string &what) noexcept {
  timespec t{};
  ::clock_gettime(CLOCK_MONOTONIC, &t);
  const uint64_t now =
      static_cast<uint64_t>(t.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(t.tv_nsec);
  uint64_t skipped = 0;
  {
    std::lock_guard lock(mu_);
    if (any_ && now - last_ns_ < interval_ns_) {
      ++pending_;
      ++left_out_;
      return false;
    }
    any_ = true;
    last_ns_ = now;
    skipped = pending_;
    pending_ = 0;
  }
  if (skipped == 0) {
    log_line(level, what);
  } else {
    try {
      log_line(level, what + " (and " + std::to_string(skipped) +
                          " more like it since the last such line)");
    } catch (...) {
      log_line(level, what);
    }
  }
  return true;
}

uint64_t LogLimiter::left_out() const noexcept {
  std::lock_guard lock(mu_);
  return left_out_;
}

}  // namespace swiftkv
