// The exception firewall of the C ABI. Every capi/ function body is one try-block ending in
// SWIFTKV_CATCH_ALL, which maps any exception to a status and records the thread's message.
#pragma once

#include <string>

#include "core/common/error.hpp"
#include "swiftkv/swiftkv.h"

namespace swiftkv::capi {

// The check every entry point makes of its pointer arguments: EINVAL naming `arg`.
inline void require(const void *p, const char *arg) {
  if (p == nullptr) fail_invalid(std::string(arg) + " is NULL");
}

// Records `message` as this thread's last error, prefixed with the failing function's name.
swiftkv_status set_error(const char *function, swiftkv_status status, const std::string &message);

// Classifies the exception being handled (call only inside a catch block).
swiftkv_status translate_current_exception(const char *function) noexcept;

}  // namespace swiftkv::capi

#define SWIFTKV_CATCH_ALL                                          \
  catch (...) {                                                    \
    return ::swiftkv::capi::translate_current_exception(__func__); \
  }
