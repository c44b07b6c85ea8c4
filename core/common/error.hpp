// The exception every core function throws for a failure a caller can act on: a status from the
// public header and a message naming the argument. capi/ turns it into a status at the ABI.
#pragma once

#include <stdexcept>
#include <string>

#include "swiftkv/swiftkv.h"

namespace swiftkv {

class Error : public std::runtime_error {
 public:
  Error(swiftkv_status status, const std::string &message)
      : std::runtime_error(message), status_(status) {}

  swiftkv_status status() const noexcept { return status_; }

 private:
  swiftkv_status status_;
};

// Shorthands for the common statuses, so call sites read as the rule they enforce.
[[noreturn]] inline void fail(swiftkv_status status, const std::string &message) {
  throw Error(status, message);
}
[[noreturn]] inline void fail_invalid(const std::string &message) {
  throw Error(SWIFTKV_EINVAL, message);
}

}  // namespace swiftkv
